"""A regularizer term that reads only each block's resid_post (the activation-norm penalty's
default sites) is fed by the model itself (Transformer.resid_capture) instead of TransformerLens
hooks, so its step stays on the lean path: the same activations, loss and gradients as the hooked
explicit path to float32 rounding, and the same training run to the golden tests' tolerance."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from groklens.tasks import TASKS
from groklens.models import build_model
from tests.helpers import tiny_config, train_tiny

ATOL, RTOL = 1e-6, 1e-4  # as tests/models/test_fast_path.py: float32 sums in another order


@pytest.mark.parametrize("variant", [dict(norm="none", n_layers=2), dict(norm="ln", mlp_bias=True),
                                     dict(norm="sphere", unembed="bounded", causal=False)])
def test_the_model_records_the_same_resid_post_as_the_hooks(variant):
    cfg = tiny_config(**variant)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[data.train_idx]
    sites = [f"blocks.{i}.hook_resid_post" for i in range(cfg.n_layers)]
    hooked: dict = {}
    with model.hooks(fwd_hooks=[(s, lambda t, hook: hooked.__setitem__(hook.name, t)) for s in sites]):
        ref = model(x)
    model.resid_capture = {s: None for s in sites}
    try:
        assert not model.hooks_attached()
        out = model(x)
        got = model.resid_capture
    finally:
        model.resid_capture = None
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for s in sites:
        torch.testing.assert_close(got[s], hooked[s], atol=ATOL, rtol=RTOL)
    # the trainer's call: logits at the readout positions only, every site still at every position
    sl = slice(data.readout_pos, data.readout_pos + 1)
    model.resid_capture = {s: None for s in sites}
    try:
        readout = model(x, readout=sl)
        at_readout = model.resid_capture
    finally:
        model.resid_capture = None
    torch.testing.assert_close(readout, ref[:, sl], atol=ATOL, rtol=RTOL)
    for s in sites:
        torch.testing.assert_close(at_readout[s], hooked[s], atol=ATOL, rtol=RTOL)
    # the penalty's gradient flows through the recorded tensors as through the hooked ones
    params = [p for n, p in model.named_parameters() if n.startswith(("blocks.", "embed."))]
    g_lean = torch.autograd.grad(sum((t.norm(dim=-1) ** 2).mean() for t in got.values()), params, allow_unused=True)
    g_ref = torch.autograd.grad(sum((t.norm(dim=-1) ** 2).mean() for t in hooked.values()), params, allow_unused=True)
    for a, b in zip(g_lean, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=RTOL)


@pytest.mark.parametrize("n_layers", [1, 2])  # one layer: the readout block is the first, on the table
def test_a_penalty_run_trains_the_hooked_runs_trajectory(n_layers, tmp_path, monkeypatch):
    """Trained with the penalty: the lean capture against the hooked explicit path (the path every
    act_norm run took before), metrics and parameters to the golden tests' 1e-3."""
    from groklens.trainers import single

    cfg = dict(steps=60, eval_every=10, checkpoint_every=20, act_norm_lambda=0.5, n_layers=n_layers, seed=4)
    lanes = []
    init = single.Lane.__init__

    def record(self, *a, **kw):
        init(self, *a, **kw)
        lanes.append(self)

    monkeypatch.setattr(single.Lane, "__init__", record)
    train_tiny(tmp_path / "lean.h5", **cfg)
    assert lanes and all(lane.resid_capture for lane in lanes)  # the model recorded the sites itself

    def hooked(self, *a, **kw):
        init(self, *a, **kw)
        self.resid_capture = False  # the TransformerLens hooks, as before

    monkeypatch.setattr(single.Lane, "__init__", hooked)
    train_tiny(tmp_path / "hooked.h5", **cfg)
    with h5py.File(tmp_path / "lean.h5") as a, h5py.File(tmp_path / "hooked.h5") as b:
        for name in ("test_loss", "train_loss", "reg_act_norm"):
            np.testing.assert_allclose(a[f"metrics/{name}"][:], b[f"metrics/{name}"][:], rtol=1e-3)
        for name in a["params"]:
            pa, pb = a[f"params/{name}"][-1], b[f"params/{name}"][-1]
            assert np.linalg.norm(pa - pb) <= 1e-3 * np.linalg.norm(pb), name
