"""The scaling-law experiment: the MLP grid and its fitted power-law exponents (Tobit beside OLS
when runs are censored)."""

from __future__ import annotations

from groklens.errors import BadInput
from groklens.experiments.core import (
    Context, Experiment, Plan, Published, Row, SMOKE, SMOKE_NOTE, Scale, fit_text, lr_tag, no_analyses, register)

SCALING = "Grokking scaling law (2026; REFERENCES.md)"


# ---------------------------------------------------------------------- scaling-law
SCALING_PUBLISHED = {"width": -0.27, "train_frac": -2.04, "lr": -0.50, "weight_decay": -0.64}


def _plan_scaling(sc: Scale, scale: str) -> Plan:
    import itertools

    ax = sc.extra["axes"]
    variants = {}
    for h, d, lr, wd in itertools.product(ax["d_mlp"], ax["train_frac"], ax["lr"], ax["weight_decay"]):
        variants[f"h{h}_d{d:g}_lr{lr_tag(lr)}_wd{wd:g}"] = {"d_mlp": h, "train_frac": d, "lr": lr, "weight_decay": wd}
    return Plan(variants, None, sc.base)


def _read_scaling(ctx: Context) -> list[Row]:
    from groklens.analyses.scaling import DEFAULT_VARS, GrokRecord, fit_scaling_law, variable_value

    diff = ctx.sc.note + "; D = train_frac (the paper's D is the training data size: the same exponent when p is fixed)"
    recs = [GrokRecord(r.name, {v: variable_value(v, r.config) for v in DEFAULT_VARS}, r.grokking, r.last_step)
            for v in ctx.plan.variants for r in ctx.group(v).runs]
    fits = fit_text(recs, list(DEFAULT_VARS))
    names = {"width": "H (width)", "train_frac": "D (data)", "lr": "eta (learning rate)",
             "weight_decay": "lambda (weight decay)"}
    rows = []
    for v in DEFAULT_VARS:
        ours, text = fits[v]
        rows.append(Row(f"scaling exponent of {names[v]}",
                        Published(SCALING_PUBLISHED[v], f"{SCALING_PUBLISHED[v]:+.2f}", SCALING),
                        ours, text, diff))
    try:
        fit = fit_scaling_law(recs, list(DEFAULT_VARS))
        r2 = fit["ols"]["r2"]
        text = f"{r2:.3f} (OLS, n={fit['n_grokked']} grokked, {fit['n_censored']} censored left out)"
    except BadInput as exc:
        r2, text = None, f"no fit: {exc}"
    rows.append(Row("R^2 of the power-law fit",
                    Published(0.732, "0.732 (0.821 with interactions)", SCALING), r2, text, diff))
    return rows


register(Experiment(
    "scaling-law",
    "two-hidden-layer MLP grid over width, data, learning rate and weight decay; fitted power-law exponents",
    {
        "smoke": Scale.of({**SMOKE, "model": "mlp", "n_layers": 2, "mlp_bias": True, "steps": 20},
                          SMOKE_NOTE + " (MLP grid 2x2x2x1)",
                        axes={"d_mlp": [16, 32], "train_frac": [0.4, 0.6], "lr": [1e-3, 3e-3], "weight_decay": [1.0]}),
        "quick": Scale.of(dict(task="add", p=23, model="mlp", n_layers=2, d_model=64, mlp_bias=True, steps=6000,
                             eval_every=50, checkpoint_every=1000, stop_after_grok=1, device="cpu"),
                        "MLP grid of 16 (2 values per axis: width 128, 256; train_frac 0.5, 0.7; lr 5e-3, 1e-2; wd 1, "
                        "3), p=23, embeddings 64 wide; censored at 6000 steps (the paper: 384 configurations)",
                        axes={"d_mlp": [128, 256], "train_frac": [0.5, 0.7], "lr": [5e-3, 1e-2],
                              "weight_decay": [1.0, 3.0]}),
        "paper": Scale.of(dict(task="add", p=97, model="mlp", n_layers=2, d_model=128, mlp_bias=True, steps=100_000,
                             eval_every=100, checkpoint_every=5000, stop_after_grok=1, device="auto"),
                        "384 configurations (4 widths x 4 data x 4 lr x 6 wd), p=97 (the paper's p and grid values "
                        "are not in REFERENCES.md: ours)",
                        axes={"d_mlp": [64, 128, 256, 512], "train_frac": [0.3, 0.4, 0.5, 0.6],
                              "lr": [3e-4, 1e-3, 3e-3, 1e-2], "weight_decay": [0.1, 0.3, 0.5, 1.0, 2.0, 3.0]}),
    },
    _plan_scaling, _read_scaling, no_analyses))
