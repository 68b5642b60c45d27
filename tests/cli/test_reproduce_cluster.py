"""`reproduce --executor ray|slurm`: the runs train on a cluster (here submitit's local backend),
then are analyzed and recorded here, with the same ledger and rows as on this machine."""

from __future__ import annotations

import json

import pytest

from tests.helpers import groklens


@pytest.mark.slow
def test_reproduce_trains_through_submitit_and_records_what_a_local_run_records(tmp_path):
    pytest.importorskip("submitit")
    local, cluster = tmp_path / "local", tmp_path / "cluster"
    groklens("reproduce", "demo", "--scale", "smoke", "-o", str(local), "-q", check=True)
    groklens("reproduce", "demo", "--scale", "smoke", "-o", str(cluster), "-q", "--executor", "slurm",
             "--submitit-cluster", "local", check=True)
    assert list((cluster / "runs" / ".submitit").glob("*_result.pkl"))  # submitit ran the training jobs
    assert not (local / "runs" / ".submitit").exists()
    ours, theirs = (json.loads((d / "ledger" / "demo.smoke.json").read_text())["runs"] for d in (cluster, local))
    assert [e["run"] for e in ours] == [e["run"] for e in theirs] and len(ours) == 8
    for a, b in zip(ours, theirs):
        assert a["config_hash"] == b["config_hash"]
        assert a["last_step"] == b["last_step"]
        for key, value in b["final"].items():
            assert a["final"][key] == pytest.approx(value, rel=1e-6, abs=1e-9), (a["run"], key)
    rows = [json.loads((d / "results.json").read_text())["rows"] for d in (cluster, local)]
    assert rows[0] == rows[1]


@pytest.mark.parametrize("args, message", [
    (["--executor", "slurm", "--no-train"], "--executor slurm trains runs; --no-train trains none"),
    (["--executor", "slurm", "--slurm-option", "mem"], "--slurm-option wants KEY=VALUE; got 'mem'"),
    (["--executor", "slurm", "--time-min", "0"], "--time-min must be a whole number"),
    (["--executor", "ray", "--address", "127.0.0.1"], "--address must be HOST:PORT"),
    (["--executor", "local", "--address", "127.0.0.1:6379"], "--address is for the ray executor"),
])
def test_cluster_options_are_refused_before_anything_is_written(tmp_path, args, message):
    pytest.importorskip("ray" if "ray" in args else "submitit")
    out = tmp_path / "out"
    proc = groklens("reproduce", "demo", "--scale", "smoke", "-o", str(out), "-q", *args, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_list_takes_no_executor():
    proc = groklens("reproduce", "--list", "--executor", "slurm")
    assert proc.returncode == 2 and "--list takes no experiment NAME, no --arms and no --executor" in proc.stderr
