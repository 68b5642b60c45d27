"""Write a trajectory: one HDF5 file per run, single writer / many readers (SWMR).

Commit protocol (docs/FORMAT.md): every dataset exists before SWMR starts (readers cannot
see groups created later). A checkpoint writes params/<name>[n] and its state slot, flushes,
then appends its step to /steps and flushes again: the length of /steps is the commit marker.
Evaluation rows are committed the same way by metrics/step. A writer killed at any moment
leaves every committed checkpoint readable; `recover()` copies them into a clean file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Mapping, Sequence

import h5py
import numpy as np

from groklens import __version__
from groklens.checkpoints import constants as C
from groklens.checkpoints.locking import WriterLock
from groklens.errors import BadInput, RunFailure

# gzip level 1 + shuffle: float32 weights barely compress, so keep the cost of writing low
PARAM_COMPRESSION = {"compression": "gzip", "compression_opts": 1, "shuffle": True}
METRIC_CHUNK = 256


class TrajectoryWriter:
    """Appends checkpoints and evaluation rows to one trajectory file."""

    def __init__(self, f: h5py.File, lock: WriterLock):
        self.f = f
        self.lock = lock
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
    ) -> "TrajectoryWriter":
        """Create a new file holding no checkpoint yet; the caller refuses existing paths.
        `copies`: the parameters of copies 1..M-1 of a routed run (`params` is copy 0)."""
        path = Path(path)
        f = h5py.File(path, "w-", libver="latest")
        try:
            f.attrs[C.ATTR_FORMAT] = C.FORMAT_NAME
            f.attrs[C.ATTR_FORMAT_VERSION] = C.FORMAT_VERSION
            f.attrs[C.ATTR_GROKLENS_VERSION] = __version__
            f.attrs[C.ATTR_CONFIG] = config_json
            f.attrs[C.ATTR_CREATED] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            g = f.create_group(C.DATA)
            for name, arr in data.items():
                g.create_dataset(name, data=arr)
            for name, value in data_attrs.items():
                g.attrs[name] = value
            f.create_dataset(C.STEPS, shape=(0,), maxshape=(None,), dtype="int64", chunks=(METRIC_CHUNK,))
            _create_params(f.create_group(C.PARAMS, track_order=True), params)
            if copies:
                g = f.create_group(C.COPIES, track_order=True)
                for m, copy_params in enumerate(copies, start=1):
                    _create_params(g.create_group(str(m), track_order=True), copy_params)
            g = f.create_group(C.METRICS, track_order=True)
            g.create_dataset(C.METRICS_STEP, shape=(0,), maxshape=(None,), dtype="int64", chunks=(METRIC_CHUNK,))
            for name in metric_names:
                if name == C.METRICS_STEP:
                    continue
                g.create_dataset(name, shape=(0,), maxshape=(None,), dtype="float64", chunks=(METRIC_CHUNK,))
            g = f.create_group(C.STATE, track_order=True)
            g.create_dataset(C.STATE_STEP, data=np.full(2, -1, dtype=np.int64))
            for name, arr in state.items():
                g.create_dataset(name, shape=(2, *arr.shape), dtype=arr.dtype)
            f.create_dataset(C.STATUS, data=np.array([b"running"], dtype=f"S{C.STATUS_LENGTH}"))
            f.flush()
            f.swmr_mode = True
            lock = WriterLock(path)
        except BaseException:
            f.close()
            path.unlink(missing_ok=True)  # never leave a half-made file behind
            raise
        return cls(f, lock)

    @classmethod
    def reopen(cls, path: str | Path) -> "TrajectoryWriter":
        """Open a clean (recovered) file to append to, in SWMR mode."""
        try:
            lock = WriterLock(path)
        except OSError:
            raise BadInput(f"{path} is being written by another process") from None
        try:
            f = h5py.File(path, "r+", libver="latest")
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
            raise RunFailure(f"writing checkpoint at step {step} failed: {_first_line(exc)}") from None
        self.n_checkpoints = n + 1

    def write_eval(self, row: Mapping[str, float]) -> None:
        """Append one evaluation row; `row` holds 'step' and every metric name given at creation."""
        m = self.n_evals
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
            raise RunFailure(f"writing evaluation at step {row['step']} failed: {_first_line(exc)}") from None
        self.n_evals = m + 1

    def _check_room(self, step: int, nbytes: int) -> None:
        """Stop cleanly before a checkpoint that the disk or the file-size limit cannot take:
        a failed HDF5 write leaves the file needing repair, a refused one leaves it clean."""
        import resource
        import shutil

        path = Path(self.f.filename)
        need = 2 * nbytes + (64 << 10)  # uncompressed worst case, twice, plus metadata slack
        size = path.stat().st_size
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        free = shutil.disk_usage(path.parent).free
        if (soft != resource.RLIM_INFINITY and size + need > soft) or need > free:
            where = "the file-size limit" if soft != resource.RLIM_INFINITY and size + need > soft else "the disk"
            raise RunFailure(
                f"not enough room on {where} for the checkpoint at step {step} (~{need >> 10} KiB); "
                f"the run is kept up to its last checkpoint: free space, then `groklens train --resume {path}`"
            )

    def set_status(self, text: str) -> None:
        if self.failed:
            return
        raw = text.encode()[: C.STATUS_LENGTH]
        try:
            self.f[C.STATUS][0] = raw
            self.f.flush()
        except (OSError, RuntimeError):
            self.failed = True  # the status is advisory; the commit markers are what count

    def close(self, status: str | None = None) -> None:
        if self.f:
            if status is not None:
                self.set_status(status)
            try:
                self.f.close()
            except (OSError, RuntimeError):
                pass
        self.lock.release()


def _create_params(g: h5py.Group, params: Mapping[str, np.ndarray]) -> None:
    for name, arr in params.items():
        g.create_dataset(name, shape=(0, *arr.shape), maxshape=(None, *arr.shape),
                         dtype="float32", chunks=(1, *arr.shape) if arr.shape else (1,),
                         **(PARAM_COMPRESSION if arr.size > 1 else {}))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def config_json(cfg) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)
