"""Every registered analysis runs on a real tiny run of every training loss (ce, stablemax, ce_float32, perceptron)."""

import numpy as np
import pytest
import torch

from groklens.analyses import compute
from groklens.analyses.common import LOSS_NAMES
from groklens.analyses.registry import names
from groklens.checkpoints import Trajectory
from groklens.models.losses import stablemax_cross_entropy
from tests.helpers import train_tiny

HEADLINE = {"attention": ["mass"], "fourier": ["neuron_fve", "restricted_loss_all", "excluded_loss_train"],
            "freq_ablation": ["ablated_loss_all", "loss_all"],
            "grokking": ["thresholds"], "llc": ["llc_mean", "llc_per_chain"], "norms": ["weight_norm"],
            "probe": ["accuracy"],
            "radial": ["rho@blocks.0.hook_resid_post", "radius_mean@blocks.0.hook_resid_post"],
            "rank": ["rankme@blocks.0.hook_resid_post"], "sharpness": ["top_eigenvalues", "trace"]}
CHEAP = {"sharpness": {"top_k": 1, "trace_samples": 3}, "llc": {"chains": 2, "draws": 4, "burnin": 2, "minibatch": 8},
         "probe": {"site": "blocks.0.hook_resid_post", "target": "answer"}}


def test_stablemax_loss_reductions_are_those_of_cross_entropy():
    logits = torch.randn(6, 5, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3, 4, 0])
    per = stablemax_cross_entropy(logits, labels, reduction="none")
    s = 1 / (1 - logits.clamp(max=0))  # s(x) for x < 0
    s = torch.where(logits >= 0, logits + 1, s)
    expected = -(s / s.sum(-1, keepdim=True)).log()[torch.arange(6), labels]
    torch.testing.assert_close(per, expected)
    total = stablemax_cross_entropy(logits, labels, reduction="sum")
    assert total.dim() == 0 and float(total) == pytest.approx(float(expected.sum()))
    assert float(stablemax_cross_entropy(logits, labels)) == pytest.approx(float(expected.mean()))


@pytest.mark.parametrize("loss", LOSS_NAMES)
def test_every_analysis_runs_on_a_run_of_every_loss(tmp_path, loss):
    path = tmp_path / "run.h5"
    train_tiny(path, loss=loss, steps=40, eval_every=10, checkpoint_every=20)
    traj = Trajectory(path)
    assert set(HEADLINE) <= set(names())
    for name in names():
        res = compute(traj, name, store=False, **CHEAP.get(name, {}))
        assert res.values, f"{name} returned nothing on a {loss} run"
        # a new analysis without headline values here: every value it returns must be finite
        for key in HEADLINE.get(name, list(res.values)):
            assert np.isfinite(np.asarray(res[key], dtype=np.float64)).all(), f"{name}.{key} on a {loss} run"
    # the loss-aware analyses measured the run's own loss: sharpness reports its value
    model, data = traj.model(traj.steps[-1]), traj.dataset()
    res = compute(traj, "sharpness", steps=[traj.steps[-1]], store=False, **CHEAP["sharpness"])
    with torch.no_grad():
        out = model.double()(data.inputs[data.train_idx])[:, data.readout_pos]
    y = data.labels[data.train_idx]
    if loss == "perceptron":  # Rosenblatt's criterion, written out: the best other logit's margin over the label's
        own = out[torch.arange(len(y)), y]
        others = out.clone()
        others[torch.arange(len(y)), y] = float("-inf")
        ref = (others.max(-1).values - own).clamp(min=0).mean()
    else:
        ref = stablemax_cross_entropy(out, y) if loss == "stablemax" else \
            torch.nn.functional.cross_entropy(out.float() if loss == "ce_float32" else out, y)
    assert res["loss"][0] == pytest.approx(float(ref), rel=1e-6 if loss == "ce_float32" else 1e-9)
