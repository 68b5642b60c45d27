"""Throughput of batched ensembles: trained model-steps per second of N small MLP configurations
trained as one vmapped ensemble (groklens.trainers.ensemble) against the same N configurations
trained one after another as single runs (groklens.trainers.training.train).

Both sides do everything a sweep does: evaluation every --eval-every steps on all p^2 inputs,
checkpoints every --checkpoint-every steps into one trajectory file per run. After a short
warm-up the two sides run in turn, --rounds times (ensemble, sequential, ensemble, ...), each
timed by wall clock and by this process's CPU time (which other processes' time slices do not
enter); the speed-up is the median over the rounds of the pair's ratio. The ensemble's files are
checked to equal the single runs' to float tolerance, so the two sides really did the same work.

Run by hand (not by the test suite):
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ensemble_throughput.py [--members 64] [--steps 300]
        [--rounds 1] [--p 23] [--d-model 32] [--d-mlp 64] [--train-frac 0.5] [--lrs ...] [--wds ...]
        [--device cpu|cuda] [--threads 1] [--json]
The scaling-law paper scale's cell (docs/PERFORMANCE.md): --p 47 --d-model 128 --train-frac 0.5
--members 24 --wds 0.1,0.3,0.5,1,2,3 with --d-mlp 64 and 512.

Configurations (default): model=mlp, 2 hidden layers of d_mlp=64, learned embeddings d_model=32,
modular addition p=23 (529 pairs, train_frac 0.5, full batch); the N members are the product of
the learning rates (default 4) x the weight decays (default 4) x as many seeds as fill N.
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


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def configs(args) -> list[RunConfig]:
    base = {"model": "mlp", "n_layers": 2, "d_model": args.d_model, "d_mlp": args.d_mlp,
            "mlp_bias": True, "task": "add",
                "p": args.p, "train_frac": args.train_frac, "steps": args.steps, "eval_every": args.eval_every,
                "checkpoint_every": args.checkpoint_every, "device": args.device, "warmup_steps": 10}
    n_seeds = max(1, -(-args.members // (len(args.lrs) * len(args.wds))))
    grid = list(itertools.product(range(n_seeds), args.lrs, args.wds))[: args.members]
    return [RunConfig.from_dict({**base, "lr": lr, "weight_decay": wd, "seed": s}) for s, lr, wd in grid]


def _timed(fn, device: str) -> tuple[float, float]:
    """(wall s, process CPU s) of fn()."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--p", type=int, default=23)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--d-mlp", type=int, default=64)
    ap.add_argument("--train-frac", type=float, default=0.5)
    ap.add_argument("--lrs", type=_floats, default=LRS, help="comma-separated learning rates")
    ap.add_argument("--wds", type=_floats, default=WDS, help="comma-separated weight decays")
    ap.add_argument("--rounds", type=int, default=1, help="ensemble / sequential pairs, in turn")
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

        ens, seq, failed_e, failed_s = [], [], 0, 0

        def ensemble(k):
            nonlocal failed_e
            results = train_ensemble(cfgs, [tmp / f"e{k}_{i}.h5" for i in range(len(cfgs))])
            failed_e = sum(r.error is not None for r in results)

        def sequential(k):
            nonlocal failed_s
            failed_s = 0
            for i, c in enumerate(cfgs):
                try:
                    train(c, tmp / f"s{k}_{i}.h5", progress=False)
                except Exception:  # noqa: BLE001 - counted, as in the ensemble
                    failed_s += 1

        for k in range(args.rounds):
            ens.append(_timed(lambda k=k: ensemble(k), args.device))
            seq.append(_timed(lambda k=k: sequential(k), args.device))

        worst = 0.0
        for i in range(0, len(cfgs), max(1, len(cfgs) // 8)):  # spot-check equality on 8 members
            a, b = Trajectory(tmp / f"e0_{i}.h5"), Trajectory(tmp / f"s0_{i}.h5")
            for name in a.param_names:
                worst = max(worst, float(np.max(np.abs(a.param_trajectory(name) - b.param_trajectory(name)))))

    model_steps = len(cfgs) * args.steps
    t_ens, t_seq = float(np.median([w for w, _ in ens])), float(np.median([w for w, _ in seq]))
    c_ens, c_seq = float(np.median([c for _, c in ens])), float(np.median([c for _, c in seq]))
    out = {
        "members": len(cfgs), "steps": args.steps, "rounds": args.rounds, "device": args.device,
        "threads": args.threads,
        "config": {"model": "mlp", "n_layers": 2, "d_model": args.d_model, "d_mlp": args.d_mlp, "p": args.p,
                   "train_frac": args.train_frac, "lrs": list(args.lrs), "wds": list(args.wds),
                   "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every},
        "ensemble_s": round(t_ens, 2), "sequential_s": round(t_seq, 2),
        "ensemble_cpu_s": round(c_ens, 2), "sequential_cpu_s": round(c_seq, 2),
        "ensemble_model_steps_per_s": round(model_steps / t_ens, 1),
        "sequential_model_steps_per_s": round(model_steps / t_seq, 1),
        # the median of the pairs' ratios (each pair ran back to back)
        "speedup": round(float(np.median([s[0] / e[0] for e, s in zip(ens, seq)])), 2),
        "speedup_cpu": round(float(np.median([s[1] / e[1] for e, s in zip(ens, seq)])), 2),
        "failed": {"ensemble": failed_e, "sequential": failed_s},
        "max_param_diff_vs_single": worst,
        "load_average": os.getloadavg()[0],
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{len(cfgs)} MLP configs x {args.steps} steps on {args.device} ({args.threads} thread(s)), "
              f"{args.rounds} round(s); load average {out['load_average']:.1f}")
        print(f"  ensemble   {t_ens:8.2f} s wall, {c_ens:8.2f} s CPU  {out['ensemble_model_steps_per_s']:10.1f} "
              "model-steps/s")
        print(f"  sequential {t_seq:8.2f} s wall, {c_seq:8.2f} s CPU  {out['sequential_model_steps_per_s']:10.1f} "
              "model-steps/s")
        print(f"  speedup    {out['speedup']:.2f}x wall, {out['speedup_cpu']:.2f}x CPU   (largest parameter difference "
              f"ensemble vs single: {worst:.2g})")


if __name__ == "__main__":
    main()
