"""How `reproduce` spreads an experiment's runs over this machine's cores (issue 31): one run per
core (`cores` workers of one thread each), one run on all cores (one worker of `cores` threads),
or between (w workers of cores // w threads), whichever finishes the runs soonest by step times
measured here, now, on the experiment's own model.

The makespan of n runs on w workers of t threads is ceil(n / w) x step(t) (every run the same
number of steps, one run per worker at a time; an ensemble of runs shares a worker the same way
whatever the layout). More threads per run pay only when the step scales well enough and there
are too few runs to fill the cores; on a loaded machine the threads of one run wait for each
other's time slices, which the measurement sees, so the choice falls back to one run per core.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MEASURE_STEPS = 3  # timed steps per thread count (after one warm-up step)


@dataclass(frozen=True)
class Layout:
    workers: int
    threads: int
    why: str


def candidates(n_runs: int, cores: int) -> list[tuple[int, int]]:
    """(workers, threads) worth comparing: w workers (at most one per run and per core) of
    cores // w threads each, or of one thread."""
    most = max(1, min(n_runs, cores))
    return [(w, t) for w in range(1, most + 1) for t in sorted({1, max(1, cores // w)})]


def choose_layout(n_runs: int, cores: int, step_seconds: Mapping[int, float]) -> Layout:
    """The (workers, threads) of `candidates` with the smallest makespan ceil(n_runs / w) x
    step_seconds[threads]; a tie goes to more workers, then fewer threads (the robust choice on
    a shared machine). `step_seconds`: a step's wall time on each thread count of the candidates."""
    if n_runs < 1 or cores < 1:
        raise ValueError(f"need at least one run and one core; got {n_runs} runs, {cores} cores")

    def key(c: tuple[int, int]) -> tuple[float, int, int]:
        w, t = c
        return float(f"{math.ceil(n_runs / w) * step_seconds[t]:.9g}"), -w, t

    w, t = min(candidates(n_runs, cores), key=key)
    span = key((w, t))[0]
    per_core = math.ceil(n_runs / min(n_runs, cores)) * step_seconds[1]
    how = "one run per core" if t == 1 else "one run on all cores" if w == 1 else f"{w} runs at a time"
    why = (f"{how} ({w} worker(s) x {t} thread(s)): {n_runs} run(s) on {cores} core(s), a step "
           + ", ".join(f"{step_seconds[k] * 1e3:.3g} ms on {k} thread(s)" for k in sorted(step_seconds))
           + (f"; {per_core / span:.2f}x the throughput of one run per core" if t > 1 else ""))
    return Layout(w, t, why)


def measure_step_seconds(cfg: Any, threads: int, steps: int = MEASURE_STEPS) -> float:
    """The median wall time of `steps` training steps of cfg on `threads` torch threads (after a
    warm-up step), in this process; torch's thread count is restored after."""
    import torch

    from groklens.tasks import TASKS
    from groklens.trainers.single import SingleRun

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run = SingleRun(cfg.replace(device="cpu"), TASKS.get(cfg.task).build(cfg))
        run.train_step(0)
        times = []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            run.train_step(step)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(before)


def plan_layout(cfgs: Sequence[Any], cores: int,
                measure: Callable[[Any, int], float] = measure_step_seconds) -> Layout:
    """The layout of `choose_layout` for training `cfgs`, from steps of the costliest config
    (by the step-time model's FLOPs) measured on each candidate thread count. One core, or
    runs on a GPU: one worker per run up to the cores, one thread, nothing measured."""
    from groklens.experiments.pipeline import step_flops

    n = len(cfgs)
    if n == 0:
        return Layout(1, 1, "nothing to train")
    if cores <= 1 or any(getattr(c, "device", "cpu") not in ("cpu", "auto") for c in cfgs) or _on_gpu(cfgs):
        return Layout(max(1, min(n, cores)), 1, f"one run per core ({min(n, cores)} worker(s) x 1 thread)")
    costliest = max(cfgs, key=lambda c: step_flops(c)[0])
    threads = sorted({t for _, t in candidates(n, cores)})
    return choose_layout(n, cores, {t: measure(costliest, t) for t in threads})


def _on_gpu(cfgs: Sequence[Any]) -> bool:
    if not any(getattr(c, "device", "cpu") == "auto" for c in cfgs):
        return False
    import torch

    return torch.cuda.is_available()
