"""The GeomDR experiment: the effective-rank regularizer against AdamW, and the rank collapse before grokking."""

from __future__ import annotations

from typing import Any

from groklens.experiments.core import (
    CANONICAL_GROK, Context, Experiment, Plan, Published, QUICK, QUICK_NOTE, Row, SMOKE, SMOKE_NOTE, Scale,
    register, speedup_row)
from groklens.experiments.verdicts import ratio_verdict

GEOMDR = "GeomDR (2026; REFERENCES.md)"


def _an_rank(sc: Scale, scale: str):
    return [("rank", {"weights": []}, "every")]


# ---------------------------------------------------------------------- geomdr
def _plan_geomdr(sc: Scale, scale: str) -> Plan:
    variants: dict[str, dict[str, Any]] = {"base": {}}
    lam, steps = sc.extra["lambda"], sc.base["steps"]
    for t in sc.extra["targets"]:
        variants[f"geomdr_t{t:g}_always"] = {"geomdr_lambda": lam, "geomdr_target": float(t)}
        variants[f"geomdr_t{t:g}_early"] = {"geomdr_lambda": lam, "geomdr_target": float(t),
                                            "geomdr_end": max(1, steps // 4)}
    return Plan(variants, "base", sc.base)


def _read_geomdr(ctx: Context) -> list[Row]:
    rows = []
    lam = ctx.sc.extra["lambda"]
    diff = (f"{ctx.sc.note}; GeomDR is our definition (docs/VARIANTS.md), lambda {lam:g}, targets "
            f"{', '.join(f'{t:g}' for t in ctx.sc.extra['targets'])}, always on or for the first quarter")
    best = None
    for v in ctx.plan.variants:
        if v == "base":
            continue
        row = speedup_row(ctx, f"speed-up of GeomDR ({v}) over AdamW",
                          Published(52.0, "up to 52x", GEOMDR), "base", v, diff)
        rows.append(row)
        if row.ours is not None and (best is None or row.ours > best.ours):
            best = row
    if best is not None:
        rows.insert(0, Row("best speed-up of GeomDR over AdamW", best.published, best.ours,
                           f"{best.ours_text} ({best.measure.split('(')[1].split(')')[0]})", diff, bound=best.bound))
    else:
        rows.insert(0, Row("best speed-up of GeomDR over AdamW", Published(52.0, "up to 52x", GEOMDR), None,
                           "n/a (no grokking time)", diff))
    ratio, text, ci, n = ctx.phase_ratio("base", "eff_rank", "grokking", "memorization")
    rows.append(Row("baseline: effective rank (Roy-Vetterli, centred, last hidden layer) at grokking / at memorization",
                    Published(None, "effective dimensionality collapses before grokking (< 1; no number)", GEOMDR),
                    ratio, text, ctx.sc.note, ratio_verdict(ratio, ci, below=True, missing=text, n=n)))
    return rows


register(Experiment(
    "geomdr",
    "GeomDR effective-rank regularizer: targets and schedules against AdamW; effective-rank collapse before "
    "grokking in the baseline",
    {
        "smoke": Scale.of({**SMOKE}, SMOKE_NOTE, **{"lambda": 1.0, "targets": [4]}),
        "quick": Scale.of({**QUICK, "steps": 6000, "stop_after_grok": 2},
                        QUICK_NOTE + "; censored at 6000 steps", **{"lambda": 1.0, "targets": [4, 16]}),
        "paper": Scale.of(dict(task="add", steps=40_000, stop_after_grok=2, eval_every=100, checkpoint_every=500),
                        "Nanda's canonical p=113 setup (the GeomDR paper's model is not in REFERENCES.md)",
                        expect_grok=CANONICAL_GROK,  # the baseline's
                        **{"lambda": 1.0, "targets": [4, 8, 16, 32]}),
    },
    _plan_geomdr, _read_geomdr, _an_rank))
