"""Zhong et al. 2023, "The Clock and the Pizza" (`reproduce clock-pizza`): which algorithm a
1-layer transformer learns on modular addition, with uniform attention (their Model A, attention
rate 0) and learned attention (Model B, rate 1), read by gradient symmetricity and distance
irrelevance (analyses/clock_pizza.py) at the end of training.

Their setup (code/train-main.py, the configs of code/save/; REFERENCES.md): p=59, 80 % of the pairs,
full batch, d_model 128, 4 heads, d_mlp 512, ReLU, no norm, no attention mask, trained MLP biases,
AdamW lr 1e-3, weight decay 2.0, betas (0.9, 0.98), 10-step warm-up, 20,000 steps, float64 loss.
What differs here at every scale: our inputs are [a, b, =] read at '=' (theirs [a, b], read at
b), our uniform attention is 1/3 over the three positions (theirs all-ones over two), and our
initialization is TransformerLens' (theirs randn / sqrt(d)).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from groklens.analyses.clock_pizza import ALGORITHM_RULE, algorithm_label
from groklens.experiments.core import (
    SMOKE, SMOKE_NOTE, Context, Experiment, Plan, Published, Row, Scale, register)
from groklens.experiments.verdicts import mean_flag, undetermined

SOURCE = "Zhong et al. 2023, The Clock and the Pizza (REFERENCES.md)"
TABLE = "median of their result/1l_fixedwidth.csv, 1-layer runs"
# their result table's medians (docs/ANALYSES.md, "clock_pizza"): attention rate <= 0.1 and >= 0.9
PUBLISHED = {"uniform": {"gradient_symmetricity": 0.993, "distance_irrelevance": 0.362, "label": "pizza",
                         "runs": "241 runs with attention rate <= 0.1"},
             "learned": {"gradient_symmetricity": 0.483, "distance_irrelevance": 0.853, "label": "clock",
                         "runs": "226 runs with attention rate >= 0.9"}}
VARIANTS = {"uniform": {"attention": "uniform"}, "learned": {"attention": "softmax"}}
THEIRS = dict(task="add", p=59, train_frac=0.8, d_model=128, n_heads=4, d_head=32, d_mlp=512, act_fn="relu",
              norm="none", causal=False, mlp_bias=True, lr=1e-3, weight_decay=2.0, betas=[0.9, 0.98], warmup_steps=10,
              batch_size=0)
DIFFERS = "inputs [a, b, =] read at '=', uniform attention 1/3 over 3 positions, TransformerLens init"
SCALES = {
    "smoke": Scale.of(SMOKE, SMOKE_NOTE),
    "quick": Scale.of({**THEIRS, "p": 31, "d_model": 64, "d_head": 16, "d_mlp": 256, "steps": 4_000,
                       "eval_every": 50, "checkpoint_every": 250, "device": "cpu"},
                      "p=31, d_model 64, d_mlp 256, 4,000 steps (theirs: p=59, d_model 128, d_mlp 512, 20,000); "
                      + DIFFERS),
    "paper": Scale.of({**THEIRS, "steps": 20_000, "eval_every": 100, "checkpoint_every": 1_000, "device": "auto"},
                      "their setup; " + DIFFERS),
}


def _plan(sc: Scale, scale: str) -> Plan:
    return Plan(VARIANTS, None, sc.base)


def _analyses(sc: Scale, scale: str):
    return [("clock_pizza", {}, "every")]  # the trajectory: about 20 checkpoints and the phases


def _run_values(path: Path, sc: Scale) -> dict[str, Any]:
    """The measures and label at the last checkpoint, and the first step each label holds from on."""
    from groklens.analyses.runner import compute

    res = compute(path, "clock_pizza")  # the stored checkpoints are reused; the rest are computed
    labels = [algorithm_label(g, d) for g, d in zip(res["gradient_symmetricity"], res["distance_irrelevance"])]
    out: dict[str, Any] = {"gradient_symmetricity": float(res["gradient_symmetricity"][-1]),
                           "distance_irrelevance": float(res["distance_irrelevance"][-1]), "label": labels[-1]}
    for name in ("clock", "pizza"):  # from this checkpoint on, every later one has the label (None: not at the end)
        settled = [s for i, s in enumerate(res.steps) if all(lbl == name for lbl in labels[i:])]
        out[f"{name}_from_step"] = settled[0] if settled else None
    return out


def _mean_row(ctx: Context, variant: str, key: str, what: str) -> Row:
    runs = ctx.group(variant).runs
    vals = [float(v) for r in runs if isinstance(v := r.run_values.get(key), (int, float))]
    pub = PUBLISHED[variant]
    published = Published(pub[key], f"{pub[key]} ({TABLE}: {pub['runs']})", SOURCE)
    if not vals:
        return Row(f"{what}, {variant} attention, end", published, None, f"— (0 of {len(runs)} seeds)", ctx.sc.note)
    mean = sum(vals) / len(vals)
    text = f"{mean:.3f}" + (f" [{min(vals):.3f}-{max(vals):.3f}]" if len(vals) > 1 else "") + " " + \
        mean_flag(len(vals), len(runs))
    return Row(f"{what}, {variant} attention, end", published, mean, text, ctx.sc.note)


def _label_row(ctx: Context, variant: str) -> Row:
    runs = ctx.group(variant).runs
    want = PUBLISHED[variant]["label"]
    labels = [r.run_values.get("label") for r in runs]
    claim = Published(None, f"{'uniform attention: pizza (Model A)' if variant == 'uniform' else 'learned attention: clock (Model B)'}",
                      SOURCE)
    text = ", ".join(f"seed {r.seed}: {lbl}" for r, lbl in zip(runs, labels)) or "— (no runs)"
    if not runs:
        verdict = undetermined("no runs")
    elif any(r.grok_censored for r in runs):  # an algorithm is read from a model that generalizes
        verdict = undetermined(f"{sum(r.grok_censored for r in runs)} of {len(runs)} seeds did not grok")
    elif all(lbl == want for lbl in labels):
        verdict = "agrees"
    elif any(lbl == want for lbl in labels):
        verdict = undetermined(f"{sum(lbl == want for lbl in labels)} of {len(runs)} seeds")
    else:
        verdict = "disagrees"
    return Row(f"algorithm at the end, {variant} attention (our rule: {ALGORITHM_RULE})", claim, None, text,
               ctx.sc.note, verdict)


def _read(ctx: Context) -> list[Row]:
    rows = []
    for variant in VARIANTS:
        rows.append(_mean_row(ctx, variant, "gradient_symmetricity", "gradient symmetricity"))
        rows.append(_mean_row(ctx, variant, "distance_irrelevance", "distance irrelevance"))
        rows.append(_label_row(ctx, variant))
    return rows


register(Experiment(
    "clock-pizza",
    "Zhong et al.'s Model A (uniform attention) and B (learned): pizza or clock, by gradient symmetricity and "
    "distance irrelevance along training",
    SCALES, _plan, _read, _analyses, seeds={"smoke": 1, "quick": 2, "paper": 3}, run_values=_run_values))
