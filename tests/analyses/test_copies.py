"""Analyses on any copy of a routed run (routing_copies > 1): Trajectory(copy=m), analyze --copy."""

import json

import h5py
import numpy as np
import pytest

from groklens.analyses.runner import compute
from groklens.checkpoints import Trajectory, sidecar_path
from groklens.trainers.train import train
from tests.helpers import groklens, tiny_config


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    path = tmp_path_factory.mktemp("copies") / "routed.h5"
    train(tiny_config(routing_copies=2, routing_width=float("inf"), steps=40, eval_every=10, checkpoint_every=20),
          path, progress=False)
    return path


def _norms_from_file(path, group, step_index):
    """Weight norm and distance from step 0 of one copy, straight from the HDF5 datasets."""
    with h5py.File(path, "r") as f:
        g = f[group]
        w = {n: g[n][step_index].astype(np.float64) for n in g}
        w0 = {n: g[n][0].astype(np.float64) for n in g}
    norm = np.sqrt(sum((a * a).sum() for a in w.values()))
    dist = np.sqrt(sum(((w[n] - w0[n]) ** 2).sum() for n in w))
    return norm, dist


def test_an_analysis_runs_on_copy_1_and_differs_from_copy_0(routed):
    r0 = compute(Trajectory(routed, copy=0), "norms")
    r1 = compute(Trajectory(routed, copy=1), "norms")
    assert r0.steps == r1.steps == [0, 20, 40]
    assert not np.allclose(r0["weight_norm"], r1["weight_norm"])
    metrics = Trajectory(routed).metrics
    for i, step in enumerate(r1.steps):
        norm, dist = _norms_from_file(routed, "copies/1", i)
        assert r1["weight_norm"][i] == pytest.approx(norm, rel=1e-9)
        assert r1["distance_from_init"][i] == pytest.approx(dist, rel=1e-9, abs=1e-12)
        row = int(np.nonzero(metrics["step"] == step)[0][0])
        assert r1["weight_norm"][i] == pytest.approx(metrics["copy1.weight_norm"][row], rel=1e-9)
        assert r0["weight_norm"][i] == pytest.approx(_norms_from_file(routed, "params", i)[0], rel=1e-9)
    # each copy's results live in its own sidecar; copy 0 keeps the plain one
    assert sidecar_path(routed).exists() and sidecar_path(routed, 1).exists()
    assert sidecar_path(routed, 1).name == "routed.copy1.analyses.h5"


def test_run_level_analysis_reads_the_copys_metrics(routed):
    metrics = Trajectory(routed).metrics
    res = compute(Trajectory(routed, copy=1), "grokking", thresholds=[0.1], store=False)
    acc = metrics["copy1.test_acc"]
    hits = np.nonzero(acc >= 0.1)[0]
    assert int(res["first_crossing"][0][0]) == (int(metrics["step"][hits[0]]) if len(hits) else -1)
    # grokked: the first of the run's grok_evals evaluations in a row at or above the threshold
    n = int(res["grok_evals"][0])
    assert n == Trajectory(routed).config.grok_evals
    sustained = [i for i in range(len(acc) - n + 1) if (acc[i:i + n] >= 0.1).all()]
    assert int(res["grokking_step"][0][0]) == (int(metrics["step"][sustained[0]]) if sustained else -1)


def test_cli_analyze_copy(routed):
    out = groklens("analyze", str(routed), "--copy", "1", "--metric", "norms", "--json", "-q", check=True)
    res = json.loads(out.stdout)
    alone = compute(Trajectory(routed, copy=1), "norms")["weight_norm"]
    assert res["norms"]["weight_norm"] == pytest.approx(list(alone))
    bad = groklens("analyze", str(routed), "--copy", "2", "--metric", "norms")
    assert bad.returncode == 2 and "no copy 2" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    info = groklens("info", str(routed), "--json", check=True)
    assert json.loads(info.stdout)["routing"]["copies"] == 2
