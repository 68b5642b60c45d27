"""The activation-norm penalty's experiments: activation-norm (propositions on the no-norm transformer and the MLP) and nanogpt-addition."""

from __future__ import annotations

from groklens.experiments.core import (
    CANONICAL_GROK, Context, Experiment, Plan, Published, QUICK, QUICK_NOTE, Row, SMOKE, SMOKE_NOTE, Scale,
    grok_row, no_analyses, register, speedup_row)
from groklens.experiments.verdicts import (
    fmt_ci, generalized_arms, mean_flag, paired_interval, ratio_verdict, undetermined, welch_log_ratio)

ACTNORM = "Activation-norm penalty ('radial inflation', 2026; REFERENCES.md)"


def _an_actnorm(sc: Scale, scale: str):
    small = scale == "smoke"
    return [("radial", {}, "phases"),
            ("sharpness", {"top_k": 1, "trace_samples": 2 if small else 10, "maxiter": 50 if small else None}, "end")]


# ---------------------------------------------------------------------- activation-norm
def _plan_actnorm(sc: Scale, scale: str) -> Plan:
    lam = sc.extra["lambda"]
    mlp = {**sc.extra["mlp"]}
    # Nanda's canonical no-norm transformer: the residual's scale reaches the logits (behind a
    # scale-invariant norm, rho and the Hessian would mostly measure the norm's eps)
    tf = {"norm": "none", **sc.extra.get("tf", {})}
    return Plan({"tf_base": tf, "tf_actnorm": {**tf, "act_norm_lambda": lam},
                 "mlp_base": mlp, "mlp_actnorm": {**mlp, "act_norm_lambda": lam}}, "tf_base", sc.base)


def _read_actnorm(ctx: Context) -> list[Row]:
    rows = []
    lam = ctx.sc.extra["lambda"]
    diff = f"{ctx.sc.note}; lambda {lam:g} (our single untuned choice; the paper's value is not in REFERENCES.md)"
    for m, label in (("tf", "transformer"), ("mlp", "MLP")):
        rows.append(speedup_row(ctx, f"speed-up of the sqrt(d) penalty, {label}", Published(6.0, "up to 6x", ACTNORM),
                                f"{m}_base", f"{m}_actnorm", diff))
    for m, label in (("tf", "no-norm transformer"), ("mlp", "MLP")):
        for v in (f"{m}_base", f"{m}_actnorm"):
            ratio, ci, n, rtext = _rho_ratio(ctx, v)
            verdict = ""
            if "actnorm" in v:  # Proposition ii is about the solution the penalty finds
                why = generalized_arms({"the penalty arm": ctx.group(v).runs})
                verdict = undetermined(why) if why else ratio_verdict(ratio, ci, below=True, missing=rtext, n=n)
            rows.append(Row(f"radial gradient energy rho / (1/d) at the end, {label}, {'penalty' if 'actnorm' in v else 'baseline'}",
                            Published(None, "rho below the isotropic 1/d baseline (Proposition ii; no number)", ACTNORM),
                            ratio, rtext, diff, verdict))
        rows.append(_hessian_row(ctx, m, label, diff))
        rad, rtext = ctx.measure(f"{m}_actnorm", "radius", "end")
        rows.append(Row(f"activation radius ||h||/sqrt(d) at the end, {label}, penalty",
                        Published(1.0, "held softly on the sqrt(d) sphere (radius 1)", ACTNORM), rad, rtext, diff))
    return rows


def _hessian_row(ctx: Context, m: str, label: str, diff: str) -> Row:
    """Top Hessian eigenvalue at the end, penalty / baseline: the ratio of geometric means over
    seeds with Welch's interval on the logs; a flat-minimum comparison only between arms that
    both generalized."""
    base, act = ctx.group(f"{m}_base").runs, ctx.group(f"{m}_actnorm").runs
    vb = [r.value("hessian_top", "end") for r in base]
    va = [r.value("hessian_top", "end") for r in act]
    vb, va = [v for v in vb if v is not None], [v for v in va if v is not None]
    ratio, ci = welch_log_ratio(va, vb)
    _, tb = ctx.measure(f"{m}_base", "hessian_top", "end")
    _, ta = ctx.measure(f"{m}_actnorm", "hessian_top", "end")
    ci_text = f" {fmt_ci(ci)}" if ci is not None else ""
    text = (f"{ratio:.3g}{ci_text} (penalty {ta} / baseline {tb})" if ratio is not None
            else f"penalty {ta} / baseline {tb}")
    why = generalized_arms({"the penalty arm": act, "the baseline": base})
    verdict = undetermined(why) if why else ratio_verdict(
        ratio, ci, below=True, missing=text, n=min(len(va), len(vb)))
    return Row(f"Hessian top eigenvalue at the end, penalty / baseline, {label}",
               Published(None, "flatter minima (Proposition iii; no number)", ACTNORM), ratio, text, diff, verdict)


def _rho_ratio(ctx: Context, variant: str) -> tuple[float | None, list | None, int, str]:
    """Mean over seeds of rho / its isotropic baseline 1/d (both stored by the radial analysis at
    the site compare reads), its t-interval over seeds, n, and the text."""
    runs = ctx.group(variant).runs
    ratios = [r.value("rho", "end") / r.value("rho_baseline", "end") for r in runs
              if r.value("rho", "end") is not None and r.value("rho_baseline", "end")]
    _, rtext = ctx.measure(variant, "rho", "end")
    if not ratios:
        return None, None, 0, f"rho {rtext}"
    mean, ci = paired_interval(ratios)
    ci_text = f" {fmt_ci(ci)}" if ci is not None else ""
    return mean, ci, len(ratios), f"{mean:.3g}{ci_text} {mean_flag(len(ratios), len(runs))} (rho {rtext})"


# ---------------------------------------------------------------------- nanogpt-addition
def _plan_nanogpt(sc: Scale, scale: str) -> Plan:
    return Plan({"base": {}, "actnorm": {"act_norm_lambda": sc.extra["lambda"]}}, "base", sc.base)


def _read_nanogpt(ctx: Context) -> list[Row]:
    diff = f"{ctx.sc.note}; lambda {ctx.sc.extra['lambda']:g} (our choice); grokking = exact-match test accuracy >= 0.95"
    rows = [speedup_row(ctx, "speed-up of the sqrt(d) penalty, nanoGPT on 3-digit addition",
                        Published(2.0, "halves the training steps (2x)", ACTNORM), "base", "actnorm", diff)]
    for v in ("base", "actnorm"):
        rows.append(grok_row(ctx, f"steps to 95% exact-match test accuracy, {v}",
                             Published(None, "no number in REFERENCES.md", ACTNORM), v, diff))
    return rows


register(Experiment(
    "activation-norm",
    "the sqrt(d) activation-norm penalty against the baseline, MLP and transformer: speed-up, radius and rho "
    "against 1/d, Hessian sharpness at the end",
    {
        "smoke": Scale.of({**SMOKE}, SMOKE_NOTE, **{"lambda": 1.0, "mlp": {"model": "mlp", "n_layers": 2, "mlp_bias": True}}),
        "quick": Scale.of({**QUICK, "steps": 6000, "stop_after_grok": 2},
                        QUICK_NOTE.replace("pre-LayerNorm", "no norm (Nanda's architecture)")
                        + "; the transformer censored at 20,000 steps (without a norm it grokked after 12,700 steps or "
                        "not within 15,000 at lr 1e-3, not within 8,000 at lr 3e-3: docs/CLI.md); MLP: 2 hidden layers "
                        "of 256, embeddings 64 wide, lr 1e-2 (it grokked at step 1200 with it, at 5800 with 3e-3: one "
                        "seed), censored at 6000 steps",
                        **{"lambda": 1.0, "tf": {"steps": 20_000},
                           "mlp": {"model": "mlp", "n_layers": 2, "mlp_bias": True, "norm": "none", "lr": 1e-2}}),
        "paper": Scale.of(dict(task="add", steps=40_000, stop_after_grok=2, eval_every=100, checkpoint_every=1000),
                        "Nanda's canonical p=113 setup; the MLP is preset `mlp` (widths ours: the paper's are not in "
                        "REFERENCES.md)",
                        expect_grok={"tf_base": CANONICAL_GROK, "tf_actnorm": CANONICAL_GROK},  # the baseline's
                        **{"lambda": 1.0, "mlp": {"model": "mlp", "n_layers": 2, "d_model": 128, "d_mlp": 256,
                                                  "mlp_bias": True}}),
    },
    _plan_actnorm, _read_actnorm, _an_actnorm))

register(Experiment(
    "nanogpt-addition",
    "3-digit addition with the ~10M-parameter causal transformer, with and without the activation-norm penalty",
    {
        "smoke": Scale.of({"task": "digits_add", "n_digits": 1, "norm": "ln",
                         "act_fn": "gelu", "causal": True, "mlp_bias": True, "n_layers": 1, "d_model": 16, "n_heads": 2,
                         "d_head": 8, "d_mlp": 32, "train_frac": 0.5, "lr": 3e-3, "batch_size": 0, "steps": 20,
                         "eval_every": 10, "checkpoint_every": 10, "warmup_steps": 5, "device": "cpu"},
                        SMOKE_NOTE + " (1-digit addition, 1 layer)", **{"lambda": 0.1}),
        "quick": Scale.of({"preset": "nanogpt_tiny", "steps": 6000, "eval_every": 100, "checkpoint_every": 1000,
                         "stop_after_grok": 1, "device": "cpu"},
                        "preset nanogpt_tiny: 2-digit addition, 2 layers x 32 wide (the paper: 3 digits, ~10M "
                        "parameters); censored at 6000 steps", **{"lambda": 0.1}),
        "paper": Scale.of({"preset": "nanogpt_10m", "stop_after_grok": 1, "device": "auto"},
                        "preset nanogpt_10m (10.6M parameters; training setup ours: docs/VARIANTS.md)", **{"lambda": 0.1}),
    },
    _plan_nanogpt, _read_nanogpt, no_analyses))
