"""The demo (`groklens demo`, `make demo`): an experiment without published numbers.

Grokking and four ways it changes: a standard (pre-LayerNorm) transformer, a bounded-sphere
transformer, a uniform-attention transformer and an activation-norm-regularized one on one small
modular-addition task, three seeds each (two at smoke). Its rows are our grokking steps and the
speed-ups over the standard model; there is nothing published to set beside them.

Scales:
  quick   the small task below, on CPU; chosen by measurement so that the standard model groks
          visibly late and the other three early (docs/CLI.md gives the numbers measured while
          choosing it)
  paper   the canonical p=113 setup (Nanda et al.; 30% of pairs, d_model 128, 4 heads, d_mlp
          512): meant for a GPU
  smoke   a tiny end-to-end check for the test suite; it proves the pipeline, not grokking

`groklens demo` is `groklens reproduce demo` into OUT (default ./demo-out) that always trains
afresh: OUT/runs/VARIANT_sSEED.h5 (+ .analyses.h5 sidecars), OUT/ledger, OUT/report (index.html,
figures, comparison.csv/json), OUT/comparison.txt and results.json. Existing demo runs are never
overwritten without `force`; nothing else in OUT is touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.experiments.core import (
    CANONICAL_GROK, Context, Experiment, Plan, Published, QUICK, QUICK_GROK, Row, SMOKE, Scale, grok_row, register,
    speedup_row)

# The variants: each a switch of the one transformer (docs/VARIANTS.md). The baseline is a
# standard pre-LayerNorm transformer; "uniform" and "act_norm" change only their one switch.
VARIANTS: dict[str, dict[str, Any]] = {
    "standard": {"norm": "ln"},
    "sphere": {"norm": "sphere", "unembed": "bounded"},
    "uniform": {"norm": "ln", "attention": "uniform"},
    "act_norm": {"norm": "ln", "act_norm_lambda": 1.0},
}
BASELINE = "standard"
LABELS = {"standard": "standard (pre-LayerNorm)", "sphere": "bounded sphere", "uniform": "uniform attention",
          "act_norm": "activation-norm penalty (lambda 1)"}
SOURCE = "the demo (no published number)"


SEEDS = {"quick": 3, "paper": 3, "smoke": 2}
DEFAULT_OUT = "demo-out"  # `groklens demo`'s output directory (ignored by git: .gitignore)


def demo_scale(base: dict[str, Any], note: str, analyze_every: int, sparse: list[tuple[str, dict[str, Any]]],
               sparse_every: int, expect_grok: int | None = None) -> Scale:
    """A demo scale: the cheap default analyses at every `analyze_every`-th checkpoint, the costly
    `sparse` ones at every `sparse_every`-th; both at memorization, grokking and the end too.
    `expect_grok`: the baseline's grokking step (Scale.expect_grok). The demo has no committed
    ledger: it reads grokking as `train` does (RunConfig.grok_evals), not at the first crossing."""
    base = {"grok_evals": RunConfig.grok_evals, **base}
    return Scale(base, note, {"analyze_every": analyze_every, "sparse_analyses": sparse, "sparse_every": sparse_every},
                 expect_grok)


SCALES: dict[str, Scale] = {
    "quick": demo_scale(
        {**QUICK, "steps": 5000, "checkpoint_every": 100, "stop_after_grok": 4},
        "p=23 modular addition, 50% of pairs, 1 layer d_model 64, CPU", analyze_every=2,
        # sharpness is ~7 s per checkpoint here, the rest ~1 s: keep it to a handful per run
        sparse=[("sharpness", {"top_k": 1, "trace_samples": 10})], sparse_every=10, expect_grok=QUICK_GROK),
    "paper": demo_scale(
        dict(task="add", p=113, train_frac=0.3, d_model=128, n_heads=4, d_head=32, d_mlp=512, lr=1e-3, weight_decay=1.0,
             steps=30000, eval_every=100, checkpoint_every=500, stop_after_grok=10, device="auto"),
        "the canonical p=113 setup (Nanda et al. 2023), meant for a GPU", analyze_every=2,
        sparse=[("sharpness", {"top_k": 3, "trace_samples": 30})], sparse_every=4, expect_grok=CANONICAL_GROK),
    "smoke": demo_scale(
        {**SMOKE, "lr": 3e-3, "weight_decay": 1.0, "steps": 40, "checkpoint_every": 20},
        "smoke: a tiny pipeline check (p=7, d_model 16, 40 steps; does not grok)", analyze_every=1,
        sparse=[("sharpness", {"top_k": 1, "trace_samples": 4})], sparse_every=4),
}


def _plan(sc: Scale, scale: str) -> Plan:
    return Plan(VARIANTS, BASELINE, sc.base)


def _analyses(sc: Scale, scale: str) -> list[tuple[str, dict[str, Any], str]]:
    """The default analysis set that the comparison and the report show, with each analysis's cheap
    parameters (the demo has minutes, not hours), and the sparse ones."""
    from groklens.analyses.measures import ANALYSES_USED
    from groklens.analyses.registry import default_requests

    every, sparse_every = sc.extra["analyze_every"], sc.extra["sparse_every"]
    # and the fourier curves on the last checkpoint's key set, which the report's progress-measures
    # figure reads (Nanda's fixed key set; without it the figure says it has none)
    return ([(n, p, f"every:{every}+phases") for n, p in default_requests(ANALYSES_USED, cheap=True)]
            + [("fourier", {"key_frequencies": "last"}, f"every:{every}+phases")]
            + [(n, p, f"every:{sparse_every}+phases") for n, p in sc.extra["sparse_analyses"]])


def _read(ctx: Context) -> list[Row]:
    none = Published(None, "none", SOURCE)
    rows = [grok_row(ctx, f"grok step, {LABELS[v]}", none, v, ctx.sc.note) for v in VARIANTS]
    rows += [speedup_row(ctx, f"speed-up over the standard model: {LABELS[v]}", none, BASELINE, v, ctx.sc.note)
             for v in VARIANTS if v != BASELINE]
    return rows


register(Experiment(
    "demo",
    "the demo: a standard, a bounded-sphere, a uniform-attention and an activation-norm transformer on one "
    "modular-addition task (no published numbers)",
    SCALES, _plan, _read, _analyses, seeds=SEEDS, published=False, own_out=DEFAULT_OUT))


# ---------------------------------------------------------------------- `groklens demo`
RENAMED_SCALES = {"laptop": "quick"}  # old spelling -> name: refused with a hint


@dataclass
class DemoResult:
    out_dir: Path
    runs: list[Path]
    report: Path | None
    table: str
    wall_s: float
    notes: list[str]


def run_names(scale: str) -> list[str]:
    """The run names of the demo at `scale`, as reproduce names them."""
    from groklens.experiments.pipeline import get_experiment, run_configs

    exp = get_experiment("demo")
    return [name for _, name, _ in run_configs(exp, scale, exp.seeds_default(scale))]


def _check_out(out: Path, scale: str, force: bool, workers: int | None) -> None:
    """reproduce's checks of the arguments, and the demo's own, before anything is removed."""
    from groklens.experiments.pipeline import _check_args, get_experiment
    from groklens.sweeps import run_path

    if scale in RENAMED_SCALES:
        raise BadInput(f"--scale {scale} is now called {RENAMED_SCALES[scale]} (the scale names of `reproduce`)")
    _check_args(get_experiment("demo"), "demo", scale, None, workers, out, None)
    for d in (out / "runs", out / "report", out / "ledger"):
        if d.exists() and not d.is_dir():
            raise BadInput(f"{d} exists and is not a directory")
    existing = [p for p in (run_path(out / "runs", n) for n in run_names(scale)) if p.exists()]
    if existing and not force:
        shown = ", ".join(p.name for p in existing[:3]) + (" ..." if len(existing) > 3 else "")
        raise BadInput(f"{out / 'runs'} already holds demo runs ({shown}); use --force to train them again, "
                       f"or -o another directory")


def _clear(out: Path, scale: str) -> None:
    """The demo's own files of this scale, by exact name (runs, sidecars, error records, its
    ledger): the demo always trains afresh; nothing else in OUT is touched."""
    from groklens.checkpoints import sidecar_path
    from groklens.experiments.ledger import ledger_path
    from groklens.sweeps import error_path, run_path

    for name in run_names(scale):
        p = run_path(out / "runs", name)
        p.unlink(missing_ok=True)
        sidecar_path(p).unlink(missing_ok=True)
        error_path(out / "runs", name).unlink(missing_ok=True)
    ledger_path(out / "ledger", "demo", scale).unlink(missing_ok=True)


def run_demo(out_dir: str | Path = DEFAULT_OUT, *, scale: str = "quick", force: bool = False,
             workers: int | None = None, progress: bool = True, echo: Callable[[str], None] = print) -> DemoResult:
    """`reproduce demo` into OUT (its ledger OUT/ledger), always training afresh: existing demo
    runs are refused without `force`; prints the comparison table and where the report is."""
    from groklens.experiments.pipeline import reproduce

    t0 = time.perf_counter()
    out = Path(out_dir)
    _check_out(out, scale, force, workers)
    out.mkdir(exist_ok=True)
    _clear(out, scale)
    sc = SCALES[scale]
    if scale == "paper":
        import torch

        if not torch.cuda.is_available():
            echo("groklens demo: no CUDA device here; the paper scale on CPU takes many hours")
    echo(f"groklens demo --scale {scale} ({sc.note}): {len(run_names(scale))} runs ({', '.join(VARIANTS)} x "
         f"{SEEDS[scale]} seeds) into {out / 'runs'}")
    res = reproduce("demo", scale, out, workers=workers, ledger_dir=out / "ledger", progress=progress,
                    echo=lambda _m: None)
    table = (out / "comparison.txt").read_text().rstrip("\n")
    echo("")
    echo(table)
    echo("")
    for note in res.notes:
        echo(note)
    wall = time.perf_counter() - t0
    where = res.report.resolve() if res.report else "none (no run files)"
    echo(f"demo finished in {wall:.0f} s; report: {where}")
    return DemoResult(out, res.runs, res.report, table, wall, res.notes)
