"""The StableMax experiment (Prieto et al.): StableMax and the perpendicular gradient without weight decay."""

from __future__ import annotations

import math

from groklens.experiments.core import (
    Context, Experiment, Plan, Published, QUICK, QUICK_NOTE, Row, SMOKE, SMOKE_NOTE, Scale, grok_row,
    no_analyses, register, speedup_row)
from groklens.experiments.verdicts import groks_verdict

PRIETO = "Prieto et al. 2025, 'Grokking at the edge of numerical stability' (REFERENCES.md)"


# ---------------------------------------------------------------------- stablemax
def _plan_stablemax(sc: Scale, scale: str) -> Plan:
    return Plan({"ce_wd1": {"weight_decay": 1.0}, "ce_wd0": {"weight_decay": 0.0},
                 "stablemax_wd0": {"loss": "stablemax", "weight_decay": 0.0},
                 "perp_wd0": {"perp_grad": True, "weight_decay": 0.0},
                 "stablemax_perp_wd0": {"loss": "stablemax", "perp_grad": True, "weight_decay": 0.0}}, "ce_wd1", sc.base)


def _read_stablemax(ctx: Context) -> list[Row]:
    rows = []
    labels = {"ce_wd0": "softmax CE, wd 0", "stablemax_wd0": "StableMax, wd 0", "perp_wd0": "perpendicular gradient, wd 0",
              "stablemax_perp_wd0": "StableMax + perpendicular gradient, wd 0"}
    base_runs = ctx.group("ce_wd1").runs
    ref = None if not base_runs or any(r.grok_censored for r in base_runs) else \
        math.exp(sum(math.log(max(r.grokking, 1)) for r in base_runs) / len(base_runs))
    for v, label in labels.items():
        row = speedup_row(ctx, f"speed-up over softmax CE with wd 1: {label}",
                          Published(None, "softmax collapse stops grokking without weight decay; StableMax and "
                                    "the perpendicular gradient remove it (no number in REFERENCES.md)", PRIETO),
                          "ce_wd1", v, ctx.sc.note)
        # the claim: plain softmax CE without weight decay does not grok, the others do; no published
        # time, so a cap decides "never" only when it is FAR x our baseline's grokking time
        row.verdict = groks_verdict(ctx.group(v).runs, should_grok=v != "ce_wd0", reference=ref,
                                    reference_what="baseline's grokking step (softmax CE, wd 1; ours)")
        rows.append(row)
    for v in ("ce_wd1", *labels):
        rows.append(grok_row(ctx, f"grok step, {labels.get(v, 'softmax CE, wd 1 (baseline)')}",
                             Published(None, "no number in REFERENCES.md", PRIETO), v, ctx.sc.note))
    return rows


register(Experiment(
    "stablemax",
    "StableMax and the perpendicular gradient (Prieto et al.) with and without weight decay on modular addition",
    {
        "smoke": Scale.of({**SMOKE}, SMOKE_NOTE),
        "quick": Scale.of({**QUICK, "steps": 6000, "stop_after_grok": 1}, QUICK_NOTE + "; censored at 6000 steps"),
        "paper": Scale.of(dict(task="add", steps=40_000, eval_every=100, checkpoint_every=2000, stop_after_grok=1),
                        "Nanda's canonical p=113 setup (Prieto et al.'s own setups are not in REFERENCES.md)"),
    },
    _plan_stablemax, _read_stablemax, no_analyses))
