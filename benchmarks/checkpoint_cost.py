"""Cost of keeping a trajectory: time per training step of the canonical p=113 model, time
per checkpoint write, the fraction of training time spent writing checkpoints, and the file
size of 100 checkpoints. Run by hand: `python benchmarks/checkpoint_cost.py [--steps 300]`.

Both timings come from the same process and the same run, so their ratio is meaningful on a
noisy machine even when the absolute numbers are not.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from groklens.checkpoints import TrajectoryWriter
from groklens.config import RunConfig
from groklens.trainers import train as training
from groklens.trainers.single import SingleRun

from common import Timed  # benchmarks/common.py



def measure(cfg: RunConfig, out: Path) -> dict:
    with Timed(TrajectoryWriter, "write_checkpoint") as ck, Timed(SingleRun, "train_step") as st, \
            Timed(SingleRun, "evaluate") as ev:
        t0 = time.perf_counter()
        training.train(cfg, out, progress=False)
        total = time.perf_counter() - t0
    return {
        "steps": cfg.steps, "checkpoints": ck.calls, "total_s": total,
        "step_ms": 1e3 * st.total / st.calls, "eval_ms": 1e3 * ev.total / ev.calls,
        "checkpoint_ms": 1e3 * ck.total / ck.calls, "checkpoint_fraction": ck.total / total,
        "file_mib": out.stat().st_size / 2**20,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300, help="training steps of the timed canonical run")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        # 1. the canonical schedule: a checkpoint every 100 steps
        canon = measure(RunConfig(steps=args.steps, eval_every=100, checkpoint_every=100, device="cpu"),
                        Path(tmp) / "canonical.h5")
        # 2. 100 checkpoints of the canonical model (one per step): the size of a 10k-step run
        #    checkpointed every 100 steps, and a precise per-checkpoint write time
        hundred = measure(RunConfig(steps=99, eval_every=99, checkpoint_every=1, device="cpu"),
                          Path(tmp) / "hundred.h5")
    est = hundred["checkpoint_ms"] / (100 * canon["step_ms"] + canon["eval_ms"] + hundred["checkpoint_ms"])
    report = {
        "threads": args.threads,
        "canonical_run": canon,
        "hundred_checkpoints": hundred,
        "estimated_checkpoint_fraction_every_100_steps": est,
        "estimated_10k_step_run_file_mib": hundred["file_mib"],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
