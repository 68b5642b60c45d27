"""Property-based (hypothesis): crafted run files, ledgers and sweep manifests are refused with
exit 2 and one line, and nothing is written (issue 29). Each generated case is invalid by
construction; the commands run in this process (groklens.cli.main), as a user would call them."""

import contextlib
import io
import json
import os
import shutil

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.helpers import train_interrupted, tiny_config

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _main(args):
    """(exit status, stderr) of `groklens ARGS` run in this process."""
    from groklens.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue().strip()


def _snapshot(root):
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def _refused_everywhere(root, commands):
    before = _snapshot(root)
    for args in commands:
        code, err = _main(args)
        assert code == 2, (args, code, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert _snapshot(root) == before, args


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("prop") / "good.h5"
    train_interrupted(tiny_config(), path, at_step=30)
    return path


# ---------------------------------------------------------------------- run files
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                           max_leaves=8)
not_an_int = st.one_of(st.text(max_size=5), st.floats(allow_nan=False), st.booleans(),
                       st.lists(st.integers(0, 3), min_size=1, max_size=3).map(np.array))
PARAM = "params/embed.W_E"
REQUIRED = ["steps", "params", "metrics", "data", "state", "status", "data/inputs", "data/labels", "data/train_idx",
            "metrics/step", "state/step"]


def _set_attr(name, value):
    return lambda f: f.attrs.__setitem__(name, value)


def _config(value):
    def edit(f):
        text = json.dumps(value)
        assume(text != f.attrs["config"])  # any other text: not the config the checksum was taken of
        f.attrs["config"] = text
    return edit


def _replace(name, data):
    def edit(f):
        if name in f:
            del f[name]
        f[name] = data
    return edit


def _unordered_steps(values):
    return _replace("steps", np.array(values, dtype=np.int64))


def _bad_index(values):
    return _replace("data/train_idx", np.array(values, dtype=np.int64))


def _link(kind, target):
    def edit(f):
        del f[PARAM]
        f[PARAM] = h5py.ExternalLink("elsewhere.h5", target) if kind == "external" else h5py.SoftLink(target)
    return edit


def _delete(name):
    def edit(f):
        assume(name in f)
        del f[name]
    return edit


def _vocab(value):
    def edit(f):
        assume(value != f["data"].attrs["d_vocab"])
        f["data"].attrs["d_vocab"] = value
    return edit


EDITS = st.one_of(
    not_an_int.map(lambda v: _set_attr("format_version", v)),
    json_values.map(_config),
    st.lists(st.integers(-3, 50), min_size=2, max_size=5).filter(
        lambda v: v[0] < 0 or any(b <= a for a, b in zip(v, v[1:]))).map(_unordered_steps),
    st.lists(st.integers(-5, 10**6), min_size=2, max_size=80).filter(
        lambda v: len(set(v)) < len(v) or min(v) < 0 or max(v) >= 121).map(_bad_index),
    st.tuples(st.sampled_from(["external", "soft"]), st.sampled_from(["/params/unembed.W_U", "/x"])).map(
        lambda t: _link(*t)),
    st.sampled_from(REQUIRED).map(_delete),
    st.one_of(st.integers(0, 2**62), not_an_int).map(_vocab),
    st.sampled_from([np.array([1, 2]), np.array([b"a", b"b"], dtype="S512"), np.zeros((1, 1)), np.float64(1)]).map(
        lambda v: _replace("status", v)),
    st.sampled_from(["f8", "i4", "f2"]).map(lambda t: lambda f: _replace(PARAM, f[PARAM][:].astype(t))(f)),
)


@SETTINGS
@given(edits=st.lists(EDITS, min_size=1, max_size=3))
def test_crafted_run_files_are_refused_and_left_alone(good, tmp_path_factory, edits):
    root = tmp_path_factory.mktemp("c")
    path = root / "x.h5"
    shutil.copy(good, path)
    applied = 0
    with h5py.File(path, "r+") as f:
        for edit in edits:
            try:
                edit(f)
                applied += 1
            except (KeyError, ValueError, TypeError, OSError, RuntimeError):
                pass  # an edit of what an earlier edit removed
    assume(applied)
    p = str(path)
    _refused_everywhere(root, [["info", p], ["analyze", p, "--metric", "norms", "-q"], ["train", "-q", "--resume", p]])


# ---------------------------------------------------------------------- ledgers
@pytest.fixture(scope="module")
def entry(good):
    from groklens.experiments.ledger import summarize_run

    return json.loads(json.dumps(summarize_run(good, "bounded-sphere", "standard", 1, [])))


WRONG = {"arm": st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=2), max_size=2)),
         "seed": st.one_of(st.text(max_size=3), st.floats(), st.booleans(), st.none()),
         "config_hash": st.one_of(st.integers(), st.none()), "config": st.one_of(st.text(max_size=3), st.integers()),
         "grokking_step": st.one_of(st.integers(), st.text(max_size=2)),
         "last_step": st.one_of(st.text(max_size=2), st.none()),
         "measures": st.one_of(st.lists(st.integers(), max_size=2), st.integers(), st.text(max_size=3))}


@st.composite
def bad_ledgers(draw, entry):
    kind = draw(st.sampled_from(["wrong-type", "missing", "duplicate", "random", "deep", "not-a-list"]))
    runs = [dict(entry)]
    if kind == "wrong-type":
        key = draw(st.sampled_from(sorted(WRONG)))
        runs[0][key] = draw(WRONG[key])
    elif kind == "missing":
        key = draw(st.sampled_from(["arm", "seed", "run", "config_hash", "arm_hash", "config", "memorization_step",
                                    "grokking_step", "last_step"]))
        del runs[0][key]
    elif kind == "duplicate":
        runs.append(dict(entry))
    elif kind == "random":
        doc = draw(json_values)
        assume(not (isinstance(doc, dict) and doc.get("format") == 1))
        return json.dumps(doc)
    elif kind == "deep":
        return "[" * draw(st.integers(40, 40_000)) + "]" * 5
    else:
        runs = draw(json_values.filter(lambda v: not isinstance(v, list)))
    return json.dumps({"format": 1, "experiment": "bounded-sphere", "scale": "smoke", "runs": runs})


@SETTINGS
@given(data=st.data())
def test_crafted_ledgers_are_refused_and_left_alone(entry, tmp_path_factory, data):
    root = tmp_path_factory.mktemp("l")
    (root / "ledger").mkdir()
    (root / "ledger" / "bounded-sphere.smoke.json").write_text(data.draw(bad_ledgers(entry)))
    _refused_everywhere(root, [["reproduce", "bounded-sphere", "--scale", "smoke", "-o", str(root / "out"),
                                "--no-train", "--ledger", str(root / "ledger"), "-q"]])


# ---------------------------------------------------------------------- sweep manifests
bad_names = st.one_of(st.sampled_from(["", ".", "..", "../x", "a/b", ".hidden", "/abs", "a\nb"]),
                      st.text(min_size=201, max_size=210))


def _valid_manifest(doc) -> bool:
    return (isinstance(doc, dict) and doc.get("format", "groklens-sweep") == "groklens-sweep"
            and isinstance(doc.get("runs"), dict))


@st.composite
def bad_manifests(draw):
    kind = draw(st.sampled_from(["random", "bad-name", "bad-config", "format", "deep"]))
    if kind == "random":
        doc = draw(json_values)
        assume(not _valid_manifest(doc))
    elif kind == "bad-name":
        doc = {"format": "groklens-sweep", "runs": {draw(bad_names): {}}}
    elif kind == "bad-config":
        doc = {"format": "groklens-sweep", "runs": {"a": draw(json_values.filter(lambda v: not isinstance(v, dict)))}}
    elif kind == "format":
        doc = {"format": draw(json_values.filter(lambda v: v != "groklens-sweep")), "runs": {}}
    else:
        return "{" * draw(st.integers(40, 40_000))
    return json.dumps(doc)


@SETTINGS
@given(manifest=bad_manifests())
def test_crafted_manifests_are_refused_and_left_alone(tmp_path_factory, manifest):
    root = tmp_path_factory.mktemp("m")
    (root / "sw").mkdir()
    (root / "sw" / "sweep.json").write_text(manifest)
    os.makedirs(root / "base", exist_ok=True)
    _refused_everywhere(root, [["sweep", "--status", str(root / "sw")]])
