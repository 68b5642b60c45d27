"""Make a trajectory clean again after its writer died, keeping every committed checkpoint.

A SIGKILLed SWMR writer leaves the file flagged as open for writing: ordinary opens refuse
it, SWMR reads still see every committed checkpoint. `recover()` copies what was committed
(checkpoints up to the last one, evaluation rows up to its step, the state slot holding it)
into a new file beside it (RUN.h5.recover-tmp-<pid>) and atomically replaces the original, so nothing committed is lost
and a crash during recovery leaves the original untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from groklens.checkpoints import constants as C
from groklens.checkpoints.locking import WriterLock, describe_holder
from groklens.checkpoints.reader import Trajectory, open_trajectory_file
from groklens.checkpoints.validate import InvalidTrajectory, model_problems
from groklens.checkpoints.integrity import DamagedDataset, is_verified, read, verify_all
from groklens.checkpoints.writer import create_state, hdf5_write_failed, release_reservation
from groklens.errors import BadInput, RunFailure
from groklens.checkpoints.locking import not_writable


def recover(path: str | Path) -> int:
    """Rewrite `path` holding only committed data; returns the last committed checkpoint step.

    The writer lock is held on the file while it is copied, so a second `--resume` of the same
    run is refused with one line instead of racing this one; the copy goes to a temporary name
    of this process, which is removed on any failure (a full disk included)."""
    path = Path(path)
    lock = _lock(path)
    tmp = path.with_name(f"{path.name}.recover-tmp-{os.getpid()}")
    try:
        _remove_stale(path)
        _check_model(path)  # bad input (a flipped bit included) is refused before anything is written
        release_reservation(lock.fd)  # a killed writer's unused reservation would take the copy's room
        with open_trajectory_file(path) as src:
            last, m, slot = _committed(path, src)
            _check_room(path, tmp)
            try:
                _write_copy(src, tmp, last, m, slot)
            except BaseException as exc:
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass
                if isinstance(exc, (OSError, RuntimeError)):
                    hdf5_write_failed()
                    raise RunFailure(f"recovering {path} failed ({_first_line(exc)}); the file is as it was: "
                                     f"free space (a full copy, {_size(path)}), then resume again") from None
                raise
        os.replace(tmp, path)
    finally:
        lock.release()
    return last


def _check_model(path: Path) -> None:
    """Every committed byte must match its checksum, and the stored parameters must be those of
    the model the stored config builds."""
    traj = Trajectory(path)
    _verify(path)
    with open_trajectory_file(path, validate=False) as f:
        groups = [(f"/{C.PARAMS}", f[C.PARAMS])] + [(f"/{C.COPIES}/{k}", g) for k, g in f.get(C.COPIES, {}).items()]
        shapes = [(where, {name: ds.shape[1:] for name, ds in g.items()}) for where, g in groups]
        n = f[C.STEPS].shape[0]
        for where, g in groups:  # the checkpoint the run continues from must be finite
            bad = next((name for name, ds in g.items() if n and not np.isfinite(read(ds, n - 1)).all()), None)
            if bad is not None:
                raise InvalidTrajectory(path, [f"{where}/{bad} at the last checkpoint is not finite"])
    data = traj.dataset()
    for where, stored in shapes:
        problems = model_problems(traj.config, data, stored, where)
        if problems:
            raise InvalidTrajectory(path, problems)


check_parameters = _check_model  # for callers that load a checkpoint before recovering (train.resume)


def _lock(path: Path) -> WriterLock:
    """The writer lock on the file now at `path`: refused while a trainer or another recovery
    holds it; retried when `path` was replaced (by a recovery that just finished) meanwhile."""
    for _ in range(5):
        try:
            lock = WriterLock(path)
        except FileNotFoundError:
            raise BadInput(f"{path}: no such file") from None
        except OSError as exc:
            if not_writable(exc):
                raise BadInput(f"cannot write {path} ({exc.strerror}); nothing was changed") from None
            raise BadInput(f"{path} is being written or recovered by a live process "
                           f"({describe_holder(path)}); stop it before resuming") from None
        try:
            if os.stat(path).st_ino == os.fstat(lock.fd).st_ino:
                return lock
        except FileNotFoundError:
            pass
        lock.release()
    raise BadInput(f"{path} keeps being replaced by another process; try again")


def _remove_stale(path: Path) -> None:
    """Temporary copies left by recoveries whose process is gone."""
    for tmp in path.parent.glob(path.name + ".recover-tmp*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _alive(int(pid)):
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _committed(path: Path, src: h5py.File) -> tuple[int, int, int]:
    """(last committed checkpoint step, evaluation rows up to it, the state slot holding it)."""
    n = int(src[C.STEPS].shape[0])
    if n == 0:
        raise BadInput(f"{path}: no checkpoint was committed before the run stopped; train it again")
    last = int(src[C.STEPS][n - 1])
    metric_steps = src[C.METRICS][C.METRICS_STEP][:]
    m = int(np.searchsorted(metric_steps, last, side="right"))
    slots = np.nonzero(src[C.STATE][C.STATE_STEP][:] == last)[0]
    if len(slots) == 0:
        raise BadInput(f"{path}: damaged trajectory (no optimizer state for step {last})")
    return last, m, int(slots[0])


def _verify(path: Path) -> None:
    """Every committed byte read against its checksum (BadInput naming the damaged dataset)."""
    try:
        with open_trajectory_file(path) as src:
            verify_all(src)
    except DamagedDataset as exc:
        raise InvalidTrajectory(path, [f"{exc}; nothing was changed"]) from None


def _check_room(path: Path, tmp: Path) -> None:
    """The copy needs about as much room as the file itself: refuse up front when it is not there."""
    import resource
    import shutil

    need = path.stat().st_size + (64 << 10)
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    free = shutil.disk_usage(path.parent).free
    if need > free or (soft != resource.RLIM_INFINITY and need > soft):
        where = "on the disk" if need > free else "under the file-size limit"
        raise RunFailure(f"recovering {path} needs room for a full copy ({_size(path)} plus 64 KiB) {where}; "
                         f"the file is as it was: free space, then resume again")


def _write_copy(src: h5py.File, tmp: Path, last: int, m: int, slot: int) -> None:
    n = int(np.searchsorted(src[C.STEPS][:], last, side="right"))
    with h5py.File(tmp, "w-", libver="latest") as dst:
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        src.copy(src[C.DATA], dst, name=C.DATA)
        _copy_truncated(src[C.STEPS], dst, C.STEPS, n)
        for group, count in ((C.PARAMS, n), (C.METRICS, m)):
            g = dst.create_group(group, track_order=True)
            for name, ds in src[group].items():
                _copy_truncated(ds, g, name, count)
        if C.COPIES in src:  # copies 1..M-1 of a routed run
            copies = dst.create_group(C.COPIES, track_order=True)
            for key, src_copy in src[C.COPIES].items():
                g = copies.create_group(key, track_order=True)
                for name, ds in src_copy.items():
                    _copy_truncated(ds, g, name, n)
        # only the slot of the last checkpoint is kept (the other may be a torn, uncommitted write)
        kept = {name: read(ds, slot) for name, ds in src[C.STATE].items() if name != C.STATE_STEP}
        checksum = is_verified(src)  # a legacy file stays one: its bytes were never checked
        g = dst.create_group(C.STATE, track_order=True)
        create_state(g, kept, checksum=checksum)
        for name, arr in kept.items():
            g[name][slot] = arr
        keep = np.full(2, -1, dtype=np.int64)
        keep[slot] = last
        g[C.STATE_STEP][:] = keep
        filters = {"chunks": (1,), "fletcher32": True} if checksum else {}
        dst.create_dataset(C.STATUS, data=np.array([b"interrupted"], dtype=f"S{C.STATUS_LENGTH}"), **filters)
        # as last written (it counts work since the last checkpoint)
        if isinstance(src.get(C.CPU_SECONDS), h5py.Dataset):
            dst.create_dataset(C.CPU_SECONDS, data=read(src[C.CPU_SECONDS]), **filters)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())


def _size(path: Path) -> str:
    size = path.stat().st_size
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.0f} KiB"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _copy_truncated(ds: h5py.Dataset, parent: h5py.Group, name: str, count: int) -> None:
    """Copy the first `count` rows of a resizable dataset with its layout and filters."""
    out = parent.create_dataset(
        name, shape=(count, *ds.shape[1:]), maxshape=ds.maxshape, dtype=ds.dtype, chunks=ds.chunks,
        compression=ds.compression, compression_opts=ds.compression_opts, shuffle=ds.shuffle,
        fletcher32=ds.fletcher32,
    )
    if count:
        out[:count] = read(ds, slice(0, count))
