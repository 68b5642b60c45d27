"""Analysis results in the run's sidecar file (RUN.h5 -> RUN.analyses.h5), crash-safe.

The trajectory file has a single SWMR writer (the trainer), so analyses live beside it and a
run still being trained can be analyzed. Layout (docs/FORMAT.md):

  /                             attrs: format="groklens-analyses", format_version=1
  /analyses/<name>/<variant>    attrs: analysis, params (canonical JSON), groklens_version,
                                       run_config_sha256, kind ("step" | "run"), updated
      steps                     int64 [n], ascending: the checkpoint steps held
      <value>                   [n, *shape] per-step values (float64 or int64), or a
                                variable-length 1-D dataset [n] when a value's length varies
                                by step (e.g. key_frequencies)
  <variant> = the first 16 hex digits of sha256(params JSON): parameter sets live side by side.

Crash safety: the file is never modified in place. A commit copies the current file's other
groups and the merged group into RUN.analyses.h5.tmp-<pid>, fsyncs it, and os.replace()s it
over the sidecar (then fsyncs the directory). A process killed at any moment leaves either the
old or the new file, never a torn one; a leftover temporary file is deleted by the next commit.
Commits of concurrent analyses are serialised by an flock on the run's directory, and each one
re-reads the file inside the lock, so two processes never drop each other's results.
Stored results are reused only when their parameters, groklens version and run config match.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from groklens import __version__
from groklens.checkpoints import sidecar_path
from groklens.errors import BadInput, RunFailure
from groklens.checkpoints.validate import clean_once, link_problems
from groklens.fileio import check_writable_dir, remove_quietly

SIDECAR_FORMAT = "groklens-analyses"
SIDECAR_VERSION = 1
ROOT = "analyses"
STEPS = "steps"


def variant_id(params_json: str) -> str:
    return hashlib.sha256(params_json.encode()).hexdigest()[:16]


def config_sha(config_json: str) -> str:
    return hashlib.sha256(config_json.encode()).hexdigest()


@dataclass
class Stored:
    """One analysis variant as stored: steps and, per value name, one array per step."""

    attrs: dict[str, Any]
    steps: list[int]
    values: dict[str, list[np.ndarray]]

    def rows(self) -> dict[int, dict[str, np.ndarray]]:
        return {s: {k: v[i] for k, v in self.values.items()} for i, s in enumerate(self.steps)}


class Sidecar:
    def __init__(self, run_path: str | Path, copy: int = 0):
        self.run_path = Path(run_path)
        self.path = sidecar_path(self.run_path, copy)  # copy m >= 1 of a routed run: its own file

    # ------------------------------------------------------------------ reading
    @contextmanager
    def _open(self) -> Iterator[h5py.File | None]:
        if not self.path.exists():
            yield None
            return
        try:
            f = h5py.File(self.path, "r", locking=False)
        except OSError as exc:
            msg = str(exc).splitlines()[0] if str(exc) else "unreadable"
            raise BadInput(f"{self.path}: unreadable analyses file ({msg}); move it away to start afresh") from None
        try:
            with self._damaged():  # a header HDF5 cannot decode is damage too, named as such
                self._check_header(f)
            yield f
        finally:
            f.close()

    def _check_header(self, f: h5py.File) -> None:
        """BadInput unless `f` is this run's analyses file, undamaged."""
        links = link_problems(f)
        if links:
            raise BadInput(f"{self.path}: invalid analyses file: {links[0]}; move it away")
        fmt = f.attrs.get("format")
        fmt = fmt.decode(errors="replace") if isinstance(fmt, bytes) else fmt
        if fmt != SIDECAR_FORMAT:
            raise BadInput(f"{self.path} exists but is not a groklens analyses file; move it away")
        version = f.attrs.get("format_version")
        if isinstance(version, (bool, np.bool_)) or not isinstance(version, (int, np.integer)) \
                or int(version) > SIDECAR_VERSION:
            raise BadInput(f"{self.path}: analyses format version {version!r} is not one this groklens reads")
        owner = _text(f.attrs.get("run"))
        if owner is not None and not isinstance(owner, str):
            raise BadInput(f"{self.path}: invalid analyses file (its run attribute is not a name); move it away")
        if owner is not None and owner != self.run_path.name:  # another run's results: never mixed
            raise BadInput(f"{self.path} holds the analyses of {owner}, not of {self.run_path.name}; move it away")
        clean_once("sidecar", f, lambda: check_sidecar(f, self.path))

    def check(self, writing: bool = False) -> None:
        """BadInput if an existing sidecar is not ours, unreadable or damaged, or (`writing`) its
        directory cannot take a new one, before anything is computed."""
        with self._open():
            pass
        if writing:
            check_writable_dir(self.path.parent, f"write {self.path.name} into")
            if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
                raise BadInput(f"{self.path} is not a regular file; move it away")

    def read(self, name: str, variant: str) -> Stored | None:
        with self._open() as f, self._damaged():
            if f is None or f"{ROOT}/{name}/{variant}" not in f:
                return None
            return _read_group(f[f"{ROOT}/{name}/{variant}"])

    def variants(self, name: str) -> list[tuple[str, dict]]:
        """(variant id, attrs) of every stored parameter set of analysis `name`."""
        with self._open() as f, self._damaged():
            if f is None or f"{ROOT}/{name}" not in f:
                return []
            return [(v, dict(g.attrs)) for v, g in f[f"{ROOT}/{name}"].items()]

    @contextmanager
    def _damaged(self) -> Iterator[None]:
        """A read that fails inside HDF5 (bad checksum, ...) names the file as damaged."""
        try:
            yield
        except (OSError, RuntimeError, KeyError, ValueError, IndexError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"{self.path}: damaged analyses file ({msg}); move it away to start afresh") from None

    # ------------------------------------------------------------------ writing
    def commit(self, name: str, variant: str, attrs: Mapping[str, Any],
               rows: Mapping[int, Mapping[str, Any]], *, replace: bool = False) -> None:
        """Merge `rows` (step -> values) into /analyses/<name>/<variant> and atomically replace the
        file. Stored rows are kept unless `replace` or their identity attributes differ."""
        for row in rows.values():
            for key in row:
                if "/" in key or not key or key == STEPS:
                    raise ValueError(f"invalid value name {key!r}")
        with _directory_lock(self.path.parent):
            for stale in self.path.parent.glob(self.path.name + ".tmp-*"):
                remove_quietly(stale)  # left by a killed commit (commits hold the lock)
            merged: dict[int, dict[str, Any]] = {}
            if not replace:
                old = self.read(name, variant)
                if matches(old, attrs):
                    keys = {frozenset(r) for r in rows.values()}
                    # rows stored by a version of the analysis with other values are dropped, not mixed
                    merged.update({s: r for s, r in old.rows().items() if not keys or frozenset(r) in keys})
            merged.update({int(s): dict(r) for s, r in rows.items()})
            tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
            try:
                with h5py.File(tmp, "w", libver="latest") as dst:
                    dst.attrs["format"] = SIDECAR_FORMAT
                    dst.attrs["format_version"] = SIDECAR_VERSION
                    dst.attrs["run"] = self.run_path.name
                    root = dst.create_group(ROOT)
                    with self._open() as src:
                        if src is not None and ROOT in src:
                            for n, group in src[ROOT].items():
                                for v in group:
                                    if (n, v) != (name, variant):
                                        dst_group = root.require_group(n)
                                        src.copy(group[v], dst_group, name=v)
                    g = root.require_group(name).create_group(variant)
                    for k, v in attrs.items():
                        g.attrs[k] = v
                    g.attrs["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                    _write_rows(g, merged)
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException as exc:
                remove_quietly(tmp)
                if isinstance(exc, (OSError, RuntimeError)) and not isinstance(exc, FileNotFoundError):
                    full = any(m in str(exc) for m in ("File too large", "No space left", "Disk quota"))
                    why = "no room left on the disk or under the file-size limit" if full else _first(exc)
                    raise RunFailure(f"writing {self.path} failed ({why}); the stored results are as they "
                                     "were") from None
                raise
            _fsync_dir(self.path.parent)


IDENTITY = ("analysis", "params", "groklens_version", "run_config_sha256", "kind")


def identity_attrs(name: str, params_json: str, run_config_json: str, kind: str) -> dict[str, str]:
    return {"analysis": name, "params": params_json, "groklens_version": __version__,
            "run_config_sha256": config_sha(run_config_json), "kind": kind}


def matches(stored: Stored | None, attrs: Mapping[str, Any]) -> bool:
    return stored is not None and all(_text(stored.attrs.get(k)) == attrs.get(k) for k in IDENTITY)


def _text(x):
    return x.decode() if isinstance(x, bytes) else x


MAX_STEPS = 1 << 24  # stored checkpoints of one analysis variant (a run has thousands)


def check_sidecar(f: h5py.File, path: Path) -> None:
    """The layout of docs/FORMAT.md, from metadata alone: /analyses/<name>/<variant> groups, each
    with 1-D integer steps (at most MAX_STEPS) and values with a row per step. BadInput otherwise."""
    def bad(what: str) -> BadInput:
        return BadInput(f"{path}: invalid analyses file ({what}); move it away to start afresh")

    if ROOT not in f:
        return
    root = f[ROOT]
    if not isinstance(root, h5py.Group):
        raise bad(f"/{ROOT} is not a group")
    for name, group in root.items():
        if not isinstance(group, h5py.Group):
            raise bad(f"/{ROOT}/{name} is not a group")
        for variant, g in group.items():
            where = f"/{ROOT}/{name}/{variant}"
            if not isinstance(g, h5py.Group):
                raise bad(f"{where} is not a group")
            steps = g.get(STEPS)
            if not isinstance(steps, h5py.Dataset) or steps.ndim != 1 or not np.issubdtype(steps.dtype, np.integer):
                raise bad(f"{where}/{STEPS} is not 1-D integers")
            if steps.shape[0] > MAX_STEPS:
                raise bad(f"{where}/{STEPS} has {steps.shape[0]} rows, more than a run has checkpoints")
            for key, ds in g.items():
                if key != STEPS and (not isinstance(ds, h5py.Dataset) or ds.ndim < 1 or ds.shape[0] != steps.shape[0]):
                    raise bad(f"{where}/{key} does not hold one row per stored step")


def _read_group(g: h5py.Group) -> Stored:
    steps_data = g[STEPS][:]
    _check_digest(g[STEPS], steps_data)
    steps = [int(s) for s in steps_data]
    values: dict[str, list[np.ndarray]] = {}
    for key, ds in g.items():
        if key == STEPS:
            continue
        if h5py.check_vlen_dtype(ds.dtype) is not None:
            values[key] = [np.asarray(x) for x in ds[:]]
        else:
            data = ds[:]
            values[key] = [data[i] for i in range(len(steps))]
        _check_digest(ds, values[key])
    attrs = {k: _text(v) for k, v in g.attrs.items()}
    return Stored(attrs=attrs, steps=steps, values=values)


DIGEST = "sha256"  # per dataset: sha256 of its rows as stored (since sidecar 1.1; absent: unverified)


def digest(rows) -> str:
    """sha256 of a dataset's rows, each with its shape (a vlen dataset's rows differ in length).
    A digest rather than Fletcher32: a vlen dataset's values live in HDF5's global heap, which
    no filter covers; a sidecar is written whole, so there are no appends to keep it current."""
    h = hashlib.sha256()
    for row in rows:
        a = np.ascontiguousarray(row)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _check_digest(ds: h5py.Dataset, rows) -> None:
    """ValueError naming `ds` when its rows are not those written (a flipped bit); a dataset of an
    earlier sidecar carries no digest and is read unverified."""
    stored = _text(ds.attrs.get(DIGEST))
    if stored is not None and stored != digest(rows):
        raise ValueError(f"{ds.name} does not match its {DIGEST} digest: its stored bytes changed")


def _write_rows(g: h5py.Group, rows: Mapping[int, Mapping[str, Any]]) -> None:
    steps = sorted(rows)
    steps_data = np.asarray(steps, dtype=np.int64)
    g.create_dataset(STEPS, data=steps_data).attrs[DIGEST] = digest(steps_data)
    if not steps:
        return
    keys = list(rows[steps[0]])
    for s in steps:
        if set(rows[s]) != set(keys):
            raise ValueError(f"step {s} has values {sorted(rows[s])}, others have {sorted(keys)}")
    for key in keys:
        arrays = [np.asarray(rows[s][key]) for s in steps]
        integer = all(np.issubdtype(a.dtype, np.integer) or a.dtype == bool for a in arrays)
        dtype = np.int64 if integer else np.float64
        shapes = {a.shape for a in arrays}
        stored = [a.astype(dtype) for a in arrays]
        if len(shapes) == 1:
            ds = g.create_dataset(key, data=np.stack(stored))
        elif all(a.ndim == 1 for a in arrays):
            ds = g.create_dataset(key, shape=(len(arrays),), dtype=h5py.vlen_dtype(dtype))
            for i, a in enumerate(stored):
                ds[i] = a
        else:
            raise ValueError(f"value {key!r} changes shape across steps: {sorted(shapes)}")
        ds.attrs[DIGEST] = digest(stored)


@contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _first(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
