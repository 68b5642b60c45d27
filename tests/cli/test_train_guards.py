"""Guards a new user meets first (issue 28), each checked on the real CLI:
Ctrl-C names the resume command, the memory guard refuses a model that cannot fit before any
file exists, a run killed before its first checkpoint blocks nothing, a busy machine is said in
one line, and a clone folder that shadows the installed package is named (`train --help`'s words
for each field: tests/cli/test_config_facts.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import config_flags, groklens, tiny_config

ROOT = Path(__file__).resolve().parents[2]


def _committed(path: Path) -> int:
    try:
        return len(Trajectory(path).steps)
    except BadInput:
        return 0


def test_ctrl_c_says_what_is_kept_and_the_exact_resume_command(tmp_path):
    path = tmp_path / "run.h5"
    cfg = tiny_config(steps=1500, checkpoint_every=10, eval_every=5, p=13)
    proc = subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--out", str(path), *config_flags(cfg)],
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            # a shell's background job ignores SIGINT, and its children inherit that: undo it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while _committed(path) < 3:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130
    last = int(Trajectory(path).steps[-1])  # read after the process ended: what it left
    assert err.strip().splitlines() == [
        f"groklens: interrupted; {path} is kept up to step {last}; `groklens train --resume {path}` continues it"]
    out = groklens("train", "-q", "--resume", str(path), check=True, timeout=900)
    assert out.returncode == 0 and int(Trajectory(path).steps[-1]) == 1500


def test_a_model_that_cannot_fit_is_refused_before_any_file_exists(tmp_path):
    out = groklens("train", "--out", str(tmp_path / "big.h5"), "--p", "113", "--d-model", "100000", cwd=tmp_path)
    assert out.returncode == 2
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "needs about" in err and "activations of the evaluation batch" in err
    assert list(tmp_path.iterdir()) == []  # no run file, no staging file


@pytest.mark.slow
def test_the_estimate_is_above_what_a_run_really_holds(tmp_path):
    """The guard's estimate (checkpoints/validate.estimate_memory) against the peak resident memory
    a real training process reaches above its start (getrusage of the child, an independent count)."""
    from groklens.checkpoints.validate import estimate_memory

    cfg = tiny_config(p=113, train_frac=0.3, d_model=256, n_heads=4, d_head=64, d_mlp=1024, steps=4,
                      eval_every=2, checkpoint_every=2)
    code = ("import resource, sys; from groklens.config import RunConfig; from groklens.trainers.train import train; "
            "import torch, h5py, transformer_lens; base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"train(RunConfig.from_json({cfg.to_json()!r}), sys.argv[1], progress=False); "
            "print(base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.h5")], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
    base_kib, peak_kib = map(int, out.stdout.split())
    assert (peak_kib - base_kib) * 1024 < sum(estimate_memory(cfg).values())


def _died_before_first_checkpoint(path: Path) -> None:
    """A trainer killed (SIGKILL, as the kernel's OOM killer does) right after creating its file."""
    cfg = tiny_config()
    code = ("import os, signal, sys; from groklens.config import RunConfig; from groklens.tasks import TASKS; "
            "from groklens.trainers import train as training; from groklens.trainers.single import SingleRun; "
            f"cfg = RunConfig.from_json({cfg.to_json()!r}); data = TASKS.get(cfg.task).build(cfg); "
            "s = SingleRun(cfg, data); params, state, _ = s.payloads([0])[0]; "
            "training.create_trajectory(__import__('pathlib').Path(sys.argv[1]), cfg, data, params, state); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL and path.exists()


def test_a_run_killed_before_its_first_checkpoint_blocks_nothing(tmp_path):
    path = tmp_path / "dead.h5"
    _died_before_first_checkpoint(path)
    info = groklens("info", str(path), check=True).stdout
    assert "died before its first checkpoint" in info and "nothing to resume" in info and "--resume" not in info
    resume = groklens("train", "-q", "--resume", str(path))
    assert resume.returncode == 2 and "holds no checkpoint" in resume.stderr
    assert len(resume.stderr.strip().splitlines()) == 1
    again = groklens("train", "-q", "--out", str(path), *config_flags(tiny_config()))  # no --force needed
    assert again.returncode == 0, again.stderr
    assert Trajectory(path).status == "completed" and len(Trajectory(path).steps) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dead.h5"]  # no staging file left
    # a run that has checkpoints is still protected
    assert groklens("train", "-q", "--out", str(path), *config_flags(tiny_config())).returncode == 2


def test_a_busy_machine_is_said_once_and_not_with_quiet(tmp_path, monkeypatch, capsys):
    import groklens.threads as T
    from groklens.cli import main

    monkeypatch.setattr(T, "load_average", lambda: 40.0)
    monkeypatch.setattr(T, "other_groklens_processes", lambda proc=None: 3)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    flags = config_flags(tiny_config(steps=20, eval_every=10, checkpoint_every=10))
    for quiet, name in ((False, "a.h5"), (True, "b.h5")):
        with pytest.raises(SystemExit) as exc:
            main(["train", "--out", str(tmp_path / name), *(["-q"] if quiet else []), *flags])
        assert exc.value.code == 0
        err = [line for line in re.split(r"[\r\n]", capsys.readouterr().err) if "groklens:" in line]
        if quiet:
            assert err == []
        else:
            assert len(err) == 1 and "the machine is busy (load average 40.0" in err[0]
            assert "3 other groklens processes computing" in err[0]


def test_a_clone_folder_that_shadows_the_package_is_named(tmp_path):
    """A script beside a folder named groklens (the clone) imports that folder as a namespace
    package; the sub-packages say so instead of `cannot import name '__version__'`."""
    (tmp_path / "groklens").symlink_to(ROOT, target_is_directory=True)
    script = tmp_path / "study.py"
    script.write_text("from groklens.checkpoints import Trajectory\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: the folder") and "shadows the installed groklens" in last
    assert str(tmp_path / "groklens") in last and "__version__" not in out.stderr
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Importing groklens" in readme and "unknown location" in readme
