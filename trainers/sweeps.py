"""Sweeps: a grid of runs described once, run by a process pool, Ray or SLURM, resumable.

A sweep file (YAML, data only) has three keys (docs/SWEEPS.md):

    base:  {field: value, ...}            # config fields, as `groklens train --config` takes them
    axes:  {field: [v1, v2, ...],         # an explicit list, or
            field: {logspace: [lo, hi, n]}}  # n values from lo to hi, evenly spaced in log
    seeds: [0, 1, 2]                      # optional; default [base seed]

The runs are the product of the axes and the seeds; an axis (and `seeds`) overrides the value
`base` gives that field, as flags override a config file in `groklens train`. Each run's name is derived from its axis
values and seed only (fields in sorted order, then the seed: `d_mlp=64__lr=0.001__seed=0`),
so the same grid always names the same runs, and adding a value to an axis keeps the names
of the runs already there. Each run is an ordinary trajectory `DIR/<name>.h5` trained through
`groklens.trainers.loop` (or a batched ensemble, `groklens.trainers.ensemble`).

State of a run, from its files alone (`run_state`):
    done         DIR/<name>.h5 has a status starting with 'completed'
    failed       DIR/<name>.error.json exists (the error, its type and traceback)
    running      a live process holds the writer lock on DIR/<name>.h5
    interrupted  DIR/<name>.h5 has committed checkpoints but no writer: resumed exactly
    pending      no file yet, or one without any committed checkpoint (restarted)
Starting a sweep again skips done runs, resumes interrupted ones, restarts the rest, and
skips failed runs unless `retry_failed` (their error stays until the retry succeeds).
DIR/sweep.json lists every run the directory was asked for, with its config.

Executors submit one task per run (or per ensemble); they never schedule anything themselves:
`local` is a concurrent.futures process pool, `ray` uses Ray tasks (a local instance or an
existing cluster), `slurm` submitit job arrays.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import json
import math
import os
import re
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from groklens.config import RunConfig, field_names
from groklens.errors import BadInput

SWEEP_KEYS = ("base", "axes", "seeds")
MANIFEST = "sweep.json"
ERROR_SUFFIX = ".error.json"
EXECUTORS = ("local", "ray", "slurm")
LOGSPACE_DIGITS = 6  # logspace values are rounded to 6 significant digits (clean names and YAML)
MAX_RUNS = 10_000  # a grid larger than this is refused up front (exit 2), never materialized
NAME_MAX = 200  # longer run names get a stable hash (file names: 255 bytes, minus suffixes)


# ---------------------------------------------------------------------- the grid
@dataclass
class RunSpec:
    name: str
    config: RunConfig


@dataclass
class Sweep:
    base: dict[str, Any]
    axes: dict[str, list[Any]]  # field -> typed values (logspace expanded)
    seeds: list[int]
    _runs: list[RunSpec] | None = field(default=None, repr=False, compare=False)

    def runs(self) -> list[RunSpec]:
        """The product of the axes and seeds, in grid order (axes as written, seeds innermost)."""
        if self._runs is None:
            self._runs = self._product()
        return list(self._runs)

    def _product(self) -> list[RunSpec]:
        fields_ = list(self.axes)
        out: list[RunSpec] = []
        for values in itertools.product(*(self.axes[f] for f in fields_)):
            point = dict(zip(fields_, values))
            for seed in self.seeds:
                cfg = _make_config(self.base, {**point, "seed": seed})
                out.append(RunSpec(run_name(point, seed), cfg))
        names = [r.name for r in out]
        if len(set(names)) != len(names):  # only reachable through string values that sanitize alike
            dup = next(n for n in names if names.count(n) > 1)
            raise BadInput(f"two runs of the grid get the same name {dup!r}; make the axis values distinct")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"base": self.base, "axes": {k: [_plain(v) for v in vs] for k, vs in self.axes.items()},
                "seeds": self.seeds}


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (yaml.safe_load: data only)."""

    path = Path(path)
    if not path.is_file():
        raise BadInput(f"sweep file {path} does not exist or is not a file")
    from groklens.config import safe_yaml

    data = safe_yaml(path, what="sweep file")
    return parse_sweep(data, source=str(path))


def parse_sweep(data: Any, source: str = "sweep") -> Sweep:
    """Check a sweep mapping {base, axes, seeds}; every problem is one BadInput line."""
    if not isinstance(data, dict):
        raise BadInput(f"{source}: a sweep must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = sorted(str(k) for k in set(data) - set(SWEEP_KEYS))
    if unknown:
        raise BadInput(f"{source}: unknown sweep key(s) {', '.join(unknown)} (known: {', '.join(SWEEP_KEYS)})")
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise BadInput(f"{source}: 'base' must be a mapping of config field -> value")
    base_cfg = RunConfig.from_dict(base)  # unknown fields and bad values are BadInput here
    axes_raw = data.get("axes") or {}
    if not isinstance(axes_raw, dict):
        raise BadInput(f"{source}: 'axes' must be a mapping of config field -> list or {{logspace: [lo, hi, n]}}")
    known = set(field_names())
    axes: dict[str, list[Any]] = {}
    for name, spec in axes_raw.items():
        if name not in known:
            raise BadInput(f"{source}: axis {name!r} is not a config field")
        if name == "seed":
            raise BadInput(f"{source}: give seeds with the 'seeds' key, not as an axis")
        axes[name] = _axis_values(name, spec, base, source)
    seeds_raw = data.get("seeds", [base_cfg.seed])
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds_raw = [seeds_raw]
    if (not isinstance(seeds_raw, list) or not seeds_raw
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw)):
        raise BadInput(f"{source}: 'seeds' must be a non-empty list of integers; got {_short(seeds_raw)}")
    if len(seeds_raw) > MAX_RUNS:
        raise BadInput(f"{source}: 'seeds' has {len(seeds_raw)} values; a sweep holds at most {MAX_RUNS} runs")
    if len(set(seeds_raw)) != len(seeds_raw):
        raise BadInput(f"{source}: 'seeds' repeats a seed: {_short(seeds_raw)}")
    total = math.prod(len(v) for v in axes.values()) * len(seeds_raw)
    if total > MAX_RUNS:  # refused before the product is built: --dry-run answers at once
        raise BadInput(f"{source}: the grid has {total} runs; a sweep holds at most {MAX_RUNS} (split it)")
    sweep = Sweep(base=dict(base), axes=axes, seeds=list(seeds_raw))
    sweep.runs()  # every combination must be a valid config: fail now, not after hours
    return sweep


def _axis_values(name: str, spec: Any, base: dict, source: str) -> list[Any]:
    if isinstance(spec, dict):
        if set(spec) != {"logspace"}:
            raise BadInput(f"{source}: axis {name!r}: a mapping must be {{logspace: [lo, hi, n]}}; got keys {sorted(spec)}")
        lohi = spec["logspace"]
        if not (isinstance(lohi, list) and len(lohi) == 3):
            raise BadInput(f"{source}: axis {name!r}: logspace needs [lo, hi, n]; got {lohi!r}")
        try:
            lo, hi = float(lohi[0]), float(lohi[1])
        except (TypeError, ValueError):
            raise BadInput(f"{source}: axis {name!r}: logspace bounds must be numbers; got {lohi[:2]!r}") from None
        n = lohi[2]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RUNS:
            raise BadInput(f"{source}: axis {name!r}: logspace count must be an integer in 1..{MAX_RUNS}; got {n!r}")
        if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)):
            raise BadInput(f"{source}: axis {name!r}: logspace bounds must be positive numbers; got {lo}, {hi}")
        raw = [float(f"{v:.{LOGSPACE_DIGITS}g}") for v in np.geomspace(lo, hi, n)]
        kind = str(_field_type(name))
        if kind == "int":
            raw = [round(v) for v in raw]
        elif kind != "float":
            raise BadInput(f"{source}: axis {name!r}: logspace needs a numeric field; {name} is {kind}")
    elif isinstance(spec, list):
        if len(spec) > MAX_RUNS:
            raise BadInput(f"{source}: axis {name!r} has {len(spec)} values; a sweep holds at most {MAX_RUNS} runs")
        raw = spec
    else:
        raise BadInput(f"{source}: axis {name!r} must be a list of values or {{logspace: [lo, hi, n]}}; "
                       f"got {_short(spec)}")
    if not raw:
        raise BadInput(f"{source}: axis {name!r} has no values")
    values = []
    for v in raw:
        typed = getattr(_make_config(base, {name: v}), name)
        values.append(tuple(typed) if isinstance(typed, list) else typed)
    for v in values:
        if values.count(v) > 1:
            raise BadInput(f"{source}: axis {name!r} repeats the value {_plain(v)!r}")
    return values


def _field_type(name: str):
    from dataclasses import fields

    return next(f.type for f in fields(RunConfig) if f.name == name)


def _make_config(base: dict, point: dict) -> RunConfig:
    values = {**base, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in point.items()}}
    return RunConfig.from_dict(values)


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, float):
        text = repr(v)  # shortest round-trip form: 0.001, 1e-05, 0.3
    elif isinstance(v, (tuple, list)):
        text = "_".join(_format_value(x) for x in v)
    else:
        text = str(v)
    return re.sub(r"[^A-Za-z0-9.+_-]", "-", text)


def run_name(point: dict[str, Any], seed: int) -> str:
    """`field=value` for each axis in sorted field order, then the seed, joined by '__'."""
    parts = [f"{k}={_format_value(point[k])}" for k in sorted(point)]
    name = "__".join(parts + [f"seed={seed}"])
    if len(name.encode()) <= NAME_MAX:
        return name
    # too long for a file name: a stable prefix and hash (sweep.json keeps the full config)
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: NAME_MAX - 40]}__h{digest}__seed={seed}"


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
    if path.exists():
        try:
            traj = Trajectory(path)
            status = traj.status
            n = len(traj.steps)
        except BadInput as exc:
            status = f"unreadable file, restarted: {exc}"
    if traj is not None and status.startswith("completed"):
        return "done", status  # a finished run wins over an error file left by a racing attempt
    if err.exists():
        try:
            return "failed", json.loads(err.read_text()).get("error", "")
        except (OSError, ValueError):
            return "failed", "(unreadable error file)"
    if traj is None:
        return "pending", status or ""
    if traj.is_live:
        return "running", f"{n} checkpoints"
    if n == 0:
        return "pending", "no committed checkpoint, restarted"
    return "interrupted", f"{n} checkpoints, last step {int(traj.steps[-1])}"


def _stored_config(path: Path) -> dict | None:
    from groklens.checkpoints import Trajectory

    try:
        return Trajectory(path).config_dict
    except BadInput:
        return None


# ---------------------------------------------------------------------- the work of one task
def execute_task(task: dict) -> list[dict]:
    """Run one task (a single run, or an ensemble of runs) in this process.

    `task` = {"runs": [{"name", "config", "path"}, ...], "ensemble": bool, "threads": int}.
    Returns one outcome per run: {"name", "state": done|failed|running, "detail"}. Errors are
    written to the run's error file here, so they survive a lost coordinator.
    """
    import torch

    threads = int(task.get("threads") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    runs = task["runs"]
    if task.get("ensemble") and len(runs) > 1:
        return _execute_ensemble(runs)
    return [_execute_single(r) for r in runs]


LOCK_FILE = ".sweep.lock"  # flock: the manifest; byte-range locks: one claim per run


@contextmanager
def _claim(out_dir: Path, name: str) -> Iterator[bool]:
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
def _manifest_lock(out_dir: Path) -> Iterator[None]:
    fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits: manifest updates take milliseconds
        yield
    finally:
        os.close(fd)


def _execute_single(run: dict) -> dict:
    name, path = run["name"], Path(run["path"])
    with _claim(path.parent, name) as mine:
        if not mine:
            return {"name": name, "state": "running", "detail": "trained by another sweep"}
        return _execute_claimed(run)


def _execute_claimed(run: dict) -> dict:
    from groklens.trainers import loop

    name, path = run["name"], Path(run["path"])
    try:
        cfg = RunConfig.from_dict(run["config"])
        state, detail = run_state(path.parent, name)
        if state == "failed":
            error_path(path.parent, name).unlink(missing_ok=True)  # a retry
            state, detail = run_state(path.parent, name)
        if state == "done":
            return {"name": name, "state": "done", "detail": detail}
        if state == "running":
            return {"name": name, "state": "running", "detail": "written by another process"}
        if state == "interrupted":
            _check_same_config(path, cfg)
            result = loop.resume(path, progress=False)
            if result.status == "already complete":
                _mark_complete(path)
        else:
            result = loop.train(cfg, path, force=True, progress=False)
        return {"name": name, "state": "done", "detail": f"step {result.last_step}"}
    except Exception as exc:  # noqa: BLE001 - recorded; Ctrl-C and SystemExit (a requeue) go through
        return _record_failure(path, name, exc)


def _execute_ensemble(runs: list[dict]) -> list[dict]:
    with ExitStack() as stack:
        mine = [r for r in runs if stack.enter_context(_claim(Path(r["path"]).parent, r["name"]))]
        outcomes = {r["name"]: {"name": r["name"], "state": "running", "detail": "trained by another sweep"}
                    for r in runs if r not in mine}
        outcomes.update({o["name"]: o for o in _execute_ensemble_claimed(mine)} if mine else {})
    return [outcomes[r["name"]] for r in runs]


def _execute_ensemble_claimed(runs: list[dict]) -> list[dict]:
    from groklens.trainers.ensemble import resume_ensemble, train_ensemble

    outcomes: dict[str, dict] = {}
    fresh: list[dict] = []
    by_step: dict[int, list[dict]] = {}
    for run in runs:
        name, path = run["name"], Path(run["path"])
        try:
            state, detail = run_state(path.parent, name)
            if state == "failed":
                error_path(path.parent, name).unlink(missing_ok=True)
                state, detail = run_state(path.parent, name)
            if state == "done":
                outcomes[name] = {"name": name, "state": "done", "detail": detail}
            elif state == "running":
                outcomes[name] = {"name": name, "state": "running", "detail": "written by another process"}
            elif state == "interrupted":
                cfg = RunConfig.from_dict(run["config"])
                _check_same_config(path, cfg)
                from groklens.checkpoints import recover

                by_step.setdefault(recover(path), []).append(run)
            else:
                fresh.append(run)
        except Exception as exc:  # noqa: BLE001
            outcomes[name] = _record_failure(path, name, exc)

    groups: list[tuple[str, list[dict]]] = [("fresh", fresh)] + [("resume", g) for g in by_step.values()]
    for kind, group in groups:
        if not group:
            continue
        if len(group) == 1:  # one member: the ordinary loop is the same computation
            outcomes[group[0]["name"]] = _execute_claimed(group[0])
            continue
        paths = [Path(r["path"]) for r in group]
        try:
            if kind == "fresh":
                results = train_ensemble([RunConfig.from_dict(r["config"]) for r in group], paths, force=True)
            else:
                results = resume_ensemble(paths)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - the whole ensemble failed: every member records it
            for r in group:
                outcomes[r["name"]] = _record_failure(Path(r["path"]), r["name"], exc)
            continue
        for r, res in zip(group, results):
            if res.error is not None:
                outcomes[r["name"]] = _record_failure(res.path, r["name"], res.error)
            else:
                outcomes[r["name"]] = {"name": r["name"], "state": "done", "detail": f"step {res.result.last_step}"}
    return [outcomes[r["name"]] for r in runs]


def _check_same_config(path: Path, cfg: RunConfig) -> None:
    stored = _stored_config(path)
    if stored is not None and stored != cfg.to_dict():
        diff = sorted(k for k in set(stored) | set(cfg.to_dict()) if stored.get(k) != cfg.to_dict().get(k))
        raise BadInput(f"{path} holds a run with a different config ({', '.join(diff)}); move it away or use another -o")


def _mark_complete(path: Path) -> None:
    """A run killed after its last checkpoint but before closing: repair it and say so."""
    from groklens.checkpoints import TrajectoryWriter, recover

    recover(path)
    TrajectoryWriter.reopen(path).close("completed")


def _record_failure(path: Path, name: str, exc: BaseException) -> dict:
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
    from groklens.fileio import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def _short(value: Any) -> str:
    import reprlib

    return reprlib.repr(value)


# ---------------------------------------------------------------------- executors
class _Executor:
    """Runs tasks somewhere; calls on_start(task) when a task is handed out and
    on_done(task, outcomes | exception) when it ends."""

    name = "base"
    workers: int

    def execute(self, tasks: list[dict], on_start: Callable, on_done: Callable) -> None:  # pragma: no cover
        raise NotImplementedError


class InlineExecutor(_Executor):
    """Every task in this process, one after another (Python API only: debugging, notebooks)."""

    name = "inline"
    workers = 1

    def execute(self, tasks, on_start, on_done):
        for task in tasks:
            on_start(task)
            try:
                outcome = execute_task(task)
            except Exception as exc:  # noqa: BLE001
                outcome = exc
            on_done(task, outcome)


class LocalExecutor(_Executor):
    """A concurrent.futures process pool on this machine, `workers` processes at a time."""

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)

    def execute(self, tasks, on_start, on_done):
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        queue = list(tasks)
        ctx = _worker_context(multiprocessing)

        def new_pool():
            return ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=_watch_coordinator,
                                       initargs=(os.getpid(),))

        pool = new_pool()
        running: dict = {}
        try:
            while queue or running:
                while queue and len(running) < self.workers:
                    task = queue.pop(0)
                    running[pool.submit(execute_task, task)] = task
                    on_start(task)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                broken = False
                for fut in done:
                    task = running.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool as exc:
                        broken = True
                        result = RuntimeError(f"the worker process died (killed, out of memory, or a script "
                                              f"without an `if __name__ == '__main__':` guard): {exc}")
                    except Exception as exc:  # noqa: BLE001
                        result = exc
                    on_done(task, result)
                if broken:  # every task in the pool is lost with it; start a new pool for the rest
                    for _fut, task in list(running.items()):
                        on_done(task, RuntimeError("the worker process died (killed, or out of memory)"))
                    running.clear()
                    pool.shutdown(wait=False, cancel_futures=True)
                    pool = new_pool()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _watch_coordinator(pid: int, every_s: float = 1.0) -> None:
    """Pool-worker initializer: leave when the coordinator `pid` is gone (killed, OOM), instead of
    idling forever; a run cut short this way is resumed by the next sweep like any killed run."""
    import threading

    def watch():
        while True:
            time.sleep(every_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:  # pid reused by another user's process: ours is gone
                os._exit(3)

    threading.Thread(target=watch, name="groklens-coordinator-watch", daemon=True).start()


def _worker_context(multiprocessing):
    """A forkserver that imported torch and the trainers once (each worker forks from it in
    milliseconds instead of importing for seconds); spawn where there is no forkserver. Never
    a plain fork of this process, which may hold torch threads."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # the model modules too (TransformerLens' hook machinery): every import done here is
        # done once per sweep, not once per worker on its first run
        ctx.set_forkserver_preload(["groklens.trainers.loop", "groklens.trainers.ensemble",
                                    "groklens.trainers.models.transformer", "groklens.trainers.models.mlp"])
        return ctx
    return multiprocessing.get_context("spawn")


class RayExecutor(_Executor):
    """Ray tasks: a local instance (`ray.init(num_cpus=workers)`) or the cluster at `address`.

    Each task asks for one CPU and, where the cluster has GPUs, `gpus_per_run` of a GPU
    (default 0.25 for a single tiny run, 1 for an ensemble): Ray packs fractional tasks onto a
    GPU and sets CUDA_VISIBLE_DEVICES, so a config with device=auto lands on it. If Ray is
    already initialised in this process, that instance is used and left running.
    """

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None,
                 gpus_per_run: float | None = None):
        self.requested_workers = workers
        self.address = address
        self.gpus_per_run = gpus_per_run

    def execute(self, tasks, on_start, on_done):
        try:
            import ray
        except ImportError:
            raise BadInput("the ray executor needs Ray: pip install 'groklens[ray]'") from None
        started_here = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.address:
                ray.init(address=self.address, **kwargs)
            else:
                ray.init(num_cpus=self.requested_workers or os.cpu_count(), **kwargs)
            started_here = True
        try:
            resources = ray.cluster_resources()
            n_cpu = int(resources.get("CPU", 1))
            has_gpu = resources.get("GPU", 0) > 0
            self.workers = max(1, self.requested_workers or n_cpu)
            remote = ray.remote(execute_task)
            queue = list(tasks)
            running: dict = {}
            while queue or running:
                while queue and len(running) < self.workers:
                    task = queue.pop(0)
                    gpus = self._gpus(task) if has_gpu else 0
                    ref = remote.options(num_cpus=1, num_gpus=gpus, max_retries=0).remote(task)
                    running[ref] = task
                    on_start(task)
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    task = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - RayTaskError, WorkerCrashedError, ...
                        result = exc
                    on_done(task, result)
        finally:
            if started_here:
                ray.shutdown()

    def _gpus(self, task: dict) -> float:
        if any(r["config"].get("device") == "cpu" for r in task["runs"]):
            return 0
        if self.gpus_per_run is not None:
            return self.gpus_per_run
        return 1.0 if task.get("ensemble") else 0.25


class _SubmititTask:
    """The callable submitit pickles. `checkpoint` lets a preempted or timed-out SLURM job be
    requeued: the new job resumes every run from its trajectory file."""

    def __call__(self, task: dict) -> list[dict]:
        return execute_task(task)

    def checkpoint(self, task: dict):
        import submitit

        return submitit.helpers.DelayedSubmission(_SubmititTask(), task)


class SlurmExecutor(_Executor):
    """submitit job arrays: one array element per task, at most `workers` running at once.

    `cluster` is submitit's: None picks SLURM where `sbatch` exists and runs jobs as local
    processes otherwise; "local" and "debug" force submitit's local / in-process executors
    (tests use them). Job logs go to DIR/.submitit/.
    """

    name = "slurm"

    def __init__(self, folder: Path, workers: int | None = None, cluster: str | None = None,
                 partition: str | None = None, time_min: int = 24 * 60, gpus_per_run: float | None = None,
                 cpus_per_task: int = 1, extra: dict[str, Any] | None = None, poll_s: float = 1.0):
        self.folder = Path(folder)
        self.workers = workers or 0
        self.cluster = cluster
        self.partition = partition
        self.time_min = time_min
        self.gpus_per_run = gpus_per_run
        self.cpus_per_task = cpus_per_task
        self.extra = extra or {}
        self.poll_s = poll_s

    def execute(self, tasks, on_start, on_done):
        try:
            import submitit
        except ImportError:
            raise BadInput("the slurm executor needs submitit: pip install 'groklens[slurm]'") from None
        executor = submitit.AutoExecutor(folder=self.folder, cluster=self.cluster)
        params: dict[str, Any] = {
            "name": "groklens-sweep", "timeout_min": self.time_min, "cpus_per_task": self.cpus_per_task,
            "slurm_array_parallelism": self.workers or len(tasks),
        }
        if self.gpus_per_run:
            params["gpus_per_node"] = math.ceil(self.gpus_per_run)  # SLURM has no fractional GPUs
        if self.partition:
            params["slurm_partition"] = self.partition
        params.update({f"slurm_{k}" if not k.startswith("slurm_") else k: v for k, v in self.extra.items()})
        executor.update_parameters(**params)
        jobs = executor.map_array(_SubmititTask(), tasks)
        for task in tasks:
            on_start(task)
        waiting = dict(zip(jobs, tasks))
        try:
            while waiting:
                finished = [job for job in waiting if job.done()]
                for job in finished:
                    task = waiting.pop(job)
                    try:
                        result = job.result()
                    except Exception as exc:  # noqa: BLE001 - FailedJobError, UncompletedJobError
                        result = exc
                    on_done(task, result)
                if waiting and not finished:
                    time.sleep(self.poll_s)
        except KeyboardInterrupt:
            for job in waiting:
                job.cancel(check=False)
            raise


# ---------------------------------------------------------------------- the runner
@dataclass
class SweepReport:
    out_dir: Path
    counts: dict[str, int]
    failed: dict[str, str] = field(default_factory=dict)
    skipped_failed: list[str] = field(default_factory=list)
    ensembles: int = 0
    single_fallback: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"dir": str(self.out_dir), "counts": self.counts, "failed": self.failed,
                "skipped_failed": self.skipped_failed, "ensembles": self.ensembles,
                "single_fallback": self.single_fallback}


def plan_tasks(runs: Sequence[RunSpec], out_dir: Path, *, ensemble: bool, ensemble_size: int,
               workers: int, threads: int) -> tuple[list[dict], dict[str, str]]:
    """Tasks for an executor: one per run, or ensembles of runs sharing `ensemble_key`.

    Returns (tasks, fallback) where fallback maps runs that cannot join an ensemble to why.
    """
    def entry(r: RunSpec) -> dict:
        return {"name": r.name, "config": r.config.to_dict(), "path": str(run_path(out_dir, r.name))}

    if not ensemble:
        return [{"runs": [entry(r)], "ensemble": False, "threads": threads} for r in runs], {}
    from groklens.trainers.ensemble import ensemble_key, unsupported_reason

    groups: dict[tuple, list[RunSpec]] = {}
    singles: list[RunSpec] = []
    fallback: dict[str, str] = {}
    for r in runs:
        key = ensemble_key(r.config)
        if key is None:
            singles.append(r)
            fallback[r.name] = unsupported_reason(r.config) or "not supported"
        else:
            groups.setdefault(key, []).append(r)
    # chunks of at most ensemble_size; split further while fewer chunks than workers
    counts = {k: math.ceil(len(g) / ensemble_size) for k, g in groups.items()}
    while sum(counts.values()) + len(singles) < workers:
        splittable = [k for k, g in groups.items() if counts[k] < len(g)]
        if not splittable:
            break
        k = max(splittable, key=lambda k: len(groups[k]) / counts[k])
        counts[k] += 1
    tasks = []
    for k, g in groups.items():
        for chunk in np.array_split(np.arange(len(g)), counts[k]):
            members = [g[i] for i in chunk]
            tasks.append({"runs": [entry(m) for m in members], "ensemble": len(members) > 1, "threads": threads})
    tasks += [{"runs": [entry(r)], "ensemble": False, "threads": threads} for r in singles]
    return tasks, fallback


def run_sweep(sweep: Sweep | Sequence[RunSpec], out_dir: str | Path, *, executor: str | _Executor = "local",
              workers: int | None = None, ensemble: bool = False, ensemble_size: int = 64,
              address: str | None = None, gpus_per_run: float | None = None, retry_failed: bool = False,
              threads: int = 1, progress: bool = True, slurm: dict[str, Any] | None = None) -> SweepReport:
    """Run every unfinished run of `sweep` into `out_dir`; see the module docstring.

    `threads` is torch's intra-op thread count in each task. One is the default: small models
    gain little from more, and on a busy machine OpenMP threads that wait for each other's
    time slices can slow a run down a hundredfold; use more for few, large runs.
    """
    runs = sweep.runs() if isinstance(sweep, Sweep) else list(sweep)
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"{out_dir} exists and is not a directory")
    if not out_dir.exists():
        if not out_dir.parent.is_dir():
            raise BadInput(f"directory {out_dir.parent} does not exist")
        out_dir.mkdir()
    if ensemble_size < 1:
        raise BadInput(f"ensemble size must be >= 1; got {ensemble_size}")
    if threads < 1:
        raise BadInput(f"threads must be >= 1; got {threads}")
    _update_manifest(out_dir, runs, sweep if isinstance(sweep, Sweep) else None)

    # classify from the files: done runs are skipped, failed ones too unless retried
    counts = {"total": len(runs), "done": 0, "running": 0, "failed": 0}
    todo: list[RunSpec] = []
    skipped_failed: list[str] = []
    failed: dict[str, str] = {}
    for r in runs:
        state, detail = run_state(out_dir, r.name)
        path = run_path(out_dir, r.name)
        if state in ("done", "interrupted", "running"):
            stored = _stored_config(path)
            if stored is not None and stored != r.config.to_dict():
                # reported, not written to an error file: moving the file away is the fix
                failed[r.name] = f"{path.name} holds a run with a different config; move it away or use another -o"
                counts["failed"] += 1
                continue
        if state == "done":
            counts["done"] += 1
        elif state == "failed" and not retry_failed:
            skipped_failed.append(r.name)
            failed[r.name] = detail
            counts["failed"] += 1
        elif state == "running":
            counts["running"] += 1  # another process writes it; not ours to touch
        else:
            todo.append(r)

    ex = _make_executor(executor, out_dir, workers, address, gpus_per_run, slurm)
    n_workers = getattr(ex, "workers", None) or workers or os.cpu_count() or 1
    tasks, fallback = plan_tasks(todo, out_dir, ensemble=ensemble, ensemble_size=ensemble_size,
                                 workers=n_workers, threads=threads)
    report = SweepReport(out_dir, counts, failed, skipped_failed,
                         ensembles=sum(1 for t in tasks if t["ensemble"]), single_fallback=fallback)
    if not tasks:
        return report

    from tqdm.auto import tqdm

    bar = tqdm(total=len(runs), initial=counts["done"], disable=not progress, unit="run", desc="sweep",
               dynamic_ncols=True)
    in_flight = {"n": 0}

    def show():
        bar.set_postfix_str(f"done {counts['done']} running {in_flight['n'] + counts['running']} "
                            f"failed {counts['failed']}", refresh=True)

    def on_start(task):
        in_flight["n"] += len(task["runs"])
        show()

    def on_done(task, result):
        in_flight["n"] -= len(task["runs"])
        if isinstance(result, BaseException):  # the task itself broke (worker died, job failed)
            outcomes = []
            for r in task["runs"]:
                with _claim(out_dir, r["name"]) as free:
                    state, detail = run_state(out_dir, r["name"])
                    if state in ("done", "failed"):  # it got that far before the task broke
                        outcomes.append({"name": r["name"], "state": state, "detail": detail})
                    elif not free:  # another sweep trains it now: not a failure of this one
                        outcomes.append({"name": r["name"], "state": "running", "detail": detail})
                    else:
                        outcomes.append(_record_failure(Path(r["path"]), r["name"], result))
            result = outcomes
        for outcome in result:
            if outcome["state"] == "done":
                counts["done"] += 1
                bar.update(1)
            elif outcome["state"] == "failed":
                counts["failed"] += 1
                failed[outcome["name"]] = outcome["detail"]
            else:
                counts["running"] += 1
        show()

    show()
    try:
        ex.execute(tasks, on_start, on_done)
    finally:
        bar.close()
    return report


def _make_executor(executor, out_dir, workers, address, gpus_per_run, slurm) -> _Executor:
    if isinstance(executor, _Executor):
        return executor
    if executor == "local":
        if address:
            raise BadInput("--address is for the ray executor")
        return LocalExecutor(workers)
    if executor == "ray":
        return RayExecutor(workers, address=address, gpus_per_run=gpus_per_run)
    if executor == "slurm":
        if address:
            raise BadInput("--address is for the ray executor")
        return SlurmExecutor(out_dir / ".submitit", workers=workers, gpus_per_run=gpus_per_run, **(slurm or {}))
    raise BadInput(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")


def _update_manifest(out_dir: Path, runs: Sequence[RunSpec], sweep: Sweep | None) -> None:
    """DIR/sweep.json: every run this directory was asked for; a name never changes config.
    Concurrent sweeps on one directory take turns (an flock), so neither drops the other's runs."""
    with _manifest_lock(out_dir):
        _update_manifest_locked(out_dir, runs, sweep)


def _update_manifest_locked(out_dir: Path, runs: Sequence[RunSpec], sweep: Sweep | None) -> None:
    path = out_dir / MANIFEST
    manifest: dict[str, Any] = {"format": "groklens-sweep", "runs": {}}
    if path.exists():
        try:
            manifest = json.loads(path.read_text())
        except ValueError:
            raise BadInput(f"{path} is damaged (not JSON); move it away") from None
    known = manifest.setdefault("runs", {})
    for r in runs:
        cfg = r.config.to_dict()
        if r.name in known and known[r.name] != cfg:
            diff = sorted(k for k in set(cfg) | set(known[r.name]) if cfg.get(k) != known[r.name].get(k))
            raise BadInput(f"{out_dir} already has run {r.name} with a different config ({', '.join(diff)}); "
                           "use another -o")
        known[r.name] = cfg
    if sweep is not None:
        manifest["grid"] = sweep.to_dict()
    _write_json(path, manifest)


def sweep_status(out_dir: str | Path) -> dict[str, Any]:
    """What `groklens sweep --status DIR` prints: counts by state, and the failed runs' errors."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise BadInput(f"{out_dir}: no such directory")
    path = out_dir / MANIFEST
    if not path.exists():
        raise BadInput(f"{out_dir} is not a sweep directory (no {MANIFEST})")
    try:
        names = list(json.loads(path.read_text())["runs"])
    except (ValueError, KeyError):
        raise BadInput(f"{path} is damaged; move it away") from None
    states = {name: run_state(out_dir, name) for name in names}
    counts = {s: 0 for s in ("done", "running", "interrupted", "pending", "failed")}
    for state, _ in states.values():
        counts[state] += 1
    return {
        "dir": str(out_dir), "total": len(names), "counts": counts,
        "runs": {n: {"state": s, "detail": d} for n, (s, d) in states.items()},
        "failed": {n: d for n, (s, d) in states.items() if s == "failed"},
    }


def export_config_yaml(run: str | Path, out: str | Path) -> Path:
    """Write RUN.h5's stored config as YAML; `groklens train --config` trains the same run again."""
    import yaml
    from groklens.checkpoints import Trajectory

    cfg = Trajectory(run).config
    Path(out).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return Path(out)


__all__ = [
    "EXECUTORS",
    "InlineExecutor",
    "LocalExecutor",
    "RayExecutor",
    "RunSpec",
    "SlurmExecutor",
    "Sweep",
    "SweepReport",
    "execute_task",
    "export_config_yaml",
    "load_sweep",
    "parse_sweep",
    "plan_tasks",
    "run_name",
    "run_state",
    "run_sweep",
    "sweep_status",
]
