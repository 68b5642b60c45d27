"""Cost of the analyses: seconds per checkpoint of each measure at p=113 on the canonical model
(RunConfig() defaults: 1 layer, d_model 128, 4 heads, d_mlp 512, 30% of the 12,769 pairs for
training), and the number of Hessian-vector products eigsh needs for a relative tolerance.

Run by hand (not by the test suite), on the threads you want to measure:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/analysis_cost.py [--train-steps 300] [--json]

The model is trained briefly first (--train-steps full-batch AdamW steps with the canonical
config, written to a temporary trajectory; 0 = the fresh initialisation), so the Hessian is that
of a model that has started memorizing. Each measure is timed as `compute` runs it on one
checkpoint: the plain function on a model loaded from the trajectory (loading is timed apart).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from groklens.analyses.attention import attention_mass
from groklens.analyses.fourier import fourier
from groklens.analyses.norms import norms
from groklens.analyses.probing import probe
from groklens.analyses.radial import radial
from groklens.analyses.rank import effective_rank
from groklens.analyses.sharpness import (
    HessianOperator,
    hutchinson_trace,
    sharpness,
    top_eigenvalues,
)
from groklens.checkpoints import Trajectory
from groklens.config import RunConfig
from groklens.trainers.train import train


def timed(fn, repeat: int = 1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--tol", type=float, default=1e-3, help="eigsh relative tolerance for the HVP count")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    threads = torch.get_num_threads()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        steps = max(args.train_steps, 1)
        cfg = RunConfig.from_dict({"steps": steps, "eval_every": steps, "checkpoint_every": steps, "device": "cpu"})
        path = Path(tmp) / "canonical.h5"
        t_train, _ = timed(lambda: train(cfg, path, progress=False))
        traj = Trajectory(path)
        step = args.train_steps
        t_load, model = timed(lambda: traj.model(step))
        data = traj.dataset()
        init = traj.params(0)
        metrics = traj.metrics
        rows = {}
        rows["model load"] = t_load
        rows["fourier (all variants + restricted/excluded loss)"], _ = timed(lambda: fourier(model, data))
        rows["attention"], _ = timed(lambda: attention_mass(model, data))
        rows["rank (2 sites, 9 weights)"], _ = timed(lambda: effective_rank(model, data))
        rows["radial (train set, all positions)"], _ = timed(lambda: radial(model, data))
        rows["norms"], _ = timed(lambda: norms(model, data, init_params=init))
        rows["probe answer @ resid_post (logistic)"], _ = timed(
            lambda: probe(model, data, site="blocks.0.hook_resid_post", target="answer"))
        rows["probe answer @ resid_post (ridge)"], _ = timed(
            lambda: probe(model, data, site="blocks.0.hook_resid_post", target="answer", classifier="ridge"))
        rows["sharpness default (top 5, tol 1e-3, 50 trace samples)"], sharp = timed(lambda: sharpness(model, data))

        # Hessian-vector products: cost of one, and how many eigsh needs at the asked tolerance
        t_build, H = timed(lambda: HessianOperator(model, data, data.train_idx))
        v = np.random.default_rng(0).standard_normal(H.n)
        t_hvp, _ = timed(lambda: H.matvec(v), repeat=3)
        counts = {}
        for k in (1, 5):
            t_eig, res = timed(lambda k=k: top_eigenvalues(H.matvec, H.n, k, tol=args.tol))
            counts[k] = {"hvps": res["hvp_count"], "seconds": t_eig, "top": res["top_eigenvalues"].tolist(),
                         "converged": res["converged"]}
        _, ref = timed(lambda: top_eigenvalues(H.matvec, H.n, 1, tol=0))
        t_tr, tr = timed(lambda: hutchinson_trace(H.matvec, H.n, 50, seed=1))

    report = {
        "config": "RunConfig() defaults (p=113, d_model 128, 4 heads, d_mlp 512, train_frac 0.3)",
        "model": f"trained {args.train_steps} full-batch AdamW steps" if args.train_steps else "fresh initialisation",
        "train_loss": float(metrics["train_loss"][-1]), "train_acc": float(metrics["train_acc"][-1]),
        "torch_threads": threads, "train_seconds": t_train,
        "load_average_1min": [load_before, os.getloadavg()[0]],  # other processes on the machine
        "seconds_per_checkpoint": rows,
        "hessian": {
            "n_params": H.n, "n_train_inputs": len(data.train_idx),
            "graph_build_seconds": t_build, "seconds_per_hvp": t_hvp,
            "eigsh_tol": args.tol,
            "eigsh_top1": counts[1], "eigsh_top5": counts[5],
            "top1_at_machine_precision": float(ref["top_eigenvalues"][0]),
            "hvps_at_machine_precision": ref["hvp_count"],
            "top1_relative_error_at_tol": (abs(counts[1]["top"][0] - ref["top_eigenvalues"][0])
                                           / abs(ref["top_eigenvalues"][0])),
            "hutchinson_50": {"trace": tr["trace"], "stderr": tr["trace_stderr"], "seconds": t_tr},
        },
        "sharpness_default_result": {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in sharp.items()},
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{report['config']}; {report['model']} (train loss {report['train_loss']:.3g}, "
          f"train acc {report['train_acc']:.3f}); torch threads {threads}; "
          f"1-min load average {report['load_average_1min'][0]:.1f} -> {report['load_average_1min'][1]:.1f}")
    for name, sec in rows.items():
        print(f"  {name:<58} {sec:8.2f} s")
    h = report["hessian"]
    print(f"  Hessian: {h['n_params']} parameters, {h['n_train_inputs']} training inputs; graph "
          f"{h['graph_build_seconds']:.2f} s, "
          f"{h['seconds_per_hvp']:.3f} s per Hessian-vector product")
    for k in (1, 5):
        c = h[f"eigsh_top{k}"]
        print(f"  eigsh(which='LA', k={k}, tol={args.tol:g}): {c['hvps']} HVPs, {c['seconds']:.1f} s, "
              f"converged={c['converged']}, top = {np.round(c['top'], 4).tolist()}")
    print(f"  k=1 at machine precision: {h['hvps_at_machine_precision']} HVPs, top "
          f"{h['top1_at_machine_precision']:.6g}; "
          f"relative error at tol {args.tol:g}: {h['top1_relative_error_at_tol']:.2e}")
    t = h["hutchinson_50"]
    print(f"  Hutchinson trace, 50 Rademacher samples: {t['trace']:.4g} +- {t['stderr']:.2g} in {t['seconds']:.1f} s")


if __name__ == "__main__":
    main()
