"""Nanda et al. 2023's progress measures at his own scale (`reproduce progress-measures`).

His canonical run (docs/REFERENCES.md): modular addition p=113, 30% of the pairs, a 1-layer
transformer (d_model 128, 4 heads, d_mlp 512, ReLU, no LayerNorm, no biases), AdamW lr 1e-3,
weight decay 1, betas (0.9, 0.98), 10-step warm-up, full batch, float64 loss. groklens' default
preset is that model, so the paper scale changes only the schedule: a checkpoint every 100
steps (his code saves every 100 epochs) and a stop 2 evaluations after the test loss first
falls to 0.01, not before step 20,000 (his cleanup ends at ~14.5k), censored at 40,000 (his
run length).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from groklens.analyses.progress import CLEANUP_LOSS, PHASE_RULE
from groklens.experiments.core import (
    Context, Experiment, Plan, Published, Row, SMOKE, SMOKE_NOTE, Scale, register)
from groklens.experiments.verdicts import fmt_ci, interval_verdict, mean_flag, paired_interval, undetermined

NANDA = "Nanda et al. 2023, progress measures for grokking (REFERENCES.md)"
STOP_LOSS = 0.01  # the schedule trains 2 evaluations past test loss <= this (the end of cleanup)

_SCHEDULE = dict(eval_every=100, checkpoint_every=100, stop_after_grok=2, stop_test_loss=STOP_LOSS)
SCALES = {
    "smoke": Scale.of({**SMOKE, "steps": 60, "stop_test_loss": 0.0}, SMOKE_NOTE),
    # Nanda's model and optimizer on p=59 with half the pairs (1,740 of 3,481): the same phases, ~4x
    # cheaper a step. With his 30% (1,044 pairs) a p=59 run had not grokked by step 9,100; with 50%
    # seed 1 grokked at step 1,700 (memorized at 200)
    "quick": Scale.of(dict(task="add", p=59, train_frac=0.5, steps=15_000, stop_min_steps=6_000, device="cpu",
                         **_SCHEDULE),
                    "p=59 and 50% of the pairs (Nanda: p=113, 30%), his model and optimizer otherwise; trained 2 "
                    "evaluations past test loss <= 0.01, not before step 6,000, censored at 15,000"),
    "paper": Scale.of(dict(task="add", steps=40_000, stop_min_steps=20_000, device="auto", **_SCHEDULE),
                    "his setup (the default preset); seeds 1..N with his data split (data_seed 598); trained 2 "
                    "evaluations past test loss <= 0.01, not before step 20,000, censored at 40,000",
                    expect_grok=14_500),  # the stop event, test loss <= 0.01: published 0.005 at ~14.5k
}


def _plan(sc: Scale, scale: str) -> Plan:
    return Plan({"nanda": {}}, None, sc.base)


def _values(ctx: Context, key: str) -> tuple[list[float], int]:
    runs = ctx.group("nanda").runs
    vals = [r.run_values.get(key) for r in runs]
    return [float(v) for v in vals if isinstance(v, (int, float))], len(runs)


def _mean_text(vals: list[float], n: int, fmt: str = ",.0f") -> str:
    if not vals:
        return f"— (0 of {n} seeds have it)"
    mean = sum(vals) / len(vals)
    spread = f" [{min(vals):{fmt}}-{max(vals):{fmt}}]" if len(vals) > 1 else ""
    return f"{mean:{fmt}}{spread} {mean_flag(len(vals), n)}"


def _step_row(ctx: Context, measure: str, key: str, published: Published) -> Row:
    """A step read from the curves; a seed that never reached it counts its last step (a bound)."""
    runs = ctx.group("nanda").runs
    steps = [r.run_values.get(key) for r in runs]
    got = [s for s in steps if s is not None]
    never = [r.run_values.get("last_step") for r, s in zip(runs, steps) if s is None]
    if not got and not never:
        return Row(measure, published, None, "— (no runs)", ctx.sc.note)
    vals = got + [v for v in never if v is not None]
    mean = sum(vals) / len(vals) if vals else None
    text = _mean_text(got, len(runs)) if not never else (
        f">= {mean:,.0f} ({len(never)} of {len(runs)} seeds never reached it: a lower bound)")
    return Row(measure, published, mean, text, ctx.sc.note, bound="lower" if never else "")


def _paired_row(ctx: Context, measure: str, claim: Published, values: list[float], n: int, threshold: float,
                claim_above: bool, unit: str) -> Row:
    if not values:
        return Row(measure, claim, None, f"— (0 of {n} seeds have both values)", ctx.sc.note,
                   undetermined("missing: the curves of no seed show both"))
    mean, ci = paired_interval(values)
    ci_text = f" {fmt_ci(ci)}" if ci is not None else ""
    text = f"{mean:.3g}{unit}{ci_text} {mean_flag(len(values), n)} (per seed: {', '.join(f'{v:.3g}' for v in values)})"
    verdict = interval_verdict(ci, threshold, claim_above=claim_above, no_ci=f"n={len(values)}")
    return Row(measure, claim, mean, text, ctx.sc.note + "; paired t-interval over seeds", verdict)


def _read(ctx: Context) -> list[Row]:
    runs = ctx.group("nanda").runs
    n = len(runs)
    note = ctx.sc.note
    rows = [Row("memorization: first evaluation with train accuracy >= 0.95", Published(1400, "~1.4k", NANDA),
                *_mem(ctx), note)]
    rows.append(_step_row(ctx, f"end of memorization M ({PHASE_RULE.split(';')[0]})", "memorization_end",
                          Published(1400, "~1.4k (test loss ~34 there)", NANDA)))
    peak, _ = _values(ctx, "test_loss_peak")
    rows.append(Row("peak test loss (memorization)", Published(34.0, "~34", NANDA),
                    sum(peak) / len(peak) if peak else None, _mean_text(peak, n, ".3g"), note))
    rows.append(_step_row(ctx, "test loss first <= 0.86", "test_loss_0.86", Published(13_800, "0.86 at ~13.8k", NANDA)))
    rows.append(_step_row(ctx, "test loss first <= 0.005", "test_loss_0.005",
                          Published(14_500, "0.005 at ~14.5k", NANDA)))
    keys = [v for r in runs if (v := r.value("n_key_freqs", "end")) is not None]
    rows.append(Row("key frequencies at the end (Nanda's rule: every neuron's best frequency)",
                    Published(5.0, "5 (14, 35, 41, 42, 52); another seed 4", NANDA),
                    sum(keys) / len(keys) if keys else None, _mean_text(keys, n, ".3g"), note))
    rows.append(_step_row(ctx, "end of circuit formation C (the excluded-loss peak after M)", "circuit_formation_end",
                          Published(None, "no number in REFERENCES.md", NANDA)))
    rows.append(_step_row(ctx, f"end of cleanup K (first test loss <= {CLEANUP_LOSS:g} after C)", "cleanup_end",
                          Published(None, "no number in REFERENCES.md", NANDA)))
    diffs = [r.run_values["test_loss_drop"] - r.run_values["restricted_loss_drop"] for r in runs
             if r.run_values.get("test_loss_drop") is not None and r.run_values.get("restricted_loss_drop") is not None]
    rows.append(_paired_row(ctx, "restricted loss falls before test loss: drop step of the test loss - of the "
                                 "restricted loss (fixed key set)",
                            Published(None, "restricted loss falls well before test loss (no number)", NANDA),
                            diffs, n, 0.0, True, " steps"))
    rows.append(_ratio_row(ctx, "excluded loss rises during circuit formation: excluded loss at C / at M",
                           "excluded loss rises during circuit formation (no number)", "excluded_at_C", "excluded_at_M",
                           above=True))
    rows.append(_ratio_row(ctx, "sum of squared weights falls through circuit formation: at C / at M",
                           "weight norm falls through circuit formation and cleanup (no number)", "weight_sq_at_C",
                           "weight_sq_at_M", above=False))
    rows.append(_ratio_row(ctx, "sum of squared weights falls through cleanup: at K / at C",
                           "weight norm falls through circuit formation and cleanup (no number)", "weight_sq_at_K",
                           "weight_sq_at_C", above=False))
    return rows


def _mem(ctx: Context) -> tuple[float | None, str]:
    _, text, _ = ctx.grok("nanda")  # for the final accuracy and collapse notes
    mems = [r.memorization for r in ctx.group("nanda").runs if r.memorization is not None]
    n = len(ctx.group("nanda").runs)
    return (sum(mems) / len(mems) if mems else None), _mean_text(mems, n) + "; grokked at " + text


def _ratio_row(ctx: Context, measure: str, claim: str, num: str, den: str, *, above: bool) -> Row:
    runs = ctx.group("nanda").runs
    vals = [r.run_values[num] / r.run_values[den] for r in runs
            if r.run_values.get(num) is not None and r.run_values.get(den)]
    return _paired_row(ctx, measure, Published(None, claim, NANDA), vals, len(runs), 1.0, above, "")


def _analyses(sc: Scale, scale: str):
    # the default key set at the end (how many frequencies); the fixed set of the last checkpoint along
    # the run for the curves (every 2nd checkpoint, and the phases)
    every = "all" if scale == "smoke" else "every:2+phases"
    return [("fourier", {}, "end"), ("fourier", {"key_frequencies": "last"}, every)]


def _run_values(path: Path, sc: Scale) -> dict[str, Any]:
    from groklens.analyses.progress import progress_summary

    return progress_summary(path)


register(Experiment(
    "progress-measures",
    "Nanda et al.'s canonical run: memorization, circuit formation and cleanup from restricted/excluded loss, "
    "key frequencies and the weight norm",
    SCALES, _plan, _read, _analyses, seeds={"smoke": 1, "quick": 3, "paper": 3}, run_values=_run_values))
