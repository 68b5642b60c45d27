"""Builders shared by the tests: tiny configs and tiny real runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from groklens.config import RunConfig

TINY = dict(p=11, train_frac=0.5, d_model=16, n_heads=2, d_head=8, d_mlp=32, lr=3e-3,
            steps=60, eval_every=10, checkpoint_every=20, device="cpu")


def tiny_config(**overrides) -> RunConfig:
    """A model small enough to train in well under a second."""
    return RunConfig.from_dict({**TINY, **overrides})


def train_tiny(path: Path, **overrides):
    from groklens.trainers.train import train

    return train(tiny_config(**overrides), path, progress=False)


def train_interrupted(cfg: RunConfig, path: Path, at_step: int, trainer_cls=None) -> None:
    """Train `cfg` into `path` as if Ctrl-C came at training step `at_step` (the checkpoints
    before it stay committed); `trainer_cls` is the strategy class whose train_step runs (default SingleRun)."""
    import pytest

    from groklens.trainers.single import SingleRun
    from groklens.trainers.train import train

    cls = trainer_cls or SingleRun
    original = cls.train_step

    def interrupted(self, step):
        if step == at_step:
            raise KeyboardInterrupt
        return original(self, step)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cls, "train_step", interrupted)
        with pytest.raises(KeyboardInterrupt):
            train(cfg, path, progress=False)


def config_flags(cfg: RunConfig) -> list[str]:
    """The `groklens train` flags that reproduce `cfg`."""
    flags = []
    for key, value in cfg.to_dict().items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        else:
            flags += [flag, str(value)]
    return flags


def groklens(*args: str, check: bool = False, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (as a user would)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    proc = subprocess.run([sys.executable, "-m", "groklens", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"groklens {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def assert_train_refused(tmp_path: Path, flags: list[str], message: str) -> None:
    """`groklens train` of a tiny run with `flags`: exit 2, one line naming `message`, no file."""
    out = groklens("train", "-q", "--out", str(tmp_path / "x.h5"), "--p", "7", "--steps", "5", "--eval-every", "5",
                   "--checkpoint-every", "5", *flags)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "x.h5").exists()


def readonly_groklens(directory: Path, *args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run the CLI with `directory` bind-mounted read-only in a private mount namespace (root or
    not: a read-only mount refuses root too; nothing outside the namespace changes). Skips the
    test where this platform cannot make one (no unshare, no mount namespaces)."""
    import shutil

    import pytest

    if shutil.which("unshare") is None or shutil.which("mount") is None:
        pytest.skip("needs unshare and mount for a read-only bind mount")
    flags = ["-m", "--propagation", "private"] if os.geteuid() == 0 else ["-r", "-m", "--propagation", "private"]
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" || exit 97; shift; exec "$@"'
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    proc = subprocess.run(["unshare", *flags, "sh", "-c", script, "sh", str(directory), sys.executable, "-m",
                           "groklens", *args], capture_output=True, text=True, timeout=timeout, env=env, **kw)
    if proc.returncode == 97 or proc.stderr.startswith("unshare:"):
        pytest.skip(f"cannot mount {directory} read-only here: {proc.stderr.strip()[:200]}")
    return proc


def dead_pid() -> int:
    """The pid of a process that has exited (what a killed writer leaves in its temporaries' names)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def snapshot(root: Path) -> dict:
    """Every path under root with its bytes (a file) or its target (a link): what a refused
    command must leave as it was."""
    return {p: (p.read_bytes() if p.is_file() and not p.is_symlink() else os.readlink(p) if p.is_symlink() else None)
            for p in sorted(root.rglob("*"))}


def one_line_exit(out: subprocess.CompletedProcess, code: int = 2) -> str:
    """The stderr of a command that exited `code` with one clean line (no traceback, no --debug hint)."""
    err = out.stderr.strip()
    assert out.returncode == code, f"exit {out.returncode}: {err[-600:]}"
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "--debug" not in err, err
    return err


PEER_SCRIPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "peer"


def peer_script(name: str):
    """A script of benchmarks/peer/ (not a package: loaded from its file), e.g. peer_script("stablemax_official")."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, PEER_SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look the module up by name
    spec.loader.exec_module(mod)
    return mod
