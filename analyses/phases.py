"""A run's phases: when it memorized (first evaluation with train accuracy >= a threshold) and
grokked (the first of the run's grok_evals consecutive evaluations with test accuracy >= it;
analyses/grokking.py), right-censored at the last evaluation, and the checkpoints that stand for them.

"At" a phase means less than one evaluation interval (`eval_every`) from its step: the trainer's
phase checkpoints are exactly there; in a file without them only a periodic checkpoint that
happens to fall there counts, and otherwise the phase has no checkpoint, with the reason.
`compare` reads stored analyses at these checkpoints; `runner.analyze_runs` computes them there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from groklens.analyses.grokking import first_crossing, grok_evals_of, grokked_at
from groklens.config import GROK_THRESHOLD
from groklens.errors import BadInput

PHASES = ("memorization", "grokking", "end")


class PhaseTimes:
    """Censoring of a run's phase steps; the class has `memorization`, `grokking`, `last_step`
    (a run's summary in compare, a ledger entry in experiments/ledger.py)."""

    memorization: int | None
    grokking: int | None
    last_step: int | None

    @property
    def grok_censored(self) -> bool:
        return self.grokking is None

    @property
    def mem_censored(self) -> bool:
        return self.memorization is None

    def grok_time(self) -> float | None:
        """Grokking step, or the censoring step (a lower bound) when it never grokked."""
        if self.grokking is not None:
            return float(self.grokking)
        return None if self.last_step is None else float(self.last_step)


def nearest_checkpoint(checkpoints: Sequence[int], step: int | None) -> int | None:
    """The checkpoint step nearest to `step` (the later one on a tie); None for None."""
    if step is None or not len(checkpoints):
        return None
    cps = np.asarray(checkpoints)
    d = np.abs(cps - step)
    best = np.nonzero(d == d.min())[0]
    return int(cps[best[-1]])


def phase_checkpoint(checkpoints: Sequence[int], step: int | None, interval: int,
                     phase: str) -> tuple[int | None, str]:
    """The checkpoint that stands for `phase` at `step`: the nearest one, if it is less than one
    evaluation interval away; else (None, the reason)."""
    if step is None:
        return None, f"never reached {phase}"
    cp = nearest_checkpoint(checkpoints, step)
    if cp is None:
        return None, "no checkpoints"
    if abs(cp - step) >= interval:
        return None, (f"no checkpoint at {phase} (step {step}): the nearest, step {cp}, is {abs(cp - step)} "
                      f"steps away, not within one evaluation interval ({interval})")
    return cp, ""


@dataclass
class Phases:
    memorization: int | None  # first evaluated step with train accuracy >= threshold
    grokking: int | None  # the first of grok_evals consecutive evaluations with test accuracy >= threshold
    last_step: int | None  # last evaluated step: where a censored run is censored
    steps: dict[str, int | None] = field(default_factory=dict)  # phase -> checkpoint step
    notes: dict[str, str] = field(default_factory=dict)  # phase -> why it has no checkpoint
    first_crossing: int | None = None  # first evaluated step with test accuracy >= threshold
    grok_evals: int = 1

    def checkpoint_steps(self) -> list[int]:
        return sorted({s for s in self.steps.values() if s is not None})


def run_phases(traj, threshold: float = GROK_THRESHOLD) -> Phases:
    """The phases of a run (a checkpoints.Trajectory) and their checkpoints."""
    metrics = traj.metrics
    steps = np.asarray(metrics["step"])
    if "train_acc" not in metrics or "test_acc" not in metrics:
        raise BadInput(f"{traj.path}: the run logs no train_acc / test_acc, so it has no grokking time")
    checkpoints = [int(s) for s in traj.steps]
    mem = first_crossing(steps, metrics["train_acc"], threshold) if len(steps) else None
    evals = grok_evals_of(traj.config_dict)
    grok = grokked_at(steps, metrics["test_acc"], threshold, evals) if len(steps) else None
    first = first_crossing(steps, metrics["test_acc"], threshold) if len(steps) else None
    out = Phases(mem, grok, int(steps[-1]) if len(steps) else None, first_crossing=first, grok_evals=evals)
    interval = int(traj.config_dict.get("eval_every") or 1)
    for phase, step in (("memorization", mem), ("grokking", grok)):
        out.steps[phase], note = phase_checkpoint(checkpoints, step, interval, phase)
        if note:
            out.notes[phase] = note
    out.steps["end"] = checkpoints[-1] if checkpoints else None
    return out
