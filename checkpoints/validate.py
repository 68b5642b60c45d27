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
task's inputs, the model's parameters and optimizer state, the activations of one step (with
device=cpu only: elsewhere they live on the accelerator), the checkpoint schedule and the
evaluation series) and refuses (BadInput) what exceeds 80% of the machine's memory, before
anything is allocated.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from groklens.checkpoints import constants as C
from groklens.config import RunConfig
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import h5py

MEMORY_SHARE = 0.8  # a run may plan for at most this share of the machine's memory
MAX_CONFIG_BYTES = 1 << 20  # a stored config is a few KiB; anything near this is not one of ours
DATA_SCAN_LIMIT = 1 << 26  # token/index range checks read at most this many values per dataset


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
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        problems = [f"unreadable ({_short(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)})"]
    if problems:
        raise InvalidTrajectory(path, problems)


def file_problems(f: "h5py.File", path: Path | str) -> list[str]:
    """Every problem found cheaply in an open trajectory (an empty list: valid)."""
    problems: list[str] = []
    version = f.attrs.get(C.ATTR_FORMAT_VERSION)
    if not isinstance(version, (int, np.integer)) or isinstance(version, (bool, np.bool_)):
        problems.append(f"format_version is {version!r}, not an integer")
    cfg = _config(f, problems)
    n = _steps(f, C.STEPS, "/steps", problems)
    _metrics(f, problems)
    _data(f, cfg, problems)
    _params(f, n, problems)
    _state(f, problems)
    return problems


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
        return RunConfig.from_dict(data)
    except BadInput as exc:
        problems.append(f"stored config: {_short(str(exc))}")
    except (RecursionError, TypeError, ValueError) as exc:
        problems.append(f"stored config: {type(exc).__name__}")
    return None


def _steps(f, key: str, where: str, problems: list[str]) -> int:
    ds = f.get(key)
    if ds is None or not hasattr(ds, "dtype"):
        problems.append(f"{where} is missing or not a dataset")
        return 0
    if ds.ndim != 1 or not np.issubdtype(ds.dtype, np.integer):
        problems.append(f"{where} is {ds.dtype} {list(ds.shape)}, not 1-D integers")
        return 0
    values = ds[:]
    if len(values) and (values[0] < 0 or np.any(np.diff(values) <= 0)):
        problems.append(f"{where} is not strictly increasing from >= 0 (duplicated or out of order)")
    return len(values)


def _metrics(f, problems: list[str]) -> None:
    g = f.get(C.METRICS)
    if g is None:
        return
    m = _steps(g, C.METRICS_STEP, f"/{C.METRICS}/{C.METRICS_STEP}", problems)
    for name, ds in g.items():
        if name == C.METRICS_STEP:
            continue
        if not hasattr(ds, "dtype") or ds.ndim != 1 or not np.issubdtype(ds.dtype, np.floating):
            problems.append(f"/{C.METRICS}/{name} is not a 1-D float series")
        elif ds.shape[0] < m:
            problems.append(f"/{C.METRICS}/{name} has {ds.shape[0]} rows, fewer than the {m} evaluations")


def _data(f, cfg, problems: list[str]) -> int:
    g = f.get(C.DATA)
    if g is None:
        return 0
    want = {"inputs": 2, "labels": None, "train_idx": 1, "test_idx": 1, "informative_mask": 2}
    arrays = {}
    for name, ndim in want.items():
        ds = g.get(name)
        if ds is None or not hasattr(ds, "dtype"):
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
            problems.append(f"/{C.DATA} attribute {key} is {v!r}, not a non-negative integer")
        else:
            attrs[key] = int(v)
    if len(arrays) < len(want):
        return 0
    N = arrays["inputs"].shape[0]
    n_ctx = arrays["inputs"].shape[1]
    if arrays["labels"].shape[0] != N or arrays["informative_mask"].shape != (N, n_ctx):
        problems.append(f"/{C.DATA}: labels and informative_mask do not match inputs' {N} rows")
    if "readout_pos" in attrs and not attrs["readout_pos"] < n_ctx:
        problems.append(f"/{C.DATA} readout_pos {attrs['readout_pos']} is outside the {n_ctx} positions")
    for name in ("train_idx", "test_idx"):
        _in_range(arrays[name], 0, N, f"/{C.DATA}/{name}", problems)
    if "d_vocab" in attrs:
        _in_range(arrays["inputs"], 0, attrs["d_vocab"], f"/{C.DATA}/inputs", problems)
    if "d_vocab_out" in attrs:
        _in_range(arrays["labels"], 0, attrs["d_vocab_out"], f"/{C.DATA}/labels", problems)
    if cfg is not None and N and cfg.task and arrays["train_idx"].shape[0] + arrays["test_idx"].shape[0] != N:
        problems.append(f"/{C.DATA}: train_idx and test_idx do not split the {N} inputs")
    return N


def _in_range(ds, lo: int, hi: int, where: str, problems: list[str]) -> None:
    if ds.size == 0:
        return
    step = max(1, math.ceil(ds.size / DATA_SCAN_LIMIT))
    values = ds[::step] if step > 1 else ds[()]
    if values.size and (values.min() < lo or values.max() >= hi):
        problems.append(f"{where} holds values outside [{lo}, {hi})")


def _params(f, n: int, problems: list[str]) -> None:
    groups = []
    if isinstance(f.get(C.PARAMS), _group_type()):
        groups.append((f"/{C.PARAMS}", f[C.PARAMS]))
    if C.COPIES in f:
        names = set(f[C.PARAMS]) if groups else set()
        keys = sorted(f[C.COPIES], key=lambda k: int(k) if k.isdigit() else -1)
        if keys != [str(m) for m in range(1, len(keys) + 1)]:
            problems.append(f"/{C.COPIES} must hold groups 1..M-1; has {keys}")
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


def _state(f, problems: list[str]) -> None:
    g = f.get(C.STATE)
    if g is None:
        return
    ds = g.get(C.STATE_STEP)
    if ds is None or not hasattr(ds, "dtype") or ds.shape != (2,) or not np.issubdtype(ds.dtype, np.integer):
        problems.append(f"/{C.STATE}/{C.STATE_STEP} is not int64 [2]")


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

    from groklens.trainers.models import build_model

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
    task = cfg.task
    if task.startswith("digits"):
        return 10 ** (2 * cfg.n_digits), 3 * cfg.n_digits + 2
    if task.startswith("seq"):
        return cfg.p ** cfg.n_informative, cfg.seq_len + 1
    return cfg.p * cfg.p, 3


def estimate_memory(cfg: "RunConfig") -> dict[str, int]:
    """Bytes a run of `cfg` holds at its peak, by part (an estimate with generous factors)."""
    n, n_ctx = task_size(cfg)
    vocab = cfg.p + cfg.distractor_vocab + 16
    d_model = max(cfg.d_model, vocab if cfg.model == "mlp" and cfg.mlp_embed == "onehot" else 0)
    per_layer = 4 * cfg.n_heads * cfg.d_head * d_model + 2 * d_model * cfg.d_mlp + 8 * d_model
    n_params = 2 * vocab * d_model + n_ctx * d_model + cfg.n_layers * per_layer
    batch = min(cfg.batch_size or n, n)
    eval_rows = min(n, 16_384)  # evaluation runs without autograd: about two layers live at once
    width = 12 * d_model + 2 * cfg.d_mlp + 3 * cfg.n_heads * n_ctx
    n_ckpt = cfg.steps // max(cfg.checkpoint_every, 1) + 2
    return {
        "task inputs": n * n_ctx * (8 * 3 + 1) + n * 8 * 4,
        "parameters and optimizer state": n_params * 4 * 8 * max(cfg.routing_copies, 1),
        "activations of one step": max(batch * cfg.n_layers, eval_rows * 2) * n_ctx * width * 4
        * max(cfg.routing_copies, 1),
        "checkpoint schedule": (n_ckpt + cfg.log_checkpoints) * 128,
        "evaluation series": (cfg.steps // max(cfg.eval_every, 1) + 2) * 8 * 24,
    }


def check_resources(cfg: "RunConfig", memory: int | None = None) -> None:
    """BadInput when a run of `cfg` cannot fit this machine's memory (with a margin)."""
    if cfg.log_checkpoints >= cfg.checkpoint_every:
        raise BadInput(f"log_checkpoints ({cfg.log_checkpoints}) must be below checkpoint_every "
                       f"({cfg.checkpoint_every}): only that many steps lie before the first regular checkpoint")
    memory = machine_memory() if memory is None else memory
    if not memory:
        return
    parts = estimate_memory(cfg)
    if cfg.device != "cpu":  # activations may live on an accelerator, whose memory is its own
        parts.pop("activations of one step")
    total = sum(parts.values())
    if total > MEMORY_SHARE * memory:
        part, size = max(parts.items(), key=lambda kv: kv[1])
        raise BadInput(f"this run needs about {_gib(total)} of memory ({part}: {_gib(size)}); the machine has "
                       f"{_gib(memory)}, and a run may plan for {int(MEMORY_SHARE * 100)}% of it")


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"
