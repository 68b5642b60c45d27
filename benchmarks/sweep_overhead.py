"""Where a local sweep of tiny runs spends its wall time: training steps, evaluation and
checkpoint writes, against everything else (process start, imports, model and data builds,
run-state checks, file opening and closing, the manifest, the pool).

Run by hand: `python benchmarks/sweep_overhead.py [--runs 64] [--steps 100] [--workers 1]`.
It runs `groklens.sweeps.run_sweep` with the local executor (the process pool of
`groklens sweep`) on a grid of tiny runs. Inside each worker the training steps
(`Trainer.train_step`), evaluations (`Trainer.evaluate` and the writing of its row,
`TrajectoryWriter.write_eval`) and checkpoint writes (`TrajectoryWriter.write_checkpoint`) are
timed; their sum over the workers, divided by the wall time times the number of workers, is the
productive share; the rest is overhead.
Both come from the same sweep, so their ratio holds on a busy machine. With `--workers 1`
(the default) the reading does not depend on how other processes share the cores.

Target (issue 18): overhead <= 20% of the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from common import Timed  # benchmarks/common.py

TIMINGS_ENV = "GROKLENS_BENCH_TIMINGS"


def timed_execute_task(task: dict) -> list[dict]:
    """groklens.sweeps.tasks.execute_task, with the productive parts timed; appends one JSON line per task."""
    from groklens.checkpoints import TrajectoryWriter
    from groklens.sweeps.tasks import execute_task
    from groklens.trainers.single import SingleRun

    t0, started = time.perf_counter(), time.time()
    with Timed(SingleRun, "train_step") as st, Timed(SingleRun, "evaluate") as ev, \
            Timed(TrajectoryWriter, "write_eval") as ew, Timed(TrajectoryWriter, "write_checkpoint") as ck:
        out = execute_task(task)
    record = {"pid": os.getpid(), "start": started, "end": time.time(), "task_s": time.perf_counter() - t0,
              "step_s": st.total, "steps": st.calls,
              "eval_s": ev.total + ew.total, "checkpoint_s": ck.total}
    with open(os.environ[TIMINGS_ENV], "a") as f:
        f.write(json.dumps(record) + "\n")
    return out


def grid(runs: int, steps: int) -> dict:
    seeds = max(1, runs // 16)
    axes = {"lr": [1e-3, 2e-3, 3e-3, 5e-3], "weight_decay": [0.1, 0.3, 1.0, 3.0]}
    return {"base": {"p": 11, "train_frac": 0.5, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32,
                     "steps": steps, "eval_every": max(1, steps // 10), "checkpoint_every": max(1, steps // 4),
                     "device": "cpu"},
            "axes": axes, "seeds": list(range(seeds))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=64, help="runs in the grid (a multiple of 16)")
    ap.add_argument("--steps", type=int, default=100, help="training steps per run")
    ap.add_argument("--workers", type=int, default=1, help="worker processes of the local executor")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from groklens import sweeps
    from groklens.sweeps import executors

    spec = sweeps.parse_sweep(grid(args.runs, args.steps))
    with tempfile.TemporaryDirectory() as tmp:
        timings = Path(tmp) / "timings.jsonl"
        os.environ[TIMINGS_ENV] = str(timings)  # inherited by the pool's server and workers
        executors.execute_task = timed_execute_task  # what LocalExecutor submits (pickled by name)
        t0, started = time.perf_counter(), time.time()
        report = sweeps.run_sweep(spec, Path(tmp) / "sweep", executor="local", workers=args.workers,
                                  progress=False)
        wall, ended = time.perf_counter() - t0, time.time()
        records = [json.loads(line) for line in timings.read_text().splitlines()]
    assert report.counts["done"] == len(spec.runs()), report.counts
    capacity = wall * args.workers
    parts = {k: sum(r[k] for r in records) for k in ("step_s", "eval_s", "checkpoint_s", "task_s")}
    productive = parts["step_s"] + parts["eval_s"] + parts["checkpoint_s"]
    result = {
        "runs": len(records), "workers": args.workers, "steps_per_run": args.steps, "wall_s": round(wall, 2),
        "share_steps": parts["step_s"] / capacity, "share_eval": parts["eval_s"] / capacity,
        "share_checkpoints": parts["checkpoint_s"] / capacity,
        "share_in_task_other": (parts["task_s"] - productive) / capacity,
        "share_outside_tasks": 1 - parts["task_s"] / capacity,
        # of which: until the first task starts (pool and worker start-up, imports), after the last ends
        "share_before_first_task": (min(r["start"] for r in records) - started) / wall,
        "share_after_last_task": (ended - max(r["end"] for r in records)) / wall,
        "overhead_share": 1 - productive / capacity,
        "worker_processes": len({r["pid"] for r in records}),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{result['runs']} runs x {args.steps} steps, {args.workers} worker(s), "
          f"{result['worker_processes']} worker process(es), wall {wall:.1f} s")
    for key in ("share_steps", "share_eval", "share_checkpoints", "share_in_task_other", "share_outside_tasks",
                "share_before_first_task", "share_after_last_task"):
        print(f"  {key:<22} {100 * result[key]:5.1f}%")
    print(f"  overhead (not steps, evaluation or checkpoint writes): {100 * result['overhead_share']:.1f}%")


if __name__ == "__main__":
    main()
