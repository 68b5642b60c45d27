"""The optimizer update (trainers/optim.py `AdamW.step`) of this checkout against another
revision's, at paper scale (issue 31).

Run by hand (not by the test suite):
    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/optim_update.py [--before REV]

`--before REV` (default c78fa4f, the update before issue 31's `addcdiv_`) is loaded from
`git show REV:trainers/optim.py` and swapped in for `AdamW.step`, alternating blocks with this
checkout's in one process, on the paper-scale models of benchmarks/flop_bound.py. Printed per
model, in CPU time: the update alone (`isolated`: 50 updates of the model's parameters with
fixed gradients per block) and inside `SingleRun.train_step` (its time and its share of the
step: there the parameters and moments come back from memory after the backward pass).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import Timed
from flop_bound import MODELS, build, paper_config


def load_revision(rev: str):
    """trainers/optim.py at `rev`, as a module of its own."""
    text = subprocess.run(["git", "show", f"{rev}:trainers/optim.py"],
                          capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "optim_before.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("optim_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(name: str, impls: dict, args) -> dict[str, tuple[float, float, float]]:
    """{impl: (isolated ms, in-step ms, in-step share)} medians over `--repeats` alternations."""
    from groklens.trainers import optim

    run = build(paper_config(name))
    params = run.lane.stacked
    grads = {n: torch.randn_like(p) * 1e-3 for n, p in params.items()}
    lr, wd = torch.tensor([1e-3], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    alone = {k: optim.AdamW(params, (0.9, 0.98)) for k in impls}
    step = 0
    for _ in range(3):  # warm-up
        run.train_step(step)
        step += 1
    rows: dict[str, list[tuple[float, float, float]]] = {k: [] for k in impls}
    try:
        for _ in range(args.repeats):
            for k, fn in impls.items():
                optim.AdamW.step = fn
                c0 = time.process_time()
                for _ in range(50):
                    alone[k].step(params, grads, lr, wd)
                isolated = (time.process_time() - c0) / 50
                with Timed(optim.Update, "__call__", clock=time.process_time) as timed:
                    c0 = time.process_time()
                    for _ in range(args.block):
                        run.train_step(step)
                        step += 1
                    total = time.process_time() - c0
                rows[k].append((1e3 * isolated, 1e3 * timed.total / args.block, timed.total / total))
    finally:
        optim.AdamW.step = impls["after"]
    return {k: tuple(statistics.median(r[i] for r in rs) for i in range(3)) for k, rs in rows.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--before", default="c78fa4f", help="the revision whose update is 'before'")
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from groklens.trainers import optim

    impls = {"before": load_revision(args.before).AdamW.step, "after": optim.AdamW.step}
    for name in args.models:
        r = measure(name, impls, args)
        (bi, bs, bsh), (ai, as_, ash) = r["before"], r["after"]
        print(f"{name:11s}: isolated {bi:.3f} -> {ai:.3f} ms ({ai / bi:.2f}x) | in the step {bs:.2f} -> {as_:.2f} ms "
              f"({as_ / bs:.2f}x), share of the step {bsh:.2%} -> {ash:.2%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
