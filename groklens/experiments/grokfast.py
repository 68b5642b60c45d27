"""The Grokfast experiment: Grokfast-EMA against the baseline on x*y mod p."""

from __future__ import annotations

from groklens.experiments.core import (
    Context, Experiment, Plan, Published, QUICK, QUICK_NOTE, Row, SMOKE, SMOKE_NOTE, Scale, grok_row,
    no_analyses, register, speedup_row)

GROKFAST = "Lee et al. 2024, Grokfast (REFERENCES.md)"


# ---------------------------------------------------------------------- grokfast
def _plan_grokfast(sc: Scale, scale: str) -> Plan:
    return Plan({"base": {}, "grokfast": {"grokfast_alpha": 0.98, "grokfast_lambda": 2.0}}, "base", sc.base)


def _read_grokfast(ctx: Context) -> list[Row]:
    diff = (f"{ctx.sc.note}; our transformer and AdamW with wd 1 (Grokfast's own model and optimizer settings "
            "are not in REFERENCES.md)")
    rows = []
    for v, pub in (("base", 39_890), ("grokfast", 910)):
        rows.append(grok_row(ctx, f"iterations to 95% validation accuracy, {'baseline' if v == 'base' else 'Grokfast-EMA (alpha 0.98, lambda 2)'}",
                             Published(pub, f"{pub:,}", GROKFAST), v, diff))
    rows.append(speedup_row(ctx, "speed-up of Grokfast-EMA", Published(39_890 / 910, "43.8x (derived: 39,890 / 910)", GROKFAST),
                            "base", "grokfast", diff))
    return rows


register(Experiment(
    "grokfast",
    "Grokfast-EMA (alpha 0.98, lambda 2) against the baseline on x*y mod p, 50% train",
    {
        "smoke": Scale.of({**SMOKE, "task": "mul"}, SMOKE_NOTE + " (x*y mod 7)"),
        "quick": Scale.of({**QUICK, "task": "mul", "steps": 6000, "stop_after_grok": 1},
                        "x*y mod 23 (the paper: mod 97), " + QUICK_NOTE.split(", ", 2)[2] + "; censored at 6000 steps"),
        "paper": Scale.of(dict(task="mul", p=97, train_frac=0.5, steps=60_000, eval_every=10, checkpoint_every=2000,
                             stop_after_grok=1),
                        "x*y mod 97, 50% train; evaluation every 10 steps",
                        expect_grok={"base": 39_890, "grokfast": 910}),  # the published iterations (_read_grokfast)
    },
    _plan_grokfast, _read_grokfast, no_analyses))
