"""Races and damaged files (issue 17): concurrent resumes, truncated killed runs, concurrent sweeps."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import config_flags, groklens, tiny_config

KILL_CFG = dict(steps=400, checkpoint_every=10, eval_every=5, p=13)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _killed_run(path, checkpoints=8):
    """A `groklens train` process SIGKILLed after `checkpoints` commits (its file needs recovery)."""
    proc = subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--out", str(path),
                             *config_flags(tiny_config(**KILL_CFG))], env=ENV, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while True:
        try:
            if len(Trajectory(path).steps) >= checkpoints:
                break
        except BadInput:
            pass
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return path


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    return _killed_run(tmp_path_factory.mktemp("killed") / "k.h5")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.h5"
    groklens("train", "-q", "--out", str(path), *config_flags(tiny_config(**KILL_CFG)), check=True)
    return Trajectory(path)


def test_two_resumes_at_once_never_collide(tmp_path, killed, reference):
    path = tmp_path / "k.h5"
    path.write_bytes(killed.read_bytes())
    procs = [subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--resume", str(path)], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert 0 in codes and set(codes) <= {0, 2}, (codes, outs)
    for (_stdout, stderr), code in zip(outs, codes):
        assert "Traceback" not in stderr and "FileNotFoundError" not in stderr, stderr
        if code == 2:  # refused with one line naming the other process
            assert len(stderr.strip().splitlines()) == 1 and "live process" in stderr, stderr
    run = Trajectory(path)
    assert run.status == "completed" and list(run.steps) == list(reference.steps)
    assert np.array_equal(run.param_trajectory("unembed.W_U"), reference.param_trajectory("unembed.W_U"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.h5"]  # no temporary file left


@pytest.mark.parametrize("share", [0.3, 0.5, 0.7, 0.95])
def test_a_truncated_killed_run_is_refused_never_read_as_zeros(tmp_path, killed, share):
    blob = killed.read_bytes()
    path = tmp_path / "t.h5"
    path.write_bytes(blob[: int(len(blob) * share)])
    before = path.read_bytes()
    for args in (["info", str(path), "--json"], ["train", "-q", "--resume", str(path)],
                 ["analyze", str(path), "--metric", "norms", "-q"]):
        out = groklens(*args, timeout=60)  # never hangs
        assert out.returncode == 2, (args, out.returncode, out.stdout[-300:], out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
        assert "truncated" in out.stderr or "damaged" in out.stderr, out.stderr
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["t.h5"]


def test_recovery_without_room_leaves_the_file_and_no_temporary(tmp_path, killed):
    path = tmp_path / "k.h5"
    path.write_bytes(killed.read_bytes())
    before = path.read_bytes()
    code = "import sys; from groklens.cli import main; main(sys.argv[1:])"

    def limit():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) // 2, len(before) // 2))

    out = subprocess.run([sys.executable, "-c", code, "train", "-q", "--resume", str(path)], preexec_fn=limit,
                         capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 1, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "full copy" in out.stderr and "KiB" in out.stderr
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["k.h5"]


def test_info_json_reports_a_killed_run_as_valid(killed):
    info = json.loads(groklens("info", str(killed), "--json", check=True).stdout)
    assert info["valid"] is True and info["problems"] == [] and info["n_checkpoints"] >= 8
