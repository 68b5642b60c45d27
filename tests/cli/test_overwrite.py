"""Overwrites that cannot lose a run (issue 17, data loss): `train --force` keeps the old run
until the new one has committed a checkpoint, refuses a live run, and no command writes over
one of its own inputs, through a symlink, or into another run's sidecar."""

import os
import signal
import subprocess
import sys
import time

import h5py
import pytest

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import config_flags, groklens, tiny_config, train_tiny


def _snapshot(root):
    return {p: (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.fixture()
def old_run(tmp_path):
    """A finished run with an analysis sidecar: what --force must not lose."""
    run = tmp_path / "run.h5"
    train_tiny(run)
    groklens("analyze", str(run), "--metric", "norms", "-q", check=True)
    assert (tmp_path / "run.analyses.h5").exists()
    return run


FLAGS = config_flags(tiny_config())


@pytest.mark.parametrize("extra,needle", [
    (["--act-norm-lambda", "1", "--act-norm-sites", "nope"], "nope"),
    (["--d-model", "100000000"], "memory"),
    (["--seed", "-1"], "seed"),
    (["--log-checkpoints", "1000000000"], "log_checkpoints"),
    (["--steps", str(10**12)], "memory"),
])
def test_force_that_fails_validation_keeps_the_old_run(old_run, extra, needle):
    before = _snapshot(old_run.parent)
    out = groklens("train", "-q", "--force", "--out", str(old_run), *FLAGS, *extra)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr
    assert _snapshot(old_run.parent) == before  # old run and its sidecar untouched, nothing new


def test_force_that_fails_before_its_first_checkpoint_keeps_the_old_run(old_run):
    # the new run cannot be written at all (file-size limit): the old run stays, no staging file
    before = _snapshot(old_run.parent)
    code = "import sys; from groklens.cli import main; main(sys.argv[1:])"
    out = subprocess.run([sys.executable, "-c", code, "train", "-q", "--force", "--out", str(old_run), *FLAGS],
                         preexec_fn=_fsize_limit(30_000), capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert out.returncode == 1, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    assert _snapshot(old_run.parent) == before


def test_force_replaces_the_run_and_its_sidecar_once_it_has_committed(old_run):
    out = groklens("train", "-q", "--force", "--out", str(old_run), *FLAGS, "--seed", "5")
    assert out.returncode == 0, out.stderr
    assert Trajectory(old_run).config.seed == 5 and Trajectory(old_run).status == "completed"
    assert sorted(p.name for p in old_run.parent.iterdir()) == ["run.h5"]  # stale sidecar dropped, no temp


def test_force_over_a_live_run_is_refused_naming_its_pid(tmp_path):
    run = tmp_path / "live.h5"
    slow = config_flags(tiny_config(steps=200_000, checkpoint_every=1000, eval_every=1000))
    proc = subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--out", str(run), *slow],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not _live_with_a_checkpoint(run):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        out = groklens("train", "-q", "--force", "--out", str(run), *FLAGS)
        assert out.returncode == 2, out.stderr
        assert f"pid {proc.pid}" in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert proc.poll() is None and Trajectory(run).is_live  # the live run goes on, in its file
        assert Trajectory(run).config.steps == 200_000
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_ctrl_c_exits_130(tmp_path):
    run = tmp_path / "int.h5"
    slow = config_flags(tiny_config(steps=200_000, checkpoint_every=1000, eval_every=1000))
    proc = subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--out", str(run), *slow],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 300
        while not _live_with_a_checkpoint(run):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("groklens: interrupted") and "Traceback" not in err
    assert Trajectory(run).status == "stopped: interrupted"


def _live_with_a_checkpoint(run):
    try:
        return Trajectory(run).is_live and len(Trajectory(run).steps) > 0
    except BadInput:  # not created yet
        return False


def test_resume_with_force_is_refused(old_run):
    out = groklens("train", "--resume", str(old_run), "--force")
    assert out.returncode == 2 and "--force" in out.stderr


def test_sidecars_of_runs_a_and_a_h5_do_not_collide(tmp_path):
    a, a_h5 = tmp_path / "a", tmp_path / "a.h5"
    train_tiny(a_h5)
    a.write_bytes(a_h5.read_bytes())
    groklens("analyze", str(a_h5), "--metric", "norms", "-q", check=True)
    first = _snapshot(tmp_path)
    groklens("analyze", str(a), "--metric", "norms", "-q", check=True)
    after = _snapshot(tmp_path)
    assert {p: v for p, v in after.items() if p in first} == first  # a.h5's results untouched
    sidecars = [p for p in after if p.name.endswith(".analyses.h5")]
    assert len(sidecars) == 2


def test_train_force_never_deletes_a_run_named_like_a_sidecar(tmp_path):
    # run.analyses.h5 is a *run* here; --force over run.h5 must not take it for run.h5's sidecar
    run, other = tmp_path / "run.h5", tmp_path / "run.analyses.h5"
    train_tiny(run)
    train_tiny(other)
    before = other.read_bytes()
    groklens("train", "-q", "--force", "--out", str(run), *FLAGS, check=True)
    assert other.read_bytes() == before


def test_report_never_writes_over_its_own_input(tmp_path):
    out_dir = tmp_path / "rep"
    out_dir.mkdir()
    run = out_dir / "comparison.json"
    train_tiny(run)
    before = _snapshot(tmp_path)
    out = groklens("report", str(run), "-o", str(out_dir), "-q")
    assert out.returncode == 2 and "comparison.json" in out.stderr, out.stderr
    assert _snapshot(tmp_path) == before


def test_report_does_not_write_through_a_symlink(tmp_path):
    run = tmp_path / "r.h5"
    train_tiny(run)
    out_dir = tmp_path / "rep"
    out_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (out_dir / "index.html").symlink_to(victim)
    out = groklens("report", str(run), "-o", str(out_dir), "-q")
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "keep me\n"
    assert not (out_dir / "index.html").is_symlink() and "<html" in (out_dir / "index.html").read_text()


def _fsize_limit(nbytes):
    def setup():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return setup


def test_sidecar_of_another_run_is_refused_not_replaced(tmp_path):
    run = tmp_path / "x.h5"
    train_tiny(run)
    groklens("analyze", str(run), "--metric", "norms", "-q", check=True)
    with h5py.File(tmp_path / "x.analyses.h5", "r+") as f:
        f.attrs["run"] = "someone-else.h5"
    before = _snapshot(tmp_path)
    out = groklens("analyze", str(run), "--metric", "norms", "-q", "--recompute")
    assert out.returncode == 2 and "someone-else.h5" in out.stderr, out.stderr
    assert _snapshot(tmp_path) == before


def test_report_into_a_full_disk_leaves_nothing_half_written(tmp_path):
    run = tmp_path / "r.h5"
    train_tiny(run)
    old = tmp_path / "old"
    groklens("report", str(run), "-o", str(old), "-q", check=True)
    code = "import sys; from groklens.cli import main; main(sys.argv[1:])"
    for out_dir in (tmp_path / "new", old):  # a new directory, and one holding a previous report
        before = _snapshot(tmp_path)
        out = subprocess.run([sys.executable, "-c", code, "report", str(run), "-o", str(out_dir), "-q"],
                             preexec_fn=_fsize_limit(8_000), capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
        assert out.returncode == 1, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
        assert _snapshot(tmp_path) == before  # no directory, no temporary files, the old report intact
