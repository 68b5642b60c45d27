"""Phase checkpoints: a checkpoint at the first evaluation where train accuracy (memorization)
and test accuracy (grokking) reach each threshold, besides the periodic ones, for single,
ensemble and routed runs, and exact across a resume."""

from __future__ import annotations

import numpy as np
import pytest

from groklens.analyses.grokking import run_summary
from groklens.checkpoints import Trajectory
from groklens.trainers.ensemble import train_ensemble
from groklens.trainers.train import resume, train
from groklens.trainers.routing import RoutedRun
from tests.helpers import tiny_config, train_interrupted

# memorizes (train acc 0.3) at step 40 and "groks" (test acc 0.3) at step 140 on CPU: neither a
# multiple of checkpoint_every
PHASED = dict(p=11, lr=1e-2, steps=300, eval_every=10, checkpoint_every=100, grok_threshold=0.3,
              train_frac=0.6, weight_decay=3.0)
THRESHOLDS = (0.3, 0.95, 0.99)  # grok_threshold and the ones the grokking analysis reports


def first_crossings(metrics, prefix=""):
    """Steps of the first evaluation with train / test accuracy >= each threshold (written here)."""
    out = {}
    for split in ("train_acc", "test_acc"):
        values = metrics[prefix + split]
        for t in THRESHOLDS:
            hits = [i for i, v in enumerate(values) if v >= t]
            if hits:
                out[(split, t)] = int(metrics["step"][hits[0]])
    return out


def crossings_from_below(metrics, prefix=""):
    """Steps where test accuracy reaches a threshold from below after the first evaluation: with
    grok_evals > 1 (the default) any of them may start grokking, so each has a checkpoint."""
    values, steps = metrics[prefix + "test_acc"], metrics["step"]
    return {int(steps[i]) for t in THRESHOLDS for i in range(1, len(values)) if values[i - 1] < t <= values[i]}


def expected_steps(metrics, copies=1):
    periodic = set(range(0, 301, 100))
    phase = set()
    for m in range(copies):
        prefix = f"copy{m}." if copies > 1 else ""
        phase |= set(first_crossings(metrics, prefix).values()) | crossings_from_below(metrics, prefix)
    return sorted(periodic | phase)


def test_single_run_checkpoints_at_memorization_and_grokking(tmp_path):
    train(tiny_config(**PHASED), tmp_path / "r.h5", progress=False)
    run = Trajectory(tmp_path / "r.h5")
    crossings = first_crossings(run.metrics)
    assert crossings[("train_acc", 0.3)] % 100 and crossings[("test_acc", 0.3)] % 100  # off the schedule
    assert list(run.steps) == expected_steps(run.metrics)
    assert set(crossings.values()) <= set(run_summary(run)["checkpoint_steps"])


def test_ensemble_members_checkpoint_at_their_own_phases(tmp_path):
    cfgs = [tiny_config(**PHASED, seed=s) for s in (999, 5)]
    paths = [tmp_path / "a.h5", tmp_path / "b.h5"]
    assert all(r.error is None for r in train_ensemble(cfgs, paths))
    for path in paths:
        run = Trajectory(path)
        assert list(run.steps) == expected_steps(run.metrics)
    assert list(Trajectory(paths[0]).steps) != list(Trajectory(paths[1]).steps)
    train(cfgs[0], tmp_path / "alone.h5", progress=False)  # member 0 is the config trained alone
    assert list(Trajectory(tmp_path / "alone.h5").steps) == list(Trajectory(paths[0]).steps)


def test_routed_run_checkpoints_at_every_copys_phases(tmp_path):
    train(tiny_config(**PHASED, routing_copies=2, routing_width=1.0), tmp_path / "r.h5", progress=False)
    run = Trajectory(tmp_path / "r.h5")
    assert list(run.steps) == expected_steps(run.metrics, copies=2)
    assert len(run.steps) > 4 + 1  # at least one phase checkpoint beside the periodic ones


@pytest.mark.parametrize("cut_at", [37, 135])  # before memorization; between memorization and grokking
def test_resume_neither_repeats_nor_misses_a_phase_checkpoint(tmp_path, cut_at):
    cfg = tiny_config(**PHASED)
    train(cfg, tmp_path / "whole.h5", progress=False)
    train_interrupted(cfg, tmp_path / "cut.h5", cut_at)
    resume(tmp_path / "cut.h5", progress=False)
    a, b = Trajectory(tmp_path / "whole.h5"), Trajectory(tmp_path / "cut.h5")
    assert list(a.steps) == list(b.steps) == expected_steps(a.metrics)
    for name in a.param_names:
        assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name)), name


def test_routed_resume_keeps_phase_checkpoints_exact(tmp_path):
    cfg = tiny_config(**PHASED, routing_copies=2, routing_width=1.0)
    train(cfg, tmp_path / "whole.h5", progress=False)
    train_interrupted(cfg, tmp_path / "cut.h5", 135, RoutedRun)
    resume(tmp_path / "cut.h5", progress=False)
    assert list(Trajectory(tmp_path / "whole.h5").steps) == list(Trajectory(tmp_path / "cut.h5").steps)
