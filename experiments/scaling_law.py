"""The scaling-law experiment: the MLP grid and its fitted power-law exponents (Tobit beside OLS when
runs are censored); at the paper scale also R^2 with interactions, the phase boundary in weight
decay and the weight norm through the transition, and the figures a reader of the paper expects."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from groklens.errors import BadInput
from groklens.experiments.core import (
    Context, Experiment, Plan, Published, Row, SMOKE, SMOKE_NOTE, Scale, fit_exponents, lr_tag, no_analyses,
    register)
from groklens.experiments.verdicts import exponent_verdict, interval_verdict, near_verdict, undetermined

SCALING = "Grokking scaling law (2026; REFERENCES.md)"


# ---------------------------------------------------------------------- scaling-law
SCALING_PUBLISHED = {"width": -0.27, "train_frac": -2.04, "lr": -0.50, "weight_decay": -0.64}
R2 = Published(0.732, "0.732 (0.821 with interactions)", SCALING)
R2_INTERACTIONS = Published(0.821, "0.821 with interaction terms", SCALING)
BOUNDARY = Published(1.0, "a sharp phase boundary near weight decay 1.0", SCALING)
NORM_FALL = Published(None, "weight norm falls monotonically through the transition (no number)", SCALING)
FIGURE = "scaling-law.png"


def _plan_scaling(sc: Scale, scale: str) -> Plan:
    import itertools

    ax = sc.extra["axes"]
    variants = {}
    for h, d, lr, wd in itertools.product(ax["d_mlp"], ax["train_frac"], ax["lr"], ax["weight_decay"]):
        variants[f"h{h}_d{d:g}_lr{lr_tag(lr)}_wd{wd:g}"] = {"d_mlp": h, "train_frac": d, "lr": lr, "weight_decay": wd}
    return Plan(variants, None, sc.base)


def _records(ctx: Context) -> tuple[list[Any], int]:
    """The recorded runs of the widths (the grid's stages) whose every configuration is recorded,
    and how many recorded runs of other widths are left out: a (width, train_frac) cell trains as
    one ensemble whose members stop as they grok, so a cell recorded before its ensemble ends holds
    only its fastest runs, and a width with only some cells recorded over-weights those cells' data
    fractions; either would bias the fit, the boundary and the rates."""
    from groklens.analyses.scaling import DEFAULT_VARS, GrokRecord, variable_value

    widths: dict[int, list[str]] = {}
    for name, over in ctx.plan.variants.items():
        widths.setdefault(over["d_mlp"], []).append(name)
    complete = {name for names in widths.values() if all(ctx.group(v).runs for v in names) for name in names}
    recs = [GrokRecord(r.name, {v: variable_value(v, r.config) for v in DEFAULT_VARS}, r.grokking, r.last_step,
                       r.run_values.get("weight_norm"))
            for v in ctx.plan.variants if v in complete for r in ctx.group(v).runs]
    left = sum(len(ctx.group(v).runs) for v in ctx.plan.variants if v not in complete)
    return recs, left


NAMES = {"width": "H (width)", "train_frac": "D (data)", "lr": "eta (learning rate)",
         "weight_decay": "lambda (weight decay)"}


def _fitted_vars(recs: list[Any]) -> tuple[list[str], dict[str, float]]:
    """The variables the recorded runs vary, and the others' one value. A grid trained in stages
    (`--arms 'h64_*'`) holds one width at first: its law is fitted over the other variables (under
    the paper's product law their exponents do not depend on the width held) rather than not at
    all. With none varying, every variable (the fit then says why it cannot be made)."""
    from groklens.analyses.scaling import DEFAULT_VARS

    values = {v: {r.values[v] for r in recs} for v in DEFAULT_VARS}
    fitted = [v for v in DEFAULT_VARS if len(values[v]) >= 2]
    if not fitted:
        return list(DEFAULT_VARS), {}
    return fitted, {v: next(iter(values[v])) for v in DEFAULT_VARS if len(values[v]) == 1}


def _read_scaling(ctx: Context) -> list[Row]:
    from groklens.analyses.scaling import DEFAULT_VARS, fit_scaling_law

    diff = ctx.sc.note + "; D = train_frac (the paper's D is the training data size: the same exponent when p is fixed)"
    claims = ctx.sc.extra.get("claims", False)
    recs, left = _records(ctx)
    fitted, held = _fitted_vars(recs)
    if left:
        diff += (f"; {left} recorded run(s) of widths not yet complete are left out until their widths are (a cell's "
                 "ensemble members stop as they grok, so its first finished runs are its fastest, and part of a width "
                 "over-weights its cells' data fractions)")
    if held:
        diff += ("; trained so far: " + ", ".join(f"{NAMES[v]} {x:g} only" for v, x in held.items())
                 + f" (the grid is trained in stages), so the law is fitted over {', '.join(fitted)}")
    fits = fit_exponents(recs, fitted)
    rows = []
    for v in DEFAULT_VARS:
        ours, ci, text = fits[v] if v in fits else (
            None, None, f"not fitted: every recorded run has {v} {held[v]:g} (the other values are not trained yet)")
        pub = SCALING_PUBLISHED[v]
        verdict = exponent_verdict(ci, pub, no_ci=text) if claims else ""
        rows.append(Row(f"scaling exponent of {NAMES[v]}", Published(pub, f"{pub:+.2f}", SCALING), ours, text, diff,
                        verdict))
    try:
        fit = fit_scaling_law(recs, fitted)
    except BadInput as exc:
        fit, why = None, f"no fit: {exc}"
    if fit is None:
        rows.append(Row("R^2 of the power-law fit", R2, None, why, diff))
    else:
        ols = fit["ols"]
        rows.append(Row("R^2 of the power-law fit", R2, ols["r2"],
                        f"{ols['r2']:.3f} (OLS, n={fit['n_grokked']} grokked, {fit['n_censored']} censored left out)",
                        diff))
        if claims:
            r2i = ols.get("r2_interactions")
            rows.append(Row("R^2 of the power-law fit with the pairwise interactions (centred logs)", R2_INTERACTIONS,
                            r2i, f"{r2i:.3f} (OLS, n={fit['n_grokked']} grokked)" if r2i is not None else
                            "n/a (too few grokked runs for 10 terms)", diff))
    if claims:
        rows += _claim_rows(recs, diff)
    return rows


def _claim_rows(recs: list[Any], diff: str) -> list[Row]:
    """The phase boundary along weight decay and the weight norm through the transition."""
    from groklens.analyses.scaling import BOUNDARY_RULE, boundary_text, claims

    c = claims(recs, ["weight_decay"])
    b, wn = c.get("boundary"), c["weight_norm"]
    if b is None:
        brow = Row("phase boundary in weight decay (grokked / not grokked)", BOUNDARY, None, "n/a (no runs)", diff)
    else:
        text = boundary_text(b, "lambda ")
        verdict = near_verdict(b["ci95"], BOUNDARY.value, b.get("why", "no boundary")) if b["estimate"] is not None \
            else undetermined(text)
        brow = Row("phase boundary in weight decay (grokked / not grokked)", BOUNDARY, b["estimate"], text,
                   f"{diff}; the boundary: {BOUNDARY_RULE} (n={sum(b['n'])} runs)", verdict)
    if wn["n"]:
        text = (f"{wn['k']} of {wn['n']} grokked runs: {wn['rate']:.2f} [{wn['ci95'][0]:.2f}, {wn['ci95'][1]:.2f}] "
                f"(exact binomial 95%); median share of falling steps {wn['median_falling']:.2f}"
                + (f"; {wn['missing']} grokked run(s) without a window of 2 evaluations" if wn["missing"] else ""))
        verdict = interval_verdict(wn["ci95"], 0.5, claim_above=True, no_ci="no runs")
        rate = wn["rate"]
    else:
        text, verdict, rate = "n/a (no grokked run with a recorded weight-norm window)", undetermined("no runs"), None
    nrow = Row("weight norm falls monotonically from memorization to grokking (rate over grokked runs)", NORM_FALL,
               rate, text, f"{diff}; monotone: no evaluation's weight norm above the previous one's by more than "
               f"{wn['tol']:g} (relative) and lower at grokking than at memorization (our rule; 'most runs': the "
               "rate's interval above 1/2)", verdict)
    return [brow, nrow]


def _run_values(path: Path, sc: Scale) -> dict[str, Any]:
    """The weight norm from memorization to grokking (analyses.scaling.weight_norm_transition):
    the claim reads it from the ledger, whose entries keep no curves."""
    from groklens.analyses.grokking import grok_evals_of, grokking_times
    from groklens.analyses.scaling import weight_norm_transition
    from groklens.checkpoints import Trajectory
    from groklens.config import GROK_THRESHOLD

    traj = Trajectory(path)
    m = traj.metrics
    key = f"{GROK_THRESHOLD:g}"
    times = grokking_times(m, (GROK_THRESHOLD,), grok_evals_of(traj.config_dict))
    memo, grok = times["memorization_step"][key], times["grokking_step"][key]
    if memo is None or grok is None or "weight_norm" not in m:
        return {"weight_norm": None}
    return {"weight_norm": weight_norm_transition(m["step"], m["weight_norm"], memo, grok)}


def _figures(ctx: Context) -> list[Path]:
    """OUT/scaling-law.png from the ledger's runs: measured against predicted, the grokking step
    against each variable with the fit, and the (lambda, D) phase map with the boundary."""
    from groklens.analyses.scaling import claims, figure, fit_scaling_law
    from groklens.fileio import staged_outputs

    recs, _ = _records(ctx)
    fitted, _ = _fitted_vars(recs)
    try:
        fit = fit_scaling_law(recs, fitted, censored=any(r.censored for r in recs))
    except BadInput:
        return []
    fig = figure(recs, {**fit, **claims(recs, fitted)}, fitted)
    with staged_outputs(ctx.out_dir) as stage:
        fig.savefig(stage / FIGURE, dpi=110, bbox_inches="tight")
    return [ctx.out_dir / FIGURE]


# the CPU paper scale: the largest grid of the paper's shape (4 widths x 4 data x 4 lr x 6 weight
# decays = 384 configurations, one seed each) that the cost model puts within about a day on 2
# cores (docs/RESULTS.md: the estimate); the paper grid at p=97 and 100k steps is a GPU sweep
# (benchmarks/scaling_law_gpu.yaml, run by benchmarks/gpu_paper_scale.sh)
PAPER_AXES = {"d_mlp": [64, 128, 256, 512], "train_frac": [0.4, 0.5, 0.6, 0.7],
              "lr": [3e-4, 1e-3, 3e-3, 1e-2], "weight_decay": [0.1, 0.3, 0.5, 1.0, 2.0, 3.0]}
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
        "paper": Scale.of(dict(task="add", p=47, model="mlp", n_layers=2, d_model=128, mlp_bias=True, steps=20_000,
                             eval_every=50, checkpoint_every=5000, stop_after_grok=1, device="auto"),
                        "CPU paper scale: 384 configurations, one seed each, as the paper (4 widths 64-512 x "
                        "train_frac 0.4-0.7 x lr 3e-4-1e-2 x 6 weight decays 0.1-3), two hidden layers, embeddings "
                        "128 wide, add mod p=47, full batch, AdamW, censored at 20,000 steps; the paper's p, grid "
                        "values and cap are not in REFERENCES.md (ours); a (width, data) cell trains as one batched "
                        "ensemble where that pays (docs/PERFORMANCE.md: widths 64 and 128 on a CPU)",
                        axes=PAPER_AXES, claims=True),
    },
    _plan_scaling, _read_scaling, no_analyses, seeds={"smoke": 1, "quick": 2, "paper": 1}, run_values=_run_values,
    figures=_figures))
