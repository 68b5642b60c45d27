"""compute(): choosing checkpoints, storing in the sidecar, reuse, crash safety, bad input."""

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from groklens.analyses import compute
from groklens.analyses.registry import ANALYSES, get
from groklens.analyses.runner import compute_many, select_steps
from groklens.analyses.store import Sidecar
from groklens.checkpoints import Trajectory, sidecar_path
from groklens.errors import RunFailure, BadInput
from tests.helpers import train_tiny


@pytest.fixture
def run(tmp_path):
    path = tmp_path / "run.h5"
    train_tiny(path)  # checkpoints at steps 0, 20, 40, 60
    return path


def _forbid(monkeypatch, name):
    """Make analysis `name` fail if it is computed at all (so results must come from the store)."""
    get(name)

    def fail(*a, **k):
        raise AssertionError(f"{name} was recomputed")

    monkeypatch.setitem(ANALYSES._items, name, dataclasses.replace(ANALYSES.get(name), func=fail))


def test_results_are_stored_with_their_parameters_and_reused(run, monkeypatch):
    first = compute(run, "rank", weights=["unembed.W_U"])
    assert first.steps == [0, 20, 40, 60] and first.computed_steps == first.steps
    side = sidecar_path(run)
    with h5py.File(side, "r") as f:
        (variant,) = f["analyses/rank"]
        g = f[f"analyses/rank/{variant}"]
        assert g["steps"][:].tolist() == [0, 20, 40, 60]
        assert '"weights":["unembed.W_U"]' in g.attrs["params"]
        assert g.attrs["groklens_version"]
    _forbid(monkeypatch, "rank")
    again = compute(run, "rank", weights=["unembed.W_U"])
    assert again.computed_steps == [] and again.reused_steps == first.steps
    for key in first.values:
        np.testing.assert_array_equal(again[key], first[key])
    with pytest.raises(AssertionError, match="recomputed"):
        compute(run, "rank", weights=["unembed.W_U"], recompute=True)
    with pytest.raises(AssertionError, match="recomputed"):  # other parameters: another variant
        compute(run, "rank", weights=["embed.W_E"])


def test_only_missing_steps_are_computed_and_variants_live_side_by_side(run):
    part = compute(run, "norms", steps=[20, 60])
    assert part.computed_steps == [20, 60]
    full = compute(run, "norms")
    assert full.computed_steps == [0, 40] and full.reused_steps == [20, 60]
    compute(run, "rank", steps=[0], weights=["unembed.W_U"])
    compute(run, "rank", steps=[0], weights=["embed.W_E"])
    assert len(Sidecar(run).variants("rank")) == 2
    assert Sidecar(run).read("norms", Sidecar(run).variants("norms")[0][0]).steps == [0, 20, 40, 60]


def test_every_k_and_steps_selection():
    assert select_steps([0, 10, 20, 30, 40], every=3) == [0, 30, 40]
    assert select_steps([0, 10, 20], steps=[20, 0, 20]) == [0, 20]
    with pytest.raises(BadInput, match="no checkpoint at step"):
        select_steps([0, 10], steps=[5])
    with pytest.raises(BadInput, match="either --every or --checkpoints"):
        select_steps([0, 10], steps=[0], every=2)


def test_a_failing_analysis_keeps_the_steps_it_finished(run, monkeypatch):
    real = get("norms")
    calls = []

    def flaky(model, data, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("disk on fire")
        return real.func(model, data, **kw)

    monkeypatch.setitem(ANALYSES._items, "norms", dataclasses.replace(real, func=flaky))
    with pytest.raises(RuntimeError, match="disk on fire"):
        compute_many(run, [("norms", {})], commit_seconds=1e9)
    stored = Sidecar(run).read("norms", Sidecar(run).variants("norms")[0][0])
    assert stored.steps == [0, 20]


def test_a_commit_that_dies_before_the_rename_leaves_the_old_file(run, monkeypatch):
    compute(run, "norms", steps=[0])
    side = sidecar_path(run)
    before = side.read_bytes()

    def crash(src, dst):
        raise OSError("killed before rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(RunFailure, match="killed before rename.*stored results are as they were"):
        compute(run, "norms", steps=[20])  # one line naming the cause (docs/FORMAT.md), not a raw OSError
    monkeypatch.undo()
    assert side.read_bytes() == before
    assert not list(side.parent.glob(side.name + ".tmp-*"))
    assert compute(run, "norms", steps=[0]).reused_steps == [0]


@pytest.mark.slow
def test_sigkill_during_an_analysis_leaves_committed_results_readable(run):
    script = textwrap.dedent(f"""
        import time, groklens.analyses.norms as n
        real = n.norms
        def slow(*a, **k):
            time.sleep(0.6)
            return real(*a, **k)
        n.norms = slow
        from groklens.analyses.runner import compute_many
        compute_many({str(run)!r}, [("norms", {{}})], commit_seconds=0)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "OMP_NUM_THREADS": "1"})
    side = sidecar_path(run)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not side.exists():
            time.sleep(0.05)
        assert side.exists(), "the analysis never committed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    variant = Sidecar(run).variants("norms")[0][0]
    stored = Sidecar(run).read("norms", variant)
    assert 1 <= len(stored.steps) < 4
    again = compute(run, "norms")
    assert again.reused_steps == stored.steps and sorted(again.computed_steps + again.reused_steps) == [0, 20, 40, 60]
    assert not list(side.parent.glob(side.name + ".tmp-*"))  # a torn temporary file is cleaned up


def test_bad_input_creates_and_changes_no_file(run):
    side = sidecar_path(run)
    cases = [
        dict(name="nope"),
        dict(name="rank", sites=["blocks.9.hook_resid_post"]),
        dict(name="rank", colour="blue"),
        dict(name="norms", steps=[7]),
        dict(name="sharpness", eval_set="val"),
        dict(name="attention", quantiles=[2.0]),
    ]
    for case in cases:
        case = dict(case)
        name = case.pop("name")
        with pytest.raises(BadInput):
            compute(run, name, **case)
        assert not side.exists()
    compute(run, "norms", steps=[0])
    stamp = (side.stat().st_ino, side.stat().st_mtime_ns, side.read_bytes())
    with pytest.raises(BadInput, match="unknown hook site"):
        compute_many(run, [("norms", {}), ("rank", {"sites": ["hook_nope"]})])
    assert (side.stat().st_ino, side.stat().st_mtime_ns, side.read_bytes()) == stamp


def test_a_foreign_sidecar_is_refused_not_overwritten(run):
    side = sidecar_path(run)
    with h5py.File(side, "w") as f:
        f["x"] = 1
    before = side.read_bytes()
    with pytest.raises(BadInput, match="not a groklens analyses file"):
        compute(run, "norms")
    assert side.read_bytes() == before


def test_results_over_a_trajectory_object_and_run_level_grokking(run):
    traj = Trajectory(run)
    res = compute(traj, "grokking", thresholds=[0.0, 1.5])
    out = res.to_json()
    assert out["thresholds"] == [0.0, 1.5]
    assert out["last_step"] == int(traj.metrics["step"][-1])
    assert out["grokking_step"] == [0, None] and out["grokking_censored"] == [0, 1]  # 1.5: never reached


def test_default_analyses_skip_what_does_not_apply_with_a_note(tmp_path):
    from groklens.analyses.runner import analyze_run

    path = tmp_path / "div.h5"
    train_tiny(path, task="div", steps=20, checkpoint_every=20)
    results, notes = analyze_run(path, progress=False)
    assert "fourier" not in results and any(n.startswith("skipped fourier") for n in notes)
    assert {"attention", "rank", "radial", "norms", "grokking"} <= set(results)
    with pytest.raises(BadInput, match="applies to tasks"):
        analyze_run(path, metrics=["fourier"], progress=False)


def test_an_unchanged_run_level_result_is_not_rewritten(run):
    compute(run, "grokking")
    side = sidecar_path(run)
    stamp = (side.stat().st_ino, side.stat().st_mtime_ns)
    compute(run, "grokking")
    assert (side.stat().st_ino, side.stat().st_mtime_ns) == stamp


def test_rows_of_an_older_definition_with_other_values_are_replaced_not_mixed(run):
    # a sidecar written before an analysis gained a value: its rows lack the new key
    compute(run, "norms", steps=[0, 20])
    sc = Sidecar(run)
    (variant, attrs), = sc.variants("norms")
    old = sc.read("norms", variant)
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items() if k != "updated"}
    rows = {s: {**r, "added_later": np.float64(1.0)} for s, r in old.rows().items() if s == 20}
    sc.commit("norms", variant, attrs, rows)
    new = sc.read("norms", variant)
    assert new.steps == [20] and "added_later" in new.values  # step 0 (old definition) dropped
