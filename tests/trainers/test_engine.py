"""The one engine: every loss, regularizer and gradient transform in every strategy (single,
vmap ensemble, routed), each checked against the same config trained as a plain single run."""

from __future__ import annotations

import numpy as np
import pytest

from groklens.checkpoints import Trajectory
from groklens.trainers.ensemble import ensemble_key, train_ensemble
from groklens.trainers.train import resume, train
from groklens.trainers.routing import RoutedRun
from groklens.sweeps import InlineExecutor, parse_sweep, run_sweep
from tests.helpers import TINY, tiny_config, train_interrupted


def assert_close_runs(a_path, b_path, tol=1e-5):
    """Same checkpoints and evaluations; every parameter and metric within `tol` (relative to
    the value's size where it exceeds 1). An ensemble's batched matmuls sum in another order than
    a single run's, and which order depends on the CPU's kernels: float32 rounding grows to
    ~1e-6 over 40 Adam steps on some machines (CI measured 1.25e-6), so 1e-5, not 1e-6."""
    a, b = Trajectory(a_path), Trajectory(b_path)
    assert a.config_dict == b.config_dict and a.status == b.status
    np.testing.assert_array_equal(a.steps, b.steps)
    for name in a.param_names:
        x, y = a.param_trajectory(name), b.param_trajectory(name)
        assert np.abs(x - y).max(initial=0) <= tol * max(1.0, np.abs(y).max(initial=0)), name
    ma, mb = a.metrics, b.metrics
    assert sorted(ma) == sorted(mb)
    for name in ma:
        x, y = np.asarray(ma[name], float), np.asarray(mb[name], float)
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        ok = ~np.isnan(x)
        assert np.all(np.abs(x[ok] - y[ok]) <= tol * np.maximum(1.0, np.abs(y[ok]))), (name, x, y)


# ---------------------------------------------------------------------- ensembles of mixed members
def test_sweep_ensemble_trains_regularized_stablemax_and_grokfast_members(tmp_path):
    """`sweep --ensemble` on a grid mixing act_norm_lambda, loss and Grokfast: ensembles only (one
    per loss), no single-run fallback, each member equal to its config trained alone."""
    sw = parse_sweep({"base": {**TINY, "steps": 40, "n_layers": 2},
                      "axes": {"loss": ["ce", "stablemax"], "act_norm_lambda": [0.0, 0.05],
                               "grokfast_lambda": [0.0, 2.0]}, "seeds": [0]})
    out = tmp_path / "sweep"
    report = run_sweep(sw, out, executor=InlineExecutor(), ensemble=True, progress=False)
    assert report.counts["done"] == 8 and report.ensembles == 2 and not report.single_fallback
    for r in sw.runs():
        ref = tmp_path / f"{r.name}.h5"
        train(r.config, ref, progress=False)
        assert_close_runs(out / f"{r.name}.h5", ref)


def test_ensemble_mixes_geomdr_and_perpendicular_gradient_members(tmp_path):
    base = dict(steps=40, geomdr_target=4.0, batch_size=16)
    cfgs = [tiny_config(**base, seed=1, geomdr_lambda=0.2),
            tiny_config(**base, seed=2, perp_grad=True, lr=1e-2),
            tiny_config(**base, seed=3, weight_decay=0.1)]
    assert len({ensemble_key(c) for c in cfgs}) == 1
    results = train_ensemble(cfgs, [tmp_path / f"e{i}.h5" for i in range(3)])
    assert all(r.error is None for r in results)
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert_close_runs(tmp_path / f"e{i}.h5", tmp_path / f"s{i}.h5")
    assert "perp_grad_removed" in Trajectory(tmp_path / "e1.h5").metrics
    assert "perp_grad_removed" not in Trajectory(tmp_path / "e0.h5").metrics


# ---------------------------------------------------------------------- routing composes with regularizers
def test_identity_routing_with_regularizers_is_independent_regularized_runs(tmp_path):
    """Bit-identical: with the identity kernel routed copy c is the single run with seed+c, with
    the penalty, Grokfast and the perpendicular gradient applied as a single run applies them."""
    cfg = tiny_config(routing_copies=2, steps=30, checkpoint_every=10, seed=4, act_norm_lambda=0.05,
                      grokfast_lambda=2.0, perp_grad=True, batch_size=16)
    train(cfg, tmp_path / "routed.h5", progress=False)
    for c in range(2):
        train(cfg.replace(routing_copies=1, seed=cfg.seed + c), tmp_path / f"single{c}.h5", progress=False)
        ref, copy = Trajectory(tmp_path / f"single{c}.h5"), Trajectory(tmp_path / "routed.h5", copy=c)
        for name in ref.param_names:
            assert np.array_equal(copy.param_trajectory(name), ref.param_trajectory(name)), (c, name)
        mc, mr = copy.metrics, ref.metrics
        for key in mr:
            assert np.array_equal(mc[key], mr[key], equal_nan=True), (c, key)


def test_routed_run_with_activation_norm_penalty_trains_and_resumes_bit_identically(tmp_path):
    cfg = tiny_config(routing_copies=3, routing_width=1.0, batch_size=16, steps=60, act_norm_lambda=0.05)
    whole, cut = tmp_path / "whole.h5", tmp_path / "cut.h5"
    train(cfg, whole, progress=False)
    m = Trajectory(whole).metrics
    assert {"reg_act_norm", "copy2.reg_act_norm", "copy1.act_norm_radius"} <= set(m)
    assert np.all(m["copy2.reg_act_norm"] > 0)
    train_interrupted(cfg, cut, 37, RoutedRun)
    assert resume(cut, progress=False).last_step == 60
    for c in range(3):
        a, b = Trajectory(whole, copy=c), Trajectory(cut, copy=c)
        assert list(a.steps) == list(b.steps)
        for name in a.param_names:
            assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name)), (c, name)
    ma, mb = Trajectory(whole).metrics, Trajectory(cut).metrics
    for key in ma:
        assert np.array_equal(ma[key], mb[key], equal_nan=True), key


# ---------------------------------------------------------------------- the entry point's callback
@pytest.mark.parametrize("kind", ["single", "routed", "ensemble"])
def test_on_commit_is_called_after_each_committed_checkpoint(tmp_path, kind):
    seen = []
    on_commit = seen.append
    cfg = tiny_config(steps=40, routing_copies=2 if kind == "routed" else 1)
    if kind == "ensemble":
        train_ensemble([cfg, cfg.replace(seed=5)], [tmp_path / "e0.h5", tmp_path / "e1.h5"], on_commit=on_commit)
    else:
        train(cfg, tmp_path / "r.h5", progress=False, on_commit=on_commit)
    assert seen == [0, 20, 40] == list(Trajectory(tmp_path / ("e0.h5" if kind == "ensemble" else "r.h5")).steps)
