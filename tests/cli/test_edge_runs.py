"""Runs at the edges (issue 17): a diverged run, a run with only its step-0 evaluation."""

import json

import h5py
import numpy as np

from tests.helpers import groklens, tiny_config, train_interrupted, train_tiny


def test_info_on_a_diverged_run(tmp_path):
    run = tmp_path / "div.h5"
    train_tiny(run)
    with h5py.File(run, "r+") as f:  # the last evaluation of a run whose loss blew up
        for name in ("train_loss", "test_loss", "train_acc", "test_acc"):
            f[f"metrics/{name}"][-1] = np.nan
    out = groklens("info", str(run))
    assert out.returncode == 0, out.stderr
    assert "non-finite" in out.stdout
    info = json.loads(groklens("info", str(run), "--json", check=True).stdout)
    assert info["last"]["test_acc"] is None and info["valid"] is True


def test_report_of_a_run_with_only_its_step_0_evaluation(tmp_path):
    run = tmp_path / "young.h5"
    train_interrupted(tiny_config(), run, at_step=1)
    out = groklens("report", str(run), "-o", str(tmp_path / "rep"), "-q")
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr and "missing" in out.stdout
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [
        "comparison.csv", "comparison.json", "explorer.html", "index.html"]
