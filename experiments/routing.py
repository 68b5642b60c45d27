"""The permutation-routing experiment (Kashiwamura & Leleu 2026, arXiv 2605.09256; REFERENCES.md):
M copies of a model trained independently, routed through two or three mixing kernels Q, or
coupled by Elastic SGD, on the paper's own models (a teacher-student perceptron and committee
machine: generalization error against the examples per weight alpha) and on modular addition (an
MLP and a transformer: the grokking step).

What we could read of the paper is its abstract and the opening of its introduction (REFERENCES.md):
the method and the claim "improving generalization" against independent and coupled copies, with
no number, size, kernel or training rule. So every setting here is ours, and the rows say so:
  - M = 4 copies; the kernels: the ring kernel of trainers/routing.py at widths 0.5, 1 and inf
    (uniform), one cyclic shift per unit and step (docs/VARIANTS.md);
  - units: every scalar weight for the perceptron and the committee machine (their single
    layer routed whole would be a whole copy: no routing at all), each layer for the MLP and
    the transformer (the benchmark of docs/VARIANTS.md);
  - Elastic SGD: the pull toward the copies' mean, gamma 0.1 (our single untuned choice);
  - the perceptron learns by Rosenblatt's criterion (the gradient of the perceptron rule; the
    abstract's "original local update rule"), full batch, AdamW without weight decay (the
    engine's optimizer in place of the rule's plain step); the committee machine (K = 3, a K = 3
    teacher) by cross-entropy through straight-through hidden signs (models/teacher.py);
  - generalization error: 1 - test accuracy on teacher_test fresh examples of each run's own
    teacher (data_seed = the seed), the mean over the copies; the grokking step of a set of
    copies: the mean of its copies' (a copy never grokked enters at the cap: a bound); a copy has
    grokked at the first of 3 evaluations in a row at test accuracy >= 0.95, and a run stops only
    at an evaluation where every copy holds it (`MODULAR_RULE`).
Claims and verdicts (verdicts.py): "routing generalizes better than independent copies" and
"... than Elastic SGD" read as a ratio of generalization errors below 1 (teacher-student: the
per-seed geometric mean over the alpha grid, paired by seed: the arms share each seed's teacher,
data and initial copies; 95% paired t-interval), or as a speed-up of grokking above 1 (modular
addition: compare.speedup's Welch interval). Elastic SGD against independent copies is shown
without a verdict: the paper states no claim of it that we read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from groklens.analyses.speedup import GrokTime, mean_std
from groklens.config import GROK_THRESHOLD
from groklens.experiments.core import (
    CANONICAL_GROK, FROM_SEED, QUICK, SMOKE, SMOKE_NOTE, Context, Experiment, Plan, Published, Row,
    Scale, no_analyses, register)
from groklens.experiments.verdicts import (
    fmt_ci, mean_flag, paired_interval, ratio_verdict, speedup_verdict, undetermined)

SOURCE = "Kashiwamura & Leleu 2026, permutation routing across model copies (arXiv 2605.09256; REFERENCES.md)"
CLAIM = "routing improves generalization over independent copies (no number in what we read)"
CLAIM_ELASTIC = "routing improves generalization over the coupled baseline, Elastic SGD (no number in what we read)"
NO_CLAIM = "no claim in what we read (the coupled baseline)"
COPIES = 4
WIDTHS = (0.5, 1.0, math.inf)  # ring-kernel widths of the routed arms (ours)
ELASTIC_GAMMA = 0.1  # Elastic SGD's coupling (ours, untuned)
# How the modular runs read grokking and stop: grokked = 3 evaluations in a row at test accuracy
# >= 0.95, and the stop rule ends a run only at an evaluation where every copy holds it. At this
# task's lr 3e-3 / wd 1 the copies' test accuracy dips and recovers every few hundred steps; under
# the experiments' legacy rule (the first crossing, stop 2 evaluations later whatever they read)
# the quick ledger's first runs took crossings in those dips for grokking and stopped inside
# the next dip, where most routed copies read 0.6-0.8 (docs/RESULTS.md, routing).
MODULAR_RULE = dict(grok_evals=3, stop_after_grok=2, stop_at_event=True)
TEACHER_MODELS = ("perceptron", "committee")
MODULAR_MODELS = ("mlp", "tf")
MODEL_LABEL = {"perceptron": "perceptron", "committee": "committee machine (K=3)", "mlp": "MLP", "tf": "transformer"}


def _arm_name(width: float) -> str:
    return "routed_uniform" if math.isinf(width) else f"routed_w{width:g}"


def arms(sc: Scale) -> dict[str, dict[str, Any]]:
    """arm -> the config fields that make it (every arm trains M copies)."""
    m = sc.extra["copies"]
    out: dict[str, dict[str, Any]] = {"independent": {"routing_copies": m}}
    for w in sc.extra["widths"]:
        out[_arm_name(w)] = {"routing_copies": m, "routing_width": w}
    out["elastic"] = {"routing_copies": m, "elastic_gamma": ELASTIC_GAMMA}
    return out


ARM_LABEL = {"independent": "independent copies", "elastic": f"Elastic SGD (gamma {ELASTIC_GAMMA:g})",
             "routed_uniform": "routed, uniform kernel"}


def _arm_label(arm: str) -> str:
    return ARM_LABEL.get(arm, arm.replace("routed_w", "routed, ring kernel width "))


def _variant(model: str, arm: str, alpha: float | None = None) -> str:
    return f"{model}_a{alpha:g}_{arm}" if alpha is not None else f"{model}_{arm}"


def _plan(sc: Scale, scale: str) -> Plan:
    variants = {}
    for model in TEACHER_MODELS:
        for alpha in sc.extra["alphas"]:
            for arm, over in arms(sc).items():
                unit = {"routing_unit": "weight"} if arm.startswith("routed") else {}
                variants[_variant(model, arm, alpha)] = {**sc.extra[model], "teacher_alpha": alpha, **over, **unit}
    for model in MODULAR_MODELS:
        for arm, over in arms(sc).items():
            variants[_variant(model, arm)] = {**sc.extra[model], **over}
    return Plan(variants, _variant("tf", "independent"), sc.base)


# ---------------------------------------------------------------------- what a run keeps
def _run_values(path: Path, sc: Scale) -> dict[str, Any]:
    """Per copy: the final generalization error (1 - test accuracy), the grokking step (None:
    never), whether it collapsed (analyses.grokking.collapse at the run's grok_evals); the same of the
    copies' ensemble."""
    from groklens.analyses.grokking import collapse, grok_evals_of
    from groklens.checkpoints import Trajectory

    traj = Trajectory(path)
    m, cfg = traj.metrics, traj.config_dict
    steps, evals = m["step"], grok_evals_of(cfg)

    def summary(prefix: str) -> tuple[float, int | None, bool]:
        c = collapse(m, GROK_THRESHOLD, prefix, evals)  # its grokked: the first of evals in a row
        return 1.0 - float(m[prefix + "test_acc"][-1]), c["grokked"], c["collapsed"]

    copies = [summary(f"copy{c}.") for c in range(cfg["routing_copies"])]
    ens = summary("ensemble.")
    return {"last_step": int(steps[-1]), "copy_test_error": [e for e, _, _ in copies],
            "copy_grok": [g for _, g, _ in copies], "copy_collapsed": [c for _, _, c in copies],
            "ensemble_test_error": ens[0], "ensemble_grok": ens[1]}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _sd_text(xs: list[float], fmt: str) -> str:
    return " ± " + format(mean_std(xs)[1], fmt) if len(xs) >= 2 else ""


def _errors(ctx: Context, variant: str) -> dict[int, float]:
    """seed -> the copies' mean generalization error, for the runs that have it."""
    return {r.seed: _mean(r.run_values["copy_test_error"]) for r in ctx.group(variant).runs
            if r.run_values.get("copy_test_error")}


# ---------------------------------------------------------------------- teacher-student rows
def _curve_row(ctx: Context, model: str, arm: str, diff: str) -> Row:
    parts = []
    for alpha in ctx.sc.extra["alphas"]:
        runs = ctx.group(_variant(model, arm, alpha)).runs
        errs = list(_errors(ctx, _variant(model, arm, alpha)).values())
        ens = [r.run_values["ensemble_test_error"] for r in runs if "ensemble_test_error" in r.run_values]
        if not errs:
            parts.append(f"alpha {alpha:g}: no runs")
            continue
        parts.append(f"alpha {alpha:g}: {_mean(errs):.3f}{_sd_text(errs, '.3f')} {mean_flag(len(errs), len(runs))}"
                     + (f", ensemble {_mean(ens):.3f}" if ens else ""))
    return Row(f"generalization error against alpha, {MODEL_LABEL[model]}, {_arm_label(arm)} (the copies' mean)",
               Published(None, "generalization error against examples per weight (no number in what we read)", SOURCE),
               None, "; ".join(parts), diff)


def _paired_row(ctx: Context, model: str, arm: str, base: str, published: Published, diff: str,
                verdict: bool) -> Row:
    """Generalization error of `arm` / of `base`: per seed the geometric mean over the alpha grid of
    the per-alpha ratios (seeds with both arms at every alpha), its paired 95% t-interval."""
    alphas = ctx.sc.extra["alphas"]
    per_alpha = {a: (_errors(ctx, _variant(model, arm, a)), _errors(ctx, _variant(model, base, a))) for a in alphas}
    seeds = set.intersection(*[set(num) & set(den) for num, den in per_alpha.values()])
    seeds = {s for s in seeds if all(den[s] > 0 and num[s] > 0 for num, den in per_alpha.values())}
    measure = (f"generalization error, {_arm_label(arm)} / {_arm_label(base)}, {MODEL_LABEL[model]} "
               f"(geometric mean over alpha {', '.join(f'{a:g}' for a in alphas)})")
    if not seeds:
        text = "n/a (no seed has both arms at every alpha)"
        return Row(measure, published, None, text, diff, undetermined(f"missing: {text}") if verdict else "")
    ratios = [math.exp(_mean([math.log(num[s] / den[s]) for num, den in per_alpha.values()])) for s in sorted(seeds)]
    mean, ci = paired_interval(ratios)
    by_alpha = "; ".join(f"alpha {a:g}: {_mean([num[s] / den[s] for s in seeds]):.3g}"
                         for a, (num, den) in per_alpha.items())
    text = (f"{mean:.3g}{' ' + fmt_ci(ci) if ci is not None else ''} (n={len(ratios)} seeds, paired; per alpha, "
            f"mean ratio: {by_alpha})")
    return Row(measure, published, mean, text, diff,
               ratio_verdict(mean, ci, below=True, missing=text, n=len(ratios)) if verdict else "")


def _teacher_rows(ctx: Context, model: str) -> list[Row]:
    x = ctx.sc.extra
    cfg = x[model]
    how = ("Rosenblatt's criterion (the perceptron rule's gradient), AdamW lr {lr:g} without weight decay"
           if model == "perceptron" else "cross-entropy through straight-through hidden signs, AdamW lr {lr:g} without "
           "weight decay").format(lr=cfg["lr"])
    diff = (f"{ctx.sc.note}; ours: N={cfg['teacher_dim']}, {cfg['teacher_test']:,} test examples, "
            f"{x['copies']} copies, {cfg['steps']:,} full-batch steps of {how}; units: every weight")
    return ([_curve_row(ctx, model, arm, diff) for arm in arms(ctx.sc)]
            + _claim_rows(ctx, lambda arm, base, pub, verdict: _paired_row(ctx, model, arm, base, pub, diff, verdict)))


def _claim_rows(ctx: Context, row) -> list[Row]:
    """`row(arm, base, published, verdict)` for each routed arm against the independent copies and
    against Elastic SGD (the claims, with verdicts), and Elastic SGD against the independent copies
    (no claim)."""
    routed = [a for a in arms(ctx.sc) if a.startswith("routed")]
    return ([row(arm, "independent", Published(None, CLAIM, SOURCE), True) for arm in routed]
            + [row(arm, "elastic", Published(None, CLAIM_ELASTIC, SOURCE), True) for arm in routed]
            + [row("elastic", "independent", Published(None, NO_CLAIM, SOURCE), False)])


# ---------------------------------------------------------------------- modular-addition rows
def _copies_times(ctx: Context, variant: str, collapsed_censored: bool = False) -> tuple[list[GrokTime], int, int]:
    """(each run's grokking time: the mean of its copies' grokking steps, a copy that never grokked
    at the run's last step, censored then (a lower bound); copies that crossed and ended below the
    threshold; runs with such a copy). `collapsed_censored`: those copies read as never grokked."""
    out, collapsed, runs = [], 0, 0
    for r in ctx.group(variant).runs:
        v = r.run_values
        if not v.get("copy_grok"):
            continue
        fell = v.get("copy_collapsed") or [False] * len(v["copy_grok"])
        grok = [None if f and collapsed_censored else g for g, f in zip(v["copy_grok"], fell)]
        steps = [v["last_step"] if g is None else g for g in grok]
        out.append(GrokTime(_mean(steps), None in grok))
        collapsed += sum(fell)
        runs += any(fell)
    return out, collapsed, runs


def _grok_row(ctx: Context, model: str, arm: str, diff: str) -> Row:
    variant = _variant(model, arm)
    runs = ctx.group(variant).runs
    times, collapsed, _ = _copies_times(ctx, variant)
    measure = f"grokking step (the copies' mean), {MODEL_LABEL[model]}, {_arm_label(arm)}"
    pub = Published(None, "no grokking claim in what we read (the paper reports generalization)", SOURCE)
    if not times:
        return Row(measure, pub, None, "no runs" if not runs else "no evaluation", diff)
    vals = [t.time for t in times]
    n_cens = sum(t.censored for t in times)
    grokked = sum(g is not None for r in runs for g in r.run_values["copy_grok"])
    total = sum(len(r.run_values["copy_grok"]) for r in runs)
    acc = [1 - e for r in runs for e in r.run_values["copy_test_error"]]
    text = ((">= " if n_cens else "") + f"{_mean(vals):,.0f}{_sd_text(vals, ',.0f')} (n={len(vals)}"
            + (f", {n_cens} with a copy censored at the cap: a lower bound" if n_cens else "") + f"); copies grokked "
            f"{grokked}/{total}; final test acc of the copies {_mean(acc):.3f} [{min(acc):.3f}-{max(acc):.3f}]"
            + (f"; {collapsed} copies crossed and then ended below {GROK_THRESHOLD:g}" if collapsed else ""))
    return Row(measure, pub, _mean(vals), text, diff, bound="lower" if n_cens else "")


def _speedup_row(ctx: Context, model: str, base: str, arm: str, published: Published, diff: str,
                 verdict: bool) -> Row:
    from groklens.analyses.compare_format import fmt_speedup
    from groklens.analyses.speedup import speedup

    tb, _, cb = _copies_times(ctx, _variant(model, base))  # the verdict counts runs (sets of copies)
    tv, _, cv = _copies_times(ctx, _variant(model, arm))
    measure = f"speed-up of grokking, {_arm_label(arm)} over {_arm_label(base)}, {MODEL_LABEL[model]}"
    if not tb or not tv:
        return Row(measure, published, None, "n/a (no runs)", diff, undetermined("no runs") if verdict else "")
    sp = speedup(tb, tv)
    text = fmt_speedup(sp) + f" (n={len(tb)} / {len(tv)}; the copies' mean grokking step per seed)"
    if cb + cv:  # the second reading of the collapsed copies, which the verdict also needs
        sp["if_censored"] = speedup(_copies_times(ctx, _variant(model, base), True)[0],
                                    _copies_times(ctx, _variant(model, arm), True)[0])
        text += f"; read with the collapsed copies censored at their last step: {fmt_speedup(sp['if_censored'])}"
    return Row(measure, published, sp["value"], text, diff,
               speedup_verdict(sp, collapsed=cb + cv) if verdict else "", sp.get("bound") or "")


def _modular_rows(ctx: Context, model: str) -> list[Row]:
    x = ctx.sc.extra
    diff = (f"{ctx.sc.note}; ours: {x['copies']} copies, units: each layer; grokking = test accuracy >= "
            f"{GROK_THRESHOLD:g} {MODULAR_RULE['grok_evals']} evaluations in a row, the copies' mean; the claim "
            "of better generalization read as grokking sooner")
    return ([_grok_row(ctx, model, arm, diff) for arm in arms(ctx.sc)]
            + _claim_rows(ctx, lambda arm, base, pub, verdict: _speedup_row(ctx, model, base, arm, pub, diff, verdict)))


def _read(ctx: Context) -> list[Row]:
    return ([row for m in TEACHER_MODELS for row in _teacher_rows(ctx, m)]
            + [row for m in MODULAR_MODELS for row in _modular_rows(ctx, m)])


# ---------------------------------------------------------------------- the figure
FIGURE = "routing.png"


def _error_curves(ctx: Context, model: str) -> dict[str, list[tuple[float, float, float]]]:
    """arm -> [(alpha, mean, sd over seeds of the copies' mean error)] at the alphas with runs (sd 0
    for one seed); arms with no runs left out."""
    out = {}
    for arm in arms(ctx.sc):
        pts = []
        for a in ctx.sc.extra["alphas"]:
            e = list(_errors(ctx, _variant(model, arm, a)).values())
            if e:
                pts.append((a, *mean_std(e)))
        if pts:
            out[arm] = pts
    return out


def _figures(ctx: Context) -> list[Path]:
    """OUT/routing.png from the ledger's runs: each teacher-student model's generalization error (the
    copies' mean; mean and standard deviation over seeds) against alpha, one line per arm; the
    paper's own plot. The modular arms' grokking steps are in the report's grokking-time figure."""
    from matplotlib.figure import Figure

    from groklens.fileio import staged_outputs

    by_model = {model: _error_curves(ctx, model) for model in TEACHER_MODELS}
    if not any(by_model.values()):
        return []
    fig = Figure(figsize=(5.5 * len(TEACHER_MODELS), 4))
    axes = fig.subplots(1, len(TEACHER_MODELS), squeeze=False)
    for ax, (model, curves) in zip(axes[0], by_model.items()):
        for arm, pts in curves.items():
            alphas, means, sds = zip(*pts)
            ax.errorbar(alphas, means, yerr=sds, marker="o", capsize=3, label=_arm_label(arm))
        ax.set(xlabel="alpha (training examples per weight)", ylabel="generalization error (copies' mean)",
               title=MODEL_LABEL[model] + ("" if curves else ": no runs"))
        ax.grid(alpha=0.3)
        if curves:
            ax.legend(fontsize=7)
    fig.suptitle(f"routing, {ctx.sc.extra['copies']} copies: mean ± sd over seeds", fontsize=10)
    fig.tight_layout()
    with staged_outputs(ctx.out_dir) as stage:
        fig.savefig(stage / FIGURE, dpi=110, bbox_inches="tight")
    return [ctx.out_dir / FIGURE]


# ---------------------------------------------------------------------- the scales
def _teacher(n: int, test: int, steps: int, eval_every: int, checkpoint_every: int) -> dict[str, dict[str, Any]]:
    """The perceptron's and the committee machine's fields (the task's data drawn from each seed)."""
    common = dict(task="teacher", teacher_dim=n, teacher_test=test, data_seed=FROM_SEED, lr=1e-2, weight_decay=0.0,
                  steps=steps, eval_every=eval_every, checkpoint_every=checkpoint_every)
    return {"perceptron": {**common, "model": "perceptron", "loss": "perceptron"},
            "committee": {**common, "model": "committee", "d_mlp": 3, "teacher_hidden": 3, "loss": "ce"}}


# the MLP of the routing benchmark (docs/VARIANTS.md): learned embeddings 64 wide, two hidden layers of 256, no biases
_MLP_QUICK = dict(model="mlp", n_layers=2, norm="none", steps=6000, **MODULAR_RULE)
SCALES = {
    "smoke": Scale.of({"device": "cpu"}, SMOKE_NOTE + " (teacher-student N=10; 2 copies)",
                      copies=2, widths=(1.0,), alphas=(2.0,), **_teacher(10, 200, 30, 10, 10),
                      tf={**SMOKE}, mlp={**SMOKE, "model": "mlp", "n_layers": 2}),
    "quick": Scale.of({"device": "cpu"},
                      "teacher-student N=100, alpha 0.5-4, 2,000 steps; modular addition p=23, 50% of pairs (the "
                      "routing benchmark of docs/VARIANTS.md): the transformer 1 layer d_model 64, pre-LayerNorm, "
                      "censored at 5,000 steps, the MLP 2 hidden layers of 256, censored at 6,000; AdamW lr 3e-3, wd 1",
                      copies=COPIES, widths=WIDTHS, alphas=(0.5, 1.0, 2.0, 4.0),
                      **_teacher(100, 10_000, 2000, 100, 500),
                      tf={**QUICK, "steps": 5000, **MODULAR_RULE}, mlp={**QUICK, **_MLP_QUICK}),
    "paper": Scale.of({"device": "auto"},
                      "sizes ours (the paper's are not in what we read): teacher-student N=500, alpha 0.5-6, 20,000 "
                      "test examples, 5,000 steps; modular addition at Nanda's p=113 (30% of pairs): the canonical "
                      "transformer and preset mlp, censored at 40,000 steps",
                      expect_grok={_variant("tf", arm): CANONICAL_GROK for arm in
                                   ("independent", "elastic", *map(_arm_name, WIDTHS))},
                      copies=COPIES, widths=WIDTHS, alphas=(0.5, 1.0, 2.0, 3.0, 4.0, 6.0),
                      **_teacher(500, 20_000, 5000, 100, 1000),
                      tf=dict(task="add", steps=40_000, eval_every=100, checkpoint_every=1000, **MODULAR_RULE),
                      mlp=dict(task="add", model="mlp", n_layers=2, d_model=128, d_mlp=256, mlp_bias=True,
                               steps=40_000, eval_every=100, checkpoint_every=1000, **MODULAR_RULE)),
}

register(Experiment(
    "routing",
    "M copies independent, routed through 3 mixing kernels, or coupled by Elastic SGD: teacher-student perceptron and "
    "committee machine (generalization error against alpha), MLP and transformer on modular addition (grokking)",
    SCALES, _plan, _read, no_analyses, seeds={"smoke": 1, "quick": 5, "paper": 5}, run_values=_run_values,
    figures=_figures))
