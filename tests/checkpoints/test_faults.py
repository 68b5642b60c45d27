"""Disk faults and files that try to run code."""

import json
import os
import pickle
import resource
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import config_flags, groklens, tiny_config, train_tiny

FAULT_CFG = dict(steps=400, checkpoint_every=5, eval_every=5, p=13)


def _limit_file_size(nbytes):
    def setup():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write returns EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return setup


def _train_limited(path, nbytes, preflight=True):
    patch = ("" if preflight
             else "from groklens.checkpoints.writer import TrajectoryWriter as W; W._check_room = lambda *a: None; ")
    code = f"import sys; {patch}from groklens.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, "train", "-q", "--out", str(path),
                           *config_flags(tiny_config(**FAULT_CFG))],
                          preexec_fn=_limit_file_size(nbytes), capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.h5"
    train_tiny(path, **FAULT_CFG)
    return Trajectory(path)


def _assert_prefix_and_resume(path, reference):
    run = Trajectory(path)
    n = len(run.steps)
    assert n >= 2 and list(run.steps) == list(reference.steps[:n])
    assert np.array_equal(run.param_trajectory("embed.W_E"), reference.param_trajectory("embed.W_E")[:n])
    out = groklens("train", "-q", "--resume", str(path))
    assert out.returncode == 0, out.stderr
    assert np.array_equal(Trajectory(path).param_trajectory("unembed.W_U"), reference.param_trajectory("unembed.W_U"))


def test_file_size_limit_stops_cleanly_with_a_clear_error(tmp_path, reference):
    path = tmp_path / "full.h5"
    out = _train_limited(path, 400_000)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]  # one line
    assert "not enough room on the file-size limit" in out.stderr and "--resume" in out.stderr
    assert Trajectory(path).status.startswith("stopped: not enough room")
    with h5py.File(path, "r"):  # closed cleanly: an ordinary HDF5 open works
        pass
    _assert_prefix_and_resume(path, reference)


def test_a_write_that_fails_inside_hdf5_leaves_every_commit_readable(tmp_path, reference):
    # without the preflight check the write itself fails (EFBIG) half-way through HDF5
    path = tmp_path / "efbig.h5"
    out = _train_limited(path, 300_000, preflight=False)
    assert out.returncode != 0
    info = json.loads(groklens("info", str(path), "--json", check=True).stdout)
    assert info["n_checkpoints"] >= 2 and "interrupted" in info["status"]
    _assert_prefix_and_resume(path, reference)


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_payload_in_a_trajectory_is_never_run(tmp_path):
    good = tmp_path / "good.h5"
    train_tiny(good)
    marker = tmp_path / "PWNED"
    payload = _Payload()
    payload.marker = marker
    blob = pickle.dumps(payload)
    for where in ("config", "param"):
        bad = tmp_path / f"bad-{where}.h5"
        bad.write_bytes(good.read_bytes())
        with h5py.File(bad, "r+") as f:
            if where == "config":
                f.attrs["config"] = np.void(blob)
            else:
                del f["params/embed.W_E"]
                f["params/embed.W_E"] = np.frombuffer(blob, dtype=np.uint8)
        for args in (["info", str(bad)], ["info", str(bad), "--json"], ["train", "--resume", str(bad)]):
            out = groklens(*args)
            assert out.returncode == 2, (args, out.stderr)
            assert "Traceback" not in out.stderr
        with pytest.raises(BadInput):
            run = Trajectory(bad)
            assert run.config is not None
            run.model(0)
    assert not marker.exists()


def test_yaml_config_cannot_run_code(tmp_path):
    marker = tmp_path / "PWNED"
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(f"p: !!python/object/apply:os.system ['touch {marker}']\n")
    out = groklens("train", "--config", str(cfg), "--out", str(tmp_path / "r.h5"))
    assert out.returncode == 2 and "not valid YAML" in out.stderr
    assert not marker.exists() and not (tmp_path / "r.h5").exists()


def test_no_pickle_or_unsafe_loads_in_the_package():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    pattern = re.compile(r"pickle\.loads?\(|torch\.load\(|yaml\.load\(|yaml\.unsafe_load|dill\.")
    offenders = []
    for folder in ("groklens", "trainers", "checkpoints", "probes", "analyses"):
        for py in (root / folder).rglob("*.py"):
            for i, line in enumerate(py.read_text().splitlines(), 1):
                if pattern.search(line) and "weights_only=True" not in line:
                    offenders.append(f"{py.relative_to(root)}:{i}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("case", ["create", "sidecar", "train-preflight-off"])
def test_every_writer_stops_with_one_line_on_a_full_disk(tmp_path, case):
    """Issue 17: no segfault, no h5py traceback, no temporary file; the message names the cause."""
    run = tmp_path / "r.h5"
    if case == "sidecar":
        train_tiny(run)
    before = {p.name for p in tmp_path.iterdir()}
    code = "import sys; from groklens.cli import main; main(sys.argv[1:])"
    if case == "train-preflight-off":
        code = ("from groklens.checkpoints.writer import TrajectoryWriter as W; W._check_room = lambda *a: None; "
                + code)
    args = {"create": ["train", "-q", "--out", str(run), *config_flags(tiny_config(**FAULT_CFG))],
            "train-preflight-off": ["train", "-q", "--out", str(run), *config_flags(tiny_config(**FAULT_CFG))],
            "sidecar": ["analyze", str(run), "--metric", "norms", "-q"]}[case]
    limit = {"create": 20_000, "sidecar": 3_000, "train-preflight-off": 300_000}[case]
    out = subprocess.run([sys.executable, "-c", code, *args], preexec_fn=_limit_file_size(limit),
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert out.returncode == 1, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "KiB" in out.stderr or "no room" in out.stderr, out.stderr
    after = {p.name for p in tmp_path.iterdir()}
    assert after - before <= ({"r.h5"} if case == "train-preflight-off" else set())  # nothing stray
