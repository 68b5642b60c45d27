"""Write a trajectory: one HDF5 file per run, single writer / many readers (SWMR).

Commit protocol (docs/FORMAT.md): every dataset exists before SWMR starts (readers cannot
see groups created later). A checkpoint writes params/<name>[n] and its state slot, flushes,
then appends its step to /steps and flushes again: the length of /steps is the commit marker.
Evaluation rows are committed the same way by metrics/step. A writer killed at any moment
leaves every committed checkpoint readable; `recover()` copies them into a clean file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping, Sequence

import h5py
import numpy as np

from groklens import __version__
from groklens.checkpoints import constants as C
from groklens.checkpoints.constants import copy_sidecar_paths, sidecar_path
from groklens.checkpoints.integrity import is_verified
from groklens.checkpoints.locking import WriterLock, describe_holder, not_writable, writer_alive
from groklens.checkpoints.validate import config_checksum, stored_extensions
from groklens.errors import BadInput, RunFailure
from groklens.fileio import check_writable_dir, remove_quietly, stale_temporaries

# gzip level 1 + shuffle: float32 weights barely compress, so keep the cost of writing low
PARAM_COMPRESSION = {"compression": "gzip", "compression_opts": 1, "shuffle": True}
METRIC_CHUNK = 256
# every dataset carries HDF5's Fletcher32 checksum, recomputed at each chunk write and checked at
# each read: a flipped bit is refused, never read as valid (checkpoints/integrity.py, format 1.3)
CHECKSUM = {"fletcher32": True}


class TrajectoryWriter:
    """Appends checkpoints and evaluation rows to one trajectory file."""

    def __init__(self, f: h5py.File, lock: WriterLock, path: Path | None = None, replaces: Path | None = None):
        self.f = f
        self.lock = lock
        self.path = Path(path or f.filename)  # where the run lives (changes when a staged run replaces)
        self.replaces = replaces  # --force: the run this staged file replaces at its first commit
        self.on_commit = None  # called with the step after each committed checkpoint
        self.n_checkpoints = int(f[C.STEPS].shape[0])
        self.n_evals = int(f[C.METRICS][C.METRICS_STEP].shape[0])
        self.metric_names = [k for k in f[C.METRICS] if k != C.METRICS_STEP]
        self.failed = False  # after a failed write HDF5's state is unknown: touch the file no more

    # ------------------------------------------------------------------ opening
    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        config_json: str,
        data: Mapping[str, np.ndarray],
        data_attrs: Mapping[str, int],
        params: Mapping[str, np.ndarray],
        state: Mapping[str, np.ndarray],
        metric_names: list[str],
        copies: Sequence[Mapping[str, np.ndarray]] = (),
        replace: bool = False,
    ) -> "TrajectoryWriter":
        """Create a new file holding no checkpoint yet; the caller refuses existing paths.
        `copies`: the parameters of copies 1..M-1 of a routed run (`params` is copy 0).
        `replace` (train --force): write a staging file beside `path` instead, and move it over
        `path` (dropping the old run's sidecars) only once its first checkpoint is committed; a
        run that fails before that leaves the old run as it was. A new file is made under a
        temporary name and linked into place once it is complete, so a writer killed while
        creating it leaves no half-made file at `path` (the next writer removes the temporary)."""
        target = Path(path)
        path = staging_path(target) if replace else creating_path(target)
        _check_creatable(path)

        for kind in ("force", "create"):  # left by writers killed before their first commit / while creating
            for stale in stale_temporaries(target.parent, f".{target.name}.{kind}-", ".tmp"):
                remove_quietly(stale)
        need = (sum(a.nbytes for a in data.values()) + 2 * sum(a.nbytes for a in state.values())
                + sum(a.nbytes for p in (params, *copies) for a in p.values()) + (64 << 10))
        _check_space(path, need, f"creating {target}")
        try:
            f = h5py.File(path, "w-", libver="latest")
        except OSError as exc:
            raise _room_or(exc, f"cannot create {target}: {_first_line(exc)}", path, resume=False) from None
        try:
            f.attrs[C.ATTR_FORMAT] = C.FORMAT_NAME
            f.attrs[C.ATTR_FORMAT_VERSION] = C.FORMAT_VERSION
            f.attrs[C.ATTR_GROKLENS_VERSION] = __version__
            f.attrs[C.ATTR_CONFIG] = config_json
            f.attrs[C.ATTR_CONFIG_SHA256] = config_checksum(config_json)  # an edited config is refused
            f.attrs[C.ATTR_INTEGRITY] = C.INTEGRITY_FLETCHER32
            f.attrs[C.ATTR_CREATED] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            g = f.create_group(C.DATA)
            for name, arr in data.items():
                g.create_dataset(name, data=arr, **CHECKSUM)
            for name, value in data_attrs.items():
                g.attrs[name] = value
            f.create_dataset(C.STEPS, shape=(0,), maxshape=(None,), dtype="int64", chunks=(METRIC_CHUNK,), **CHECKSUM)
            _create_params(f.create_group(C.PARAMS, track_order=True), params)
            if copies:
                g = f.create_group(C.COPIES, track_order=True)
                for m, copy_params in enumerate(copies, start=1):
                    _create_params(g.create_group(str(m), track_order=True), copy_params)
            g = f.create_group(C.METRICS, track_order=True)
            g.create_dataset(C.METRICS_STEP, shape=(0,), maxshape=(None,), dtype="int64", chunks=(METRIC_CHUNK,),
                             **CHECKSUM)
            for name in metric_names:
                if name == C.METRICS_STEP:
                    continue
                g.create_dataset(name, shape=(0,), maxshape=(None,), dtype="float64", chunks=(METRIC_CHUNK,),
                                 **CHECKSUM)
            g = f.create_group(C.STATE, track_order=True)
            create_state(g, state)
            f.create_dataset(C.STATUS, data=np.array([b"running"], dtype=f"S{C.STATUS_LENGTH}"), chunks=(1,),
                             **CHECKSUM)
            f.create_dataset(C.CPU_SECONDS, data=np.zeros(1), chunks=(1,), **CHECKSUM)
            f.flush()
            f.swmr_mode = True
            lock = WriterLock(path)
            if not replace:
                _link_into_place(path, target)
        except BaseException as exc:
            remove_quietly(path)  # never leave a half-made file behind
            if isinstance(exc, (OSError, RuntimeError)):
                _abandon(f)
                raise _room_or(exc, f"cannot create {target}: {_first_line(exc)}", path, resume=False) from None
            _close_quietly(f)
            raise
        return cls(f, lock, path if replace else target, replaces=target if replace else None)

    @classmethod
    def reopen(cls, path: str | Path, extension: Mapping | None = None) -> "TrajectoryWriter":
        """Open a clean (recovered) file to append to, in SWMR mode; `extension` (a raised step
        cap) is appended to the file's extension record first, under the writer's lock (SWMR
        cannot write attributes)."""
        try:
            lock = WriterLock(path)
        except OSError as exc:
            if not_writable(exc):
                raise BadInput(f"cannot write {path} ({exc.strerror})") from None
            raise BadInput(f"{path} is being written by a live process ({describe_holder(path)}); "
                           "stop it before resuming") from None
        try:
            f = h5py.File(path, "r+", libver="latest")
            if C.CPU_SECONDS not in f:  # a file from before it was kept: SWMR cannot add it later
                f.create_dataset(C.CPU_SECONDS, data=np.full(1, np.nan), chunks=(1,), **_checksum_of(f))
            if extension is not None:
                f.attrs[C.ATTR_EXTENSIONS] = json.dumps([*stored_extensions(f), dict(extension)])
            f.swmr_mode = True
        except BaseException:
            lock.release()
            raise
        return cls(f, lock)

    @property
    def last_step(self) -> int | None:
        """The step of the last committed checkpoint (None before the first)."""
        return int(self.f[C.STEPS][self.n_checkpoints - 1]) if self.n_checkpoints else None

    # ------------------------------------------------------------------ appending
    def write_checkpoint(self, step: int, params: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray],
                         copies: Sequence[Mapping[str, np.ndarray]] = ()) -> None:
        """Checkpoint `step`: params (copy 0), the state slot, and copies 1..M-1 of a routed run."""
        n = self.n_checkpoints
        self._check_room(step, sum(a.nbytes for p in (params, *copies) for a in p.values())
                         + sum(a.nbytes for a in state.values()))
        with _interrupt_deferred():
            self._write_checkpoint(n, step, params, state, copies)
        if self.replaces is not None:
            self._take_place()
        if self.on_commit is not None:
            self.on_commit(step)

    def _write_checkpoint(self, n: int, step: int, params, state, copies) -> None:
        try:
            groups = [self.f[C.PARAMS]] + [self.f[C.COPIES][str(m)] for m in range(1, len(copies) + 1)]
            for g, values in zip(groups, (params, *copies)):
                for name, arr in values.items():
                    ds = g[name]
                    ds.resize(n + 1, axis=0)
                    ds[n] = arr
            # the slot not holding the last committed checkpoint: a torn write here is harmless
            slot = n % 2
            g = self.f[C.STATE]
            for name, arr in state.items():
                g[name][slot] = arr
            g[C.STATE_STEP][slot] = step
            self.f.flush()
            steps = self.f[C.STEPS]
            steps.resize(n + 1, axis=0)
            steps[n] = step
            self.f.flush()  # commit
        except (OSError, RuntimeError) as exc:
            self.failed = True
            hdf5_write_failed()
            raise _room_or(exc, f"writing checkpoint at step {step} failed: {_first_line(exc)}", self.path) from None
        self.n_checkpoints = n + 1

    def _take_place(self) -> None:
        """The staged run has a checkpoint: it replaces the old run now (train --force)."""
        target = self.replaces
        if writer_alive(target):  # started since the check before training: the live run wins
            raise BadInput(f"{target} is being written by a live process ({describe_holder(target)}); "
                           "not replaced")
        os.replace(self.path, target)
        self.path, self.replaces = target, None
        for old in [sidecar_path(target), *copy_sidecar_paths(target)]:
            drop_sidecar(old, target)  # analyses of the old run would be stale

    def write_eval(self, row: Mapping[str, float]) -> None:
        """Append one evaluation row; `row` holds 'step' and every metric name given at creation."""
        m = self.n_evals
        # a new chunk of every series at worst: room reserved first, as for a checkpoint
        self._check_room(int(row["step"]), (len(self.metric_names) + 1) * METRIC_CHUNK * 8, "evaluation")
        with _interrupt_deferred():
            self._write_eval(m, row)

    def _write_eval(self, m: int, row: Mapping[str, float]) -> None:
        g = self.f[C.METRICS]
        try:
            for name in self.metric_names:
                ds = g[name]
                ds.resize(m + 1, axis=0)
                ds[m] = row.get(name, np.nan)
            self.f.flush()
            ds = g[C.METRICS_STEP]
            ds.resize(m + 1, axis=0)
            ds[m] = int(row["step"])
            self.f.flush()  # commit
        except (OSError, RuntimeError) as exc:
            self.failed = True
            hdf5_write_failed()
            raise _room_or(exc, f"writing evaluation at step {row['step']} failed: {_first_line(exc)}",
                           self.path) from None
        self.n_evals = m + 1

    def _check_room(self, step: int, nbytes: int, what: str = "checkpoint") -> None:
        """Stop cleanly before a commit that the disk or the file-size limit cannot take: a failed
        HDF5 write leaves the file needing repair (and h5py could crash flushing it), a refused one
        leaves it clean. The room is reserved on the disk for this file before anything is written
        (fallocate, keeping the file's size), so a process filling the disk meanwhile fails, not this
        commit; where the file system cannot reserve, the free space is checked instead."""
        import resource
        import shutil

        path = self.path
        need = 2 * nbytes + (64 << 10)  # uncompressed worst case, twice, plus metadata slack
        size = path.stat().st_size
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        limit = soft != resource.RLIM_INFINITY and size + need > soft
        reserved = None if limit or self.lock.fd is None else reserve_space(self.lock.fd, size, need)
        if limit or reserved is False or (reserved is None and need > shutil.disk_usage(path.parent).free):
            where = "the file-size limit" if limit else "the disk"
            raise RunFailure(
                f"not enough room on {where} for the {what} at step {step} (~{need >> 10} KiB); "
                f"the run is kept up to its last checkpoint: free space, then `groklens train --resume {path}`"
            )

    def set_cpu_seconds(self, seconds: float) -> None:
        """The CPU time the run has taken so far; committed with the next checkpoint or close."""
        if self.failed or C.CPU_SECONDS not in self.f:
            return
        try:
            self.f[C.CPU_SECONDS][0] = seconds
        except (OSError, RuntimeError):
            hdf5_write_failed()
            self.failed = True

    def set_status(self, text: str) -> None:
        if self.failed:
            return
        raw = " ".join(str(text).split()).encode()[: C.STATUS_LENGTH]  # one line, whatever the reason says
        try:
            self.f[C.STATUS][0] = raw
            self.f.flush()
        except (OSError, RuntimeError):
            hdf5_write_failed()
            self.failed = True  # the status is advisory; the commit markers are what count

    def close(self, status: str | None = None) -> None:
        if self.failed:
            _abandon(self.f)  # closing would flush into the failed file: leave it as a killed writer does
        elif self.f:
            if status is not None:
                self.set_status(status)
            _close_quietly(self.f)
        if self.lock.fd is not None:
            release_reservation(self.lock.fd)
        self.lock.release()
        if self.replaces is not None:  # never committed: the old run stays, the staging file goes
            try:
                self.path.unlink(missing_ok=True)
            except OSError:
                pass


@contextmanager
def _interrupt_deferred():
    """Hold Ctrl-C back while a commit writes. Python raises KeyboardInterrupt between any two
    bytecodes, so one landing between a series' resize and its value left a row of fill values
    that close() then flushed: /metrics/step "not strictly increasing", an unreadable run. The
    interrupt is raised once the commit (or its bookkeeping) is complete."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)  # the default handler raises KeyboardInterrupt


def _create_params(g: h5py.Group, params: Mapping[str, np.ndarray]) -> None:
    for name, arr in params.items():
        g.create_dataset(name, shape=(0, *arr.shape), maxshape=(None, *arr.shape),
                         dtype="float32", chunks=(1, *arr.shape) if arr.shape else (1,),
                         **(PARAM_COMPRESSION if arr.size > 1 else {}), **CHECKSUM)


def create_state(g: h5py.Group, state: Mapping[str, np.ndarray], checksum: bool = True) -> None:
    """/state/step and the two slots of every state array. One chunk per slot: the slot being
    written is never in the chunk (nor under the checksum) of the last committed one."""
    filters = CHECKSUM if checksum else {}
    g.create_dataset(C.STATE_STEP, data=np.full(2, -1, dtype=np.int64), chunks=(1,), **filters)
    for name, arr in state.items():
        g.create_dataset(name, shape=(2, *arr.shape), dtype=arr.dtype,
                         chunks=(1, *arr.shape) if arr.size else True, **filters)


def _checksum_of(f: h5py.File) -> dict:
    """A dataset added to an existing file checksummed as the file's others are (none in a legacy file)."""
    return CHECKSUM if is_verified(f) else {}


WRITE_FAILED = False  # an HDF5 write failed in this process (the CLI then exits without teardown)


def hdf5_write_failed() -> None:
    """After a failed write HDF5 cannot flush the file's cached metadata, and h5py can crash
    closing the file at exit: `groklens.cli.main` then exits without interpreter teardown.
    What is on disk is what a killed writer leaves, which readers and `--resume` handle."""
    global WRITE_FAILED
    WRITE_FAILED = True


def _failed_write(exc: BaseException | None) -> bool:
    return isinstance(exc, (RuntimeError, OSError)) and "write failed" in str(exc)


def _quiet_unraisable(unraisable, _previous=sys.unraisablehook) -> None:
    """h5py reports each object it frees after a failed write as an ignored exception, with a
    traceback (hundreds of lines on a full disk); the one-line error says it all."""
    if _failed_write(unraisable.exc_value):
        hdf5_write_failed()
        return
    _previous(unraisable)


def _quiet_excepthook(kind, value, tb, _previous=sys.excepthook) -> None:
    if _failed_write(value):  # Cython prints the traceback of an ignored exception through here
        hdf5_write_failed()
        return
    _previous(kind, value, tb)


sys.unraisablehook = _quiet_unraisable
sys.excepthook = _quiet_excepthook


def creating_path(target: Path) -> Path:
    """Where a new run file is made before it is linked into place: beside the target, per process."""
    return target.with_name(f".{target.name}.create-{os.getpid()}.tmp")


def _link_into_place(tmp: Path, target: Path) -> None:
    """Give the complete new file `tmp` the name `target`, never over a file that appeared there
    meanwhile (a hard link fails on an existing name); `tmp` is then removed."""
    try:
        os.link(tmp, target)
    except FileExistsError:
        raise BadInput(f"{target} appeared while this run was being created; not replaced") from None
    except OSError:  # a file system without hard links: a rename, after the same check
        if target.exists() or target.is_symlink():
            raise BadInput(f"{target} appeared while this run was being created; not replaced") from None
        os.rename(tmp, target)
        return
    os.unlink(tmp)


def staging_path(target: Path) -> Path:
    """Where `train --force` writes until its first commit: beside the target, per process."""
    return target.with_name(f".{target.name}.force-{os.getpid()}.tmp")


def drop_sidecar(path: Path, run: Path) -> None:
    """Delete `path` if it is the analyses sidecar of `run` (never a run or a foreign file that
    happens to carry the name)."""
    if path.is_symlink():  # a link is removed, never followed
        path.unlink()
        return
    if not path.is_file():
        return
    try:
        with h5py.File(path, "r", locking=False) as f:
            fmt, owner = f.attrs.get("format"), f.attrs.get("run")
    except OSError:
        return
    fmt = fmt.decode() if isinstance(fmt, bytes) else fmt
    owner = owner.decode() if isinstance(owner, bytes) else owner
    if fmt == "groklens-analyses" and owner in (None, run.name):
        path.unlink(missing_ok=True)


_FALLOC_FL_KEEP_SIZE = 1
_fallocate = None


def reserve_space(fd: int, offset: int, length: int) -> bool | None:
    """Allocate disk blocks for bytes [offset, offset + length) of the file `fd` without changing
    its size (Linux fallocate, FALLOC_FL_KEEP_SIZE): later writes there cannot fail for want of
    space. True: reserved; False: the disk (or quota) has no room; None: not supported here."""
    import ctypes
    import ctypes.util
    import errno

    global _fallocate
    if _fallocate is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _fallocate = getattr(libc, "fallocate64", None) or libc.fallocate
            _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            _fallocate.restype = ctypes.c_int
        except (OSError, AttributeError):
            _fallocate = False
    if _fallocate is False:
        return None
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    return False if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else None


def release_reservation(fd: int) -> None:
    """Free the blocks reserved past the end of the file `fd` and never written: they outlive the
    process (a 3 MiB run kept 1.1 MiB of them), and a recovery's full copy on a nearly full disk
    then finds the room gone. Truncating to the file's own size frees them (ext4, tmpfs, XFS) and
    changes no byte of it."""
    try:
        os.ftruncate(fd, os.fstat(fd).st_size)
    except OSError:
        pass  # read-only or unsupported: the blocks stay, nothing is lost


def _check_space(path: Path, need: int, what: str) -> None:
    """RunFailure, before anything is written, when the disk or the file-size limit lacks `need` bytes."""
    import resource
    import shutil

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    free = shutil.disk_usage(path.parent).free
    if need > free or (soft != resource.RLIM_INFINITY and need > soft):
        where = f"the disk has {free >> 10} KiB free" if need > free else f"the file-size limit is {soft >> 10} KiB"
        raise RunFailure(f"{what} needs about {need >> 10} KiB; {where}")


def _check_creatable(path: Path) -> None:
    check_writable_dir(path.parent)


_ABANDONED: list = []  # files whose write failed, kept open until the process exits


def _abandon(f: h5py.File) -> None:
    hdf5_write_failed()
    _ABANDONED.append(f)


def _close_quietly(f: h5py.File) -> None:
    try:
        f.close()
    except Exception:  # noqa: BLE001 - after a failed write HDF5 may refuse to flush on close
        pass


def _room_or(exc: BaseException, message: str, path: Path, resume: bool = True) -> RunFailure:
    """A one-line RunFailure; a full disk or file-size limit is named as such."""
    import errno

    hdf5_write_failed()
    text = str(exc)
    full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or any(
        s in text for s in ("No space left", "File too large", "Disk quota", "errno = 27", "errno = 28"))
    if full:
        then = "`groklens train --resume` continues the run" if resume else "train again"
        return RunFailure(f"{path}: no room left on the disk or under the file-size limit ({message}); "
                          f"free space, then {then}")
    return RunFailure(message)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def config_json(cfg) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)
