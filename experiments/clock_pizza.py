"""Zhong et al. 2023, "The Clock and the Pizza" (`reproduce clock-pizza`): which algorithm a
1-layer transformer learns on modular addition, with uniform attention (their Model A, attention
rate 0) and learned attention (Model B, rate 1), read by gradient symmetricity and distance
irrelevance (analyses/clock_pizza.py) at the end of training; and between them their
attention-rate interpolation (RunConfig.attention_rate, docs/VARIANTS.md) on a stated grid, with
the rate where the label switches from pizza to clock (BOUNDARY_RULE).

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
from groklens.experiments.sphere_paper import ARCH, ARCH_LABEL, PAPER_SPLIT, SPHERE_PAPER_BASE
from groklens.experiments.verdicts import mean_flag, undetermined

SOURCE = "Zhong et al. 2023, The Clock and the Pizza (REFERENCES.md)"
TABLE = "median of their result/1l_fixedwidth.csv, 1-layer runs"
# their result table's medians (docs/ANALYSES.md, "clock_pizza"): attention rate <= 0.1 and >= 0.9
PUBLISHED = {"uniform": {"gradient_symmetricity": 0.993, "distance_irrelevance": 0.362, "label": "pizza",
                         "runs": "241 runs with attention rate <= 0.1"},
             "learned": {"gradient_symmetricity": 0.483, "distance_irrelevance": 0.853, "label": "clock",
                         "runs": "226 runs with attention rate >= 0.9"}}
VARIANTS = {"uniform": {"attention": "uniform"}, "learned": {"attention": "softmax"}}  # rates 0 and 1
# Their phase boundary: result/1l_fixedwidth.csv's runs of PUBLISHED's selection (2,381) binned by
# attn_coeff in steps of 0.05 and labelled by our rule: pizza the majority of every bin up to 0.55,
# clock of every bin above 0.75, neither in the bins between (the label counts: docs/ANALYSES.md).
THEIR_PIZZA_TO, THEIR_CLOCK_ABOVE = 0.55, 0.75
THEIR_POSITIONS = 2  # their inputs [a, b]
RATE_MIN_SEEDS = 3  # a grid rate's label (a majority) and the boundary are read from at least this many seeds


def softmax_share(coeff: float, n: int = THEIR_POSITIONS) -> float:
    """Their attn_coeff c as the softmax's share of the attention mass over n positions (their
    uniform part is all ones): c / (c + n (1 - c)); our attention_rate is that share itself."""
    return coeff / (coeff + n * (1 - coeff))


def their_coeff(share: float, n: int = THEIR_POSITIONS) -> float:
    """The inverse of softmax_share: their attn_coeff with the softmax's share `share`."""
    return n * share / (1 + (n - 1) * share)


BOUNDARY_RULE = (f"per attention rate ({RATE_MIN_SEEDS} seeds or more) the label of a strict majority of its seeds "
                 "(else mixed); the boundary lies between the largest pizza rate and the smallest clock rate when "
                 "every pizza rate is below every clock rate (its estimate: their midpoint), and rates are the "
                 "softmax's share of the readout's "
                 "attention mass (ours: attention_rate; theirs: c / (c + 2 (1 - c)))")
THEIRS = dict(task="add", p=59, train_frac=0.8, d_model=128, n_heads=4, d_head=32, d_mlp=512, act_fn="relu",
              norm="none", causal=False, mlp_bias=True, lr=1e-3, weight_decay=2.0, betas=[0.9, 0.98], warmup_steps=10,
              batch_size=0)
DIFFERS = "inputs [a, b, =] read at '=', uniform attention 1/3 over 3 positions, TransformerLens init"
# The attention rates between 0 (uniform) and 1 (learned) each scale trains. Paper: steps of 0.1
# over their transition band (shares 0.38-0.60, their attn_coeff 0.55-0.75) and beside it.
SCALES = {
    "smoke": Scale.of(SMOKE, SMOKE_NOTE, rates=(0.5,)),
    "quick": Scale.of({**THEIRS, "p": 31, "d_model": 64, "d_head": 16, "d_mlp": 256, "steps": 4_000,
                       "eval_every": 50, "checkpoint_every": 250, "device": "cpu"},
                      "p=31, d_model 64, d_mlp 256, 4,000 steps (theirs: p=59, d_model 128, d_mlp 512, 20,000); "
                      + DIFFERS, rates=(0.25, 0.5, 0.75)),
    "paper": Scale.of({**THEIRS, "steps": 20_000, "eval_every": 100, "checkpoint_every": 1_000, "device": "auto"},
                      "their setup; " + DIFFERS + "; the sphere_* arms: the sphere paper's (their rows say so)",
                      rates=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8), sphere_arms=True),
}


def rate_arms(sc: Scale) -> dict[str, float]:
    """Arm -> attention rate, in rate order: uniform (0), the scale's grid, learned (1)."""
    return {"uniform": 0.0, **{f"rate_{r:g}": r for r in sc.extra["rates"]}, "learned": 1.0}


# The sphere paper's story (Yildirim 2026): LayerNorm's magnitude freedom lets a model build the Pizza,
# the bounded sphere forces the Clock. Paper scale reads Zhong et al.'s measures on the sphere paper's
# own arms: bounded-sphere's runs on the paper's split of each seed (the same configs, so the same
# files serve both experiments), at the end of those runs, 2 evaluations after test accuracy first
# reaches 0.95 (the sphere paper's stop): the algorithm at generalization, not after a long cleanup.
# Arm -> (the sphere paper's architecture, attention). The first three are bounded-sphere's paper-split
# arms; RMSNorm and uniform attention (the sphere paper's uniform-attention arms, LayerNorm and sphere
# wd 1, here on the paper's split too) only clock-pizza trains: uniform attention is Zhong et al.'s
# Pizza setting, so those two ask whether the sphere still learns the Clock where the Pizza is easiest.
SPHERE_ARMS = {"sphere_ln": ("ln", "softmax"), "sphere_sphere_wd1": ("sphere_wd1", "softmax"),
               "sphere_sphere_wd0": ("sphere_wd0", "softmax"), "sphere_rms": ("rms", "softmax"),
               "sphere_ln_uniform": ("ln", "uniform"), "sphere_sphere_wd1_uniform": ("sphere_wd1", "uniform")}


def sphere_arm_config(arch: str, attention: str = "softmax") -> dict[str, Any]:
    """The full config fields of the sphere paper's `arch` on the paper's split of each seed at lr 6e-4
    (bounded-sphere's `{arch}_papersplit` arm at its paper scale, where it has one), with `attention`."""
    # learned attention is the default, left unset as bounded-sphere leaves it: the same dict, the same hash
    return {**SPHERE_PAPER_BASE, **ARCH[arch], **PAPER_SPLIT, "lr": 6e-4,
            **({"attention": attention} if attention != "softmax" else {})}


def sphere_arm_label(arm: str) -> str:
    arch, attention = SPHERE_ARMS[arm]
    return ARCH_LABEL[arch] + (" + uniform attention" if attention == "uniform" else "")


def _plan(sc: Scale, scale: str) -> Plan:
    grid = {arm: {"attention": "softmax", "attention_rate": r} for arm, r in rate_arms(sc).items()
            if arm not in VARIANTS}
    sphere = ({arm: sphere_arm_config(*aa) for arm, aa in SPHERE_ARMS.items()} if sc.extra.get("sphere_arms")
              else {})
    return Plan({"uniform": VARIANTS["uniform"], **grid, "learned": VARIANTS["learned"], **sphere}, None, sc.base)


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
    want = PUBLISHED[variant]["label"]
    claim = Published(None,
                      "uniform attention: pizza (Model A)" if variant == "uniform"
                      else "learned attention: clock (Model B)",
                      SOURCE)
    text, verdict = _labels(ctx, variant, want)
    return Row(f"algorithm at the end, {variant} attention (our rule: {ALGORITHM_RULE})", claim, None, text,
               ctx.sc.note, verdict)


def _labels(ctx: Context, variant: str, want: str | None) -> tuple[str, str]:
    """Each seed's label at the end, and the verdict on "every seed is `want`" (none: no claim)."""
    runs = ctx.group(variant).runs
    labels = [r.run_values.get("label") for r in runs]
    text = ", ".join(f"seed {r.seed}: {lbl}" for r, lbl in zip(runs, labels)) or "— (no runs)"
    if want is None:
        verdict = ""
    elif not runs:
        verdict = undetermined("no runs")
    elif any(r.grok_censored for r in runs):  # an algorithm is read from a model that generalizes
        verdict = undetermined(f"{sum(r.grok_censored for r in runs)} of {len(runs)} seeds did not grok")
    elif all(lbl == want for lbl in labels):
        verdict = "agrees"
    elif any(lbl == want for lbl in labels):
        verdict = undetermined(f"{sum(lbl == want for lbl in labels)} of {len(runs)} seeds")
    else:
        verdict = "disagrees"
    return text, verdict


def _their_label(rate: float) -> str | None:
    """The label their table gives the majority at our rate's softmax share; None in their band."""
    c = round(their_coeff(rate), 9)  # rate 0.6 is attn_coeff 0.75, not 0.7499...
    return "pizza" if c <= THEIR_PIZZA_TO else "clock" if c > THEIR_CLOCK_ABOVE else None


def _values_text(runs) -> str:
    parts = []
    for key, what in (("gradient_symmetricity", "gradient symmetricity"),
                      ("distance_irrelevance", "distance irrelevance")):
        vals = [float(v) for r in runs if isinstance(v := r.run_values.get(key), (int, float))]
        if vals:
            spread = f" [{min(vals):.3f}-{max(vals):.3f}]" if len(vals) > 1 else ""
            parts.append(f"{what} {sum(vals) / len(vals):.3f}{spread}")
    return f" ({'; '.join(parts)})" if parts else ""


def _rate_row(ctx: Context, arm: str, rate: float) -> Row:
    """One grid rate: each seed's label, the measures' means, against their table at the same share."""
    want = _their_label(rate)
    c = their_coeff(rate)
    claim = (f"{want} (their table's majority at attn_coeff {c:.2f}, the same softmax share)" if want else
             f"their transition band (attn_coeff {c:.2f}, above {THEIR_PIZZA_TO} and up to {THEIR_CLOCK_ABOVE}: "
             "neither the majority)")
    text, verdict = _labels(ctx, arm, want)
    n = len(ctx.group(arm).runs)
    if verdict and 0 < n < RATE_MIN_SEEDS and not verdict.startswith("undetermined"):
        verdict = undetermined(f"{n} seed(s); a rate is read from {RATE_MIN_SEEDS}")
    return Row(f"algorithm at the end, attention rate {rate:g} (our rule)", Published(None, claim, SOURCE), None,
               text + _values_text(ctx.group(arm).runs), ctx.sc.note, verdict)


def majority(labels: list) -> str:
    """The label of a strict majority of `labels`, else 'mixed' ('—' for none)."""
    if not labels:
        return "—"
    top = max(set(labels), key=labels.count)
    return top if labels.count(top) * 2 > len(labels) else "mixed"


def boundary(labels_by_rate: dict[float, str]) -> tuple[float, float] | str:
    """(largest pizza rate, smallest clock rate) by BOUNDARY_RULE, or why there is no boundary."""
    pizza = [r for r, lbl in labels_by_rate.items() if lbl == "pizza"]
    clock = [r for r, lbl in labels_by_rate.items() if lbl == "clock"]
    if not pizza or not clock:
        return "no " + ("pizza" if not pizza else "clock") + " rate"
    if max(pizza) > min(clock):
        return f"pizza at {max(pizza):g} above clock at {min(clock):g}: no single boundary"
    return max(pizza), min(clock)


def _boundary_row(ctx: Context) -> Row:
    arms = rate_arms(ctx.sc)
    runs = {arm: ctx.group(arm).runs for arm in arms}
    lo, hi = softmax_share(THEIR_PIZZA_TO), softmax_share(THEIR_CLOCK_ABOVE)
    mid = softmax_share((THEIR_PIZZA_TO + THEIR_CLOCK_ABOVE) / 2)
    published = Published(round(mid, 3), f"pizza up to attn_coeff {THEIR_PIZZA_TO}, clock above {THEIR_CLOCK_ABOVE} "
                           f"(shares {lo:.2f} and {hi:.2f}); midpoint {(THEIR_PIZZA_TO + THEIR_CLOCK_ABOVE) / 2:g} = "
                           f"share {mid:.2f} (their result/1l_fixedwidth.csv, 2,381 1-layer runs in bins of 0.05, "
                           "labelled by our rule)",
                           SOURCE)
    per_rate = {arms[a]: majority([r.run_values.get("label") for r in rs]) for a, rs in runs.items() if rs}
    found = boundary(per_rate)
    seeds = sorted({r.seed for rs in runs.values() for r in rs})
    per_seed = []
    for seed in seeds:  # the same rule on one seed's labels
        b = boundary({arms[a]: r.run_values.get("label") for a, rs in runs.items() for r in rs if r.seed == seed})
        per_seed.append(f"seed {seed}: " + (f"{(b[0] + b[1]) / 2:g}" if isinstance(b, tuple) else b))
    text = ", ".join(f"{r:g}: {lbl}" for r, lbl in sorted(per_rate.items())) or "— (no runs)"
    ours = None
    if isinstance(found, tuple):
        ours = (found[0] + found[1]) / 2
        text = f"{ours:g} (pizza up to {found[0]:g}, clock from {found[1]:g}); by rate: {text}"
    else:
        text = f"— ({found}); by rate: {text}"
    if per_seed:
        text += "; per seed: " + "; ".join(per_seed)
    missing = [a for a, rs in runs.items() if not rs]
    thin = [a for a, rs in runs.items() if 0 < len(rs) < RATE_MIN_SEEDS]
    censored = sum(r.grok_censored for rs in runs.values() for r in rs)
    if missing:
        verdict = undetermined(f"no runs at {len(missing)} of {len(arms)} rates")
    elif thin:
        verdict = undetermined(f"fewer than {RATE_MIN_SEEDS} seeds at {len(thin)} of {len(arms)} rates")
    elif censored:
        verdict = undetermined(f"{censored} run(s) did not grok")
    else:
        verdict = "agrees" if ours is not None else "disagrees"
    return Row(f"phase boundary: attention rate where the label switches from pizza to clock ({BOUNDARY_RULE})",
               published, ours, text, ctx.sc.note, verdict)


def _read(ctx: Context) -> list[Row]:
    rows = []
    for variant in VARIANTS:
        rows.append(_mean_row(ctx, variant, "gradient_symmetricity", "gradient symmetricity"))
        rows.append(_mean_row(ctx, variant, "distance_irrelevance", "distance irrelevance"))
        rows.append(_label_row(ctx, variant))
    rows += [_rate_row(ctx, arm, r) for arm, r in rate_arms(ctx.sc).items() if arm not in VARIANTS]
    rows.append(_boundary_row(ctx))
    if ctx.sc.extra.get("sphere_arms"):
        rows += _sphere_rows(ctx)
    return rows


SPHERE_SOURCE = "Yildirim 2026, arXiv 2603.05228 (REFERENCES.md), read by Zhong et al.'s measures"
SPHERE_NOTE = ("the sphere paper's arms on the paper's split of each seed (p=113, 30%, lr 6e-4, post-norm "
               "LayerNorm/RMSNorm, PyTorch's init; LayerNorm and both spheres with learned attention are bounded-"
               "sphere's runs), read at their last checkpoint, 2 evaluations after test accuracy first reached 0.95")
# The story's two readings: learned attention (the sphere paper's table), and uniform attention, where
# Zhong et al. found the Pizza: (row, LayerNorm arm, sphere arms)
STORIES = (("the bounded sphere learns the Clock where LayerNorm learns the Pizza (every seed)",
            "sphere_ln", ("sphere_sphere_wd1", "sphere_sphere_wd0")),
           ("with uniform attention (Zhong et al.'s Pizza setting), the bounded sphere (wd 1) learns the Clock where "
            "LayerNorm learns the Pizza (every seed)", "sphere_ln_uniform", ("sphere_sphere_wd1_uniform",)))


def _sphere_rows(ctx: Context) -> list[Row]:
    """Per sphere-paper arm each seed's label and the mean measures; then the story's claim: the
    bounded sphere learns the Clock where LayerNorm learns the Pizza (every seed, both sides), with
    learned and with uniform attention."""
    rows = []
    for arm in SPHERE_ARMS:
        text, _ = _labels(ctx, arm, None)
        rows.append(Row(f"algorithm at generalization, {sphere_arm_label(arm)} (the sphere paper's arm; our rule)",
                        Published(None, "not reported (the sphere paper's story: LayerNorm Pizza, sphere Clock)",
                                  SPHERE_SOURCE), None, text + _values_text(ctx.group(arm).runs), SPHERE_NOTE))
    for what, ln_arm, sphere_arms in STORIES:
        ln = ctx.group(ln_arm).runs
        spheres = [r for arm in sphere_arms for r in ctx.group(arm).runs]
        ln_labels = [r.run_values.get("label") for r in ln]
        sphere_labels = [r.run_values.get("label") for r in spheres]
        text = (f"{sphere_arm_label(ln_arm)}: {', '.join(map(str, ln_labels)) or '— (no runs)'}; "
                f"{' and '.join(sphere_arm_label(a) for a in sphere_arms)}: "
                f"{', '.join(map(str, sphere_labels)) or '— (no runs)'}")
        rows.append(Row(what, Published(None, "the sphere paper's account of its speed-up (no measured label)",
                                        SPHERE_SOURCE), None, text, SPHERE_NOTE,
                        _story_verdict(ln_labels, sphere_labels, any(r.grok_censored for r in ln + spheres))))
    return rows


def _story_verdict(ln_labels: list, sphere_labels: list, censored: bool) -> str:
    """'agrees' when every LayerNorm seed is pizza and every sphere seed clock; 'disagrees' when a seed
    has the other side's algorithm; otherwise undetermined (no runs, a run that did not grok, neither)."""
    if not ln_labels or not sphere_labels:
        return undetermined("no runs" if not ln_labels and not sphere_labels else
                            f"no {'LayerNorm' if not ln_labels else 'bounded-sphere'} runs")
    if censored:
        return undetermined("a run did not grok")
    if all(lbl == "pizza" for lbl in ln_labels) and all(lbl == "clock" for lbl in sphere_labels):
        return "agrees"
    if any(lbl == "clock" for lbl in ln_labels) or any(lbl == "pizza" for lbl in sphere_labels):
        return "disagrees"  # a seed with the other arm's algorithm
    return undetermined("seeds labelled neither: "
                        f"{ln_labels.count('neither')} LayerNorm, {sphere_labels.count('neither')} sphere")


register(Experiment(
    "clock-pizza",
    "Zhong et al.'s Model A (uniform attention) and B (learned), and their attention-rate interpolation between "
    "them: pizza or clock, by gradient symmetricity and distance irrelevance along training, and the rate where "
    "the label switches",
    SCALES, _plan, _read, _analyses, seeds={"smoke": 1, "quick": 2, "paper": 3}, run_values=_run_values))
