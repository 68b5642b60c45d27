"""The structural-attention experiment (issue 41): the two inverse laws, the attention mass on
every informative token, the gradient that reaches attention, the MLP capacity sweep and the
attention-mask ticket against the KL intervention, on informative-token sequence tasks.

Arms at one scale (`_plan_struct`): wd{w} over the weight-decay levels (the first law); kl{b} over
the KL strengths at weight decay beta_wd (the second law); mlp{d} over MLP widths at beta_wd (the
capacity condition); `ticket`: the baseline's own seed trained again with its readout query
confined to the keys the grokked baseline attends to (trainers/ticket.py, our reading of
"lottery-ticket transfer"). The baseline is wd{beta_wd}: the donor of the ticket, the reference of
the KL speed-ups, and the run the mass and gradient rows are read on."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from groklens.experiments.core import (
    Context, Experiment, Plan, Published, Row, SMOKE, SMOKE_NOTE, Scale, fit_exponents, grok_row, register,
    speedup_row)
from groklens.experiments.verdicts import (
    exponent_verdict, fmt_ci, interval_verdict, mean_flag, outcome, paired_interval, ratio_verdict,
    speedup_verdict, undetermined)

STRUCT = "Structural (Bayesian) attention account (2026; REFERENCES.md)"
TICKET = "ticket"
# the measures kept along the whole run in the ledger (their curves): the mass and gradient rows read them
CURVES = ("attn_mass", "attn_min_mass", "attn_qk_grad", "attn_qk_share", "attn_struct_pull")


def _an_attention(sc: Scale, scale: str):
    return [("attention", {}, "all"), ("attention_gradient", {}, "all")]


def _variants(sc: Scale) -> tuple[dict[str, dict[str, Any]], str]:
    """(variant -> overrides, the baseline variant) of one scale."""
    x = sc.extra
    wd0 = x["beta_wd"]
    base = f"wd{wd0:g}"
    variants = {f"wd{wd:g}": {"weight_decay": wd} for wd in x["wds"]}
    variants.setdefault(base, {"weight_decay": wd0})
    for beta in x["betas"]:
        variants[f"kl{beta:g}"] = {"weight_decay": wd0, "kl_attn_beta": beta}
    for d in x.get("d_mlps", ()):
        if d != sc.base["d_mlp"]:
            variants[f"mlp{d}"] = {"weight_decay": wd0, "d_mlp": d}
    if x.get("ticket"):
        variants[TICKET] = {"weight_decay": wd0, "attn_mask_from": base + "_s{seed}"}
    return variants, base


def _plan_struct(sc: Scale, scale: str) -> Plan:
    variants, base = _variants(sc)
    return Plan(variants, base, sc.base)


# ---------------------------------------------------------------------- the two laws
def _law(ctx: Context, variants: list[str], var: str, delay: bool) -> tuple[float | None, list | None, str]:
    """Exponent of log T (delay: of log(T - memorization)) on log `var` over the runs of
    `variants` (analyses.scaling: OLS on the grokked runs; Tobit on all when some are censored,
    then its estimate and interval); runs that never memorized have no delay and are left out."""
    from groklens.analyses.scaling import GrokRecord

    recs, skipped = [], 0
    for v in variants:
        for r in ctx.group(v).runs:
            t, last = r.grokking, r.last_step
            if delay:
                if r.memorization is None:
                    skipped += 1
                    continue
                t = None if t is None else max(t - r.memorization, 1)
                last = max(last - r.memorization, 1)
            recs.append(GrokRecord(r.name, {var: float(r.config[var])}, t, last))
    est, ci, text = fit_exponents(recs, [var])[var]
    return est, ci, text + (f"; {skipped} run(s) that never memorized left out" if skipped else "")


def _law_rows(ctx: Context, diff: str) -> list[Row]:
    x = ctx.sc.extra
    wd_vars = [f"wd{w:g}" for w in x["wds"]]
    kl_vars = [f"kl{b:g}" for b in x["betas"]]
    rows = []
    for label, variants, var, published, what in (
            ("the delay (grokking - memorization) in weight decay", wd_vars, "weight_decay",
             "the delay inversely proportional to weight decay (the 'inverse-weight-decay delay')", True),
            ("the grokking step in KL strength beta", kl_vars, "kl_attn_beta",
             "grokking time inversely proportional to the intervention strength", False)):
        est, ci, text = _law(ctx, variants, var, delay=what)
        _, _, other = _law(ctx, variants, var, delay=not what)
        levels = sorted({float(ctx.group(v).runs[0].config[var]) for v in variants if ctx.group(v).runs})
        text += f"; on the {'grokking step' if what else 'delay'}: {other}"
        rows.append(Row(f"exponent of {label} ({len(levels)} levels, {', '.join(f'{v:g}' for v in levels)})",
                        Published(-1.0, published, STRUCT), est, text, diff,
                        exponent_verdict(ci, -1.0, no_ci=text)))
    return rows


# ---------------------------------------------------------------------- along the run (ledger curves)
def _curve(run, key: str) -> tuple[list[int], list[float]] | None:
    c = run.entry.get("curves", {}).get(key)
    if not c or not c.get("steps"):
        return None
    pairs = [(int(s), v) for s, v in zip(c["steps"], c["values"]) if isinstance(v, (int, float)) and math.isfinite(v)]
    return ([s for s, _ in pairs], [v for _, v in pairs]) if pairs else None


def _at(curve: tuple[list[int], list[float]], step: float) -> float:
    """The stored value at the last stored checkpoint at or before `step` (the first one before any)."""
    steps, values = curve
    i = max((k for k, s in enumerate(steps) if s <= step), default=0)
    return values[i]


def _points(ctx: Context, variant: str, key: str) -> list[dict[str, float]]:
    """Per seed: the measure at memorization and at grokking (the ledger's phase values, else read
    off its curve), and from its curve at initialization (the first stored checkpoint) and halfway
    through the delay (a censored run: halfway to its last step)."""
    out = []
    for r in ctx.group(variant).runs:
        c = _curve(r, key)
        p = {}
        for phase, step in (("memorization", r.memorization), ("grokking", r.grokking)):
            v = r.value(key, phase)
            if v is None and c is not None and step is not None:
                v = _at(c, step)
            if v is not None:
                p[phase] = v
        if c is not None:
            p["init"] = c[1][0]
            if r.memorization is not None:
                p["mid"] = _at(c, (r.memorization + (r.grokking if r.grokking is not None else r.last_step)) / 2)
        if p:
            out.append(p)
    return out


def _fmt(v: float) -> str:
    from groklens.analyses.compare import fmt_number

    return fmt_number(v)


def _phase_text(points: list[dict[str, float]]) -> str:
    parts = []
    for ph, label in (("init", "init"), ("memorization", "memorization"), ("mid", "mid-delay"),
                      ("grokking", "grokking")):
        vals = [p[ph] for p in points if ph in p]
        if vals:
            parts.append(f"{label} {_fmt(sum(vals) / len(vals))}")
    return "means: " + ", ".join(parts)


def _paired_row(ctx: Context, measure: str, published: Published, key: str, num: str, den: str, diff: str, *,
                below: bool, difference: bool = False) -> Row:
    """A row on the baseline's curve of `key`: num / den per seed (or num - den with
    `difference`), paired interval over seeds, verdict on "< 1" (below; "< 0" for a difference)."""
    base = ctx.plan.baseline
    pts = [p for p in _points(ctx, base, key) if num in p and den in p]
    n_runs = len(ctx.group(base).runs)
    if not pts:
        return Row(measure, published, None, f"— (no seed has {key} at {num} and {den})", diff,
                   undetermined(f"missing: no seed has {key} at {num} and {den}"))
    if difference:
        vals = [p[num] - p[den] for p in pts]
    else:
        vals = [p[num] / p[den] for p in pts if p[den] != 0]
    mean, ci = paired_interval(vals)
    ci_text = f" {fmt_ci(ci)}" if ci is not None else ""
    text = f"{_fmt(mean)}{ci_text} {mean_flag(len(vals), n_runs)}; {_phase_text(pts)}"
    if difference:
        verdict = interval_verdict(ci, 0.0, claim_above=not below, no_ci=f"n={len(vals)}")
    else:
        verdict = ratio_verdict(mean, ci, below=below, missing=key, n=len(vals))
    return Row(measure, published, mean, text, diff, verdict)


def _rise_row(ctx: Context, diff: str) -> Row:
    """When the least-attended informative token's mass makes half its rise from memorization to
    grokking: the fraction of the delay elapsed then (per grokked seed; a late rise is near 1)."""
    base = ctx.plan.baseline
    fracs = []
    for r in ctx.group(base).runs:
        c = _curve(r, "attn_min_mass")
        if c is None or r.memorization is None or r.grokking is None or r.grokking <= r.memorization:
            continue
        lo, hi = _at(c, r.memorization), _at(c, r.grokking)
        if hi <= lo:
            fracs.append(1.0)  # no rise by grokking: as late as it gets
            continue
        half = next((s for s, v in zip(*c) if r.memorization <= s <= r.grokking and v >= (lo + hi) / 2), r.grokking)
        fracs.append((half - r.memorization) / (r.grokking - r.memorization))
    published = Published(None, "delayed generalization is delayed structural inference: attention reaches every "
                          "informative token late in the delay (> 0.5; no number)", STRUCT)
    if not fracs:
        return Row("fraction of the delay elapsed when the least-attended informative token's mass is half-way up",
                   published, None, "— (no grokked baseline seed with a curve)", diff,
                   undetermined("missing: no grokked baseline seed with the attention curve"))
    mean, ci = paired_interval(fracs)
    text = f"{mean:.2f}{' ' + fmt_ci(ci) if ci else ''} {mean_flag(len(fracs), len(ctx.group(base).runs))}"
    return Row("fraction of the delay elapsed when the least-attended informative token's mass is half-way up "
               "(baseline)", published, mean, text, diff + "; ours: the first checkpoint at half the rise",
               interval_verdict(ci, 0.5, claim_above=True, no_ci=f"n={len(fracs)}"))


def _mass_rows(ctx: Context, diff: str) -> list[Row]:
    need = Published(None, "attention must place sufficient mass on every informative token; the memorizing MLP "
                     "starves it first (> 1; no number)", STRUCT)
    rows = []
    for key, what in (("attn_min_mass", "the least-attended informative token (per-input minimum over the "
                       "informative positions)"), ("attn_mass", "all informative tokens (sum)")):
        rows.append(_paired_row(ctx, f"attention mass of the readout query on {what}, at grokking / at "
                                     "memorization (baseline)", need, key, "grokking",
                                     "memorization", diff, below=False))
    rows.append(_rise_row(ctx, diff))
    return rows


def _gradient_rows(ctx: Context, diff: str) -> list[Row]:
    starve = Published(None, "once the MLP memorizes it drives the loss near zero and starves attention of structural "
                       "gradient (< 1; no number)", STRUCT)
    note = diff + "; the task loss on the training inputs, at the stored checkpoints (attention_gradient)"
    return [
        _paired_row(ctx, "gradient norm of W_Q, W_K at memorization / at initialization (baseline)", starve,
                    "attn_qk_grad", "memorization", "init", note, below=True),
        _paired_row(ctx, "W_Q, W_K share of the whole gradient norm at memorization / at initialization (baseline)",
                    starve, "attn_qk_share", "memorization", "init", note, below=True),
        _paired_row(ctx, "W_Q, W_K share of the whole gradient norm half-way through the delay / at initialization "
                         "(baseline)", starve, "attn_qk_share", "mid", "init", note, below=True),
        _paired_row(ctx, "pull of the loss toward the informative tokens (-sum of dl/dscore over them), at "
                         "memorization minus at initialization (baseline)",
                    Published(None, "starved of structural gradient (< 0; no number)", STRUCT), "attn_struct_pull",
                    "memorization", "init", note, below=True, difference=True),
    ]


# ---------------------------------------------------------------------- capacity and the ticket
def _log_times(runs) -> list[float]:
    """log grokking steps of an arm's seeds (a censored seed at its last step), or [] when none grokked."""
    if not any(not r.grok_censored for r in runs):
        return []
    return [math.log(r.grok_time()) for r in runs if r.grok_time()]


def _capacity_rows(ctx: Context, diff: str) -> list[Row]:
    x = ctx.sc.extra
    widths = sorted(set(x.get("d_mlps", ())))
    if not widths:
        return []
    d0 = ctx.sc.base["d_mlp"]
    arm = {d: ctx.plan.baseline if d == d0 else f"mlp{d}" for d in widths}
    window = Published(None, "generalization needs MLP capacity in a Goldilocks window: too little cannot fit the "
                       "rule, too much memorizes (no number)", STRUCT)
    rows = [grok_row(ctx, f"grokking step, d_mlp {d}", Published(None, "no number", STRUCT), arm[d], diff)
            for d in widths]
    times = {d: _log_times(ctx.group(arm[d]).runs) for d in widths}
    have = {d: t for d, t in times.items() if t}
    if len(have) < 3:
        rows.append(Row("Goldilocks window of MLP width (the fastest width lies inside the sweep, and both ends are "
                        "slower)", window, None, f"— ({len(have)} widths with a grokked seed)", diff,
                        undetermined("missing: fewer than 3 widths with a grokked seed")))
        return rows
    best = min(have, key=lambda d: sum(have[d]) / len(have[d]))
    parts, verdicts = [], []
    for end in (widths[0], widths[-1]):
        if end == best:
            continue
        _, text, sp = ctx.speedup(arm[end], arm[best])  # T_end / T_best: > 1 where the end is slower
        parts.append(f"d_mlp {end} / {best}: {text}")
        verdicts.append((f"d_mlp {end} / {best}", speedup_verdict(sp, collapsed=sp.get("collapsed", 0))))
    if best in (widths[0], widths[-1]):
        verdict = undetermined(f"the fastest width, d_mlp {best}, is an end of the sweep {widths[0]}-{widths[-1]}: "
                               "no window inside it")
    elif all(outcome(v) == "agrees" for _, v in verdicts):
        verdict = "agrees"
    elif any(outcome(v) == "disagrees" for _, v in verdicts):
        verdict = "disagrees (an end of the sweep is not slower than the fastest width)"
    else:
        verdict = undetermined("; ".join(f"{pair}: {v}" for pair, v in verdicts if outcome(v) != "agrees"))
    ours = math.exp(sum(have[best]) / len(have[best]))
    rows.append(Row(f"Goldilocks window of MLP width: fastest d_mlp {best} (of {', '.join(map(str, widths))}), "
                    "speed-up over each end", window, ours, f"grokking step {ours:,.0f} (geometric mean) at d_mlp "
                    f"{best}; " + "; ".join(parts), diff + "; ours: the fastest width chosen from the same runs",
                    verdict))
    return rows


def _ticket_rows(ctx: Context, diff: str) -> list[Row]:
    if not ctx.sc.extra.get("ticket"):
        return []
    base, x = ctx.plan.baseline, ctx.sc.extra
    runs = ctx.group(TICKET).runs
    donors = {r.seed: r for r in ctx.group(base).runs}
    grokked = {seed for seed, r in donors.items() if not r.grok_censored}
    masks = [f"s{r.seed}: {r.config.get('attn_mask') or '?'}"
             + ("" if r.seed in grokked else " (donor never grokked: its last checkpoint)") for r in runs]
    informative = _informative_positions(ctx.sc.base)
    note = (diff + f"; ticket (ours): the readout query confined to the keys holding 90% of the grokked baseline's "
            f"readout attention (same seed and init), informative positions {informative}; masks "
            + ("; ".join(masks) if masks else "none yet"))
    # a ticket is a grokked model's structure: a seed whose donor never grokked has none to transfer, so
    # the rows leave it out, and the ticket-over-baseline row compares the same seeds on both sides
    left = sorted(r.seed for r in runs if r.seed not in grokked)
    if left:
        note += (f"; left out of these rows: the ticket's seed(s) {', '.join(map(str, left))} (the donor never "
                 "grokked: no grokked structure to transfer), and those seeds of the baseline in the ticket's speed-up")
    kept = {r.seed for r in runs if r.seed in grokked}
    tctx = replace(ctx, arms={**ctx.arms, TICKET: [r for r in runs if r.seed in kept],
                              base: [r for r in ctx.group(base).runs if r.seed in kept or not runs]})
    bmax = max(x["betas"])
    rows = [speedup_row(tctx, "speed-up of the attention-mask ticket over the baseline (the ticket's seeds whose "
                              "baseline grokked)",
                        Published(None, "lottery-ticket transfer speeds grokking (no number)", STRUCT), base, TICKET,
                        note),
            speedup_row(tctx, f"speed-up of the KL intervention (Bayesian ticket, beta {bmax:g}) over the "
                              "attention-mask ticket", Published(None, "the Bayesian ticket matches or outperforms "
                                                                 "lottery-ticket transfer (>= 1; 'matches' is not told "
                                                                 "apart by the interval rule)", STRUCT),
                        TICKET, f"kl{bmax:g}", note, verdict=True)]
    others = [f"beta {b:g}: {tctx.speedup(TICKET, f'kl{b:g}')[1]}" for b in sorted(x["betas"]) if b != bmax]
    if others:
        rows[-1].ours_text += "; other strengths: " + "; ".join(others)
    return rows


def _informative_positions(base: dict[str, Any]) -> str:
    from groklens.config import RunConfig
    from groklens.tasks import TASKS

    cfg = RunConfig.from_dict({k: v for k, v in base.items() if k != "preset"})
    mask = TASKS.get(cfg.task).build(cfg).informative_mask
    return "per input" if bool((mask != mask[0]).any()) else " ".join(str(int(j)) for j in mask[0].nonzero()[:, 0])


def _read_struct(ctx: Context) -> list[Row]:
    diff = f"{ctx.sc.note}; KL intervention is our definition (REFERENCES.md def. 3)"
    rows = _law_rows(ctx, diff)
    rows += _mass_rows(ctx, diff)
    rows += _gradient_rows(ctx, diff)
    for b in ctx.sc.extra["betas"]:
        rows.append(speedup_row(ctx, f"speed-up of the KL intervention beta {b:g}",
                                Published(None, "shorter delay (no number)", STRUCT), ctx.plan.baseline, f"kl{b:g}",
                                diff, verdict=True))
    rows += _capacity_rows(ctx, diff)
    rows += _ticket_rows(ctx, diff)
    return rows


# seq_add with 2 separate distractor tokens: with residue distractors (p=17, L=6; p=23, L=3) the
# quick baseline memorizes at step 50 and stays at chance for 6,000 steps (docs/RESULTS.md)
_SEQ_QUICK = dict(task="seq_add", p=23, seq_len=4, n_informative=2, informative_layout="first", distractor_vocab=2,
                  train_frac=0.5, d_model=64, n_heads=2, d_head=32, d_mlp=256, norm="ln", lr=3e-3, steps=6000,
                  eval_every=50, checkpoint_every=250, stop_after_grok=2, device="cpu")
# Paper scale (ours: the paper's tasks and sizes are not in REFERENCES.md; docs/RESULTS.md says why
# this size): Nanda's model and optimizer (1 layer, d_model 128, 4 heads, d_mlp 512, no norm, AdamW
# lr 1e-3, betas 0.9/0.98, full batch) on seq_add p=41, L=8, the 2 informative tokens spread (at 0
# and 7) among 6 positions of 2 separate distractor tokens, half the 1,681 inputs for training.
_SEQ_PAPER = dict(task="seq_add", p=41, seq_len=8, n_informative=2, informative_layout="spread", distractor_vocab=2,
                  train_frac=0.5, d_model=128, n_heads=4, d_head=32, d_mlp=512, norm="none", lr=1e-3, steps=30_000,
                  eval_every=100, checkpoint_every=1000, log_checkpoints=8, grok_evals=3, stop_after_grok=2,
                  device="auto")
PAPER_NOTE = ("seq_add p=41, L=8, k=2 informative tokens at positions 0 and 7 among 6 positions of 2 separate "
              "distractor tokens, 50% of the 1,681 inputs; Nanda's 1-layer model (d_model 128, 4 heads, d_mlp 512, no "
              "norm) and AdamW lr 1e-3, full batch; grokked = 3 evaluations in a row at test accuracy >= 0.95; "
              "censored at 30,000 steps (ours: the paper's tasks and sizes are not in REFERENCES.md)")
register(Experiment(
    "structural-attention",
    "informative-token task: grokking time against weight decay and KL strength (the two inverse laws); attention "
    "mass on every informative token and the gradient that reaches attention along the run; MLP capacity sweep; "
    "attention-mask ticket against the KL intervention",
    {
        "smoke": Scale.of({**SMOKE, "task": "seq_add", "p": 5, "seq_len": 4, "n_informative": 2,
                           "informative_layout": "spread"}, SMOKE_NOTE + " (seq_add p=5, L=4)",
                          wds=[0.5, 1.0, 2.0], betas=[0.3, 1.0], beta_wd=1.0, d_mlps=[8, 16, 32], ticket=True,
                          ledger_curves=CURVES),
        "quick": Scale.of(_SEQ_QUICK, "seq_add: p=23, L=4, the k=2 informative tokens first, then 2 positions of 2 "
                          "separate distractor tokens; 1 layer d_model 64, pre-LayerNorm, lr 3e-3; censored at 6000 "
                          "steps (the paper's tasks and sizes are not in REFERENCES.md)",
                          wds=[0.3, 1.0, 3.0], betas=[0.1, 0.3, 1.0], beta_wd=1.0, d_mlps=[64, 256, 1024],
                          ticket=True, ledger_curves=CURVES),
        "paper": Scale.of(_SEQ_PAPER, PAPER_NOTE, wds=[0.5, 1.0, 2.0, 3.0, 5.0], betas=[0.01, 0.03, 0.1, 0.3, 1.0],
                          beta_wd=1.0, d_mlps=[32, 64, 128, 512, 2048, 8192], ticket=True, ledger_curves=CURVES),
    },
    _plan_struct, _read_struct, _an_attention, seeds={"smoke": 1, "quick": 2, "paper": 5}))
