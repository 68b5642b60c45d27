"""Sweeps: grid files, run names, resumable runner, failures, and the local/Ray/SLURM executors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from groklens.checkpoints import Trajectory
from groklens.trainers import train as training
from groklens import sweeps
from groklens.sweeps import (
    InlineExecutor,
    LocalExecutor,
    SlurmExecutor,
    load_sweep,
    parse_sweep,
    plan_tasks,
    run_state,
    run_sweep,
    sweep_status,
)

from groklens.errors import BadInput
from tests.helpers import TINY, groklens, train_interrupted
from tests.trainers.test_ensemble import assert_same_trajectory

BASE = {k: v for k, v in TINY.items()}  # p=11, tiny widths, 60 steps


def grid(tmp_path: Path, data: dict, name: str = "grid.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def single(tmp_path: Path, cfg, name: str) -> Path:
    """The same config trained alone, the reference for a sweep's run."""
    path = tmp_path / "ref" / f"{name}.h5"
    path.parent.mkdir(exist_ok=True)
    training.train(cfg, path, progress=False)
    return path


# ---------------------------------------------------------------------- the grid
def test_product_and_stable_names():
    sw = parse_sweep({"base": BASE, "axes": {"weight_decay": [0.5, 1.0], "d_mlp": [16, 32]}, "seeds": [0, 1]})
    runs = sw.runs()
    assert len(runs) == 8
    names = [r.name for r in runs]
    # fields in sorted order, then the seed; the YAML's axis order does not matter
    assert names[0] == "d_mlp=16__weight_decay=0.5__seed=0"
    swapped = parse_sweep({"base": BASE, "axes": {"d_mlp": [16, 32], "weight_decay": [0.5, 1.0]}, "seeds": [0, 1]})
    assert sorted(r.name for r in swapped.runs()) == sorted(names)
    by_name = {r.name: r.config for r in runs}
    cfg = by_name["d_mlp=32__weight_decay=1.0__seed=1"]
    assert (cfg.d_mlp, cfg.weight_decay, cfg.seed, cfg.p) == (32, 1.0, 1, 11)
    # adding a value to an axis keeps every existing name
    grown = parse_sweep({"base": BASE, "axes": {"weight_decay": [0.5, 1.0, 2.0], "d_mlp": [16, 32]}, "seeds": [0, 1]})
    assert set(names) < {r.name for r in grown.runs()}


def test_logspace_axis_and_yaml_strings(tmp_path):
    path = grid(tmp_path, {})
    # YAML 1.1 reads 1e-3 as a string; the config's types decide
    path.write_text("base: {p: 11, steps: 20, eval_every: 10, checkpoint_every: 10}\n"
                    "axes:\n  lr: {logspace: [1e-4, 1e-2, 3]}\n  d_mlp: {logspace: [16, 64, 3]}\n"
                    "  weight_decay: [1e-1, 1.0]\nseeds: [3]\n")
    sw = load_sweep(path)
    assert sw.axes["lr"] == [1e-4, 1e-3, 1e-2]
    assert sw.axes["d_mlp"] == [16, 32, 64]
    assert sw.axes["weight_decay"] == [0.1, 1.0]
    assert all(isinstance(v, int) for v in sw.axes["d_mlp"])
    assert "d_mlp=16__lr=0.0001__weight_decay=0.1__seed=3" in {r.name for r in sw.runs()}


@pytest.mark.parametrize("data, message", [
    ({"base": {}, "axis": {}}, "unknown sweep key"),
    ({"base": {"lrr": 1}}, "unknown config key"),
    ({"axes": {"lrr": [1]}}, "not a config field"),
    ({"axes": {"lr": 0.1}}, "must be a list"),
    ({"axes": {"lr": []}}, "no values"),
    ({"axes": {"lr": {"linspace": [1, 2, 3]}}}, "logspace"),
    ({"axes": {"lr": {"logspace": [1e-3, 1e-2]}}}, "lo, hi, n"),
    ({"axes": {"lr": {"logspace": [-1, 1e-2, 3]}}}, "positive"),
    ({"axes": {"lr": {"logspace": [1e-3, 1e-2, 0]}}}, "count"),
    ({"axes": {"norm": {"logspace": [1, 2, 2]}}}, "numeric"),
    ({"axes": {"lr": [1e-3, 0.001]}}, "repeats"),
    ({"axes": {"lr": [1e-3, -1.0]}}, "lr must be"),
    ({"axes": {"seed": [1, 2]}}, "seeds"),
    ({"seeds": "zero"}, "list of integers"),
    ({"seeds": [1, 1]}, "repeats"),
    ([1, 2], "mapping"),
])
def test_bad_sweeps_are_one_line_bad_input(data, message):
    with pytest.raises(BadInput, match=message) as info:
        parse_sweep(data)
    assert "\n" not in str(info.value)


def test_missing_or_invalid_files(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load_sweep(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: [unclosed\n")
    with pytest.raises(BadInput, match="not valid YAML"):
        load_sweep(bad)
    code = tmp_path / "code.yaml"  # files are data only: no python tags
    code.write_text("base: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(BadInput):
        load_sweep(code)
    with pytest.raises(BadInput, match="no such directory"):
        sweep_status(tmp_path / "missing")
    with pytest.raises(BadInput, match="not a sweep directory"):
        sweep_status(tmp_path)


# ---------------------------------------------------------------------- the runner
@pytest.mark.slow
def test_half_finished_directory_is_completed(tmp_path):
    """done runs are skipped, interrupted ones resumed exactly, empty/uncommitted ones restarted."""
    sw = parse_sweep({"base": {**BASE, "steps": 80}, "axes": {"weight_decay": [0.3, 1.0]}, "seeds": [0, 1]})
    runs = {r.name: r for r in sw.runs()}
    out = tmp_path / "sweep"
    out.mkdir()
    done, interrupted, empty, missing = sorted(runs)
    training.train(runs[done].config, out / f"{done}.h5", progress=False)
    done_mtime = (out / f"{done}.h5").stat().st_mtime_ns
    # an interrupted run: Ctrl-C at step 50 leaves checkpoints 0, 20, 40
    train_interrupted(runs[interrupted].config, out / f"{interrupted}.h5", 50)
    (out / f"{empty}.h5").write_bytes(b"")  # killed before HDF5 wrote anything
    assert run_state(out, done)[0] == "done"
    assert run_state(out, interrupted) == ("interrupted", "3 checkpoints, last step 40")
    assert run_state(out, empty)[0] == "pending"

    report = run_sweep(sw, out, executor=LocalExecutor(workers=2), progress=False)
    assert report.counts == {"total": 4, "done": 4, "running": 0, "failed": 0}
    assert (out / f"{done}.h5").stat().st_mtime_ns == done_mtime  # not touched
    for name in (interrupted, empty, missing):
        assert_same_trajectory(out / f"{name}.h5", single(tmp_path, runs[name].config, name))
    status = sweep_status(out)
    assert status["counts"]["done"] == 4 and status["total"] == 4


def test_failing_run_is_recorded_and_others_finish(tmp_path):
    sw = parse_sweep({"base": {**BASE, "steps": 40}, "axes": {"lr": [3e-3, 1e30, 1e-3]}})
    out = tmp_path / "sweep"
    report = run_sweep(sw, out, executor=InlineExecutor(), progress=False)
    bad = "lr=1e+30__seed=999"
    assert report.counts == {"total": 3, "done": 2, "running": 0, "failed": 1}
    assert "non-finite loss" in report.failed[bad]
    record = json.loads((out / f"{bad}.error.json").read_text())
    assert record["type"] == "RunFailure" and "non-finite" in record["error"] and "Traceback" in record["traceback"]
    assert sweep_status(out)["failed"] == {bad: record["error"]}
    # started again: the failed run is not retried unless asked
    again = run_sweep(sw, out, executor=InlineExecutor(), progress=False)
    assert again.skipped_failed == [bad] and again.counts["done"] == 2
    assert json.loads((out / f"{bad}.error.json").read_text())["time"] == record["time"]
    retried = run_sweep(sw, out, executor=InlineExecutor(), retry_failed=True, progress=False)
    assert retried.counts["failed"] == 1 and retried.skipped_failed == []


def test_a_config_holding_infinity_resumes(tmp_path):
    """routing_width inf (the uniform kernel) is written to sweep.json as Infinity: a second run
    of the same sweep reads it back and finds the run done (it refused the manifest before)."""
    sw = parse_sweep({"base": {**BASE, "steps": 20, "routing_copies": 2, "routing_width": float("inf")}})
    out = tmp_path / "sweep"
    assert run_sweep(sw, out, executor=InlineExecutor(), progress=False).counts["done"] == 1
    assert "Infinity" in (out / "sweep.json").read_text()
    again = run_sweep(sw, out, executor=InlineExecutor(), progress=False)
    assert again.counts == {"total": 1, "done": 1, "running": 0, "failed": 0}
    with pytest.raises(BadInput, match="different config.*routing_width"):
        run_sweep(parse_sweep({"base": {**BASE, "steps": 20, "routing_copies": 2, "routing_width": 1.0}}), out,
                  executor=InlineExecutor(), progress=False)


def test_directory_refuses_a_changed_config(tmp_path):
    out = tmp_path / "sweep"
    run_sweep(parse_sweep({"base": {**BASE, "steps": 20}}), out, executor=InlineExecutor(), progress=False)
    with pytest.raises(BadInput, match="different config.*steps"):
        run_sweep(parse_sweep({"base": {**BASE, "steps": 40}}), out, executor=InlineExecutor(), progress=False)
    with pytest.raises(BadInput, match="not a directory"):
        run_sweep(parse_sweep({"base": BASE}), out / "sweep.json", executor=InlineExecutor(), progress=False)
    with pytest.raises(BadInput, match="does not exist"):
        run_sweep(parse_sweep({"base": BASE}), tmp_path / "a" / "b", executor=InlineExecutor(), progress=False)


def test_ensemble_sweep_writes_ordinary_runs(tmp_path):
    sw = parse_sweep({"base": {**BASE, "steps": 40},
                      "axes": {"lr": [1e-3, 3e-3], "weight_decay": [0.3, 1.0]}, "seeds": [0, 1]})
    out = tmp_path / "sweep"
    report = run_sweep(sw, out, executor=InlineExecutor(), ensemble=True, ensemble_size=5, progress=False)
    assert report.counts["done"] == 8 and report.ensembles == 2  # 8 members in chunks of <= 5
    for r in sw.runs()[::3]:
        assert_same_trajectory(out / f"{r.name}.h5", single(tmp_path, r.config, r.name))


def test_plan_tasks_groups_and_splits(tmp_path):
    sw = parse_sweep({"base": BASE, "axes": {"d_mlp": [16, 32], "lr": [1e-3, 2e-3, 3e-3]}, "seeds": [0, 1]})
    runs = sw.runs()
    tasks, fallback = plan_tasks(runs, tmp_path, ensemble=True, ensemble_size=64, workers=1, threads=1)
    assert len(tasks) == 2 and not fallback  # one ensemble per architecture
    assert {len(t["runs"]) for t in tasks} == {6}
    assert all(len({r["config"]["d_mlp"] for r in t["runs"]}) == 1 for t in tasks)
    tasks, _ = plan_tasks(runs, tmp_path, ensemble=True, ensemble_size=64, workers=4, threads=1)
    assert len(tasks) == 4 and sum(len(t["runs"]) for t in tasks) == 12  # split to keep 4 workers busy
    tasks, _ = plan_tasks(runs, tmp_path, ensemble=False, ensemble_size=64, workers=4, threads=1)
    assert len(tasks) == 12 and not any(t["ensemble"] for t in tasks)


# ---------------------------------------------------------------------- the command line
@pytest.mark.slow
def test_cli_sweep_status_and_exit_codes(tmp_path):
    path = grid(tmp_path, {"base": {**BASE, "steps": 40}, "axes": {"lr": [3e-3, 1e30]}})
    out = tmp_path / "sweep"
    proc = groklens("sweep", str(path), "-o", str(out), "--workers", "2", "-q")
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "1 of 2 runs failed" in proc.stderr
    assert "failed   lr=1e+30__seed=999: training stopped: non-finite" in proc.stdout
    status = json.loads(groklens("sweep", "--status", str(out), "--json", check=True).stdout)
    assert status["counts"] == {"done": 1, "running": 0, "interrupted": 0, "pending": 0, "failed": 1,
                                "blocked": 0}
    text = groklens("sweep", "--status", str(out), check=True).stdout
    assert "1 done" in text and "1 failed" in text
    dry = groklens("sweep", str(path), "-o", str(out), "--dry-run", check=True).stdout
    assert "done         lr=0.003__seed=999" in dry and "failed       lr=1e+30__seed=999" in dry
    for args, message in [
        (("sweep", str(tmp_path / "nope.yaml"), "-o", str(out)), "does not exist"),
        (("sweep", "--status", str(tmp_path / "nope")), "no such directory"),
        (("sweep", str(path)), "missing --out"),
        (("sweep", str(path), "-o", str(out), "--executor", "local", "--address", "x:1"), "--address"),
    ]:
        proc = groklens(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_stored_config_as_yaml_trains_the_same_run(tmp_path):
    sw = parse_sweep({"base": {**BASE, "steps": 40}, "axes": {"lr": [2e-3]}, "seeds": [5]})
    out = tmp_path / "sweep"
    run_sweep(sw, out, executor=InlineExecutor(), progress=False)
    name = sw.runs()[0].name
    cfg_yaml = sweeps.export_config_yaml(out / f"{name}.h5", tmp_path / "run.yaml")
    assert yaml.safe_load(cfg_yaml.read_text())["lr"] == 2e-3
    groklens("train", "--config", str(cfg_yaml), "-o", str(tmp_path / "again.h5"), "-q", check=True)
    assert_same_trajectory(out / f"{name}.h5", tmp_path / "again.h5")


@pytest.mark.slow
def test_killed_sweep_resumes_where_it_stopped(tmp_path):
    """SIGKILL the whole `groklens sweep` process group mid-run, then start it again."""
    path = grid(tmp_path, {"base": {**BASE, "steps": 600, "eval_every": 50, "checkpoint_every": 50},
                           "axes": {"weight_decay": [0.5, 1.0]}})
    out = tmp_path / "sweep"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "groklens", "sweep", str(path), "-o", str(out), "--workers", "1",
                             "-q"], env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = out / "weight_decay=0.5__seed=999.h5"
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            try:
                if first.exists() and len(Trajectory(first).steps) >= 3:
                    break
            except BadInput:
                pass  # the file is being created
            time.sleep(0.05)
        else:
            pytest.fail("the sweep never committed 3 checkpoints")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.time() + 30  # the worker's exit (and its writer lock) trails the coordinator's
    while Trajectory(first).is_live and time.time() < deadline:
        time.sleep(0.05)
    n_before = len(Trajectory(first).steps)
    assert run_state(out, first.name[:-3])[0] == "interrupted"
    assert Trajectory(first).status == "running"  # the writer died without closing
    again = subprocess.Popen([sys.executable, "-m", "groklens", "sweep", str(path), "-o", str(out), "--workers", "1",
                              "-q"], env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = again.communicate(timeout=300)
    finally:
        if again.poll() is None:  # never leave the pool's workers behind
            os.killpg(again.pid, signal.SIGKILL)
            again.wait()
    assert again.returncode == 0, err
    assert sweep_status(out)["counts"]["done"] == 2
    cfg = Trajectory(first).config
    ref = single(tmp_path, cfg, "first")
    assert_same_trajectory(first, ref)
    assert len(Trajectory(first).steps) == 13 > n_before


# ---------------------------------------------------------------------- Ray and SLURM
@pytest.mark.slow
def test_ray_executor_on_a_local_ray_instance(tmp_path):
    ray = pytest.importorskip("ray")
    sw = parse_sweep({"base": {**BASE, "steps": 40}, "axes": {"lr": [1e-3, 3e-3, 1e30]}})
    out = tmp_path / "sweep"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        report = run_sweep(sw, out, executor="ray", progress=False)
    finally:
        ray.shutdown()
    assert report.counts == {"total": 3, "done": 2, "running": 0, "failed": 1}
    assert "non-finite" in report.failed["lr=1e+30__seed=999"]
    r = sw.runs()[1]
    assert_same_trajectory(out / f"{r.name}.h5", single(tmp_path, r.config, r.name))


@pytest.mark.slow
def test_slurm_executor_through_submitit_local(tmp_path):
    pytest.importorskip("submitit")
    sw = parse_sweep({"base": {**BASE, "steps": 40}, "axes": {"weight_decay": [0.5, 1.0]}, "seeds": [0, 1]})
    out = tmp_path / "sweep"
    out.mkdir()
    executor = SlurmExecutor(out / ".submitit", workers=2, cluster="local", time_min=10, poll_s=0.2)
    report = run_sweep(sw, out, executor=executor, ensemble=True, progress=False)
    assert report.counts["done"] == 4 and report.ensembles == 2
    assert list((out / ".submitit").glob("*_result.pkl"))  # submitit really ran the jobs
    r = sw.runs()[0]
    assert_same_trajectory(out / f"{r.name}.h5", single(tmp_path, r.config, r.name))
    np.testing.assert_equal(sweep_status(out)["counts"]["done"], 4)


# ---------------------------------------------------------------------- refused before anything is written
def _free_loopback_port() -> int:
    import socket

    with socket.socket() as s:  # bound and closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, message", [
    # ray.init retried a silent address with no answer in 150 s
    (["--executor", "ray", "--address", "127.0.0.1:{port}"], "nothing answers at 127.0.0.1:{port} within 10 s"),
    (["--executor", "ray", "--address", "127.0.0.1"], "--address must be HOST:PORT"),
    (["--executor", "ray", "--gpus-per-run", "nan"], "--gpus-per-run must be a number from 0 to 64"),
    (["--executor", "slurm", "--gpus-per-run", "-1"], "--gpus-per-run must be a number from 0 to 64"),
    # submitit ran the job, which failed after 33 s
    (["--executor", "slurm", "--submitit-cluster", "local", "--time-min", "-1"], "--time-min must be a whole number"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_executor_options_are_refused_at_once_and_nothing_is_written(tmp_path, args, message, dry_run):
    pytest.importorskip("ray" if "ray" in args else "submitit")
    port = _free_loopback_port()
    args, message = [a.format(port=port) for a in args], message.format(port=port)
    g = grid(tmp_path, {"base": {**BASE, "steps": 20, "eval_every": 10, "checkpoint_every": 10}})
    out = tmp_path / "sweep"
    proc = groklens("sweep", str(g), "-o", str(out), "-q", *args, *(["--dry-run"] if dry_run else []), timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-500:]
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("executor, package", [("ray", "ray"), ("slurm", "submitit")])
def test_a_missing_executor_package_is_refused_before_sweep_json(tmp_path, executor, package):
    """With Ray missing, sweep.json was written before the refusal."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / f"{package}.py").write_text(f"raise ImportError('no {package} here')\n")
    g = grid(tmp_path, {"base": {**BASE, "steps": 20, "eval_every": 10, "checkpoint_every": 10}})
    out = tmp_path / "sweep"
    proc = groklens("sweep", str(g), "-o", str(out), "-q", "--executor", executor, timeout=60,
                    env={"PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 2 and f"needs {'Ray' if package == 'ray' else 'submitit'}" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.timeout(20)
def test_a_ray_address_that_never_answers_times_out():
    """A head whose accept queue is full drops the SYN: the connect waits, bounded by the timeout
    (ray.init itself retried for minutes). Loopback only: a listener of backlog 0, filled."""
    import socket
    import time

    from groklens.sweeps.executors import check_ray_address

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        for _ in range(4):  # fill the accept queue (its length is backlog + 1 on Linux)
            c = socket.socket()
            c.settimeout(0.3)
            try:
                c.connect(("127.0.0.1", port))
            except OSError:
                c.close()
                break
            fillers.append(c)
        else:
            pytest.skip("this kernel accepts every loopback connection: no silent address to try")
        try:
            start = time.perf_counter()
            with pytest.raises(BadInput, match=f"nothing answers at 127.0.0.1:{port} within 0.5 s"):
                check_ray_address(f"127.0.0.1:{port}", timeout_s=0.5)
            assert time.perf_counter() - start < 5
        finally:
            for c in fillers:
                c.close()
