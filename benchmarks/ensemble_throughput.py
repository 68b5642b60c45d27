"""Throughput of batched ensembles: trained model-steps per second of N small MLP configurations
trained as one vmapped ensemble (groklens.trainers.ensemble) against the same N configurations
trained one after another as single runs (groklens.trainers.training.train).

Both sides do everything a sweep does: evaluation every --eval-every steps on all p^2 inputs,
checkpoints every --checkpoint-every steps into one trajectory file per run. Each side runs
once after a short warm-up; the ensemble's files are checked to equal the single runs' to
float tolerance, so the two sides really did the same work.

Run by hand (not by the test suite):
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ensemble_throughput.py [--members 64] [--steps 300]
        [--device cpu|cuda] [--threads 1] [--json]

Configurations (default): model=mlp, 2 hidden layers of d_mlp=64, learned embeddings d_model=32,
modular addition p=23 (529 pairs, train_frac 0.5, full batch); the N members are the product of
4 learning rates x 4 weight decays x N/16 seeds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from groklens.checkpoints import Trajectory
from groklens.trainers.ensemble import train_ensemble
from groklens.trainers.train import train

from groklens.config import RunConfig

LRS = (3e-4, 1e-3, 3e-3, 1e-2)
WDS = (0.1, 0.3, 1.0, 3.0)


def configs(args) -> list[RunConfig]:
    base = {"model": "mlp", "n_layers": 2, "d_model": args.d_model, "d_mlp": args.d_mlp,
            "mlp_bias": True, "task": "add",
                "p": args.p, "train_frac": 0.5, "steps": args.steps, "eval_every": args.eval_every,
                "checkpoint_every": args.checkpoint_every, "device": args.device, "warmup_steps": 10}
    n_seeds = max(1, args.members // (len(LRS) * len(WDS)))
    grid = list(itertools.product(LRS, WDS, range(n_seeds)))[: args.members]
    return [RunConfig.from_dict({**base, "lr": lr, "weight_decay": wd, "seed": s}) for lr, wd, s in grid]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--p", type=int, default=23)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--d-mlp", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfgs = configs(args)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # warm-up: first-call costs (allocator, vmap tracing of the model) out of the timings
        warm = [c.replace(steps=20, eval_every=10, checkpoint_every=10) for c in cfgs[:2]]
        train_ensemble(warm, [tmp / "w0.h5", tmp / "w1.h5"])
        train(warm[0], tmp / "w2.h5", progress=False)
        if args.device == "cuda":
            torch.cuda.synchronize()

        t0 = time.perf_counter()
        results = train_ensemble(cfgs, [tmp / f"e{i}.h5" for i in range(len(cfgs))])
        if args.device == "cuda":
            torch.cuda.synchronize()
        t_ens = time.perf_counter() - t0
        failed_e = sum(r.error is not None for r in results)

        t0 = time.perf_counter()
        failed_s = 0
        for i, c in enumerate(cfgs):
            try:
                train(c, tmp / f"s{i}.h5", progress=False)
            except Exception:  # noqa: BLE001 - counted, as in the ensemble
                failed_s += 1
        if args.device == "cuda":
            torch.cuda.synchronize()
        t_seq = time.perf_counter() - t0

        worst = 0.0
        for i in range(0, len(cfgs), max(1, len(cfgs) // 8)):  # spot-check equality on 8 members
            a, b = Trajectory(tmp / f"e{i}.h5"), Trajectory(tmp / f"s{i}.h5")
            for name in a.param_names:
                worst = max(worst, float(np.max(np.abs(a.param_trajectory(name) - b.param_trajectory(name)))))

    model_steps = len(cfgs) * args.steps
    out = {
        "members": len(cfgs), "steps": args.steps, "device": args.device, "threads": args.threads,
        "config": {"model": "mlp", "n_layers": 2, "d_model": args.d_model, "d_mlp": args.d_mlp, "p": args.p,
                   "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every},
        "ensemble_s": round(t_ens, 2), "sequential_s": round(t_seq, 2),
        "ensemble_model_steps_per_s": round(model_steps / t_ens, 1),
        "sequential_model_steps_per_s": round(model_steps / t_seq, 1),
        "speedup": round(t_seq / t_ens, 2),
        "failed": {"ensemble": failed_e, "sequential": failed_s},
        "max_param_diff_vs_single": worst,
        "load_average": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{len(cfgs)} MLP configs x {args.steps} steps on {args.device} ({args.threads} thread(s)); "
              f"load average {out['load_average']:.1f}")
        print(f"  ensemble   {t_ens:8.2f} s  {out['ensemble_model_steps_per_s']:10.1f} model-steps/s")
        print(f"  sequential {t_seq:8.2f} s  {out['sequential_model_steps_per_s']:10.1f} model-steps/s")
        print(f"  speedup    {out['speedup']:.2f}x   (largest parameter difference ensemble vs single: {worst:.2g})")


if __name__ == "__main__":
    main()
