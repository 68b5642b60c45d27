"""The LLC trajectory's cost: devinterp's sampler (chains one after another, backend=devinterp)
against the vectorized one, per checkpoint (every chain at once, backend=vmap) and for the whole
trajectory (every checkpoint's chains at once: llc_many, what `groklens analyze --metric llc`
runs), on the same checkpoints of a run, in one process. The per-checkpoint sides alternate so
that a shared machine's load falls on both; the trajectory pass runs after them.

Each side uses the same hyperparameters (default: the analysis's defaults); the report gives
each side's seconds, the ratios, and how far the estimates are apart in units of their combined
standard error (devinterp's minibatch order differs, so it agrees statistically, not to the bit;
the trajectory pass equals the per-checkpoint vmap to float rounding).

Run by hand (not by the test suite):
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/llc_chains.py RUN.h5 [--checkpoints 30] [--chains 4]
        [--draws 200] [--burnin 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from groklens.analyses.llc import llc, llc_many
from groklens.analyses.runner import select_steps
from groklens.checkpoints import Trajectory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--checkpoints", type=int, default=30, help="checkpoints spread along the run")
    ap.add_argument("--chains", type=int, default=None)
    ap.add_argument("--draws", type=int, default=None)
    ap.add_argument("--burnin", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    traj = Trajectory(args.run)
    available = [int(s) for s in traj.steps]
    steps = select_steps(available, every=max(1, len(available) // args.checkpoints))[-args.checkpoints:]
    data = traj.dataset()
    kw = {k: v for k, v in (("chains", args.chains), ("draws", args.draws), ("burnin", args.burnin)) if v is not None}
    seconds = {"devinterp": 0.0, "vmap": 0.0, "vmap_trajectory": 0.0}
    rows = []
    for s in steps:
        model = traj.model(s)
        est = {}
        for backend in ("devinterp", "vmap"):
            t0 = time.perf_counter()
            est[backend] = llc(model, data, backend=backend, **kw)
            seconds[backend] += time.perf_counter() - t0
        a, b = est["devinterp"], est["vmap"]
        se = np.hypot(a["llc_std"], b["llc_std"]) / np.sqrt(len(a["llc_per_chain"]))
        rows.append({"step": s, "devinterp": a["llc_mean"], "vmap": b["llc_mean"],
                     "z": float((b["llc_mean"] - a["llc_mean"]) / se) if se > 0 else float("nan")})
    t0 = time.perf_counter()
    together = llc_many([traj.model(s) for s in steps], data, **kw)
    seconds["vmap_trajectory"] = time.perf_counter() - t0
    for r, t in zip(rows, together):
        r["vmap_trajectory"] = t["llc_mean"]
    out = {"run": args.run, "checkpoints": steps, "params": kw or "the analysis's defaults",
           "seconds": seconds, "ratio": seconds["devinterp"] / seconds["vmap"],
           "ratio_trajectory": seconds["devinterp"] / seconds["vmap_trajectory"], "per_checkpoint": rows,
           "max_abs_z": float(np.nanmax([abs(r["z"]) for r in rows]))}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{len(steps)} checkpoints of {args.run}: devinterp {seconds['devinterp']:.0f} s, vmap per checkpoint "
          f"{seconds['vmap']:.0f} s ({out['ratio']:.1f}x), vmap trajectory {seconds['vmap_trajectory']:.0f} s "
          f"({out['ratio_trajectory']:.1f}x); devinterp and vmap apart by at most {out['max_abs_z']:.1f} "
          "combined standard errors")
    for r in rows:
        print(f"  step {r['step']:>6}: devinterp {r['devinterp']:8.3f}  vmap {r['vmap']:8.3f}  "
              f"trajectory {r['vmap_trajectory']:8.3f}  z {r['z']:+.1f}")


if __name__ == "__main__":
    main()
