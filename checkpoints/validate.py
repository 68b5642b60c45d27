"""One validation of a trajectory file against docs/FORMAT.md, and the resource check of a config.

`file_problems(f, path)` checks what can be checked cheaply, from metadata and small datasets,
without importing torch or reading parameters: the config (through RunConfig), the format
version's type, /steps and /metrics/step (1-D integers, strictly increasing), every metric
series (1-D floats, as long as metrics/step), the data (shapes, integer dtypes, index and token
ranges, attributes) and every parameter dataset (float32, a row per committed checkpoint, the
same names in every copy). `model_problems(traj)` adds what needs the model the config builds
(parameter names and shapes, on torch's meta device: no memory is allocated); readers that load
parameters run it. Every reader opens files through `reader.open_trajectory_file`, which runs
`file_problems`; a file with a problem is bad input (exit 2, one line naming the file and the
first problem), and `groklens info --json` lists them all.

`check_resources(cfg)` estimates from the config alone what a run would hold in memory (the
task's inputs, the model's parameters and optimizer state, the activations of one training step
and of the evaluation batch (on the device the run trains on: an accelerator's memory is its
own), the checkpoint schedule and the evaluation series) and refuses (BadInput) what exceeds 80%
of the memory that holds it, before anything is allocated or created.

Stored facts are checked against each other (issue 29): the data's shapes, vocabulary and readout
position against what the stored config's task has (before any data is read), the split indices
(distinct, in range, disjoint, covering the inputs), the copies group against routing_copies, and
the config against its checksum (`config_sha256`, written since format 1.1; a file without one is
read as a legacy file). Links to other files or other objects, virtual datasets and external
storage are refused before anything is followed (`link_problems`), and no dataset is read whose
size a crafted file could make unbounded (series longer than MAX_ROWS are refused from their shape).

Stored values are checked against what they can be (issue 46): every dataset read here goes
through `integrity.read` (a Fletcher32 failure names the dataset), metric series lie in their
range (`metric_range`), checkpoint steps end at most at the config's `steps`, and /data equals what
the stored config rebuilds (`Task.arrays`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from groklens.checkpoints import constants as C
from groklens.checkpoints.integrity import DamagedDataset, integrity_problems, read
from groklens.config import RunConfig, stored_dict
from groklens.errors import BadInput
from groklens.tasks import TASKS

if TYPE_CHECKING:  # pragma: no cover
    import h5py

MEMORY_SHARE = 0.8  # a run may plan for at most this share of the machine's memory
ACTIVATIONS = ("activations of one training step", "activations of the evaluation batch")
MAX_CONFIG_BYTES = 1 << 20  # a stored config is a few KiB; anything near this is not one of ours
DATA_SCAN_LIMIT = 1 << 26  # token/index range checks read at most this many values per dataset
MAX_ROWS = 1 << 24  # checkpoints or evaluations of one run: 16M (a run has thousands)
MAX_OBJECTS = 100_000  # groups and datasets of one file (64 copies of a deep model have a few thousand)
SPLIT_CHECK_LIMIT = 1 << 26  # split indices are checked for duplicates up to this many inputs
ACCURACY = (0.0, 1.0)  # the range of an accuracy series (a share of inputs)
REBUILD_LIMIT = 1 << 22  # stored task data is compared with the config's rebuild up to this many inputs


# ---------------------------------------------------------------------- checked once per content
# (check name, file identity) of the files a check found clean in this process: a file opened again
# unchanged is not walked again (a report opened each run's files about 150 times, a walk each)
_CLEAN: set[tuple] = set()
_CLEAN_MAX = 4096
# a file changed this recently may change again within one tick of its timestamps: not remembered
_RACY_NS = 200_000_000


def _identity(f: "h5py.File") -> tuple | None:
    """What tells a file's content apart here: device, inode, size, modification and change times
    (a write or a touch moves the change time, which no one can set back). None for a file open
    for writing, or not opened from a path (a padded view of a damaged file)."""
    try:
        if f.mode != "r" or f.driver != "sec2":
            return None
        st = os.stat(f.filename)
    except (OSError, TypeError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def clean_once(name: str, f: "h5py.File", check: Callable[[], list | None]) -> list:
    """check()'s problems with `f` (it returns them, or raises; None is none); a clean result is
    remembered for this content of the file, so the same unchanged file is found clean again
    without the walk."""
    key = _identity(f)
    if key is not None and (name, key) in _CLEAN:
        return []
    started = time.time_ns()
    problems = check() or []
    if not problems and key is not None and started - key[3] > _RACY_NS and _identity(f) == key:
        if len(_CLEAN) >= _CLEAN_MAX:
            _CLEAN.clear()
        _CLEAN.add((name, key))
    return problems


# ---------------------------------------------------------------------- the file
class InvalidTrajectory(BadInput):
    """A trajectory that does not match docs/FORMAT.md: the message names the first problem."""

    def __init__(self, path, problems: list[str]):
        more = f" (and {len(problems) - 1} more; `groklens info --json` lists them)" if len(problems) > 1 else ""
        super().__init__(f"{path}: invalid trajectory: {problems[0]}{more}")
        self.path = str(path)
        self.problems = problems


def check_file(f: "h5py.File", path) -> None:
    """Raise InvalidTrajectory when `f` has a problem (a read failing inside HDF5 is one)."""
    try:
        problems = file_problems(f, path)
    except DamagedDataset as exc:  # one line naming the dataset whose stored bytes changed
        problems = [str(exc)]
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        problems = [f"unreadable ({_short(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)})"]
    if problems:
        raise InvalidTrajectory(path, problems)


def file_problems(f: "h5py.File", path: Path | str) -> list[str]:
    """Every problem found cheaply in an open trajectory (an empty list: valid)."""
    return clean_once("trajectory", f, lambda: _file_problems(f, path))


def _file_problems(f: "h5py.File", path: Path | str) -> list[str]:
    problems = link_problems(f)
    if problems:  # nothing past a link is read
        return problems
    version = f.attrs.get(C.ATTR_FORMAT_VERSION)
    if not isinstance(version, (int, np.integer)) or isinstance(version, (bool, np.bool_)):
        problems.append(f"format_version is {_short(repr(version), 60)}, not an integer")
    cfg = _config(f, problems)
    n = _steps(f, C.STEPS, "/steps", problems, cfg)
    _metrics(f, problems, cfg)
    _data(f, cfg, problems)
    _params(f, n, problems)
    _copies_match(f, cfg, problems)
    _state(f, problems)
    _status(f, problems)
    _cpu_seconds(f)
    problems += integrity_problems(f)  # last: a crafted dataset's own problem is the one to name
    return problems


def link_problems(f: "h5py.File") -> list[str]:
    """Soft and external links, virtual datasets and datasets with external storage: a groklens
    writer makes none, and following one would read another object or another file."""
    return clean_once("links", f, lambda: _link_problems(f))


def _link_problems(f: "h5py.File") -> list[str]:
    import h5py

    problems: list[str] = []
    stack = [("", f)]
    seen = 0
    while stack and not problems:
        where, g = stack.pop()
        for name in g:
            seen += 1
            if seen > MAX_OBJECTS:
                return [f"the file holds more than {MAX_OBJECTS} objects"]
            link = g.get(name, getlink=True)
            full = f"{where}/{name}"
            if isinstance(link, (h5py.ExternalLink, h5py.SoftLink)):
                kind = "an external link" if isinstance(link, h5py.ExternalLink) else "a soft link"
                problems.append(f"{full} is {kind}; a groklens file holds its data itself")
                break
            obj = g.get(name)
            if isinstance(obj, h5py.Group):
                stack.append((full, obj))
            elif isinstance(obj, h5py.Dataset) and (obj.is_virtual or obj.external):
                problems.append(f"{full} is a {'virtual' if obj.is_virtual else 'externally stored'} dataset; "
                                "a groklens file holds its data itself")
                break
            elif obj is not None and not isinstance(obj, h5py.Dataset):
                problems.append(f"{full} is a {type(obj).__name__}, not a group or dataset")
                break
    return problems


def config_checksum(config_json: str) -> str:
    """What the `config_sha256` root attribute holds: sha256 of the stored config text (UTF-8)."""
    import hashlib

    return hashlib.sha256(config_json.encode("utf-8")).hexdigest()


def stored_extensions(f) -> list[dict]:
    """The file's step-cap extensions (ATTR_EXTENSIONS), oldest first; [] when it has none.
    BadInput when the record is not a list of {steps, from_steps, at_step, ...} with rising caps."""
    raw = f.attrs.get(C.ATTR_EXTENSIONS)
    if raw is None:
        return []
    try:
        data = json.loads(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
    except (TypeError, ValueError, RecursionError):
        data = None
    ok = isinstance(data, list) and all(
        isinstance(e, dict) and all(type(e.get(k)) is int for k in ("steps", "from_steps", "at_step"))
        and e["from_steps"] < e["steps"] for e in data)
    if not ok or any(a["steps"] != b["from_steps"] for a, b in zip(data, data[1:])):
        raise BadInput(f"the {C.ATTR_EXTENSIONS} attribute is not a record of rising step caps")
    return data


def _config(f, problems: list[str]):
    raw = f.attrs.get(C.ATTR_CONFIG)
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if not isinstance(raw, str) or len(raw) > MAX_CONFIG_BYTES:
        problems.append("the config attribute is not a JSON text")
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        problems.append("the stored config is not JSON (or nested too deep)")
        return None
    if not isinstance(data, dict):
        problems.append(f"the stored config is a {type(data).__name__}, not a mapping")
        return None
    if "task" not in data:
        problems.append("the stored config lacks 'task'")
    try:
        cfg = RunConfig.from_dict(data)
    except BadInput as exc:
        problems.append(f"stored config: {_short(str(exc))}")
        return None
    except (RecursionError, TypeError, ValueError, OverflowError) as exc:
        problems.append(f"stored config: {type(exc).__name__}")
        return None
    try:
        extensions = stored_extensions(f)
    except BadInput as exc:
        problems.append(str(exc))
        return None
    if extensions and extensions[0]["from_steps"] != cfg.steps:
        problems.append(f"the first step-cap extension starts from {extensions[0]['from_steps']} steps, not the "
                        f"config's {cfg.steps}")
        return None
    stored = f.attrs.get(C.ATTR_CONFIG_SHA256)
    if stored is not None:  # absent: a file written before the checksum (legacy, accepted)
        stored = stored.decode(errors="replace") if isinstance(stored, bytes) else stored
        if not isinstance(stored, str) or stored != config_checksum(raw):
            problems.append(f"the stored config does not match its checksum ({C.ATTR_CONFIG_SHA256}): it was "
                            "edited after the run was written")
            return None
    return cfg.replace(steps=extensions[-1]["steps"]) if extensions else cfg


def _steps(f, key: str, where: str, problems: list[str], cfg=None) -> int:
    ds = f.get(key) if isinstance(f, _group_type()) else None
    if ds is None or not hasattr(ds, "dtype") or not hasattr(ds, "ndim"):
        problems.append(f"{where} is missing or not a dataset")
        return 0
    if ds.ndim != 1 or not np.issubdtype(ds.dtype, np.integer):
        problems.append(f"{where} is {ds.dtype} {list(ds.shape)}, not 1-D integers")
        return 0
    if ds.shape[0] > MAX_ROWS:
        problems.append(f"{where} has {ds.shape[0]} rows, more than a run can have ({MAX_ROWS})")
        return 0
    values = read(ds)
    if len(values) and (values[0] < 0 or np.any(np.diff(values) <= 0)):
        problems.append(f"{where} is not strictly increasing from >= 0 (duplicated or out of order)")
    elif cfg is not None and len(values) and values[-1] > cfg.steps:
        problems.append(f"{where} holds step {values[-1]}, past the run's last step ({cfg.steps})")
    return len(values)


def _metrics(f, problems: list[str], cfg=None) -> None:
    g = f.get(C.METRICS)
    if g is None:
        return
    if not isinstance(g, _group_type()):
        problems.append(f"/{C.METRICS} is not a group")
        return
    m = _steps(g, C.METRICS_STEP, f"/{C.METRICS}/{C.METRICS_STEP}", problems, cfg)
    for name, ds in g.items():
        if name == C.METRICS_STEP:
            continue
        if not hasattr(ds, "dtype") or ds.ndim != 1 or not np.issubdtype(ds.dtype, np.floating):
            problems.append(f"/{C.METRICS}/{name} is not a 1-D float series")
        elif ds.shape[0] < m:
            problems.append(f"/{C.METRICS}/{name} has {ds.shape[0]} rows, fewer than the {m} evaluations")
        else:
            _metric_range(name, read(ds, slice(0, m)), problems)


def metric_range(name: str) -> tuple[float, float] | None:
    """The values a metric series can hold (NaN, not measured, aside): accuracies are shares of
    inputs, losses, norms and learning rates are non-negative (a loss may overflow to inf); None
    for a series with no known range (a regularizer's)."""
    base = name.rsplit(".", 1)[-1]  # copy<m>.test_acc, ensemble.train_loss: the column's own name
    if base.endswith("_acc"):
        return ACCURACY
    if base.endswith(("_loss", "_ce")) or base in ("weight_norm", "grad_norm", "lr"):
        return 0.0, math.inf
    return None


def _metric_range(name: str, values: np.ndarray, problems: list[str]) -> None:
    bounds = metric_range(name)
    if bounds is None:
        return
    lo, hi = bounds
    bad = np.nonzero(~np.isnan(values) & ((values < lo) | (values > hi)))[0]
    if bad.size:
        problems.append(f"/{C.METRICS}/{name} row {int(bad[0])} holds {values[bad[0]]!r}, outside "
                        f"[{lo:g}, {hi:g}]")


def _data(f, cfg, problems: list[str]) -> int:
    g = f.get(C.DATA)
    if g is None:
        return 0
    if not isinstance(g, _group_type()):
        problems.append(f"/{C.DATA} is not a group")
        return 0
    want = {"inputs": 2, "labels": None, "train_idx": 1, "test_idx": 1, "informative_mask": 2}
    arrays = {}
    for name, ndim in want.items():
        ds = g.get(name)
        if ds is None or not hasattr(ds, "dtype") or not hasattr(ds, "ndim"):
            problems.append(f"/{C.DATA}/{name} is missing")
            continue
        kind = np.bool_ if name == "informative_mask" else np.integer
        if not np.issubdtype(ds.dtype, kind) or (ndim is not None and ds.ndim != ndim) or ds.ndim not in (1, 2):
            problems.append(f"/{C.DATA}/{name} is {ds.dtype} {list(ds.shape)}, not as docs/FORMAT.md says")
            continue
        arrays[name] = ds
    attrs = {}
    for key in ("readout_pos", "d_vocab", "d_vocab_out"):
        v = g.attrs.get(key)
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or int(v) < 0:
            problems.append(f"/{C.DATA} attribute {key} is {_short(repr(v), 60)}, not a non-negative integer")
        else:
            attrs[key] = int(v)
    if len(arrays) < len(want):
        return 0
    N = arrays["inputs"].shape[0]
    n_ctx = arrays["inputs"].shape[1]
    if cfg is not None and not _data_fits_config(cfg, arrays, attrs, problems):
        return 0  # nothing is read from data that the config does not describe
    if N > SPLIT_CHECK_LIMIT:
        problems.append(f"/{C.DATA}/inputs has {N} rows, more than a run can have")
        return 0
    if arrays["labels"].shape[0] != N or arrays["informative_mask"].shape != (N, n_ctx):
        problems.append(f"/{C.DATA}: labels and informative_mask do not match inputs' {N} rows")
    if "readout_pos" in attrs and not attrs["readout_pos"] < n_ctx:
        problems.append(f"/{C.DATA} readout_pos {attrs['readout_pos']} is outside the {n_ctx} positions")
    if "d_vocab" in attrs:
        _in_range(arrays["inputs"], 0, attrs["d_vocab"], f"/{C.DATA}/inputs", problems)
    if "d_vocab_out" in attrs:
        _in_range(arrays["labels"], 0, attrs["d_vocab_out"], f"/{C.DATA}/labels", problems)
    _split(arrays["train_idx"], arrays["test_idx"], N, cfg is not None and bool(cfg.task), problems)
    if cfg is not None and not problems and N <= REBUILD_LIMIT:
        _data_is_task(f, arrays, problems)
    return N


def _data_is_task(f, arrays, problems: list[str]) -> None:
    """/data against what the stored config rebuilds (the task's grid and the data_seed's split):
    an edited label or a swapped split index that no range shows."""
    try:
        cfg = RunConfig.from_dict(stored_dict(json.loads(f.attrs[C.ATTR_CONFIG])))
        want = TASKS.get(cfg.task).arrays(cfg)
    except (BadInput, ValueError, TypeError, KeyError):
        return  # an unknown task, or a config that builds no data: reported where it is checked
    for name, ds in arrays.items():
        have = read(ds)
        if have.shape != want[name].shape or not np.array_equal(have, want[name]):
            rows = np.nonzero((have != want[name]).reshape(len(have), -1).any(1))[0] \
                if have.shape == want[name].shape else []
            at = f" (row {int(rows[0])} first)" if len(rows) else ""
            problems.append(f"/{C.DATA}/{name} is not the data the stored config builds{at}")
            return


def _data_fits_config(cfg, arrays, attrs, problems: list[str]) -> bool:
    """The data's shapes, vocabulary and readout position against the stored config's task."""
    want = data_shape(cfg)
    try:
        task = TASKS.get(cfg.task)
        vocab = tuple(int(v) for v in task.vocab(cfg))
        readout = int(task.readout_position(cfg))
    except BadInput:
        return True  # an unknown task is the config's problem, reported there
    inputs, labels = arrays["inputs"], arrays["labels"]
    if want is not None:
        n, n_ctx, n_targets = want
        label_shape = (n, n_targets) if n_targets else (n,)
        if inputs.shape != (n, n_ctx) or labels.shape != label_shape:
            problems.append(f"/{C.DATA} holds inputs {list(inputs.shape)} and labels {list(labels.shape)}; the stored "
                            f"config's task ({cfg.task}, p={cfg.p}) has inputs {[n, n_ctx]} and labels "
                            f"{list(label_shape)}")
            return False
    stored = (attrs.get("d_vocab"), attrs.get("d_vocab_out"))
    if None not in stored and stored != vocab:
        problems.append(f"/{C.DATA} vocabulary (d_vocab {stored[0]}, d_vocab_out {stored[1]}) is not the stored "
                        f"config's ({vocab[0]}, {vocab[1]})")
        return False
    if "readout_pos" in attrs and attrs["readout_pos"] != readout:
        problems.append(f"/{C.DATA} readout_pos {attrs['readout_pos']} is not the stored config's ({readout})")
        return False
    return True


def _split(train, test, N: int, whole: bool, problems: list[str]) -> None:
    """train_idx and test_idx: in range, each without duplicates, disjoint, together every input."""
    if train.shape[0] > N or test.shape[0] > N:
        problems.append(f"/{C.DATA}: train_idx and test_idx are longer than the {N} inputs")
        return
    tr, te = read(train).astype(np.int64), read(test).astype(np.int64)
    for name, idx in (("train_idx", tr), ("test_idx", te)):
        if idx.size and (idx.min() < 0 or idx.max() >= N):
            problems.append(f"/{C.DATA}/{name} holds values outside [0, {N})")
            return
        if idx.size == 0 and whole:
            problems.append(f"/{C.DATA}/{name} is empty")
            return
        if np.unique(idx).size != idx.size:
            problems.append(f"/{C.DATA}/{name} holds an index twice")
            return
    if np.intersect1d(tr, te).size:
        problems.append(f"/{C.DATA}: train_idx and test_idx share inputs")
    elif whole and tr.size + te.size != N:
        problems.append(f"/{C.DATA}: train_idx and test_idx do not split the {N} inputs")


def data_shape(cfg: "RunConfig") -> tuple[int, int, int] | None:
    """(inputs, positions per input, answer positions: 0 for labels [N]) of cfg's task, from the
    config alone (the task's own `shape`); None for a task that declares none or is not
    registered here (its data is then not compared)."""
    if cfg.task not in TASKS:
        return None
    shape = TASKS.get(cfg.task).shape
    return None if shape is None else shape(cfg)


def _in_range(ds, lo: int, hi: int, where: str, problems: list[str]) -> None:
    if ds.size == 0:
        return
    step = max(1, math.ceil(ds.size / DATA_SCAN_LIMIT))
    values = read(ds, slice(None, None, step))
    if values.size and (values.min() < lo or values.max() >= hi):
        problems.append(f"{where} holds values outside [{lo}, {hi})")


def _params(f, n: int, problems: list[str]) -> None:
    groups = []
    if isinstance(f.get(C.PARAMS), _group_type()):
        groups.append((f"/{C.PARAMS}", f[C.PARAMS]))
    elif C.PARAMS in f:
        problems.append(f"/{C.PARAMS} is not a group")
    if C.COPIES in f:
        if not isinstance(f[C.COPIES], _group_type()):
            problems.append(f"/{C.COPIES} is not a group")
            return
        names = set(f[C.PARAMS]) if groups else set()
        keys = sorted(f[C.COPIES], key=lambda k: int(k) if k.isdigit() else -1)
        if keys != [str(m) for m in range(1, len(keys) + 1)]:
            problems.append(f"/{C.COPIES} must hold groups 1..M-1; has {_short(repr(keys), 80)}")
            keys = []
        for key in keys:
            g = f[C.COPIES][key]
            if not isinstance(g, _group_type()) or set(g) != names:
                problems.append(f"/{C.COPIES}/{key} does not hold /{C.PARAMS}' names")
                continue
            groups.append((f"/{C.COPIES}/{key}", g))
    for where, g in groups:
        if not len(g):
            problems.append(f"{where} holds no parameter")
        for name, ds in g.items():
            if not hasattr(ds, "dtype") or ds.dtype != np.float32 or ds.ndim < 1 or ds.shape[0] < n:
                problems.append(f"{where}/{name} is not float32 [n_checkpoints, ...] with {n} rows")


def _copies_match(f, cfg, problems: list[str]) -> None:
    """A routed run (routing_copies M > 1) holds copies 1..M-1 in /copies; a single run none."""
    if cfg is None:
        return
    have = 1 + (len(f[C.COPIES]) if isinstance(f.get(C.COPIES), _group_type()) else 0)
    if have != cfg.routing_copies:
        problems.append(f"the stored config has routing_copies {cfg.routing_copies}, the file holds {have} "
                        f"cop{'y' if have == 1 else 'ies'} of the parameters")


def _state(f, problems: list[str]) -> None:
    g = f.get(C.STATE)
    if g is None:
        return
    if not isinstance(g, _group_type()):
        problems.append(f"/{C.STATE} is not a group")
        return
    ds = g.get(C.STATE_STEP)
    if ds is None or not hasattr(ds, "dtype") or ds.shape != (2,) or not np.issubdtype(ds.dtype, np.integer):
        problems.append(f"/{C.STATE}/{C.STATE_STEP} is not int64 [2]")
    for name, ds in g.items():
        if name != C.STATE_STEP and (not hasattr(ds, "dtype") or ds.ndim < 1 or ds.shape[0] != 2):
            problems.append(f"/{C.STATE}/{name} is not a dataset of two slots [2, ...]")
            break


def _status(f, problems: list[str]) -> None:
    ds = f.get(C.STATUS)
    if ds is None or not hasattr(ds, "dtype") or ds.shape != (1,) or ds.dtype.kind != "S":
        what = "missing" if ds is None else (f"{ds.dtype} {list(ds.shape)}" if hasattr(ds, "dtype") else "a group")
        problems.append(f"/{C.STATUS} is {what}, not one fixed-length byte string")
        return
    read(ds)  # its checksum: info shows it


def _cpu_seconds(f) -> None:
    """Its checksum (a damaged value is refused, not shown as the run's CPU time); optional."""
    ds = f.get(C.CPU_SECONDS)
    if ds is not None and hasattr(ds, "dtype") and ds.shape == (1,):
        read(ds)


def _group_type():
    import h5py

    return h5py.Group


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def model_problems(cfg: "RunConfig", data, stored: dict[str, tuple[int, ...]], where: str = "/params") -> list[str]:
    """Parameter names and shapes against the model `cfg` builds (on the meta device: no memory).
    `stored`: name -> shape of one checkpoint's row."""
    import torch

    from groklens.models import build_model

    with torch.device("meta"):
        try:
            model = build_model(cfg, data)
        except BadInput as exc:
            return [f"the stored config builds no model: {_short(str(exc))}"]
    want = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    missing = sorted(set(want) - set(stored))
    extra = sorted(set(stored) - set(want))
    if missing:
        return [f"{where} lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")]
    if extra:
        return [f"{where}/{extra[0]} is not a parameter of the configured model"]
    return [f"{where}/{name} has shape {list(stored[name])}, the model's is {list(shape)}"
            for name, shape in want.items() if tuple(stored[name]) != shape][:1]


# ---------------------------------------------------------------------- resources
def machine_memory() -> int:
    """Physical memory in bytes (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def task_size(cfg: "RunConfig") -> tuple[int, int]:
    """(inputs, positions per input) of cfg's task, from the config alone."""
    shape = data_shape(cfg)
    return (shape[0], shape[1]) if shape is not None else (cfg.p * cfg.p, 3)


def estimate_memory(cfg: "RunConfig") -> dict[str, int]:
    """Bytes a run of `cfg` holds at its peak, by part (an estimate with generous factors)."""
    from groklens.models import model_width

    n, n_ctx = task_size(cfg)
    vocab = cfg.p + cfg.distractor_vocab + 16
    d_model = model_width(cfg, vocab)  # the model's own fact (a one-hot embedding is as wide as the vocabulary)
    per_layer = 4 * cfg.n_heads * cfg.d_head * d_model + 2 * d_model * cfg.d_mlp + 8 * d_model
    n_params = 2 * vocab * d_model + n_ctx * d_model + cfg.n_layers * per_layer
    batch = min(cfg.batch_size or n, n)
    eval_rows = min(n, 16_384)  # evaluation runs without autograd: about two layers live at once
    width = 12 * d_model + 2 * cfg.d_mlp + 3 * cfg.n_heads * n_ctx
    n_ckpt = cfg.steps // max(cfg.checkpoint_every, 1) + 2
    copies = max(cfg.routing_copies, 1)
    # a training step keeps every layer's activations for backward; an evaluation (EVAL_CHUNK
    # inputs, no autograd) about two layers at once; they are never live together
    step_acts = batch * cfg.n_layers * n_ctx * width * 4 * copies
    eval_acts = eval_rows * 2 * n_ctx * width * 4 * copies
    extra = TASKS.get(cfg.task).extra_memory  # the task's own fact (the teacher task's Gaussian vectors)
    table = extra(cfg) if extra is not None else 0
    return {
        "task inputs": n * n_ctx * (8 * 3 + 1) + n * 8 * 4 + table,
        "parameters and optimizer state": n_params * 4 * 8 * copies,
        ACTIVATIONS[eval_acts > step_acts]: max(step_acts, eval_acts),
        "checkpoint schedule": (n_ckpt + cfg.log_checkpoints) * 128,
        "evaluation series": (cfg.steps // max(cfg.eval_every, 1) + 2) * 8 * 24,
    }


def check_resources(cfg: "RunConfig", memory: int | None = None, device: str | None = None,
                    device_memory: int | None = None) -> None:
    """BadInput when a run of `cfg` cannot fit this machine's memory (with a margin). `device`:
    where the run trains, resolved ('cpu', 'cuda'; default cfg.device, with 'auto' as the CPU):
    on an accelerator the parameters and activations are checked against `device_memory` (its
    free memory; unchecked when None) and the rest against the machine's."""
    if cfg.log_checkpoints >= cfg.checkpoint_every:
        raise BadInput(f"log_checkpoints ({cfg.log_checkpoints}) must be below checkpoint_every "
                       f"({cfg.checkpoint_every}): only that many steps lie before the first regular checkpoint")
    device = device or ("cpu" if cfg.device == "auto" else cfg.device)
    parts = estimate_memory(cfg)
    if device != "cpu":  # activations live on the accelerator, whose memory is its own
        on_device = {k: parts.pop(k) for k in ACTIVATIONS if k in parts}
        on_device["parameters and optimizer state"] = parts["parameters and optimizer state"]
        if device_memory:
            _refuse_over(on_device, device_memory, f"the {device} device")
    memory = machine_memory() if memory is None else memory
    if memory:
        _refuse_over(parts, memory, "the machine")


def _refuse_over(parts: dict[str, int], memory: int, where: str) -> None:
    total = sum(parts.values())
    if total > MEMORY_SHARE * memory:
        part, size = max(parts.items(), key=lambda kv: kv[1])
        raise BadInput(f"this run needs about {_gib(total)} of memory ({part}: {_gib(size)}); {where} has "
                       f"{_gib(memory)}, and a run may plan for {int(MEMORY_SHARE * 100)}% of it")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
