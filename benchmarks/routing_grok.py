"""Grokking with permutation routing across model copies, against independent copies and a single model.

Run by hand (not by the test suite), on one thread:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/routing_grok.py --out runs/routing --seeds 10 20 30

Arms (each an ordinary `groklens train` run; the printed command reproduces its file):
  baseline     one model (routing_copies 1), seed S
  independent  M copies, identity kernel (routing_width 0): M independent runs with seeds S..S+M-1
  routed-W     M copies routed through the ring kernel of width W (same seeds, so the copies start
               from the same weights as the independent arm's)
Base config: modular addition p = 23, 50% of the pairs for training, 1 layer, d_model 64, 2 heads
x 32, d_mlp 256, pre-LayerNorm, AdamW lr 3e-3, wd 1, full batch, evaluation every 50 steps. Every
run goes the full --steps (no stop rule), so final accuracies are compared at the same step; the
grokking step is the first evaluation with test accuracy >= 0.95, `> steps` when never (censored).
"final" is the test accuracy at the last step, "last-10 mean" its mean over the last 10 evaluations
(test accuracy of this config still swings by several points after grokking). "copy spread" is
the mean over copies c > 0 of ||theta_c - theta_0|| / ||theta_0|| at the last step.
Seeds are spaced by 10 so that the copies of different seeds never share an initialisation.
The MLP table of docs/VARIANTS.md: add `--steps 6000 --set model=mlp n_layers=2 norm=none`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import flags  # benchmarks/common.py

BASE = dict(task="add", p=23, train_frac=0.5, d_model=64, n_heads=2, d_head=32, d_mlp=256, norm="ln", lr=3e-3,
            weight_decay=1.0, eval_every=50, checkpoint_every=1000, device="cpu")


def arms(copies: int, widths: list[float]) -> dict[str, dict]:
    out = {"baseline": {}, "independent": dict(routing_copies=copies, routing_width=0.0)}
    for w in widths:
        out[f"routed-{w:g}"] = dict(routing_copies=copies, routing_width=w)
    return out


def _row(path: Path) -> dict:
    from groklens.analyses.grokking import first_crossing
    from groklens.checkpoints import Trajectory

    run = Trajectory(path)
    m = run.metrics
    n = run.n_copies
    prefixes = [f"copy{c}." for c in range(n)] if n > 1 else [""]
    grok = [first_crossing(m["step"], m[p + "test_acc"], 0.95) for p in prefixes]
    final = [float(m[p + "test_acc"][-1]) for p in prefixes]
    tail = [float(m[p + "test_acc"][-10:].mean()) for p in prefixes]
    ens = first_crossing(m["step"], m["ensemble.test_acc"], 0.95) if n > 1 else None
    spread = None
    if n > 1:  # how far apart the copies end: mean over c > 0 of ||theta_c - theta_0|| / ||theta_0||
        last = int(run.steps[-1])
        p0 = {k: v.double() for k, v in run.params(last).items()}
        norm0 = sum(float((v * v).sum()) for v in p0.values()) ** 0.5
        spread = statistics.mean(
            sum(float(((v.double() - p0[k]) ** 2).sum()) for k, v in Trajectory(path, copy=c).params(last).items())
            ** 0.5 / norm0 for c in range(1, n))
    return dict(grok=grok, final=final, tail=tail, ensemble_grok=ens, spread=spread,
                ensemble_final=float(m["ensemble.test_acc"][-1]) if n > 1 else None,
                ensemble_tail=float(m["ensemble.test_acc"][-10:].mean()) if n > 1 else None,
                last_step=int(m["step"][-1]), copies=n)


def _show(step, last):
    return str(step) if step is not None else f"> {last}"


def _mean_of(done: list, total: int) -> str:
    return f"{statistics.mean(done):.0f} ({len(done)}/{total})" if done else f"none (0/{total})"


def table(rows: dict[str, dict[int, dict]], seeds: list[int], walls: dict) -> str:
    lines = ["| arm | seed | grok step @0.95 per copy | ensemble grok step | final test acc per copy | "
             "ensemble final | copy spread | wall s |", "|---|---|---|---|---|---|---|---|"]
    for arm, by_seed in rows.items():
        for s in seeds:
            if s not in by_seed:
                continue
            r = by_seed[s]
            lines.append(
                f"| {arm} | {s} | {', '.join(_show(g, r['last_step']) for g in r['grok'])} | "
                f"{_show(r['ensemble_grok'], r['last_step']) if r['copies'] > 1 else '-'} | "
                f"{', '.join('%.3f' % a for a in r['final'])} | "
                f"{'%.3f' % r['ensemble_final'] if r['ensemble_final'] is not None else '-'} | "
                f"{'%.3f' % r['spread'] if r['spread'] is not None else '-'} | "
                f"{walls.get(f'{arm}/{s}', float('nan')):.0f} |")
    lines += ["", "| arm | mean grok step, all copies x seeds (grokked/total) | median | mean ensemble grok step | "
              "mean final test acc | mean last-10 test acc | ensemble: final, last-10 |",
              "|---|---|---|---|---|---|---|"]
    for arm, by_seed in rows.items():
        rs = [by_seed[s] for s in seeds if s in by_seed]
        steps = [g for r in rs for g in r["grok"]]
        done = [g for g in steps if g is not None]
        ens = [r["ensemble_grok"] for r in rs if r["ensemble_grok"] is not None]
        mean = f"{statistics.mean(done):.0f} ({len(done)}/{len(steps)})" if done else f"none (0/{len(steps)})"
        median = f"{statistics.median(done):.0f}" if len(done) == len(steps) and done else "-"
        lines.append(f"| {arm} | {mean} | {median} | "
                     f"{_mean_of(ens, len(rs)) if rs and rs[0]['copies'] > 1 else '-'} | "
                     f"{statistics.mean(a for r in rs for a in r['final']):.3f} | "
                     f"{statistics.mean(a for r in rs for a in r['tail']):.3f} | "
                     + (f"{statistics.mean(r['ensemble_final'] for r in rs):.3f}, "
                        f"{statistics.mean(r['ensemble_tail'] for r in rs):.3f} |" if rs[0]["copies"] > 1 else "- |"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the trajectory files")
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 20, 30])
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--widths", type=float, nargs="+", default=[1.0], help="routing widths of the routed arms")
    ap.add_argument("--arms", nargs="+", default=None, help="subset of the arms (default: all)")
    ap.add_argument("--steps", type=int, default=5000, help="length of every run (and censoring limit)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="change the base config (e.g. model=mlp n_layers=2 norm=none)")
    args = ap.parse_args(argv)

    import torch

    from groklens.config import RunConfig
    from groklens.trainers.train import train

    torch.set_num_threads(1)
    base = dict(BASE, steps=args.steps)
    for item in args.set:
        key, _, value = item.partition("=")
        base[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    all_arms = arms(args.copies, args.widths)
    chosen = args.arms or list(all_arms)
    args.out.mkdir(parents=True, exist_ok=True)
    walls_path = args.out / "walls.json"
    walls = json.loads(walls_path.read_text()) if walls_path.exists() else {}
    rows: dict[str, dict[int, dict]] = {a: {} for a in chosen}
    for seed in args.seeds:
        for arm in chosen:
            overrides = {**base, **all_arms[arm], "seed": seed}
            path = args.out / f"{arm}-s{seed}.h5"
            done = path.exists() and f"{arm}/{seed}" in walls
            if not done:
                cfg = RunConfig.from_dict(overrides)
                print(f"groklens train --out {path} {flags(overrides)}", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                train(cfg, path, force=True, progress=False)
                walls[f"{arm}/{seed}"] = time.perf_counter() - t0
                walls_path.write_text(json.dumps(walls, indent=1))
            rows[arm][seed] = _row(path)
            print(f"{arm} seed {seed}: {rows[arm][seed]} ({walls[f'{arm}/{seed}']:.0f} s)", file=sys.stderr, flush=True)
    print(table(rows, args.seeds, walls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
