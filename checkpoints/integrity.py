"""Stored bits are checked: every dataset of a trajectory carries HDF5's Fletcher32 checksum.

Since format 1.3 the writer creates every dataset chunked with the Fletcher32 filter and marks
the file with the root attribute `integrity = "fletcher32"`. HDF5 recomputes a chunk's checksum
whenever the chunk is written (an appended checkpoint or metric row included, so it works with
SWMR appends) and checks it on every read; a flipped bit makes the read fail. Here that failure
becomes one line naming the dataset. Files without the attribute (formats before 1.3) are read
as before and reported unverified. HDF5's own metadata (object headers, chunk indices, the
superblock) carries checksums in the format the writer uses (libver "latest").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from groklens.checkpoints import constants as C

if TYPE_CHECKING:  # pragma: no cover
    import h5py
    import numpy as np

# a live writer rewrites the chunk holding the newest metric row in place: a SWMR reader can catch
# it half written, so a failed read of a live file is retried after a pause before it counts
RETRIES = 3
RETRY_PAUSE_S = 0.05


class DamagedDataset(OSError):
    """A dataset whose stored bytes fail their checksum; the message names it."""

    def __init__(self, name: str):
        super().__init__(f"{name} fails its Fletcher32 checksum: its stored bytes changed "
                         "(a flipped bit or a damaged disk)")
        self.dataset = name


def read(ds: "h5py.Dataset", selection=()) -> "np.ndarray":
    """`ds[selection]`, or DamagedDataset naming `ds` when its stored bytes fail their checksum."""
    for attempt in range(RETRIES):
        try:
            return ds[selection]
        except OSError as exc:
            if not _checksum_failed(exc):
                raise
            if not ds.file.swmr_mode or attempt == RETRIES - 1:
                raise DamagedDataset(ds.name) from None
            time.sleep(RETRY_PAUSE_S)
            ds.refresh()
    raise AssertionError("unreachable")  # pragma: no cover


def _checksum_failed(exc: OSError) -> bool:
    """HDF5 reports a failed Fletcher32 check (or an undecodable chunk) as a failing filter."""
    return "filter returned failure" in str(exc) or "data error detected" in str(exc)


def is_verified(f: "h5py.File") -> bool:
    """The file says every dataset carries a checksum (format 1.3 and later)."""
    value = f.attrs.get(C.ATTR_INTEGRITY)
    return (value.decode(errors="replace") if isinstance(value, bytes) else value) == C.INTEGRITY_FLETCHER32


def datasets(f: "h5py.File") -> list["h5py.Dataset"]:
    """Every dataset of the file, in a fixed order."""
    import h5py

    found: list[h5py.Dataset] = []
    f.visititems(lambda _name, obj: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
    return found


def integrity_problems(f: "h5py.File") -> list[str]:
    """In a file that says it is checksummed, a dataset without the checksum was written by
    something else (a checksum dropped, so that edited bytes would read as valid)."""
    if not is_verified(f):
        return []
    return [f"{ds.name} carries no Fletcher32 checksum, though the file says every dataset does"
            for ds in datasets(f) if not ds.fletcher32][:1]


def verify_all(f: "h5py.File") -> None:
    """Read every committed byte, a chunk at a time (DamagedDataset at the first dataset that fails
    its checksum): what `--resume` does before it writes anything. Committed: the checkpoints
    /steps counts, the evaluation rows /metrics/step counts, and the state slot of the last
    checkpoint; a killed writer's uncommitted row or slot is what recovery drops, not damage."""
    n = int(f[C.STEPS].shape[0])
    m = int(f[C.METRICS][C.METRICS_STEP].shape[0])
    last = int(read(f[C.STEPS], n - 1)) if n else None
    slots = [i for i, s in enumerate(read(f[C.STATE][C.STATE_STEP])) if s == last]
    for ds in datasets(f):
        top = ds.name.split("/")[1]
        if top in (C.PARAMS, C.COPIES):
            _read_rows(ds, n)
        elif top == C.METRICS:
            _read_rows(ds, m)
        elif top == C.STATE and ds.name != f"/{C.STATE}/{C.STATE_STEP}":
            for slot in slots:
                read(ds, slot)
        else:
            read(ds)


def _read_rows(ds: "h5py.Dataset", count: int) -> None:
    rows = ds.chunks[0] if ds.chunks else max(count, 1)
    for start in range(0, min(count, ds.shape[0]), rows):
        read(ds, slice(start, min(start + rows, count)))
