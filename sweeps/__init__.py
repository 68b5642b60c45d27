"""groklens.sweeps: a grid of runs described once, run by a process pool, Ray or SLURM, resumable.
Orchestration above the trainers: it calls train / train_ensemble and never changes how a run trains.

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
`groklens.trainers.train` (or a batched ensemble, `groklens.trainers.ensemble`).

State of a run, from its files alone (`run_state`):
    done         DIR/<name>.h5 has a status starting with 'completed'
    failed       DIR/<name>.error.json exists (the error, its type and traceback)
    running      a live process holds the writer lock on DIR/<name>.h5
    interrupted  DIR/<name>.h5 has committed checkpoints but no writer: resumed exactly
    pending      no file yet, or one without any committed checkpoint (restarted)
    blocked      DIR/<name>.h5 is not a readable groklens run (a foreign, damaged or truncated file,
                 a link or a device): reported, never replaced; moving it away is the fix
Starting a sweep again skips done runs, resumes interrupted ones, restarts the rest, and
skips failed runs unless `retry_failed` (their error stays until the retry succeeds).
DIR/sweep.json lists every run the directory was asked for, with its config.

Executors submit one task per run (or per ensemble); they never schedule anything themselves:
`local` is a concurrent.futures process pool, `ray` uses Ray tasks (a local instance or an
existing cluster), `slurm` submitit job arrays.

The pieces, one module each (this package runs them and re-exports what callers import):
    grid.py       the sweep file, checked; the runs of the grid and their names
    files.py      the files of DIR: run state, claims and locks, sweep.json, error records
    tasks.py      runs grouped into tasks (ensembles), and the work of one task
    executors.py  local / ray / slurm (and inline, for the Python API)
(Before issue 44 they were groklens.trainers.sweeps and trainers/sweep_*.py; those names still import,
groklens/trainers/__init__.py says how.)
"""

from __future__ import annotations

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groklens.config import as_planned
from groklens.errors import BadInput
from groklens.sweeps.executors import (
    EXECUTORS,
    Executor,
    InlineExecutor,
    LocalExecutor,
    RayExecutor,
    SlurmExecutor,
    make_executor,
)
from groklens.sweeps.files import (
    ERROR_SUFFIX,
    MANIFEST,
    claim_run,
    error_path,
    export_config_yaml,
    record_failure,
    run_path,
    run_state,
    stored_config,
    sweep_status,
    update_manifest,
)
from groklens.sweeps.grid import RunSpec, Sweep, load_sweep, parse_sweep, run_name
from groklens.sweeps.tasks import check_buildable, execute_task, expected_wall, plan_tasks
from groklens.trainers import loggers
from groklens.fileio import check_writable_dir


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


def run_sweep(sweep: Sweep | Sequence[RunSpec], out_dir: str | Path, *, executor: str | Executor = "local",
              workers: int | None = None, ensemble: bool | Callable[[Any], str | None] = False, ensemble_size: int = 64,
              address: str | None = None, gpus_per_run: float | None = None, retry_failed: bool = False,
              threads: int = 1, progress: bool = True, slurm: dict[str, Any] | None = None,
              cost: Callable[[Any], float] | None = None, log: Sequence[str] = ()) -> SweepReport:
    """Run every unfinished run of `sweep` into `out_dir`; see the module docstring. `cost`:
    the seconds a run's config takes, which sizes the ensembles (plan_tasks; default: its steps).
    `ensemble`: True, or a rule cfg -> None (joins an ensemble) or why the run trains alone.
    `log`: `--log` specs (tensorboard:DIR, wandb:PROJECT): every run trained mirrors its rows
    there under its own name (trainers/loggers.py), checked before anything is written.

    `threads` is torch's intra-op thread count in each task. One is the default: small models
    gain little from more, and on a busy machine OpenMP threads that wait for each other's
    time slices can slow a run down a hundredfold; use more for few, large runs.
    """
    runs = sweep.runs() if isinstance(sweep, Sweep) else list(sweep)
    if ensemble_size < 1:
        raise BadInput(f"ensemble size must be >= 1; got {ensemble_size}")
    check_threads(threads, executor)
    check_buildable(runs)  # every run's config builds its run, before anything is written
    specs = loggers.check_specs(log)
    for r in runs:
        loggers.check_targets(specs, run_path(Path(out_dir), r.name))
    ex = make_executor(executor, Path(out_dir), workers, address, gpus_per_run, slurm)
    ex.check()  # Ray or submitit missing, a bad option, a silent --address: before sweep.json
    out_dir = _make_out_dir(Path(out_dir))
    update_manifest(out_dir, runs, sweep if isinstance(sweep, Sweep) else None)
    todo, report = _classify(runs, out_dir, retry_failed)
    n_workers = getattr(ex, "workers", None) or workers or os.cpu_count() or 1
    tasks, report.single_fallback = plan_tasks(todo, out_dir, ensemble=ensemble, ensemble_size=ensemble_size,
                                               workers=n_workers, threads=threads, cost=cost)
    report.ensembles = sum(1 for t in tasks if t["ensemble"])
    for t in tasks:
        t["log"] = [list(s) for s in specs]
    if tasks:
        _execute(ex, tasks, report, total=len(runs), progress=progress)
    return report


def dry_run_wall(tasks: Sequence[dict], workers: int) -> float:
    """`sweep --dry-run --ensemble`'s expected wall time (s) of its tasks on `workers` workers."""
    return expected_wall([t["cost"] for t in tasks], workers)


def dry_run_tasks(runs: Sequence[RunSpec], states: dict[str, tuple[str, str]], out_dir: Path, *,
                  ensemble_size: int, workers: int, threads: int,
                  cost: Callable[[Any], float] | None = None) -> list[dict[str, Any]]:
    """`sweep --dry-run --ensemble`: the tasks the pending and interrupted runs would be cut into
    (plan_tasks), each {runs: names, ensemble, cost}."""
    todo = [r for r in runs if states[r.name][0] in ("pending", "interrupted")]
    tasks, _ = plan_tasks(todo, out_dir, ensemble=True, ensemble_size=ensemble_size, workers=workers,
                          threads=threads, cost=cost)
    return [{"runs": [m["name"] for m in t["runs"]], "ensemble": t["ensemble"], "cost": t["cost"]} for t in tasks]


MAX_THREADS = 1024  # torch threads per task on a remote node (ray, slurm); locally: the cores


def check_threads(threads: int, executor: Any = "local") -> None:
    """--threads: at least 1, at most this machine's cores for local tasks (more only starve
    each other: a worker that starts 100,000 threads dies) and MAX_THREADS elsewhere."""
    local = not isinstance(executor, str) or executor == "local"
    most = (os.cpu_count() or 1) if local else MAX_THREADS
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= most:
        where = "this machine's cores" if local else "the most a task may start"
        raise BadInput(f"threads must be in 1..{most} ({where}); got {threads}")


def _make_out_dir(out_dir: Path) -> Path:
    """DIR itself may be new, its parent must exist (a typo in -o is not a tree of directories)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BadInput(f"{out_dir} exists and is not a directory")
    if not out_dir.exists():
        if not out_dir.parent.is_dir():
            raise BadInput(f"directory {out_dir.parent} does not exist")
        check_writable_dir(out_dir.parent, f"create {out_dir.name} in")
        try:
            out_dir.mkdir()
        except FileExistsError:
            pass  # a concurrent sweep made it
        except OSError as exc:
            raise BadInput(f"cannot create {out_dir} ({exc.strerror})") from None
    check_writable_dir(out_dir)
    return out_dir


def _classify(runs: Sequence[RunSpec], out_dir: Path, retry_failed: bool) -> tuple[list[RunSpec], SweepReport]:
    """From the files: done runs are skipped, failed ones too unless retried, running ones are
    another process's; the rest (pending, interrupted, retried) are to do."""
    report = SweepReport(out_dir, {"total": len(runs), "done": 0, "running": 0, "failed": 0})
    counts = report.counts
    todo: list[RunSpec] = []
    for r in runs:
        state, detail = run_state(out_dir, r.name)
        path = run_path(out_dir, r.name)
        if state in ("done", "interrupted", "running"):
            stored = stored_config(path)
            if stored is not None and as_planned(stored) != as_planned(r.config.to_dict()):
                # reported, not written to an error file: moving the file away is the fix
                report.failed[r.name] = (f"{path.name} holds a run with a different config; move it away or use "
                                         "another -o")
                counts["failed"] += 1
                continue
        if state == "done":
            counts["done"] += 1
        elif state == "blocked":  # a file that is not ours to replace: reported, never trained over
            report.failed[r.name] = detail
            counts["failed"] += 1
        elif state == "failed" and not retry_failed:
            report.skipped_failed.append(r.name)
            report.failed[r.name] = detail
            counts["failed"] += 1
        elif state == "running":
            counts["running"] += 1  # another process writes it; not ours to touch
        else:
            todo.append(r)
    return todo, report


def _execute(ex: Executor, tasks: list[dict], report: SweepReport, *, total: int, progress: bool) -> None:
    bar = _Progress(report, total, progress, cap_steps=sum(int(r["config"]["steps"]) for t in tasks for r in t["runs"]))
    bar.show()
    try:
        ex.execute(tasks, bar.on_start, bar.on_done)
    finally:
        bar.close()


POLL_S = 5.0  # how often the progress bar reads the in-flight runs' files


def member_progress(path: str | Path) -> tuple[int, bool]:
    """(last committed step, finished?) of a run file being trained, read as any reader reads it
    (SWMR); (0, False) before its file exists or while it cannot be read. The last step is the
    later of its last checkpoint and its last evaluation: evaluations come more often (a 3-digit
    nanoGPT run evaluated every 50 steps and checkpointed every 1,000 showed 0 steps done for the
    17 minutes to its step 1,000, and the time left grew)."""
    from groklens.checkpoints import constants as C
    from groklens.checkpoints.reader import open_trajectory_file

    try:
        with open_trajectory_file(path, validate=False) as f:
            # both datasets exist from the file's creation (checkpoints/writer.py); a length commits a row
            committed = (f[C.STEPS], f[C.METRICS][C.METRICS_STEP])
            last = max((int(d[len(d) - 1]) for d in committed if len(d)), default=0)
            status = f[C.STATUS][0].split(b"\0", 1)[0].decode(errors="replace")
    except (BadInput, OSError, KeyError, ValueError, RuntimeError):  # not there yet, or mid-write
        return 0, False
    # finished: at its cap, ended by its stop rule, or left its ensemble diverged (not interrupted)
    return last, status.startswith(("completed", "stopped: non-finite"))


def in_flight_steps(runs: Sequence[dict]) -> dict[str, int]:
    """What the runs ({path, config}) of the tasks in flight have done: `steps` committed, `caps`
    (their steps' sum), `finished` runs (an ensemble's members stop on their own), and `work`:
    the steps of their caps behind them (a finished run's whole cap: nothing of it is left)."""
    done = [member_progress(r["path"]) for r in runs]
    caps = [int(r["config"]["steps"]) for r in runs]
    return {"steps": sum(s for s, _ in done), "caps": sum(caps), "finished": sum(f for _, f in done),
            "work": sum(cap if finished else min(s, cap) for (s, finished), cap in zip(done, caps))}


def in_flight_text(runs: Sequence[dict], done: dict[str, int] | None = None) -> str:
    """What the runs of the tasks in flight have done (in_flight_steps, or `done` where the caller
    has already read it), as the bar shows it."""
    d = in_flight_steps(runs) if done is None else done
    return f"in flight: {d['steps']:,}/{d['caps']:,} steps, {d['finished']} of {len(runs)} runs finished"


def time_left_text(steps_done: int, cap_steps: int, elapsed_s: float) -> str:
    """About how long the sweep has left: the steps still to go to the runs' caps at the pace of the
    steps so far (a finished run counts its whole cap as gone, so runs that stop after grokking
    shorten it as they stop); empty before a step is counted."""
    if steps_done <= 0 or elapsed_s <= 0:
        return ""
    left = max(cap_steps - steps_done, 0) * elapsed_s / steps_done
    return f"~{_duration(left)} left (steps to the caps at the pace so far)"


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class _Progress:
    """The sweep's progress bar; counts each task's outcomes into the report as it ends, and,
    every POLL_S seconds, the committed steps and finished members of the tasks in flight."""

    def __init__(self, report: SweepReport, total: int, enabled: bool, cap_steps: int = 0):
        import threading
        import time

        from tqdm.auto import tqdm

        self.report = report
        self.active: dict[int, list[dict]] = {}  # id(task) -> its runs, for the tasks handed out and not ended
        # the time left comes from steps, not runs: tqdm's runs/s said "19:31 remaining" for 13 minutes while a
        # 6-member ensemble ran (issue 43)
        self.cap_steps, self.ended_steps, self.start = cap_steps, 0, time.monotonic()
        self.bar = tqdm(total=total, initial=report.counts["done"], disable=not enabled, unit="run", desc="sweep",
                        dynamic_ncols=True, bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} runs "
                                                       "[{elapsed}{postfix}]")
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.poller = threading.Thread(target=self._poll, daemon=True) if enabled else None
        if self.poller is not None:
            self.poller.start()

    @property
    def in_flight(self) -> int:
        return sum(len(runs) for runs in self.active.values())

    def show(self, flight: str = "") -> None:
        counts = self.report.counts
        with self.lock:
            self.bar.set_postfix_str(f"done {counts['done']} running {self.in_flight + counts['running']} "
                                     f"failed {counts['failed']}" + (f"; {flight}" if flight else ""), refresh=True)

    def _poll(self) -> None:
        import time

        while not self.stopped.wait(POLL_S):
            runs = [r for runs in list(self.active.values()) for r in runs]
            if runs:
                done = in_flight_steps(runs)  # each run file read once per poll
                left = time_left_text(self.ended_steps + done["work"], self.cap_steps, time.monotonic() - self.start)
                self.show(in_flight_text(runs, done) + (f"; {left}" if left else ""))

    def on_start(self, task: dict) -> None:
        self.active[id(task)] = list(task["runs"])
        self.show()

    def on_done(self, task: dict, result: list[dict] | BaseException) -> None:
        self.active.pop(id(task), None)
        self.ended_steps += sum(int(r["config"]["steps"]) for r in task["runs"])
        if isinstance(result, BaseException):  # the task itself broke (worker died, job failed)
            result = _outcomes_of_broken_task(self.report.out_dir, task, result)
        counts = self.report.counts
        for outcome in result:
            if outcome["state"] == "done":
                counts["done"] += 1
                self.bar.update(1)
            elif outcome["state"] == "failed":
                counts["failed"] += 1
                self.report.failed[outcome["name"]] = outcome["detail"]
            else:
                counts["running"] += 1
        self.show()

    def close(self) -> None:
        self.stopped.set()
        if self.poller is not None:
            self.poller.join()
        self.bar.close()


def _outcomes_of_broken_task(out_dir: Path, task: dict, exc: BaseException) -> list[dict]:
    """Each run of a task that broke as a whole: what its files say it reached, "running" where
    another sweep holds it, else a failure recorded in its error file."""
    outcomes = []
    for r in task["runs"]:
        with claim_run(out_dir, r["name"]) as free:
            state, detail = run_state(out_dir, r["name"])
            if state in ("done", "failed"):  # it got that far before the task broke
                outcomes.append({"name": r["name"], "state": state, "detail": detail})
            elif not free:  # another sweep trains it now: not a failure of this one
                outcomes.append({"name": r["name"], "state": "running", "detail": detail})
            else:
                outcomes.append(record_failure(Path(r["path"]), r["name"], exc))
    return outcomes


__all__ = [
    "ERROR_SUFFIX",
    "EXECUTORS",
    "MANIFEST",
    "Executor",
    "InlineExecutor",
    "LocalExecutor",
    "RayExecutor",
    "RunSpec",
    "SlurmExecutor",
    "Sweep",
    "SweepReport",
    "check_buildable",
    "check_threads",
    "error_path",
    "execute_task",
    "export_config_yaml",
    "load_sweep",
    "make_executor",
    "parse_sweep",
    "plan_tasks",
    "run_name",
    "run_path",
    "run_state",
    "run_sweep",
    "sweep_status",
]
