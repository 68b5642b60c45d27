"""The files of a sweep directory: where each run's files go, the state of a run read from them
alone, the locks that let sweeps share a directory, the manifest (DIR/sweep.json), the error
records (DIR/<name>.error.json) and `--status`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.fileio import write_text_atomic
from groklens.trainers.sweep_grid import RunSpec, Sweep

MANIFEST = "sweep.json"
ERROR_SUFFIX = ".error.json"
LOCK_FILE = ".sweep.lock"  # flock: the manifest; byte-range locks: one claim per run


# ---------------------------------------------------------------------- state of a run
def run_path(out_dir: Path, name: str) -> Path:
    return out_dir / f"{name}.h5"


def error_path(out_dir: Path, name: str) -> Path:
    return out_dir / f"{name}{ERROR_SUFFIX}"


def run_state(out_dir: Path, name: str) -> tuple[str, str]:
    """(state, detail) of one run, from its files alone; see the module docstring."""
    from groklens.checkpoints import Trajectory

    err = error_path(out_dir, name)
    path = run_path(out_dir, name)
    traj = status = None
    n = 0
    if path.exists():
        try:
            traj = Trajectory(path)
            status = traj.status
            n = len(traj.steps)
        except BadInput as exc:
            status = f"unreadable file, restarted: {exc}"
    if traj is not None and status.startswith("completed"):
        return "done", status  # a finished run wins over an error file left by a racing attempt
    if err.exists():
        try:
            return "failed", json.loads(err.read_text()).get("error", "")
        except (OSError, ValueError):
            return "failed", "(unreadable error file)"
    if traj is None:
        return "pending", status or ""
    if traj.is_live:
        return "running", f"{n} checkpoints"
    if n == 0:
        return "pending", "no committed checkpoint, restarted"
    return "interrupted", f"{n} checkpoints, last step {int(traj.steps[-1])}"


def stored_config(path: Path) -> dict | None:
    from groklens.checkpoints import Trajectory

    try:
        return Trajectory(path).config_dict
    except BadInput:
        return None


def config_diff(a: dict, b: dict) -> list[str]:
    """The config fields on which `a` and `b` differ, sorted."""
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def check_same_config(path: Path, cfg: RunConfig) -> None:
    stored = stored_config(path)
    if stored is not None and stored != cfg.to_dict():
        diff = config_diff(stored, cfg.to_dict())
        raise BadInput(f"{path} holds a run with a different config ({', '.join(diff)}); move it away or use another -o")


@contextmanager
def claim_run(out_dir: Path, name: str) -> Iterator[bool]:
    """Yield True while this process holds the run's claim (an OFD lock on one byte of DIR's
    lock file, at an offset from the name's hash); False when another sweep holds it. A claim
    dies with its process, so a killed sweep never leaves a run claimed."""
    import struct

    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    offset = int.from_bytes(hashlib.sha256(name.encode()).digest()[:6], "little")
    try:
        try:
            cmd = getattr(fcntl, "F_OFD_SETLK", None)
            if cmd is not None:
                fcntl.fcntl(fd, cmd, struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0) + b"\0" * 4)
            else:  # pragma: no cover - non-Linux
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
            held = True
        except OSError:
            held = False
        yield held
    finally:
        os.close(fd)


@contextmanager
def manifest_lock(out_dir: Path) -> Iterator[None]:
    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits: manifest updates take milliseconds
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------------- records
def record_failure(path: Path, name: str, exc: BaseException) -> dict:
    message = " ".join(str(exc).split()) or type(exc).__name__
    record = {
        "run": name, "error": message, "type": type(exc).__name__,
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
    }
    _write_json(error_path(path.parent, name), record)
    return {"name": name, "state": "failed", "detail": message}


def _write_json(path: Path, data: Any) -> None:
    """Whole or not at all (groklens.fileio)."""
    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def update_manifest(out_dir: Path, runs: Sequence[RunSpec], sweep: Sweep | None) -> None:
    """DIR/sweep.json: every run this directory was asked for; a name never changes config.
    Concurrent sweeps on one directory take turns (an flock), so neither drops the other's runs."""
    with manifest_lock(out_dir):
        _update_manifest_locked(out_dir, runs, sweep)


def _update_manifest_locked(out_dir: Path, runs: Sequence[RunSpec], sweep: Sweep | None) -> None:
    path = out_dir / MANIFEST
    manifest: dict[str, Any] = {"format": "groklens-sweep", "runs": {}}
    if path.exists():
        try:
            manifest = json.loads(path.read_text())
        except ValueError:
            raise BadInput(f"{path} is damaged (not JSON); move it away") from None
    known = manifest.setdefault("runs", {})
    for r in runs:
        cfg = r.config.to_dict()
        if r.name in known and known[r.name] != cfg:
            diff = config_diff(cfg, known[r.name])
            raise BadInput(f"{out_dir} already has run {r.name} with a different config ({', '.join(diff)}); "
                           "use another -o")
        known[r.name] = cfg
    if sweep is not None:
        manifest["grid"] = sweep.to_dict()
    _write_json(path, manifest)


def sweep_status(out_dir: str | Path) -> dict[str, Any]:
    """What `groklens sweep --status DIR` prints: counts by state, and the failed runs' errors."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise BadInput(f"{out_dir}: no such directory")
    path = out_dir / MANIFEST
    if not path.exists():
        raise BadInput(f"{out_dir} is not a sweep directory (no {MANIFEST})")
    try:
        names = list(json.loads(path.read_text())["runs"])
    except (ValueError, KeyError):
        raise BadInput(f"{path} is damaged; move it away") from None
    states = {name: run_state(out_dir, name) for name in names}
    counts = {s: 0 for s in ("done", "running", "interrupted", "pending", "failed")}
    for state, _ in states.values():
        counts[state] += 1
    return {
        "dir": str(out_dir), "total": len(names), "counts": counts,
        "runs": {n: {"state": s, "detail": d} for n, (s, d) in states.items()},
        "failed": {n: d for n, (s, d) in states.items() if s == "failed"},
    }


def export_config_yaml(run: str | Path, out: str | Path) -> Path:
    """Write RUN.h5's stored config as YAML; `groklens train --config` trains the same run again."""
    import yaml
    from groklens.checkpoints import Trajectory

    cfg = Trajectory(run).config
    Path(out).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return Path(out)
