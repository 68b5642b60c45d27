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

from groklens.config import RunConfig, as_planned
from groklens.errors import BadInput
from groklens.fileio import write_text_atomic
from groklens.sweeps.grid import RunSpec, Sweep
from groklens.fileio import load_json_file

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
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return "blocked", f"{path.name} is not a regular file; move it away (a sweep never replaces it)"
    if path.exists() and path.stat().st_size == 0:  # killed before HDF5 wrote anything: nothing to lose
        return ("failed", read_error(err)) if err.exists() else ("pending", "empty file, restarted")
    if path.exists():
        try:
            traj = Trajectory(path)
            status = traj.status
            n = len(traj.steps)
        except BadInput as exc:
            why = str(exc).removeprefix(f"{path}: ")
            return "blocked", (f"{path.name} is not a readable groklens run ({why}); move it away (a sweep never "
                               "replaces it)")
    if traj is not None and status.startswith("completed"):
        return "done", status  # a finished run wins over an error file left by a racing attempt
    if err.exists() or err.is_symlink():
        return "failed", read_error(err)
    if traj is None:
        return "pending", ""
    if traj.is_live:
        return "running", f"{n} checkpoints"
    if n == 0:
        return "pending", "no committed checkpoint, restarted"
    return "interrupted", f"{n} checkpoints, last step {int(traj.steps[-1])}"


ERROR_MAX_BYTES = 1 << 20


def read_error(path: Path) -> str:
    """The one-line error of an error record (DIR/<name>.error.json), or what is wrong with it."""
    try:
        record = load_json_file(path, "error record", max_bytes=ERROR_MAX_BYTES)
    except BadInput as exc:
        return f"(unreadable error file: {str(exc).removeprefix(f'{path}: error record ')})"
    error = record.get("error") if isinstance(record, dict) else None
    if not isinstance(error, str):
        return "(unreadable error file: no error message in it)"
    return " ".join(error.split())[:1000]


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
    if stored is not None and as_planned(stored) != as_planned(cfg.to_dict()):
        diff = config_diff(as_planned(stored), cfg.to_dict())
        raise BadInput(f"{path} holds a run with a different config ({', '.join(diff)}); move it away or use "
                       "another -o")


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
    manifest: dict[str, Any] = {"format": MANIFEST_FORMAT, "runs": {}}
    if path.exists() or path.is_symlink():
        manifest = load_manifest(path)
    known = manifest["runs"]
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


MANIFEST_FORMAT = "groklens-sweep"
MANIFEST_MAX_RUNS = 100_000  # a grid is capped far lower (sweep_grid); this bounds what is read


def check_run_name(name: Any, where: str) -> str:
    """A run name as a sweep names it: one plain file name in DIR (no '/', no '..', no leading
    '.', printable, at most 200 characters)."""
    ok = (isinstance(name, str) and 0 < len(name) <= 200 and "/" not in name and "\\" not in name
          and not name.startswith(".") and name.isprintable())
    if not ok:
        raise BadInput(f"{where}: {name!r} is not a run name (a plain file name inside the sweep directory)")
    return name


def load_manifest(path: Path) -> dict[str, Any]:
    """DIR/sweep.json, checked: {"format": "groklens-sweep", "runs": {name: config mapping}, ...};
    every name a plain file name in DIR. BadInput (one line) for anything else."""
    # Infinity allowed: a config may hold one (routing_width inf, the uniform kernel), and the
    # manifest is written by json.dumps, which spells it so
    data = load_json_file(path, "sweep manifest", allow_nan=True)
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a sweep manifest (a {type(data).__name__}, not a mapping); move it away")
    if data.get("format", MANIFEST_FORMAT) != MANIFEST_FORMAT:
        raise BadInput(f"{path} is not a sweep manifest (format {data.get('format')!r}); move it away")
    runs = data.get("runs")
    if not isinstance(runs, dict):
        raise BadInput(f"{path}: 'runs' must map run names to configs; got {type(runs).__name__}; move it away")
    if len(runs) > MANIFEST_MAX_RUNS:
        raise BadInput(f"{path} lists {len(runs)} runs, over {MANIFEST_MAX_RUNS}")
    for name, cfg in runs.items():
        check_run_name(name, str(path))
        if not isinstance(cfg, dict):
            raise BadInput(f"{path}: run {name!r} has no config mapping; move it away")
    data["format"] = MANIFEST_FORMAT
    return data


def sweep_status(out_dir: str | Path) -> dict[str, Any]:
    """What `groklens sweep --status DIR` prints: counts by state, and the failed runs' errors."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise BadInput(f"{out_dir}: no such directory")
    path = out_dir / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise BadInput(f"{out_dir} is not a sweep directory (no {MANIFEST})")
    names = list(load_manifest(path)["runs"])
    states = {name: run_state(out_dir, name) for name in names}
    counts = {s: 0 for s in STATES}
    for state, _ in states.values():
        counts[state] += 1
    return {
        "dir": str(out_dir), "total": len(names), "counts": counts,
        "runs": {n: {"state": s, "detail": d} for n, (s, d) in states.items()},
        "failed": {n: d for n, (s, d) in states.items() if s in ("failed", "blocked")},
    }


STATES = ("done", "running", "interrupted", "pending", "failed", "blocked")


def export_config_yaml(run: str | Path, out: str | Path) -> Path:
    """Write RUN.h5's stored config as YAML; `groklens train --config` trains the same run again."""
    import yaml
    from groklens.checkpoints import Trajectory

    cfg = Trajectory(run).config
    Path(out).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return Path(out)
