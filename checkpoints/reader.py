"""Read a trajectory, also while it is written and after its writer was killed.

Every read opens the file in SWMR read mode and sees only committed checkpoints and rows:
n = len(/steps) checkpoints, m = len(metrics/step) evaluations. Opening per call keeps a
`Trajectory` object valid across a live run without explicit refreshes.
"""

from __future__ import annotations

import io
import math
import json
import os
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import h5py
import numpy as np

from groklens.checkpoints import constants as C
from groklens.checkpoints.integrity import DamagedDataset, is_verified, read
from groklens.checkpoints.locking import writer_alive
from groklens.checkpoints.validate import check_file, stored_extensions
from groklens.config import RunConfig, stored_dict
from groklens.errors import BadInput, require_pandas
from groklens.tasks import TaskData
from groklens.checkpoints.validate import link_problems
from groklens.checkpoints.constants import sidecar_path
from groklens.fileio import pid_alive

if TYPE_CHECKING:  # pragma: no cover
    import torch

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def open_trajectory_file(path: str | Path, validate: bool = True) -> h5py.File:
    """Open a trajectory read-only (SWMR), or raise BadInput saying what is wrong with it;
    `validate` also checks it against docs/FORMAT.md (checkpoints/validate.py)."""
    path = Path(path)
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if not path.is_file():
        raise BadInput(f"{path}: is a directory, not a trajectory file" if path.is_dir()
                       else f"{path}: not a regular file")
    with open(path, "rb") as fh:
        head = fh.read(8)
    if head != HDF5_SIGNATURE:
        raise BadInput(f"{path}: not an HDF5 file (empty or wrong format)" if head else f"{path}: empty file")
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as exc:
        msg = str(exc).splitlines()[0] if str(exc) else "unreadable"
        if "truncated file" in msg:  # opened only if everything it refers to is on disk
            f = _open_padded_copy(path)
        elif "already open for write" not in msg and "consistency flags" not in msg:
            raise BadInput(f"{path}: damaged or truncated HDF5 file ({msg})") from None
        else:
            # a live or killed SWMR writer: only a SWMR read opens it. A truncated file would make
            # the SWMR reader retry for a long time, so compare its size with the stored EOF first.
            _check_not_truncated(path)
            f = _open_swmr(path, path)
    try:
        _check_format(path, f)
        if validate:
            check_file(f, path)
    except BaseException:
        f.close()
        raise
    return f


def _open_padded_copy(path: Path) -> h5py.File:
    """A writer whose disk write failed (disk full, file-size limit) can leave the superblock's
    end-of-file address beyond the bytes that reached the disk. Everything committed lies before
    the failed write, so the file read as if padded with zeros up to that address shows every
    committed checkpoint. It is read through a view (no copy) whose superblock has its 'open for
    writing' flags cleared (checksum recomputed), so it opens without SWMR, whose reader would
    retry damaged metadata for many minutes; then every chunk the file refers to must lie within
    the bytes on disk, or the file was cut (a truncated copy of a killed run) and is refused
    rather than read as zeros."""
    real = path.stat().st_size
    with open(path, "rb") as fh:
        sb = bytearray(fh.read(48))
    if len(sb) < 48 or sb[8] not in (2, 3) or sb[9] != 8:
        raise BadInput(f"{path}: damaged or truncated HDF5 file (superblock unreadable)")
    stored_eof = int.from_bytes(sb[28:36], "little")
    sb[11] = 0
    sb[44:48] = lookup3(bytes(sb[:44])).to_bytes(4, "little")
    view = _PaddedView(path, bytes(sb), max(stored_eof, real))
    try:
        f = h5py.File(view, "r")
    except OSError as exc:
        view.close()
        raise BadInput(f"{path}: truncated HDF5 file ({real} of {stored_eof} bytes; {_first(exc)})") from None
    try:
        beyond = _data_beyond(f, real)
    except (OSError, RuntimeError, KeyError, ValueError):
        beyond = "its metadata is unreadable"
    if beyond:
        f.close()
        raise BadInput(f"{path}: truncated HDF5 file ({real} of {stored_eof} bytes; {beyond})")
    return f


class _PaddedView(io.RawIOBase):
    """Read-only file object: `path` with its first bytes replaced by `head`, zeros up to `size`."""

    def __init__(self, path: Path, head: bytes, size: int):
        self.fh = open(path, "rb")
        self.head, self.size, self.pos = head, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence] + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.size - self.pos))
        self.fh.seek(self.pos)
        got = self.fh.readinto(memoryview(buffer)[:n]) or 0
        buffer[got:n] = bytes(n - got)
        if self.pos < len(self.head):
            k = min(n, len(self.head) - self.pos)
            buffer[:k] = self.head[self.pos:self.pos + k]
        self.pos += n
        return n

    def close(self) -> None:
        self.fh.close()
        super().close()


def _data_beyond(f: h5py.File, size: int) -> str | None:
    """Where the file refers to data past its first `size` bytes, or None (chunk metadata only)."""
    found: list[str] = []

    def visit(name, obj):
        if found or not isinstance(obj, h5py.Dataset):
            return
        dsid = obj.id
        if obj.chunks is None:
            offset = dsid.get_offset()
            if offset is not None and offset + dsid.get_storage_size() > size:
                found.append(f"/{name} lies beyond the end")
            return
        for i in range(dsid.get_num_chunks()):
            info = dsid.get_chunk_info(i)
            if info.byte_offset + info.size > size:
                found.append(f"/{name} chunk {i} lies beyond the end")
                return

    f.visititems(visit)
    return found[0] if found else None


def _first(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & 0xFFFFFFFF


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 hashlittle: the checksum HDF5 keeps in a v2/v3 superblock."""
    M = 0xFFFFFFFF
    length = len(data)
    a = b = c = (0xDEADBEEF + length + initval) & M
    i = 0
    while length > 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & M
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & M
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & M
        a = (a - c) & M; a ^= _rot(c, 4); c = (c + b) & M  # noqa: E702 - the reference's mix()
        b = (b - a) & M; b ^= _rot(a, 6); a = (a + c) & M  # noqa: E702
        c = (c - b) & M; c ^= _rot(b, 8); b = (b + a) & M  # noqa: E702
        a = (a - c) & M; a ^= _rot(c, 16); c = (c + b) & M  # noqa: E702
        b = (b - a) & M; b ^= _rot(a, 19); a = (a + c) & M  # noqa: E702
        c = (c - b) & M; c ^= _rot(b, 4); b = (b + a) & M  # noqa: E702
        length -= 12
        i += 12
    if length == 0:
        return c
    tail = data[i:] + b"\0" * (12 - length)
    a = (a + int.from_bytes(tail[0:4], "little")) & M
    b = (b + int.from_bytes(tail[4:8], "little")) & M
    c = (c + int.from_bytes(tail[8:12], "little")) & M
    for x, y, k in (("c", "b", 14), ("a", "c", 11), ("b", "a", 25), ("c", "b", 16), ("a", "c", 4),
                    ("b", "a", 14), ("c", "b", 24)):  # the reference's final()
        v = {"a": a, "b": b, "c": c}
        v[x] = ((v[x] ^ v[y]) - _rot(v[y], k)) & M
        a, b, c = v["a"], v["b"], v["c"]
    return c


def _open_swmr(file: Path, path: Path) -> h5py.File:
    """A SWMR read of `file`; errors name the user's `path`."""
    try:
        return h5py.File(file, "r", libver="latest", swmr=True, locking=False)
    except OSError as exc:
        why = str(exc).splitlines()[0] if str(exc) else "unreadable"
        raise BadInput(f"{path}: damaged HDF5 file ({why})") from None


def _check_not_truncated(path: Path) -> None:
    """Superblock v2/v3 stores the end-of-file address at byte 28; a shorter file is truncated."""
    with open(path, "rb") as fh:
        sb = fh.read(48)
    if len(sb) < 36 or sb[8] not in (2, 3) or sb[9] != 8:
        raise BadInput(f"{path}: damaged or truncated HDF5 file (superblock unreadable)")
    stored_eof = int.from_bytes(sb[28:36], "little")
    if path.stat().st_size < stored_eof:
        raise BadInput(f"{path}: truncated HDF5 file ({path.stat().st_size} of {stored_eof} bytes)")


def _check_format(path: Path, f: h5py.File) -> None:
    try:
        links = link_problems(f)  # before anything is followed
        fmt = f.attrs.get(C.ATTR_FORMAT)
        version = f.attrs.get(C.ATTR_FORMAT_VERSION)
    except (OSError, KeyError, RuntimeError, ValueError, TypeError):
        raise BadInput(f"{path}: damaged HDF5 file (root attributes unreadable)") from None
    if links:
        raise BadInput(f"{path}: invalid trajectory: {links[0]}")
    if isinstance(fmt, bytes):
        fmt = fmt.decode(errors="replace")
    if fmt != C.FORMAT_NAME:
        raise BadInput(f"{path}: not a groklens trajectory (format attribute is {_shown(fmt)})")
    if isinstance(version, (bool, np.bool_)) or not isinstance(version, (int, np.integer)):
        raise BadInput(f"{path}: invalid trajectory: format_version is {_shown(version)}, not an integer")
    if int(version) > C.FORMAT_VERSION:
        raise BadInput(
            f"{path}: trajectory format version {version} is newer than this groklens reads "
            f"({C.FORMAT_VERSION}); upgrade groklens"
        )
    kinds = {C.STEPS: h5py.Dataset, C.PARAMS: h5py.Group, C.METRICS: h5py.Group, C.DATA: h5py.Group,
             C.STATE: h5py.Group}
    for key, kind in kinds.items():
        try:
            obj = f.get(key)
        except (OSError, RuntimeError):
            raise BadInput(f"{path}: damaged trajectory (cannot read /{key})") from None
        if obj is None:
            raise BadInput(f"{path}: damaged trajectory (missing /{key})")
        if not isinstance(obj, kind):
            raise BadInput(f"{path}: invalid trajectory: /{key} is a {type(obj).__name__.lower()}, not a "
                           f"{kind.__name__.lower()}")
    if f[C.STEPS].ndim != 1:
        raise BadInput(f"{path}: invalid trajectory: /{C.STEPS} is {list(f[C.STEPS].shape)}, not 1-D")
    try:  # parameters are plain float32 arrays with a row per committed checkpoint, nothing else
        n = f[C.STEPS].shape[0]
        groups = [(C.PARAMS, f[C.PARAMS])]
        if C.COPIES in f:  # copies 1..M-1 of a routed run: numbered groups with the same names
            if not isinstance(f[C.COPIES], h5py.Group):
                raise BadInput(f"{path}: invalid trajectory: /{C.COPIES} is not a group")
            names = set(f[C.PARAMS])
            keys = sorted(f[C.COPIES], key=lambda k: int(k) if k.isdigit() else -1)
            if keys != [str(m) for m in range(1, len(keys) + 1)]:
                raise BadInput(f"{path}: damaged trajectory (/{C.COPIES} must hold groups 1..M-1; has "
                               f"{_shown(keys)})")
            for key in keys:
                g = f[C.COPIES][key]
                if not isinstance(g, h5py.Group) or set(g) != names:
                    raise BadInput(f"{path}: damaged trajectory (/{C.COPIES}/{key} does not hold params/'s names)")
                groups.append((f"{C.COPIES}/{key}", g))
        for where, g in groups:
            for name, ds in g.items():
                if not isinstance(ds, h5py.Dataset) or ds.dtype != np.float32 or ds.ndim < 1 or ds.shape[0] < n:
                    raise BadInput(f"{path}: damaged trajectory ({where}/{name} is not float32 [n_checkpoints, ...])")
    except (OSError, RuntimeError):
        raise BadInput(f"{path}: damaged trajectory (cannot read /{C.PARAMS})") from None


def _shown(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """`text` with control characters (a newline in a crafted status) shown as spaces: one line."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


class Trajectory:
    """A run's checkpoint trajectory: config, steps, metrics, params, models and data.

    A routed run (routing_copies M > 1) holds M copies of the model. `copy=m` selects one:
    params, param_trajectory, model and param_names are then copy m's, and `metrics` shows copy
    m's columns (`copy<m>.test_acc`, ...) under the plain names (`test_acc`, ...), so every
    analysis runs on any copy. `copy=None` (the default) is the file as stored: copy 0's
    parameters, and the main metric columns, which are copy 0's too (docs/FORMAT.md).
    A single run has one copy, 0.
    """

    def __init__(self, path: str | Path, copy: int | None = None):
        if not isinstance(path, (str, os.PathLike)):
            raise BadInput(f"Trajectory(path): a path to a RUN.h5 (str or Path); got {_shown(path)}")
        self.path = Path(path)
        with self._open(validate=True) as f:  # validates the file now, not at first use
            self.n_copies = 1 + (len(f[C.COPIES]) if C.COPIES in f else 0)
        if copy is not None and (isinstance(copy, bool) or not isinstance(copy, (int, np.integer))
                                 or not 0 <= copy < self.n_copies):
            have = f"copies 0..{self.n_copies - 1}" if self.n_copies > 1 else "one copy, 0 (not a routed run)"
            raise BadInput(f"{self.path}: no copy {copy!r}; the run has {have}")
        self.copy = None if copy is None else int(copy)

    def _params_group(self, f: h5py.File) -> h5py.Group:
        return f[C.COPIES][str(self.copy)] if self.copy else f[C.PARAMS]

    @contextmanager
    def _open(self, validate: bool = False) -> Iterator[h5py.File]:
        f = open_trajectory_file(self.path, validate=validate)
        try:
            yield f
        except DamagedDataset as exc:
            raise BadInput(f"{self.path}: damaged trajectory: {exc}") from None
        except (OSError, RuntimeError, KeyError) as exc:
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise BadInput(f"{self.path}: damaged trajectory ({msg})") from None
        finally:
            f.close()

    # ------------------------------------------------------------------ metadata
    @cached_property
    def config_dict(self) -> dict:
        with self._open() as f:
            raw = f.attrs[C.ATTR_CONFIG]
        try:
            data = json.loads(raw)
        except (TypeError, ValueError):
            raise BadInput(f"{self.path}: damaged trajectory (stored config is not JSON)") from None

        # an older file's missing keys read as that file meant them; a raised cap is the last extension's
        cfg = stored_dict(data)
        extensions = self.extensions
        return {**cfg, "steps": extensions[-1]["steps"]} if extensions and isinstance(cfg, dict) else cfg

    @cached_property
    def extensions(self) -> list[dict]:
        """The step-cap extensions of the run (`train --resume RUN --steps N`), oldest first:
        {steps, from_steps, at_step, groklens_version, when}; [] for a run trained to its first cap."""
        with self._open() as f:
            try:
                return stored_extensions(f)
            except BadInput as exc:
                raise BadInput(f"{self.path}: invalid trajectory: {exc}") from None

    @cached_property
    def config(self) -> "RunConfig":
        return RunConfig.from_dict(self.config_dict)

    @property
    def steps(self) -> np.ndarray:
        with self._open() as f:
            return read(f[C.STEPS])

    @property
    def metrics(self) -> dict[str, np.ndarray]:
        """Committed evaluation rows: metric name -> array (metrics['step'] are the steps)."""
        with self._open() as f:
            g = f[C.METRICS]
            m = g[C.METRICS_STEP].shape[0]
            out = {C.METRICS_STEP: read(g[C.METRICS_STEP], slice(0, m))}
            for name in g:
                if name != C.METRICS_STEP:
                    out[name] = read(g[name], slice(0, m))
        if self.copy is not None:  # copy m's columns under the plain names
            prefix = f"copy{self.copy}."
            out.update({k[len(prefix):]: v for k, v in list(out.items()) if k.startswith(prefix)})
        return out

    @property
    def status(self) -> str:
        """The stored status, on one line (a crafted one cannot inject lines into `info`)."""
        with self._open() as f:
            ds = f.get(C.STATUS)
            if not isinstance(ds, h5py.Dataset) or ds.shape != (1,) or ds.dtype.kind != "S":
                raise BadInput(f"{self.path}: invalid trajectory: /{C.STATUS} is not one fixed-length byte string")
            return printable(read(ds, 0).split(b"\0", 1)[0].decode(errors="replace"))

    @property
    def cpu_seconds(self) -> float | None:
        """The process CPU time its training took (all threads, resumes added up), None where not
        recorded (files from before it was kept, or a value that is not one finite number)."""
        with self._open() as f:
            ds = f.get(C.CPU_SECONDS)
            if not isinstance(ds, h5py.Dataset) or ds.shape != (1,) or ds.dtype.kind != "f":
                return None
            value = float(read(ds, 0))
            return value if math.isfinite(value) and value >= 0 else None

    @property
    def verified(self) -> bool:
        """Every dataset carries a checksum that each read checks (format 1.3 and later); False
        for a file of an earlier format, whose stored bits nothing checks."""
        with self._open() as f:
            return is_verified(f)

    @property
    def is_live(self) -> bool:
        """A trainer process is writing this file right now."""
        return writer_alive(self.path)

    @property
    def param_names(self) -> list[str]:
        with self._open() as f:
            return list(self._params_group(f))

    # ------------------------------------------------------------------ parameters and models
    def checkpoint_index(self, step: int) -> int:
        step = self._step(step)
        steps = self.steps
        hits = np.nonzero(steps == step)[0]
        if len(hits) == 0:
            where = f"{steps[0]}..{steps[-1]} ({len(steps)} checkpoints)" if len(steps) else "none yet"
            raise BadInput(f"{self.path}: no checkpoint at step {step}; checkpoints: {where}")
        return int(hits[0])

    def _step(self, step) -> int:
        """A checkpoint step as given: an int, never a float or string (300.5 or "300" would
        otherwise read as checkpoint 300) nor a bool."""
        if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
            raise BadInput(f"{self.path}: a checkpoint step is an int (one of Trajectory.steps); got {_shown(step)}")
        return int(step)

    def params(self, step: int) -> dict[str, "torch.Tensor"]:
        import torch

        i = self.checkpoint_index(step)
        with self._open() as f:
            out = {name: torch.from_numpy(read(ds, i)) for name, ds in self._params_group(f).items()}
        bad = next((name for name, t in out.items() if not torch.isfinite(t).all()), None)
        if bad is not None:  # the trainer stops before storing a non-finite step: the file is damaged
            raise BadInput(f"{self.path}: invalid trajectory: {bad} at step {step} is not finite")
        return out

    def state(self, step: int) -> dict[str, np.ndarray]:
        """The optimizer, regularizer and RNG state stored with checkpoint `step` (the latest
        checkpoint always has it): all an exact resume needs."""
        with self._open() as f:
            g = f[C.STATE]
            slots = np.nonzero(read(g[C.STATE_STEP]) == self._step(step))[0]
            if len(slots) == 0:
                raise BadInput(f"{self.path}: no optimizer state stored for step {step}")
            return {name: read(ds, int(slots[0])) for name, ds in g.items() if name != C.STATE_STEP}

    def param_trajectory(self, name: str) -> np.ndarray:
        """One parameter at every committed checkpoint: [n_checkpoints, *shape]."""
        with self._open() as f:
            n = f[C.STEPS].shape[0]
            g = self._params_group(f)
            if name not in g:
                raise BadInput(f"{self.path}: no parameter {name!r} (have: {', '.join(g)})")
            return read(g[name], slice(0, n))

    def to_pandas(self):
        """The metrics as a pandas DataFrame: one row per evaluation, columns `step` and every
        logged metric (pandas is an optional extra). A stored analysis as a DataFrame:
        groklens.analyses.to_pandas(run, NAME)."""
        pd = require_pandas()
        metrics = self.metrics
        cols = {C.METRICS_STEP: np.asarray(metrics[C.METRICS_STEP], dtype=np.int64)}
        cols.update({k: np.asarray(v, dtype=float) for k, v in metrics.items() if k != C.METRICS_STEP})
        return pd.DataFrame(cols)

    def model(self, step: int, device: str = "cpu"):
        """The model at `step`, ready: a HookedRootModule in eval mode on `device`."""
        from groklens.models import build_model

        params = self.params(step)
        model = build_model(self.config, self.dataset())
        try:
            model.load_state_dict(params, strict=True)
        except RuntimeError as exc:  # names or shapes that are not the configured model's
            first = " ".join(str(exc).split("\n", 2)[1:2]).strip() or str(exc).splitlines()[0]
            raise BadInput(f"{self.path}: invalid trajectory: the parameters do not fit the configured model "
                           f"({first})") from None
        return model.to(device).eval()

    def dataset(self) -> "TaskData":
        """The exact inputs, labels and split the run trained on (from the file, not regenerated)."""
        import torch

        with self._open() as f:
            g = f[C.DATA]
            arrays = {name: read(g[name]) for name in g}
            attrs = {k: int(g.attrs[k]) for k in ("readout_pos", "d_vocab", "d_vocab_out")}  # others: ignored
        return TaskData(
            inputs=torch.from_numpy(arrays["inputs"]).long(),
            labels=torch.from_numpy(arrays["labels"]).long(),
            train_idx=torch.from_numpy(arrays["train_idx"]).long(),
            test_idx=torch.from_numpy(arrays["test_idx"]).long(),
            readout_pos=attrs["readout_pos"],
            informative_mask=torch.from_numpy(arrays["informative_mask"]).bool(),
            d_vocab=attrs["d_vocab"],
            d_vocab_out=attrs["d_vocab_out"],
        )


def stale_temporaries(run: Path) -> list[str]:
    """Names of temporary files beside `run` left by killed writers (a --force staging file, a
    new file being created, a recovery copy, a sidecar commit) whose process is gone."""
    run = Path(run)
    kinds = [(f".{run.name}.force-", ".tmp"), (f".{run.name}.create-", ".tmp"), (f"{run.name}.recover-tmp-", ""),
             (f"{sidecar_path(run).name}.tmp-", "")]
    try:
        names = [p.name for p in run.parent.iterdir()]  # one listing, however many runs share the directory
    except OSError:
        return []
    found = []
    for name in names:
        for prefix, suffix in kinds:
            pid = name[len(prefix):len(name) - len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else ""
            if pid.isdigit() and not pid_alive(int(pid)):
                found.append(printable(name))
    return sorted(found)

