"""`groklens demo` (and `make demo`): grokking, and four ways it changes, in a few minutes.

Trains a standard (pre-LayerNorm) transformer, a bounded-sphere transformer, a uniform-attention
transformer and an activation-norm-regularized one on one small modular-addition task, a few
seeds each, analyzes them (a cheap subset of measures), prints the comparison table and writes
the report.

Scales (`--scale`, the names `reproduce` uses too):
  quick (default)   the small task below, on CPU; chosen by measurement so that the standard
                    model groks visibly late and the other three early (docs/CLI.md gives the
                    numbers measured while choosing it)
  paper             the canonical p=113 setup (Nanda et al.; 30% of pairs, d_model 128, 4 heads,
                    d_mlp 512): meant for a GPU
  smoke             a tiny end-to-end check for the test suite; it proves the pipeline, not grokking

What it writes under OUT (default ./demo-out): runs/<variant>_s<seed>.h5 (+ their
.analyses.h5 sidecars and the sweep manifest runs/sweep.json) and report/ (index.html,
figures, comparison.csv/json). Existing run files are never overwritten without `force`;
nothing else in OUT is touched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groklens.errors import BadInput, GroklensError

DEFAULT_OUT = "demo-out"  # ignored by git (.gitignore)

# The variants: each a switch of the one transformer (docs/VARIANTS.md). The baseline is a
# standard pre-LayerNorm transformer; "uniform" and "act_norm" change only their one switch.
VARIANTS: dict[str, dict[str, Any]] = {
    "standard": {"norm": "ln"},
    "sphere": {"norm": "sphere", "unembed": "bounded"},
    "uniform": {"norm": "ln", "attention": "uniform"},
    "act_norm": {"norm": "ln", "act_norm_lambda": 1.0},
}
BASELINE = "standard"


@dataclass
class DemoScale:
    """One demo scale (the experiments' Scale, groklens/experiments/core.py, is another thing)."""

    base: dict[str, Any]
    seeds: list[int]
    analyze_every: int  # the cheap analyses (cheap_analyses()) at every analyze_every-th checkpoint
    # costlier ones: at every `sparse_every`-th checkpoint and at memorization, grokking and the end
    sparse_analyses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sparse_every: int = 4
    note: str = ""


def cheap_analyses() -> list[tuple[str, dict[str, Any]]]:
    """The default analysis set (analyses/registry.py) that the comparison and the report show,
    each with its cheap parameters: the demo has minutes, not hours."""
    from groklens.analyses.compare import ANALYSES_USED
    from groklens.analyses.registry import default_requests

    return default_requests(ANALYSES_USED, cheap=True)


SCALES: dict[str, DemoScale] = {
    "quick": DemoScale(
        base=dict(task="add", p=23, train_frac=0.5, d_model=64, n_heads=2, d_head=32, d_mlp=256, lr=3e-3,
                  weight_decay=1.0, steps=5000, eval_every=50, checkpoint_every=100, stop_after_grok=4,
                  device="cpu"),
        seeds=[1, 2, 3],
        analyze_every=2,
        # sharpness is ~7 s per checkpoint here, the rest ~1 s: keep it to a handful per run
        sparse_analyses=[("sharpness", {"top_k": 1, "trace_samples": 10})],
        sparse_every=10,
        note="p=23 modular addition, 50% of pairs, 1 layer d_model 64, CPU",
    ),
    "paper": DemoScale(
        base=dict(task="add", p=113, train_frac=0.3, d_model=128, n_heads=4, d_head=32, d_mlp=512, lr=1e-3,
                  weight_decay=1.0, steps=30000, eval_every=100, checkpoint_every=500, stop_after_grok=10,
                  device="auto"),
        seeds=[1, 2, 3],
        analyze_every=2,
        sparse_analyses=[("sharpness", {"top_k": 3, "trace_samples": 30})],
        note="the canonical p=113 setup (Nanda et al. 2023), meant for a GPU",
    ),
    "smoke": DemoScale(
        base=dict(task="add", p=7, train_frac=0.5, d_model=16, n_heads=2, d_head=8, d_mlp=32, lr=3e-3,
                  weight_decay=1.0, steps=40, eval_every=10, checkpoint_every=20, device="cpu"),
        seeds=[1, 2],
        analyze_every=1,
        sparse_analyses=[("sharpness", {"top_k": 1, "trace_samples": 4})],
        note="a tiny pipeline check (does not grok)",
    ),
}
RENAMED_SCALES = {"laptop": "quick"}  # old spelling -> name: refused with a hint


@dataclass
class DemoResult:
    out_dir: Path
    runs: list[Path]
    report: Path
    table: str
    wall_s: float
    missing: list[tuple[str, str]]


def run_names(scale: DemoScale) -> list[tuple[str, str, dict[str, Any]]]:
    """(variant, run name, config dict) for every run of the demo."""
    out = []
    for variant, over in VARIANTS.items():
        for seed in scale.seeds:
            out.append((variant, f"{variant}_s{seed}", {**scale.base, **over, "seed": seed}))
    return out


def run_demo(out_dir: str | Path = DEFAULT_OUT, *, scale: str = "quick", force: bool = False,
             workers: int | None = None, fmt: str = "png", progress: bool = True,
             echo: Callable[[str], None] = print) -> DemoResult:
    """Train, analyze, compare and report (see the module docstring); returns where it all is."""
    from groklens.config import RunConfig
    from groklens.trainers.sweeps import RunSpec, error_path, run_path

    t0 = time.perf_counter()
    if scale in RENAMED_SCALES:
        raise BadInput(f"--scale {scale} is now called {RENAMED_SCALES[scale]} (the scale names of `reproduce`)")
    if scale not in SCALES:
        raise BadInput(f"--scale must be one of {', '.join(SCALES)}; got {scale!r}")
    sc = SCALES[scale]
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory")
    if not out.exists() and not out.parent.is_dir():
        raise BadInput(f"directory {out.parent} does not exist")
    runs_dir, report_dir = out / "runs", out / "report"
    for d in (runs_dir, report_dir):
        if d.exists() and not d.is_dir():
            raise BadInput(f"{d} exists and is not a directory")
    specs = [RunSpec(name, RunConfig.from_dict(cfg)) for _, name, cfg in run_names(sc)]
    paths = [run_path(runs_dir, s.name) for s in specs]
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        shown = ", ".join(p.name for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise BadInput(f"{runs_dir} already holds demo runs ({shown}); use --force to train them again, "
                       f"or -o another directory")
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1; got {workers}")
    if force:  # only the demo's own run files (and their sidecars / error files), by exact name
        from groklens.checkpoints import sidecar_path

        for s, p in zip(specs, paths):
            p.unlink(missing_ok=True)
            sidecar_path(p).unlink(missing_ok=True)
            error_path(runs_dir, s.name).unlink(missing_ok=True)
    out.mkdir(exist_ok=True)
    runs_dir.mkdir(exist_ok=True)
    n_workers = workers or max(1, min(len(specs), os.cpu_count() or 1))

    if scale == "paper":
        import torch

        if not torch.cuda.is_available():
            echo("groklens demo: no CUDA device here; the paper scale on CPU takes many hours")
    # 1. train every run (a process pool: one run per core; resumable like any sweep)
    echo(f"groklens demo ({scale}: {sc.note}): training {len(specs)} runs "
         f"({', '.join(VARIANTS)} x seeds {', '.join(map(str, sc.seeds))}) on {n_workers} worker(s) into {runs_dir}")
    from groklens.trainers.sweeps import run_sweep

    t_train = time.perf_counter()
    rep = run_sweep(specs, runs_dir, executor="local", workers=n_workers, progress=progress)
    if rep.counts["failed"]:
        first = next(iter(rep.failed.items()))
        raise GroklensError(f"{rep.counts['failed']} demo run(s) failed, e.g. {first[0]}: {first[1]}")
    echo(f"trained in {time.perf_counter() - t_train:.0f} s")

    # 2. analyze: the cheap measures along the trajectory, sharpness at memorization/grokking/end
    t_an = time.perf_counter()
    analyze_demo_runs(paths, sc, n_workers, progress=progress)
    echo(f"analyzed in {time.perf_counter() - t_an:.0f} s")

    # 3. compare and report
    from groklens.analyses.compare import compare
    from groklens.analyses.report import build_report

    baseline = paths[[v for v, _, _ in run_names(sc)].index(BASELINE)]
    comp = compare(paths, baseline=baseline, group_by="variant")
    result = build_report(paths, report_dir, fmt=fmt, comparison=comp)
    table = comp.format_table()
    echo("")
    echo(table)
    echo("")
    wall = time.perf_counter() - t0
    for title, why in result.missing:
        echo(f"not in the report: {title} ({why})")
    echo(f"demo finished in {wall:.0f} s; report: {result.index.resolve()}")
    return DemoResult(out, paths, result.index, table, wall, result.missing)


def analyze_demo_runs(paths: list[Path], sc: DemoScale, workers: int, progress: bool = True) -> list[str]:
    """The cheap analyses along each run, the costly ones sparser; both at the memorization,
    grokking and last checkpoints too."""
    from groklens.analyses.runner import analyze_runs

    requests = [(n, p, f"every:{sc.analyze_every}+phases") for n, p in cheap_analyses()]
    requests += [(n, p, f"every:{sc.sparse_every}+phases") for n, p in sc.sparse_analyses]
    return analyze_runs(paths, requests, workers=workers, progress=progress)
