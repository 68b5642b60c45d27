"""Sweeps that race, and run names the file system cannot hold (issue 17)."""

import json
import os
import subprocess
import sys

from tests.helpers import groklens

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GRID = ("base: {p: 7, train_frac: 0.5, d_model: 8, n_heads: 1, d_head: 8, d_mlp: 16, steps: 20, eval_every: 10,\n"
        "       checkpoint_every: 10, device: cpu}\naxes: {lr: [0.001, 0.003]}\nseeds: [0, 1]\n")


def test_two_sweeps_at_once_never_record_a_finished_run_as_failed(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    out = tmp_path / "sw"
    procs = [subprocess.Popen([sys.executable, "-m", "groklens", "sweep", str(grid), "-o", str(out), "-q",
                               "--workers", "1"], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    status = json.loads(groklens("sweep", "--status", str(out), "--json", check=True).stdout)
    assert status["counts"]["done"] == 4 and status["counts"]["failed"] == 0, status
    assert not list(out.glob("*.error.json")) and not list(out.glob("*.tmp*")) and not list(out.glob(".*.tmp"))
    again = groklens("sweep", str(grid), "-o", str(out), "-q")  # a later sweep finds everything done
    assert again.returncode == 0 and "4 done" in again.stdout, again.stderr


def test_a_completed_run_wins_over_a_stale_error_file(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    out = tmp_path / "sw"
    groklens("sweep", str(grid), "-o", str(out), "-q", "--workers", "1", check=True)
    name = "lr=0.001__seed=0"
    (out / f"{name}.error.json").write_text(json.dumps({"run": name, "error": "File exists", "type": "OSError"}))
    status = json.loads(groklens("sweep", "--status", str(out), "--json", check=True).stdout)
    assert status["runs"][name]["state"] == "done" and status["counts"]["failed"] == 0
    again = groklens("sweep", str(grid), "-o", str(out), "-q")
    assert again.returncode == 0, again.stderr


def test_run_names_longer_than_the_file_system_allows_get_a_stable_hash(tmp_path):
    sites = ",".join(["blocks.0.hook_resid_post"] * 20)
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID.replace("axes: {lr: [0.001, 0.003]}\nseeds: [0, 1]",
                                 f"axes: {{act_norm_sites: ['{sites}']}}\nseeds: [0]").replace(
                    "device: cpu}", "device: cpu, act_norm_lambda: 0.1}"))
    out = tmp_path / "sw"
    first = groklens("sweep", str(grid), "-o", str(out), "--dry-run", "--json", check=True)
    (name,) = [r["name"] for r in json.loads(first.stdout)]
    assert len(name.encode()) <= 200 and "__h" in name
    assert json.loads(groklens("sweep", str(grid), "-o", str(out), "--dry-run", "--json").stdout)[0]["name"] == name
    run = groklens("sweep", str(grid), "-o", str(out), "-q")
    assert run.returncode == 0, run.stderr
    assert (out / f"{name}.h5").exists()
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["runs"][name]["act_norm_sites"] == sites  # the full value is kept
