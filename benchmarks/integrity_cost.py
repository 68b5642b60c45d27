"""Cost of the Fletcher32 checksums (format 1.3, issue 46): process CPU time of `train` and of
reading a run back, with and without the checksums, on the canonical p=113 model (d_model 128).
Run by hand: `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/integrity_cost.py [--steps 300] [--rounds 2]`.

Both variants run in this one process, alternating, and are reported as ratios of CPU time
(time.process_time), which the other work on a shared machine does not add to. "Without" is the
file of format 1.2: the writer's filters dropped and its integrity attribute named otherwise, so
the file reads as an unverified earlier-format one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import types
from contextlib import contextmanager
from pathlib import Path

import torch

from groklens.checkpoints import Trajectory, constants
from groklens.checkpoints import writer as writer_module
from groklens.checkpoints.integrity import verify_all
from groklens.checkpoints.reader import open_trajectory_file
from groklens.config import RunConfig
from groklens.trainers.train import train


@contextmanager
def checksums(on: bool):
    """The writer as it is (on) or as format 1.2 wrote (off)."""
    if on:
        yield
        return
    saved = writer_module.CHECKSUM, writer_module.C
    writer_module.CHECKSUM = {}
    writer_module.C = types.SimpleNamespace(**{**vars(constants), "ATTR_INTEGRITY": "benchmark_unchecked"})
    try:
        yield
    finally:
        writer_module.CHECKSUM, writer_module.C = saved


def read_back(path: Path) -> None:
    """What a reader of the whole run does: open (validation), metrics, every checkpoint, and the
    resume check that reads every committed byte."""
    run = Trajectory(path)
    _ = run.metrics  # reading validates and decodes the metrics table
    for step in run.steps:
        run.params(int(step))
    with open_trajectory_file(path) as f:
        verify_all(f)


def cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--checkpoint-every", type=int, default=20, help="often, so that writing weighs")
    ap.add_argument("--rounds", type=int, default=2, help="alternating with/without pairs")
    args = ap.parse_args()
    cfg = RunConfig(steps=args.steps, eval_every=10, checkpoint_every=args.checkpoint_every, device="cpu")
    times = {True: {"train": [], "read": []}, False: {"train": [], "read": []}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for on in (r % 2 == 0, r % 2 != 0):  # alternate which goes first
                path = Path(tmp) / f"run-{r}-{on}.h5"
                with checksums(on):
                    times[on]["train"].append(cpu(lambda path=path: train(cfg, path, progress=False)))
                assert Trajectory(path).verified == on
                times[on]["read"].append(cpu(lambda path=path: read_back(path)))
                times[on].setdefault("file_mib", path.stat().st_size / 2**20)
                n_checkpoints = len(Trajectory(path).steps)
    report = {"threads": torch.get_num_threads(), "steps": cfg.steps, "checkpoints": n_checkpoints,
              "rounds": args.rounds,
              **{f"{'with' if on else 'without'}_{k}_cpu_s": sum(v) for on in times for k, v in times[on].items()
                 if k != "file_mib"},
              "train_ratio": sum(times[True]["train"]) / sum(times[False]["train"]),
              "read_ratio": sum(times[True]["read"]) / sum(times[False]["read"]),
              "file_mib": {"with": times[True]["file_mib"], "without": times[False]["file_mib"]}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
