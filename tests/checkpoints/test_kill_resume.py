"""Real `groklens train` processes, killed with SIGKILL at random moments, then resumed."""

import json
import os
import random
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


def _start(path, cfg):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--out", str(path), *config_flags(cfg)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _committed(path):
    try:
        return len(Trajectory(path).steps)
    except BadInput:  # not created yet
        return 0


def _kill_when(proc, path, min_checkpoints, extra_delay):
    deadline = time.time() + 120
    while _committed(path) < min_checkpoints:
        assert proc.poll() is None, f"trainer ended before the kill: {proc.stderr.read().decode()}"
        assert time.time() < deadline
        time.sleep(0.01)
    time.sleep(extra_delay)
    seen = _committed(path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return seen


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("ref") / "ref.h5"
    groklens("train", "-q", "--out", str(path), *config_flags(tiny_config(**KILL_CFG)), check=True)
    return Trajectory(path)


def _assert_identical(run: Trajectory, ref: Trajectory):
    assert list(run.steps) == list(ref.steps)
    for name in ref.param_names:
        assert np.array_equal(run.param_trajectory(name), ref.param_trajectory(name)), name
    for key, values in ref.metrics.items():
        assert np.array_equal(run.metrics[key], values, equal_nan=True), key
    assert run.status == "completed"


def _kill_and_resume(tmp_path, reference, rng, name, kills=1):
    path = tmp_path / name
    cfg = tiny_config(**KILL_CFG)
    proc = _start(path, cfg)
    seen = _kill_when(proc, path, rng.randint(1, 30), rng.uniform(0, 0.05))
    for _ in range(kills - 1):  # kill the resumed process too, mid-run
        info = json.loads(groklens("info", str(path), "--json", check=True).stdout)
        assert info["n_checkpoints"] >= seen and "interrupted" in info["status"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--resume", str(path)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        seen = _kill_when(proc, path, min(seen + rng.randint(1, 5), 40), rng.uniform(0, 0.05))
    run = Trajectory(path)  # a killed writer's file opens and holds every committed checkpoint
    assert len(run.steps) >= seen
    assert list(run.steps) == list(reference.steps[: len(run.steps)])
    for name in reference.param_names[:3]:
        assert np.array_equal(run.param_trajectory(name), reference.param_trajectory(name)[: len(run.steps)])
    out = groklens("train", "-q", "--resume", str(path))
    assert out.returncode == 0, out.stderr
    _assert_identical(Trajectory(path), reference)
    return seen


def test_sigkill_then_resume_is_bit_identical(tmp_path, reference):
    rng = random.Random(1)
    _kill_and_resume(tmp_path, reference, rng, "k1.h5")


def test_two_kills_then_resume_is_bit_identical(tmp_path, reference):
    rng = random.Random(2)
    _kill_and_resume(tmp_path, reference, rng, "k2.h5", kills=2)


@pytest.mark.slow
def test_many_random_kills(tmp_path, reference):
    rng = random.Random(3)
    survived = 0
    trials = 4  # one kill and two kills, twice each, at random steps
    for i in range(trials):
        _kill_and_resume(tmp_path, reference, rng, f"many{i}.h5", kills=1 + i % 2)
        survived += 1
    assert survived == trials


def test_readers_during_writes_never_fail_or_see_torn_checkpoints(tmp_path, reference):
    path = tmp_path / "live.h5"
    proc = _start(path, tiny_config(**KILL_CFG))
    reads = 0
    try:
        while _committed(path) == 0:
            time.sleep(0.01)
        while proc.poll() is None:
            run = Trajectory(path)
            steps = run.steps
            m = run.metrics
            assert len(set(len(v) for v in m.values())) == 1  # whole evaluation rows only
            last = int(steps[-1])
            assert np.array_equal(run.params(last)["unembed.W_U"].numpy(),
                                  reference.param_trajectory("unembed.W_U")[len(steps) - 1])
            reads += 1
    finally:
        proc.wait(timeout=120)
    info = groklens("info", str(path), "--json", check=True)
    assert json.loads(info.stdout)["status"] == "completed"
    assert reads >= 3


def test_live_run_reports_live_and_resume_refuses_it(tmp_path):
    path = tmp_path / "busy.h5"
    proc = _start(path, tiny_config(**{**KILL_CFG, "steps": 4000}))
    try:
        while _committed(path) == 0:
            time.sleep(0.01)
        info = json.loads(groklens("info", str(path), "--json", check=True).stdout)
        assert info["live"] is True and info["status"] == "running"
        out = groklens("train", "--resume", str(path))
        assert out.returncode == 2 and "being written" in out.stderr
    finally:
        proc.kill()
        proc.wait()


def test_info_compare_and_report_on_a_run_being_written(tmp_path):
    path = tmp_path / "live.h5"
    proc = _start(path, tiny_config(**{**KILL_CFG, "steps": 3000, "checkpoint_every": 50}))
    ok = []
    try:
        while _committed(path) < 2:
            time.sleep(0.05)
        for i in range(2):
            for args in (["info", str(path), "--json"], ["compare", str(path), "--format", "json"],
                         ["report", str(path), "-o", str(tmp_path / f"report{i}"), "-q"]):
                out = groklens(*args)
                assert out.returncode == 0, (args, out.stderr)
                ok.append(proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()
    assert any(ok)  # at least some of the reads happened while the trainer was writing
    assert (tmp_path / "report1" / "index.html").exists()
