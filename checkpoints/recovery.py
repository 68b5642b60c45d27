"""Make a trajectory clean again after its writer died, keeping every committed checkpoint.

A SIGKILLed SWMR writer leaves the file flagged as open for writing: ordinary opens refuse
it, SWMR reads still see every committed checkpoint. `recover()` copies what was committed
(checkpoints up to the last one, evaluation rows up to its step, the state slot holding it)
into a new file beside it and atomically replaces the original, so nothing committed is lost
and a crash during recovery leaves the original untouched.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from groklens.checkpoints import constants as C
from groklens.checkpoints.locking import writer_alive
from groklens.checkpoints.reader import open_trajectory_file
from groklens.errors import BadInput


def recover(path: str | Path) -> int:
    """Rewrite `path` holding only committed data; returns the last committed checkpoint step."""
    path = Path(path)
    if writer_alive(path):
        raise BadInput(f"{path} is being written by a live process; stop it before resuming")
    tmp = path.with_name(path.name + ".recover-tmp")
    tmp.unlink(missing_ok=True)
    with open_trajectory_file(path) as src:
        n = int(src[C.STEPS].shape[0])
        if n == 0:
            raise BadInput(f"{path}: no checkpoint was committed before the run stopped; train it again")
        steps = src[C.STEPS][:n]
        last = int(steps[-1])
        metric_steps = src[C.METRICS][C.METRICS_STEP][:]
        m = int(np.searchsorted(metric_steps, last, side="right"))
        slot_steps = src[C.STATE][C.STATE_STEP][:]
        slots = np.nonzero(slot_steps == last)[0]
        if len(slots) == 0:
            raise BadInput(f"{path}: damaged trajectory (no optimizer state for step {last})")
        try:
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
                g = dst.create_group(C.STATE, track_order=True)
                for name, ds in src[C.STATE].items():
                    g.create_dataset(name, data=ds[:])
                keep = np.full(2, -1, dtype=np.int64)
                keep[slots[0]] = last
                g[C.STATE_STEP][:] = keep
                dst.create_dataset(C.STATUS, data=np.array([b"interrupted"], dtype=f"S{C.STATUS_LENGTH}"))
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, path)
    return last


def _copy_truncated(ds: h5py.Dataset, parent: h5py.Group, name: str, count: int) -> None:
    """Copy the first `count` rows of a resizable dataset with its layout and filters."""
    out = parent.create_dataset(
        name, shape=(count, *ds.shape[1:]), maxshape=ds.maxshape, dtype=ds.dtype, chunks=ds.chunks,
        compression=ds.compression, compression_opts=ds.compression_opts, shuffle=ds.shuffle,
    )
    if count:
        out[:count] = ds[:count]
