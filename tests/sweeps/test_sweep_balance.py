"""Ensembles in a sweep sized by the runs' cost, so that no worker idles while another has more
than one run's work left; `--dry-run --ensemble` shows the grouping (issue 43)."""

from __future__ import annotations

import json

import yaml

from groklens.sweeps.grid import parse_sweep
from groklens.sweeps.tasks import plan_tasks
from tests.helpers import TINY, groklens

BASE = dict(TINY)


def runs_of(d_mlp: int, seeds: list[int]):
    return parse_sweep({"base": {**BASE, "d_mlp": d_mlp}, "axes": {"lr": [1e-3, 2e-3, 3e-3]}, "seeds": seeds}).runs()


def finish_times(tasks: list[dict], workers: int) -> list[float]:
    """When each worker runs out of work, each taking the next task as it frees (the executors)."""
    free = [0.0] * workers
    for t in tasks:
        i = free.index(min(free))
        free[i] += t["cost"]
    return sorted(free)


def idle_gap(tasks, workers, most_per_run) -> float:
    times = finish_times(tasks, workers)
    return (times[-1] - times[0]) / most_per_run  # in runs' work


def test_nine_runs_in_groups_of_three_and_six_keep_two_workers_busy(tmp_path):
    runs = runs_of(32, [0]) + runs_of(64, [0, 1])  # two architectures: 3 and 6 runs
    tasks, _ = plan_tasks(runs, tmp_path, ensemble=True, ensemble_size=64, workers=2, threads=1)
    assert sum(len(t["runs"]) for t in tasks) == 9
    assert all(len({r["config"]["d_mlp"] for r in t["runs"]}) == 1 for t in tasks)  # ensembles share the step
    assert idle_gap(tasks, 2, 60.0) <= 1  # before: one ensemble of 3, one of 6: 3 runs apart
    assert [t["cost"] for t in tasks] == sorted((t["cost"] for t in tasks), reverse=True)  # costliest first


def test_costlier_runs_are_cut_finer(tmp_path):
    """A run of the wide architecture costs 3 of the narrow (a measured cost, here given)."""
    runs = runs_of(32, [0, 1, 2]) + runs_of(256, [0])
    cost = {32: 1.0, 256: 3.0}
    tasks, _ = plan_tasks(runs, tmp_path, ensemble=True, ensemble_size=64, workers=3, threads=1,
                          cost=lambda cfg: cost[cfg.d_mlp])
    assert sum(t["cost"] for t in tasks) == 18 and idle_gap(tasks, 3, 3.0) <= 1
    for t in tasks:
        assert t["cost"] == sum(cost[r["config"]["d_mlp"]] for r in t["runs"])


def test_dry_run_with_ensemble_shows_the_grouping(tmp_path, monkeypatch):
    monkeypatch.setenv("GROKLENS_CACHE_DIR", str(tmp_path / "cache"))  # the step times measured here
    g = tmp_path / "grid.yaml"
    g.write_text(yaml.safe_dump({"base": BASE, "axes": {"d_mlp": [16, 32], "lr": [1e-3, 3e-3]}, "seeds": [0]}))
    out = tmp_path / "sweep"
    text = groklens("sweep", str(g), "-o", str(out), "--dry-run", "--ensemble", "--workers", "2", "-q",
                    check=True).stdout
    lines = [ln for ln in text.splitlines() if ln.startswith("task ")]
    assert lines and all(" s: " in ln for ln in lines)
    named = [n for ln in lines for n in ln.split(": ", 1)[1].split(", ")]
    assert sorted(named) == sorted(ln.split()[1] for ln in text.splitlines() if ln.startswith("pending"))
    data = json.loads(groklens("sweep", str(g), "-o", str(out), "--dry-run", "--ensemble", "--workers", "2",
                               "--json", check=True).stdout)
    assert len(data["runs"]) == 4 and sum(len(t["runs"]) for t in data["tasks"]) == 4
    assert not out.exists()  # a dry run writes nothing


def test_progress_counts_the_committed_steps_and_finished_members_in_flight(tmp_path):
    """What the sweep's bar shows of the tasks in flight, read from their files as any reader."""
    from groklens.sweeps import in_flight_text
    from tests.helpers import tiny_config, train_interrupted, train_tiny

    done, stopped, half = tmp_path / "done.h5", tmp_path / "stopped.h5", tmp_path / "half.h5"
    train_tiny(done)  # 60 steps: completed at its cap
    train_tiny(stopped, steps=2000, eval_every=10, checkpoint_every=1000, grok_threshold=0.05, stop_after_grok=2)
    train_interrupted(tiny_config(), half, at_step=45)  # checkpoints at 0, 20, 40 committed
    runs = [{"path": str(p), "config": {"steps": s}} for p, s in ((done, 60), (stopped, 2000), (half, 60))]
    runs.append({"path": str(tmp_path / "not-yet.h5"), "config": {"steps": 60}})
    # stopped: its stop rule ended it at step 130 (test_grok_evals.py); not-yet: no file, 0 steps
    assert in_flight_text(runs) == "in flight: 230/2,180 steps, 2 of 4 runs finished"


def test_progress_counts_evaluations_between_checkpoints(tmp_path):
    """A run evaluated more often than it is checkpointed: the bar counts its last evaluation, not
    only its last checkpoint (else a run checkpointed every 1,000 steps shows 0 done until then)."""
    from groklens.checkpoints.reader import open_trajectory_file
    from groklens.sweeps import member_progress
    from tests.helpers import tiny_config, train_interrupted

    path = tmp_path / "sparse.h5"
    train_interrupted(tiny_config(steps=60, eval_every=5, checkpoint_every=40), path, at_step=37)
    with open_trajectory_file(path, validate=False) as f:  # what the file committed, read independently
        checkpoints, evals = list(f["steps"][:]), list(f["metrics"]["step"][:])
    assert checkpoints[-1] < evals[-1] <= 37
    assert member_progress(path) == (evals[-1], False)


def test_expected_wall_is_the_last_worker_to_run_out():
    from groklens.sweeps.tasks import expected_wall

    assert expected_wall([5, 4, 3, 3, 1], 2) == 8  # 5+3 and 4+3+1
    assert expected_wall([6, 3], 2) == 6 and expected_wall([6, 3], 1) == 9 and expected_wall([], 3) == 0


def test_time_left_counts_steps_not_runs():
    """The bar's time left: 3 of 9 runs done says nothing while a 6-member ensemble runs; its steps do."""
    from groklens.sweeps import time_left_text

    assert time_left_text(0, 9000, 10.0) == ""
    assert time_left_text(3000, 9000, 60.0) == "~2m00s left (steps to the caps at the pace so far)"
    assert time_left_text(1000, 101000, 36.0) == "~1h00m left (steps to the caps at the pace so far)"
    assert time_left_text(9500, 9000, 60.0).startswith("~0m00s")


def test_dry_run_says_the_expected_wall_time(tmp_path, monkeypatch):
    monkeypatch.setenv("GROKLENS_CACHE_DIR", str(tmp_path / "cache"))
    g = tmp_path / "grid.yaml"
    g.write_text(yaml.safe_dump({"base": BASE, "axes": {"d_mlp": [16, 32], "lr": [1e-3, 3e-3]}, "seeds": [0]}))
    data = json.loads(groklens("sweep", str(g), "-o", str(tmp_path / "s"), "--dry-run", "--ensemble", "--workers", "2",
                               "--json", check=True).stdout)
    costs = sorted((t["cost"] for t in data["tasks"]), reverse=True)
    assert data["workers"] == 2 and max(costs) <= data["expected_wall_s"] <= sum(costs)
    text = groklens("sweep", str(g), "-o", str(tmp_path / "s"), "--dry-run", "--ensemble", "--workers", "2", "-q",
                    check=True).stdout
    assert "expected: ~" in text and "on 2 worker(s)" in text
