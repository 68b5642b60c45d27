"""The one training loop. Every run goes through `run()`: a single run, a vmap ensemble of N
members and a routed set of M copies alike (docs/VARIANTS.md).

The loop owns what a run does over time: the step counter and its progress bar, the evaluation
schedule, the stop rule, the checkpoint schedule, non-finite handling and closing the files.
What differs between the kinds of run is a `Strategy`: how parameters are held (one module,
stacked functional state, M modules) and how a step forms losses and gradients. A strategy
trains one or more `Member`s; each member writes one trajectory file.

Checkpoints: step 0, the periodic schedule (`checkpoint_schedule`), and phase checkpoints: at
the first evaluation where train accuracy reaches each phase threshold (memorization) and
where test accuracy does (grokking), per copy of a routed run, so that "at memorization" and
"at grokking" read a checkpoint at that step. The thresholds are the ones the grokking
analysis reports (0.95, 0.99) and the run's grok_threshold. With grok_evals > 1 every later
evaluation where test accuracy crosses a threshold again from below is a phase checkpoint too:
any crossing may start the grok_evals evaluations in a row that make grokking.

Step s means "after s optimizer updates": step 0 is the initialisation. A member stops when
its loss or gradient is not finite (its last good checkpoint stays), or by the stop rule: at the
first evaluation that is at least `stop_after_grok` evaluations after it grokked (the first of
`grok_evals` consecutive evaluations with test accuracy >= `grok_threshold`,
groklens.config.first_sustained; with `stop_test_loss`, the first evaluation with test loss <=
that value: Nanda's cleanup, a loss event that grok_evals does not touch), is itself at the event
(test accuracy >= grok_threshold, or test loss <= stop_test_loss), and is at or past step
`stop_min_steps`. So a run whose test accuracy dips after grokking trains on through the dip
until an evaluation is back at the threshold (or the cap), and its "at end" is never read in a
collapse. The rule reads only the counters and the current row, which a resume rebuilds from
the committed rows (`restore_counters`), so a resumed run stops where the run in one go does.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from groklens.config import PHASE_THRESHOLDS, first_sustained  # the thresholds the grokking analysis reports
from groklens.errors import BadInput, RunFailure

if TYPE_CHECKING:  # pragma: no cover
    from groklens.checkpoints import TrajectoryWriter
    from groklens.config import RunConfig
    from groklens.tasks import TaskData

EVAL_CHUNK = 16_384  # inputs per forward pass during evaluation (bounds memory)
METRIC_NAMES = ["train_loss", "test_loss", "train_acc", "test_acc", "weight_norm", "grad_norm", "lr"]


@dataclass
class TrainResult:
    path: Path
    last_step: int
    status: str


@dataclass(eq=False)
class Member:
    """One trajectory file being trained: a single run, one ensemble member, or a routed set."""

    cfg: "RunConfig"
    data: "TaskData"
    path: Path
    writer: "TrajectoryWriter | None" = None
    grad_norm: float = math.nan  # of the last step (logged at the next evaluation)
    evals_after_grok: int | None = None  # evaluations since it grokked (None: not yet grokked)
    event_streak: int = 0  # consecutive evaluations, up to the last, with the stop event
    last_row: dict | None = None  # the previous evaluation row (a crossing from below is a phase event)
    phases: set[str] = field(default_factory=set)  # the phase events reached so far (`phases_reached`)
    result: TrainResult | None = None
    error: BaseException | None = None
    extra: dict = field(default_factory=dict)
    cpu_s: float = 0.0  # process CPU time of its training so far (a resume starts from the stored value)


class Strategy:
    """How a kind of run holds its parameters and forms a step. `members` are the ones still
    training, in the order of the strategy's own storage."""

    members: list[Member]
    label = "train"
    progress = False

    def train_step(self, step: int) -> list[tuple[Member, str]]:
        """One update of every member, from `step` to `step + 1`. A member whose loss or
        gradient is not finite is not updated: it is removed from `members` and returned with
        the reason."""
        raise NotImplementedError

    def evaluate(self, step: int) -> list[dict[str, float]]:
        """One evaluation row per member (in `members` order)."""
        raise NotImplementedError

    def payloads(self, indices: list[int]) -> list[tuple[dict, dict, list]]:
        """(params, state, copies) of members[i] for each i: what a checkpoint writes."""
        raise NotImplementedError

    def keep(self, indices: list[int]) -> None:
        """Continue with members[indices] only."""
        raise NotImplementedError


# ---------------------------------------------------------------------- schedule
def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' asked for, but no CUDA device is available")
    return torch.device(name)


def checkpoint_schedule(cfg: "RunConfig") -> set[int]:
    """Step 0, every checkpoint_every steps, the last step, and optional log-spaced early ones."""
    steps = set(range(0, cfg.steps + 1, cfg.checkpoint_every)) | {cfg.steps}
    if cfg.log_checkpoints:
        early = np.geomspace(1, cfg.checkpoint_every, cfg.log_checkpoints + 2)[:-1]
        steps |= {int(s) for s in np.round(early) if 0 < s < cfg.checkpoint_every}
    return steps


def warmup_factor(cfg: "RunConfig", step: int) -> float:
    # Nanda's schedule: lr * min(step / warmup, 1), so the very first update has lr 0
    return min(step / cfg.warmup_steps, 1.0) if cfg.warmup_steps else 1.0


def stop_accuracy(row: dict, cfg: "RunConfig"):
    """The test accuracy the stop rule watches: test_acc, or with routing the lowest copy's
    (a routed run stops once every copy has grokked). Works on a row or on metric series."""
    if cfg.routing_copies == 1:
        return row["test_acc"]
    return np.min([row[f"copy{m}.test_acc"] for m in range(cfg.routing_copies)], axis=0)


def stop_event(row: dict, cfg: "RunConfig"):
    """Whether a row is the event the stop rule counts from: test loss <= stop_test_loss when
    that is set (Nanda's cleanup), test accuracy >= grok_threshold otherwise. Works on a row or,
    elementwise, on metric series."""
    if cfg.stop_test_loss > 0:
        return np.asarray(row["test_loss"]) <= cfg.stop_test_loss
    return np.asarray(stop_accuracy(row, cfg)) >= cfg.grok_threshold


def phases_reached(row: dict, cfg: "RunConfig") -> set[str]:
    """The phase events a row (or, on resume, any row of the metric series) has reached:
    '<copy>train_acc>=t' (memorization) and '<copy>test_acc>=t' (grokking) for each threshold
    t in PHASE_THRESHOLDS and grok_threshold; <copy> is '' or, routed, 'copy<m>.'."""
    prefixes = [""] if cfg.routing_copies == 1 else [f"copy{m}." for m in range(cfg.routing_copies)]
    return {f"{prefix}{split}>={t:g}" for prefix in prefixes for split in ("train_acc", "test_acc")
            for t in sorted({*PHASE_THRESHOLDS, cfg.grok_threshold}) if np.any(np.asarray(row[prefix + split]) >= t)}


def crossed_again(row: dict, last: dict | None, cfg: "RunConfig") -> bool:
    """With grok_evals > 1: whether test accuracy crossed a phase threshold from below between the
    last row and this one (the start of what may be grokking needs a checkpoint)."""
    if cfg.grok_evals == 1 or last is None:
        return False
    prefixes = [""] if cfg.routing_copies == 1 else [f"copy{m}." for m in range(cfg.routing_copies)]
    return any(row[p + "test_acc"] >= t > last[p + "test_acc"]
               for p in prefixes for t in {*PHASE_THRESHOLDS, cfg.grok_threshold})


def nonfinite_reason(what: str, value: float, step: int) -> str:
    return f"non-finite {what} ({value}) at step {step}"


def subnormals_flushed() -> bool:
    """Whether this thread's CPU flushes float32 subnormals to zero now (torch.set_flush_denormal;
    torch has no getter): a subnormal times one is zero then."""
    return bool((torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0)


@contextmanager
def flushing_denormals(on: bool):
    """Flush float32 subnormals to zero on the CPU inside the block when `on` (a run's
    flush_denormal): the trainers' entry points (train, resume, and their ensemble forms) build the
    model and train inside it. The flag is per thread: torch sets the calling thread's, and its
    intra-op threads take the one they were started with, so the block begins before the model is
    built, where torch starts them in a training process (a pool that a caller's earlier work
    started keeps its setting: those threads then compute unflushed, to the same numbers). After
    the block the calling thread has its former setting back."""
    before = subnormals_flushed()
    if on == before:
        yield
        return
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


# ---------------------------------------------------------------------- the loop
def run(strategy: Strategy, start_step: int, *, fresh: bool,
        on_commit: Callable[[int], None] | None = None,
        on_eval: Callable[[Member, dict], None] | None = None) -> list[Member]:
    """Train every member of `strategy` from `start_step` to the end of its schedule; their
    writers must be open. A fresh run first evaluates and checkpoints step 0. `on_commit(step)`
    is called after each committed checkpoint, `on_eval(member, row)` after each evaluation row
    is written (live logging, trainers/loggers.py). Returns every member, with its result or error."""
    everyone = list(strategy.members)
    cfg = everyone[0].cfg  # the schedule is shared
    schedule = checkpoint_schedule(cfg)
    bar = _progress_bar(cfg.steps, start_step, strategy)
    step = start_step
    clock = _CpuClock(strategy)
    try:
        if fresh:
            _evaluate(strategy, 0, bar, on_eval)
            clock.charge()
            _commit(strategy, list(range(len(strategy.members))), 0, on_commit)
        while step < cfg.steps and strategy.members:
            for member, reason in strategy.train_step(step):
                _fail(member, reason)
            if not strategy.members:
                break
            step += 1
            bar.update(1)
            stopping: list[int] = []
            phase: list[int] = []
            if step % cfg.eval_every == 0 or step == cfg.steps:
                stopping, phase = _evaluate(strategy, step, bar, on_eval)
            write = list(range(len(strategy.members))) if step in schedule else sorted({*stopping, *phase})
            if write or stopping:
                clock.charge()
            _commit(strategy, write, step, on_commit)
            if stopping:
                _finish(strategy, stopping, step)
    except KeyboardInterrupt:
        clock.charge()
        _close_all(strategy, "stopped: interrupted")
        raise
    except RunFailure as exc:  # e.g. no room for a checkpoint: close the files cleanly
        _close_all(strategy, f"stopped: {exc}")
        raise
    except BaseException:
        _close_all(strategy, "stopped: training failed")
        raise
    finally:
        bar.close()
    clock.charge()
    for member in strategy.members:
        member.writer.close("completed")
        member.result = TrainResult(member.writer.path, step, "completed")  # a staged --force run has moved
    return everyone


class _CpuClock:
    """Charges the process CPU time since the last charge to the members training (an equal
    share each: an ensemble's members take one step together) and hands each member's total
    to its writer, which commits it with the next checkpoint or close. Process time counts
    every thread of the run (core-seconds), and not the time slices other processes took."""

    def __init__(self, strategy: Strategy):
        self.strategy, self.mark = strategy, time.process_time()

    def charge(self) -> None:
        now = time.process_time()
        members = self.strategy.members
        for member in members:
            member.cpu_s += (now - self.mark) / len(members)
            if member.writer is not None:
                member.writer.set_cpu_seconds(member.cpu_s)
        self.mark = now


def _evaluate(strategy: Strategy, step: int, bar, on_eval=None) -> tuple[list[int], list[int]]:
    """Evaluate and record every member; returns the members the stop rule ends now and those
    that reached a phase event (each needs a checkpoint at this step)."""
    rows = strategy.evaluate(step)
    stopping, phase = [], []
    for i, (member, row) in enumerate(zip(strategy.members, rows)):
        member.writer.write_eval(row)
        if on_eval is not None:
            on_eval(member, row)
        cfg = member.cfg
        new = phases_reached(row, cfg) - member.phases
        if new or crossed_again(row, member.last_row, cfg):
            member.phases |= new
            phase.append(i)
        member.last_row = row
        event = bool(stop_event(row, cfg))
        _count_stop_event(member, event)
        if stop_rule_ends(member, event, step):
            stopping.append(i)
    bar.set_postfix_str(_postfix(rows[0]), refresh=False)
    return stopping, phase


def stop_rule_ends(member: Member, event: bool, step: int) -> bool:
    """Whether the stop rule ends a member at this evaluation (module docstring): stop_after_grok
    evaluations or more after grokking, the event holding at this very evaluation (not in a dip
    after grokking), and not before stop_min_steps."""
    cfg = member.cfg
    return bool(cfg.stop_after_grok and member.evals_after_grok is not None
                and member.evals_after_grok >= cfg.stop_after_grok and (event or not cfg.stop_at_event)
                and step >= cfg.stop_min_steps)


def _count_stop_event(member: Member, event: bool) -> None:
    """Advance the stop rule's counters by one evaluation: grokked once the event held grok_evals
    evaluations in a row, at the first of them (so then grok_evals - 1 evaluations ago)."""
    member.event_streak = member.event_streak + 1 if event else 0
    if member.evals_after_grok is not None:
        member.evals_after_grok += 1
    elif member.event_streak == member.cfg.stop_event_evals():
        member.evals_after_grok = member.cfg.stop_event_evals() - 1


def _commit(strategy: Strategy, indices: list[int], step: int, on_commit) -> None:
    if not indices:
        return
    for i, (params, state, copies) in zip(indices, strategy.payloads(indices)):
        strategy.members[i].writer.write_checkpoint(step, params, state, copies)
    if on_commit is not None:
        on_commit(step)


def _finish(strategy: Strategy, stopping: list[int], step: int) -> None:
    for i in stopping:
        member = strategy.members[i]
        cfg = member.cfg
        event = f"test loss <= {cfg.stop_test_loss:g}" if cfg.stop_test_loss > 0 else "grokking"
        status = f"completed: stopped {cfg.stop_after_grok} evaluations after {event}"
        if member.evals_after_grok > cfg.stop_after_grok:  # it waited for the event to hold again, or for the step
            holds = f"test loss <= {cfg.stop_test_loss:g}" if cfg.stop_test_loss > 0 else \
                f"test accuracy >= {cfg.grok_threshold:g}"
            status += (f" ({member.evals_after_grok} evaluations after it: the first then with {holds}"
                       + (f" at or past step {cfg.stop_min_steps}" if cfg.stop_min_steps else "") + ")")
        member.writer.close(status)
        member.result = TrainResult(member.writer.path, step, status)
    strategy.keep([i for i in range(len(strategy.members)) if i not in stopping])


def _fail(member: Member, reason: str) -> None:
    last = member.writer.last_step
    member.writer.close(f"stopped: {reason}")
    member.error = RunFailure(
        f"training stopped: {reason}; the last good checkpoint (step {last}) is kept in {member.writer.path}")


def _close_all(strategy: Strategy, status: str) -> None:
    for member in strategy.members:
        member.writer.close(status)


def _postfix(row: dict[str, float]) -> str:
    return (f"loss {row['train_loss']:.3g}/{row['test_loss']:.3g} "
            f"acc {row['train_acc']:.3f}/{row['test_acc']:.3f}")


def _progress_bar(total: int, initial: int, strategy: Strategy):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not strategy.progress, unit="step", dynamic_ncols=True,
                desc=strategy.label, leave=True)


# ---------------------------------------------------------------------- resume
def restore_counters(member: Member, metrics: dict[str, np.ndarray], cpu_s: float | None = None) -> None:
    """The loop's own per-member state after a resume, from the committed evaluation rows
    (`Trajectory.metrics`, read before the writer reopens the file) and the stored CPU time
    (`Trajectory.cpu_seconds`; None in a file from before it was kept: it stays unknown, NaN)."""
    member.cpu_s = math.nan if cpu_s is None else cpu_s
    events = np.atleast_1d(stop_event(metrics, member.cfg))
    start = first_sustained(events, member.cfg.stop_event_evals())
    member.evals_after_grok = None if start is None else int(len(events) - 1 - start)
    below = np.nonzero(~events)[0]  # the trailing run of events (grokking not yet confirmed)
    member.event_streak = int(len(events) - 1 - below[-1]) if len(below) else int(len(events))
    member.last_row = {k: v[-1] for k, v in metrics.items()} if len(metrics["step"]) else None
    # recovery kept the rows up to the last checkpoint: a phase reached in them has its checkpoint
    member.phases = phases_reached(metrics, member.cfg) if len(metrics["step"]) else set()


def raise_failure(members: list[Member]) -> None:
    """For a run of one file: the member's error, raised."""
    for member in members:
        if member.error is not None:
            raise member.error
