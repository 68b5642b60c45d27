"""Grokking step of the model variants and regularizers on one small modular-addition config.

Run by hand (not by the test suite), on one thread:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/variants_grok.py --out runs/variants --seeds 1 2 3

Every run is an ordinary `groklens train` run: the printed `groklens train` command of a row
reproduces its trajectory file. The base config is Nanda's model (1 layer, d_model 128, 4 heads
of 32, d_mlp 512, no norm, causal, no biases; AdamW lr 1e-3, wd 1, betas (0.9, 0.98), 10
warm-up steps, full batch) on a small task: p = 23, 50% of the pairs for training. It memorizes
in ~100 steps and groks after 5k-15k steps, 2-7 minutes per run on one free CPU core.
Narrower models (`--set d_model=64 n_heads=2 d_mlp=256`) plateau below 0.95 on some seeds, and
at lr 3e-3 the test accuracy creeps up without a sharp transition on some seeds.
The regularizer strengths are single untuned guesses (act_norm_lambda 0.1; GeomDR lambda 1
toward 8 dimensions, always on).
A run stops 4 evaluations after test accuracy first reaches 0.95; one that never
does is censored at --steps and reported as `> steps`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import flags  # benchmarks/common.py

BASE = dict(task="add", p=23, train_frac=0.5, d_model=128, n_heads=4, d_head=32, d_mlp=512, lr=1e-3,
            weight_decay=1.0, eval_every=50, checkpoint_every=1000, stop_after_grok=4, device="cpu")
VARIANTS = {
    "standard": {},
    "sphere": dict(norm="sphere", unembed="bounded"),
    "uniform_attn": dict(attention="uniform"),
    "act_norm": dict(act_norm_lambda=0.1),
    "geomdr": dict(geomdr_lambda=1.0, geomdr_target=8.0),
}


def _row(path: Path) -> dict:
    from groklens.analyses.grokking import grokking_times
    from groklens.checkpoints import Trajectory

    run = Trajectory(path)
    times = grokking_times(run.metrics, (0.9, 0.95))
    return dict(grok_95=times["grokking_step"]["0.95"], grok_90=times["grokking_step"]["0.9"],
                memorized=times["memorization_step"]["0.95"], last_step=times["last_step"],
                final_test_acc=float(run.metrics["test_acc"][-1]), steps=run.config.steps)


def _table(rows: dict[str, dict[int, dict]], seeds: list[int]) -> str:
    def show(step, r):
        return str(step) if step is not None else f"> {r['last_step']}"

    lines = ["| variant | grok step @0.95 (seeds " + ", ".join(map(str, seeds)) + ") | mean of grokked "
             "| grok step @0.90 | memorized @0.95 | final test acc |", "|---|---|---|---|---|---|"]
    for name, by_seed in rows.items():
        rs = [by_seed[s] for s in seeds if s in by_seed]
        done = [r["grok_95"] for r in rs if r["grok_95"] is not None]
        mean = "none"
        if done:
            mean = f"{statistics.mean(done):.0f}" + ("" if len(done) == len(rs) else f" ({len(done)}/{len(rs)})")
        lines.append(f"| {name} | {', '.join(show(r['grok_95'], r) for r in rs)} | {mean} "
                     f"| {', '.join(show(r['grok_90'], r) for r in rs)} | {', '.join(str(r['memorized']) for r in rs)} "
                     f"| {', '.join('%.3f' % r['final_test_acc'] for r in rs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the trajectory files")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--steps", type=int, default=20_000, help="censoring limit of every run")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="override a field of every variant, e.g. act_norm_lambda=0.01")
    ap.add_argument("--report", action="store_true", help="only tabulate the runs already in --out")
    ap.add_argument("--json", action="store_true", help="print each row as a JSON line too")
    args = ap.parse_args(argv)

    import torch

    from groklens.config import RunConfig
    from groklens.trainers.train import train

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    extra = dict(kv.split("=", 1) for kv in args.set)
    rows: dict[str, dict[int, dict]] = {}
    for name in args.variants:
        for seed in args.seeds:
            over = {**BASE, **VARIANTS[name], **extra, "seed": seed, "steps": args.steps}
            path = args.out / f"{name}_s{seed}.h5"
            wall = None
            if not args.report:
                t0 = time.perf_counter()
                train(RunConfig.from_dict(over), path, force=True, progress=False)
                wall = round(time.perf_counter() - t0, 1)
            elif not path.exists():
                continue
            row = dict(variant=name, seed=seed, **_row(path), wall_s=wall,
                       command=f"groklens train --out {path} --force {flags(over)}")
            rows.setdefault(name, {})[seed] = row
            g = row["grok_95"]
            print(f"{name:14s} seed {seed}: grok@0.95 {g if g is not None else '> %d' % row['last_step']:>7}  "
                  f"grok@0.90 {row['grok_90']}  memorized {row['memorized']}  ({wall} s)", flush=True)
            if args.json:
                print(json.dumps(row), flush=True)
    print()
    print(_table(rows, args.seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
