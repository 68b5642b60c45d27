"""to_pandas: a run's metrics and stored analyses, and a comparison, as DataFrames; each checked
against the files read directly with h5py and against the CSV / JSON the CLI prints."""

from __future__ import annotations

import io
import json
import sys

import h5py
import numpy as np
import pytest

from groklens.analyses import compute, to_pandas
from groklens.analyses.compare import compare
from groklens.checkpoints import Trajectory, sidecar_path
from groklens.errors import BadInput
from tests.helpers import groklens, train_tiny

pd = pytest.importorskip("pandas")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    paths = [d / "a.h5", d / "b.h5"]
    train_tiny(paths[0], steps=200, lr=1e-2, norm="ln")
    train_tiny(paths[1], steps=200, lr=1e-2, norm="ln", seed=2)
    for p in paths:
        compute(Trajectory(p), "norms")
    return paths


def test_metrics_frame_is_the_files_metrics(runs):
    df = Trajectory(runs[0]).to_pandas()
    with h5py.File(runs[0], "r") as f:
        g = f["metrics"]
        assert list(df.columns) == ["step", *[k for k in g if k != "step"]]
        assert np.array_equal(df["step"].to_numpy(), g["step"][:])
        for k in g:
            assert np.array_equal(df[k].to_numpy(), g[k][:], equal_nan=True), k


def test_analysis_frame_is_the_sidecars_values_by_step(runs):
    df = to_pandas(Trajectory(runs[0]), "norms")
    with h5py.File(sidecar_path(runs[0]), "r") as f:
        (variant,) = f["analyses/norms"].values()
        assert df["step"].tolist() == [int(s) for s in variant["steps"][:]]
        scalars = [k for k in variant if k != "steps" and variant[k].ndim == 1]
        assert scalars
        for k in scalars:
            assert np.allclose(df[k].to_numpy(float), variant[k][:], equal_nan=True), k
    wide = to_pandas(Trajectory(runs[0]), "all")
    assert wide["step"].tolist() == df["step"].tolist() and f"norms.{scalars[0]}" in wide.columns
    with pytest.raises(BadInput, match="no stored 'fourier' analysis"):
        to_pandas(Trajectory(runs[0]), "fourier")


def test_a_stored_parameter_set_is_picked_by_its_parameters(runs):
    """Three fourier parameter sets stored side by side (the default key set per checkpoint, the
    last checkpoint's key set at every checkpoint, and one named frequency): params picks one, read
    back against the sidecar group whose stored parameters say so; no params reads the default set.
    The named single frequency differs from the default set whatever the tiny run learned, so the
    pick is told apart even where the default's key set never changes along the run."""
    run = Trajectory(runs[1])
    compute(run, "fourier", every=4)
    compute(run, "fourier", every=4, key_frequencies="last")
    with h5py.File(sidecar_path(runs[1]), "r") as f:
        (default_group,) = [g for g in f["analyses/fourier"].values()
                            if json.loads(g.attrs["params"])["key_frequencies"] is None]
        default_last = [int(k) for k in default_group["key_frequencies"][-1]]
    single = [1] if default_last != [1] else [2]
    compute(run, "fourier", every=4, key_frequencies=single)
    with h5py.File(sidecar_path(runs[1]), "r") as f:
        groups = {json.dumps(json.loads(g.attrs["params"])["key_frequencies"]): g
                  for g in f["analyses/fourier"].values()}
        # "last" is stored as the list it resolved to: the key set at the last checkpoint
        assert set(groups) == {"null", json.dumps(default_last), json.dumps(single)}
        want = {k: g["restricted_loss_all"][:] for k, g in groups.items()}
        steps = [int(s) for s in groups[json.dumps(default_last)]["steps"][:]]
    last = to_pandas(run, "fourier", {"key_frequencies": "last"})
    assert last["step"].tolist() == steps
    assert np.allclose(last["restricted_loss_all"].to_numpy(float), want[json.dumps(default_last)], equal_nan=True)
    named = to_pandas(run, "fourier", {"key_frequencies": single})
    assert np.allclose(named["restricted_loss_all"].to_numpy(float), want[json.dumps(single)], equal_nan=True)
    default = to_pandas(run, "fourier")
    assert np.allclose(default["restricted_loss_all"].to_numpy(float), want["null"], equal_nan=True)
    assert not np.allclose(want[json.dumps(single)], want["null"], equal_nan=True)  # the picks differ
    with pytest.raises(BadInput, match="no 'fourier' stored with cluster_threshold=0.5; stored parameter sets: "):
        to_pandas(run, "fourier", {"cluster_threshold": 0.5})
    with pytest.raises(BadInput, match="unknown parameter"):
        to_pandas(run, "fourier", {"key_frequency": "last"})
    with pytest.raises(BadInput, match="name the analysis"):
        to_pandas(run, "all", {"key_frequencies": "last"})


def test_comparison_frame_is_the_csv_table_and_the_json_table(runs):
    comp = compare(runs, baseline=runs[0])
    df = comp.to_pandas()
    csv = pd.read_csv(io.StringIO(comp.to_csv()))
    assert list(df.columns) == list(csv.columns) and len(df) == len(csv) == 2
    for col in ("memorization_step_mean", "grokking_step_mean", "gap_mean", "speedup"):
        assert np.allclose(pd.to_numeric(df[col]).to_numpy(float), csv[col].to_numpy(float), equal_nan=True), col
    data = json.loads(groklens("compare", *map(str, runs), "--baseline", str(runs[0]), "--format", "json",
                               check=True).stdout)
    table = pd.DataFrame(data["table"])
    assert list(table.columns) == list(csv.columns)
    assert table["memorization_step_mean"].tolist() == csv["memorization_step_mean"].tolist()
    # independently: memorization = first evaluation with train accuracy >= 0.95, from the file
    run = Trajectory(runs[0])
    first = int(run.metrics["step"][np.argmax(run.metrics["train_acc"] >= 0.95)])
    assert df["memorization_step_mean"][0] == first


def test_without_pandas_one_line_says_how_to_get_it(runs, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now raises ImportError
    with pytest.raises(ImportError,
                       match=r"^to_pandas needs pandas, an optional extra: pip install 'groklens\[pandas\]'$"):
        Trajectory(runs[0]).to_pandas()


def test_to_pandas_takes_a_path_as_compute_does(runs):
    """to_pandas("a.h5") was AttributeError: 'str' object has no attribute 'to_pandas'."""
    assert to_pandas(str(runs[0])).equals(Trajectory(runs[0]).to_pandas())
    assert to_pandas(runs[0], "norms").equals(to_pandas(Trajectory(runs[0]), "norms"))
    with pytest.raises(BadInput, match=r"Trajectory\(path\): a path"):
        to_pandas(None)
    with pytest.raises(BadInput, match="an analysis name or 'all'"):
        to_pandas(runs[0], 3)


@pytest.mark.parametrize("paths", [None, 3, "a.h5"])
def test_compare_of_a_non_list_is_refused(paths):
    """compare(None) was a TypeError, compare("a.h5") compared the runs '/', 'a', ... (ValueError)."""
    with pytest.raises(BadInput, match=r"compare\(paths\): a list of RUN.h5 paths"):
        compare(paths)


def test_compare_of_a_list_holding_a_non_path_is_refused(runs):
    with pytest.raises(BadInput, match="a run is a path"):
        compare([runs[0], None])
    with pytest.raises(BadInput, match="a run is a path"):
        compare([runs[0]], baseline=1)
