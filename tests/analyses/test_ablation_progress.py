"""Frequency ablation against independent computations (a weight edit; a precomputed patch), and
Nanda's progress measures: the curves, the phase rule on a planted curve, the report's figure."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.analyses.ablation import frequency_ablation
from groklens.analyses.progress import drop_step, phase_boundaries, ProgressCurves
from groklens.errors import BadInput


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from tests.helpers import train_tiny

    path = tmp_path_factory.mktemp("abl") / "run.h5"
    train_tiny(path, p=11, steps=200, eval_every=20, checkpoint_every=40, lr=1e-2)
    return path


def _unit_waves(p: int, freqs, x: np.ndarray) -> np.ndarray:
    """[len(x), 2|K|] cos(2 pi k x / p), sin(...) normalised over x (built here, not from fourier.py)."""
    cols = []
    for k in freqs:
        for f in (np.cos, np.sin):
            v = f(2 * math.pi * k * x / p)
            cols.append(v / np.linalg.norm(v))
    return np.stack(cols, axis=1)


def _loss(logits, data, idx=slice(None)):
    lg = logits[:, int(data.readout_pos)].double()
    return float(F.cross_entropy(lg[idx], data.labels[idx]))


def test_embedding_ablation_equals_editing_the_embedding_weights(run):
    from groklens.checkpoints import Trajectory

    traj = Trajectory(run)
    model, data = traj.model(traj.steps[-1]), traj.dataset()
    out = frequency_ablation(model, data, frequencies=[1, 3])
    # independently: project the residue rows of W_E off the cos/sin(w_k t) vectors, then a plain forward
    edited = copy.deepcopy(model)
    p = 11
    U = _unit_waves(p, [1, 3], np.arange(p))  # [p, 4]
    with torch.no_grad():
        E = edited.embed.W_E[:p].double().numpy()
        edited.embed.W_E[:p] = torch.from_numpy(E - U @ (U.T @ E)).float()
        logits = edited(data.inputs)
        clean = model(data.inputs)
    assert out["ablated_loss_all"] == pytest.approx(_loss(logits, data), rel=1e-5)
    assert out["ablated_loss_test"] == pytest.approx(_loss(logits, data, data.test_idx), rel=1e-5)
    # float32 rounding: the analysis runs the hooked (explicit) path, a bare forward may take the lean one
    assert out["loss_all"] == pytest.approx(_loss(clean, data), rel=1e-6)
    assert out["frequencies"].tolist() == [1, 3]
    assert not model.blocks[0].hook_resid_pre._forward_hooks  # nothing left behind
    none = frequency_ablation(model, data, frequencies=[])
    assert none["ablated_loss_all"] == pytest.approx(none["loss_all"], rel=1e-12)


@pytest.mark.parametrize("along", ["a+b", "a"])
def test_site_ablation_equals_a_precomputed_patch(run, along):
    from groklens.checkpoints import Trajectory
    from groklens.probes.capture import capture
    from groklens.probes.grid import modular_grid
    from groklens.probes.interventions import run_patched

    traj = Trajectory(run)
    model, data = traj.model(traj.steps[-1]), traj.dataset()
    site, pos, p = "blocks.0.hook_resid_mid", int(data.readout_pos), 11
    out = frequency_ablation(model, data, frequencies=[2, 4], site=site, along=along)
    X = capture(model, data.inputs, [site], position=pos)[site].double().numpy()  # [N, d]
    grid = modular_grid(data)
    if along == "a+b":
        D = _unit_waves(p, [2, 4], grid.c.astype(float))  # over the N input rows
        Y = X - D @ (D.T @ X)
    else:
        U = _unit_waves(p, [2, 4], np.arange(p))  # along the first operand
        G = X[grid.cell]  # [a, b, d]
        G = G - np.einsum("ar,cr,cbd->abd", U, U, G)
        Y = G[grid.a, grid.b]
    logits = run_patched(model, data.inputs, {site: (pos, torch.from_numpy(Y).float())})
    assert out["ablated_loss_all"] == pytest.approx(_loss(logits, data), rel=1e-5)
    assert out["ablated_loss_train"] == pytest.approx(_loss(logits, data, data.train_idx), rel=1e-5)


def test_ablation_refuses_bad_input(run):
    from groklens.checkpoints import Trajectory

    traj = Trajectory(run)
    model, data = traj.model(traj.steps[-1]), traj.dataset()
    with pytest.raises(BadInput, match="along must be"):
        frequency_ablation(model, data, along="c")
    with pytest.raises(BadInput, match="along='token'"):
        frequency_ablation(model, data, site="blocks.0.hook_resid_mid")
    with pytest.raises(BadInput):
        frequency_ablation(model, data, frequencies=[9])  # p=11 has frequencies 1..5


def test_the_phase_rule_on_planted_curves():
    steps = np.arange(0, 2001, 100)
    test = np.concatenate([np.linspace(4.0, 30.0, 4), np.full(9, 30.0) - np.arange(9), np.geomspace(20, 1e-3, 8)])
    excluded_ck = steps[::2]
    excluded = np.interp(excluded_ck, [0, 300, 1200, 2000], [1.0, 1.0, 8.0, 2.0])
    c = ProgressCurves(steps, np.full(len(steps), 1e-3), test, np.linspace(10, 2, len(steps)), excluded_ck,
                       np.geomspace(5, 1e-3, len(excluded_ck)), excluded)
    ph = phase_boundaries(c)
    assert ph["memorization_end"] == 300  # the test-loss peak (30 at steps 300 and 400: the first)
    assert ph["circuit_formation_end"] == 1200  # the excluded-loss peak after M
    # K: the first evaluation after C with test loss <= 0.01
    assert ph["cleanup_end"] == int(steps[np.nonzero((test <= 0.01) & (steps > 1200))[0][0]])
    # the drop step: first step after the peak at or below sqrt(peak * final)
    level = math.sqrt(30.0 * 1e-3)
    assert drop_step(steps, test) == int(steps[np.nonzero((test <= level) & (steps >= 300))[0][0]])
    assert drop_step(steps, np.linspace(1, 2, len(steps))) is None  # never falls


def test_a_peak_where_the_run_stopped_is_no_phase_boundary():
    """A run stopped while its excluded loss still rises: the excluded loss's highest point is
    the last checkpoint, which says where the run stopped, not where circuit formation ended, so
    C (and K after it) is None; with the curve turned down before the end C is its peak. Likewise
    a test loss still rising at the end gives no M."""
    steps = np.arange(0, 2001, 100)
    test = np.concatenate([np.linspace(4.0, 30.0, 4), np.geomspace(29, 1e-3, len(steps) - 4)])
    ck = steps[::2]
    rising = np.linspace(1.0, 8.0, len(ck))
    c = ProgressCurves(steps, np.full(len(steps), 1e-3), test, np.linspace(10, 2, len(steps)), ck,
                       np.geomspace(5, 1e-3, len(ck)), rising)
    assert phase_boundaries(c) == {"memorization_end": 300, "circuit_formation_end": None, "cleanup_end": None}
    turned = rising.copy()
    turned[-2:] = [6.0, 5.0]  # peaks at checkpoint -3, then falls
    c.excluded = turned
    ph = phase_boundaries(c)
    assert ph["circuit_formation_end"] == int(ck[-3])
    assert ph["cleanup_end"] == int(steps[np.nonzero((test <= 0.01) & (steps > ck[-3]))[0][0]])
    c.test_loss = np.linspace(1.0, 3.0, len(steps))  # never falls, highest at the end
    assert phase_boundaries(c)["memorization_end"] is None


def test_report_analyze_stores_the_fixed_key_set_the_figure_reads(run, tmp_path):
    """A plain `report --analyze` stored only each checkpoint's own key set, so its progress-measures
    figure said it should not be read (issue 43's study); it now stores the last checkpoint's set too."""
    import shutil

    from groklens.analyses import compute
    from groklens.analyses.progress import progress_curves
    from tests.helpers import groklens

    shutil.copy(run, tmp_path / "r.h5")
    res = groklens("report", str(tmp_path / "r.h5"), "-o", str(tmp_path / "rep"), "--analyze", "--metric", "fourier",
                   "--figures", "progress_measures", "-q")
    assert res.returncode == 0, res.stderr
    c = progress_curves(tmp_path / "r.h5")
    own = compute(tmp_path / "r.h5", "fourier", steps=[int(c.ck_steps[-1])], store=False)
    assert c.key_source.startswith("fixed key set")
    assert c.key_set == [int(k) for k in np.asarray(own.values["key_frequencies"][0]).reshape(-1)]


def test_the_progress_measures_figure_on_a_tiny_run(run, tmp_path):
    """`report --analyze --param fourier.key_frequencies=last` draws Nanda's figure with a fixed key set."""
    import shutil

    from groklens.analyses.progress import progress_curves
    from tests.helpers import groklens

    shutil.copy(run, tmp_path / "r.h5")
    res = groklens("report", str(tmp_path / "r.h5"), "-o", str(tmp_path / "rep"), "--analyze", "--metric", "fourier",
                   "--param", "fourier.key_frequencies=last", "-q")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "rep" / "fig_progress_measures.png").exists()
    c = progress_curves(tmp_path / "r.h5")
    assert c.key_set and c.key_source.startswith("fixed key set")
    assert len(c.ck_steps) >= 3 and np.all(np.isfinite(c.restricted)) and np.all(c.excluded > 0)
    # the curves are the stored values: the same as the analysis at that checkpoint with that key set
    from groklens.analyses.fourier import fourier
    from groklens.checkpoints import Trajectory

    traj = Trajectory(tmp_path / "r.h5")
    last = int(c.ck_steps[-1])
    direct = fourier(traj.model(last), traj.dataset(), key_frequencies=c.key_set)
    assert c.restricted[-1] == pytest.approx(direct["restricted_loss_all"], rel=1e-9)
    assert np.allclose(c.weight_sq, np.asarray(traj.metrics["weight_norm"]) ** 2)
