"""How `reproduce` spreads an experiment's runs over this machine's cores (issue 31): one run per
core (`cores` workers of one thread each), one run on all cores (one worker of `cores` threads),
or between (w workers of cores // w threads), whichever finishes the runs soonest by step times
measured here, now, on the experiment's own model.

The makespan of n runs on w workers of t threads is ceil(n / w) x step(t) (every run the same
number of steps, one run per worker at a time; an ensemble of runs shares a worker the same way
whatever the layout). More threads per run pay only when the step scales well enough and there
are too few runs to fill the cores; on a loaded machine the threads of one run wait for each
other's time slices, which the measurement sees, so the choice falls back to one run per core.

`step_flops` is the step-cost model both the layout (which run is costliest) and `reproduce
--list`'s estimates read.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from groklens.config import TEACHER_MODELS

MEASURE_STEPS = 3  # timed steps per thread count (after one warm-up step)
# On a CPU a vmapped ensemble pays where a run's step is overhead-bound, not where it is
# compute-bound. Measured on this project's 2-core CPU (docs/PERFORMANCE.md, 2026-12-05), process
# CPU time of 24 members against the same 24 single runs: 1.17x the throughput at a 3.5 ms step
# (the scaling-law paper cell at width 64), 0.86x at a 33 ms step (width 512); 1.6-2.4x at 1.3 ms
# (docs/SWEEPS.md). `reproduce` trains a CPU run whose step (timed here, one thread) is longer
# than this alone.
ENSEMBLE_CPU_MAX_STEP_S = 0.01


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
    from groklens.trainers.train import strategy_class

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu = cfg.replace(device="cpu")
        run = strategy_class(cpu)(cpu, TASKS.get(cfg.task).build(cfg))
        run.train_step(0)
        times = []
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            run.train_step(step)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=512)
def _task_shape(cfg_json: str) -> tuple[int, int, int, int]:
    """(all inputs, training inputs, sequence length, output vocabulary) of a config's task, from
    the task registry (the task's own grid, split and vocabulary: no task sizes are hard-coded here)."""
    from groklens.config import RunConfig
    from groklens.tasks import TASKS

    cfg = RunConfig.from_dict(json.loads(cfg_json))
    task = TASKS.get(cfg.task)
    if task.shape is not None:  # from the config alone: building a teacher's or S5's grid took seconds a listing
        n_all, ctx, _ = task.shape(cfg)
    else:
        inputs, labels, *_ = task.grid(cfg)
        n_all, ctx = len(labels), inputs.shape[1]
    n_train = len(task.draw_split(cfg, n_all)[0])
    return int(n_all), n_train, int(ctx), int(task.vocab(cfg)[1])


def step_flops(cfg) -> tuple[float, float]:
    """(FLOPs of one training step, FLOPs of one evaluation) of cfg: 6 x (multiply-add weights
    per token) x tokens for training (forward + backward), 2 x for the evaluation forward pass;
    a routed run's M copies each take both."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("seed", "lr", "weight_decay", "steps")}
    n_all, n_train, ctx, vocab_out = _task_shape(json.dumps(data, sort_keys=True))
    batch = cfg.batch_size if cfg.batch_size and cfg.batch_size < n_train else n_train
    copies = cfg.routing_copies
    if cfg.model in TEACHER_MODELS:  # one example vector of teacher_dim per input, K hidden units
        per = cfg.teacher_dim * (cfg.d_mlp if cfg.model == "committee" else 1)
        return 6.0 * per * batch * copies, 2.0 * per * n_all * copies
    if cfg.model == "mlp":
        d_in = (ctx - 1) * cfg.d_model
        per = d_in * cfg.d_mlp + (cfg.n_layers - 1) * cfg.d_mlp ** 2 + cfg.d_mlp * vocab_out
        tokens_train, tokens_eval = batch, n_all
    else:
        h = cfg.n_heads * cfg.d_head
        per = cfg.n_layers * (4 * cfg.d_model * h + 2 * cfg.d_model * cfg.d_mlp + 2 * ctx * h) + cfg.d_model * vocab_out
        tokens_train, tokens_eval = batch * ctx, n_all * ctx
    return 6.0 * per * tokens_train * copies, 2.0 * per * tokens_eval * copies


def plan_layout(cfgs: Sequence[Any], cores: int,
                measure: Callable[[Any, int], float] = measure_step_seconds) -> Layout:
    """The layout of `choose_layout` for training `cfgs`, from steps of the costliest config
    (by the step-time model's FLOPs) measured on each candidate thread count. One core, or
    runs on a GPU: one worker per run up to the cores, one thread, nothing measured."""
    n = len(cfgs)
    if n == 0:
        return Layout(1, 1, "nothing to train")
    if cores <= 1 or any(getattr(c, "device", "cpu") not in ("cpu", "auto") for c in cfgs) or _on_gpu(cfgs):
        return Layout(max(1, min(n, cores)), 1, f"one run per core ({min(n, cores)} worker(s) x 1 thread)")
    costliest = max(cfgs, key=lambda c: step_flops(c)[0])
    threads = sorted({t for _, t in candidates(n, cores)})
    return choose_layout(n, cores, {t: measure(costliest, t) for t in threads})


def ensemble_rule(step_seconds: Callable[[Any], float | None], gpu: bool = False) -> Callable[[Any], str | None]:
    """`run_sweep`'s ensemble rule for reproduce: None (join an ensemble) for a run on a GPU (here,
    or `gpu`: a cluster's, where the runs train), or whose step takes at most
    ENSEMBLE_CPU_MAX_STEP_S on one CPU thread as timed here (`step_seconds`; None where it was not
    timed: it joins), else why it trains alone."""
    def rule(cfg) -> str | None:
        if gpu or _on_gpu([cfg]) or getattr(cfg, "device", "cpu") not in ("cpu", "auto"):
            return None
        step = step_seconds(cfg)
        if step is None or step <= ENSEMBLE_CPU_MAX_STEP_S:
            return None
        return (f"a {step * 1e3:.3g} ms step on one CPU thread: compute-bound, where an ensemble does not pay "
                f"(over {ENSEMBLE_CPU_MAX_STEP_S * 1e3:g} ms)")
    return rule


def _on_gpu(cfgs: Sequence[Any]) -> bool:
    if not any(getattr(c, "device", "cpu") == "auto" for c in cfgs):
        return False
    import torch

    return torch.cuda.is_available()
