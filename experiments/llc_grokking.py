"""devinterp's grokking notebook (`examples/grokking.ipynb`, timaeus-research/devinterp) with
groklens: its task, model, training and SGLD settings, and rows for its claims about the LLC curve
(`reproduce llc-grokking`).

What the notebook states (read in the repository; devinterp 1.2.0 ran it):
- task: (a + b) mod 53 on all 2,809 pairs, 40% for training (int(0.4 * 2809) = 1,123 pairs,
  a random.shuffle of the pairs with seed 0);
- model: an MLP, one shared nn.Embedding(53, 12), nn.Linear(12, 48) with bias for each operand,
  their sum, GELU, nn.Linear(48, 53) without bias (PyTorch's default inits);
- training: torch.optim.Adam, lr 0.005, weight_decay 0.0002 (Adam's L2 term), a fresh random batch
  of 128 training pairs per step, 25,000 steps, a model saved every 250 steps (100 checkpoints),
  both accuracies every 250 steps;
- SGLD at every checkpoint: lr 3e-3, nbeta 2.0, localization 5, 1 chain of 500 draws, no
  burn-in, minibatches of 128 training pairs, cross-entropy;
- its claims: "the LLC first increases during memorization and then decreases ~smoothly
  afterward, flattening out after the model is done grokking"; and "the LLC, which was measured
  only on the train set, tracks the test loss pretty well" (no numbers).

groklens' model=mlp (n_layers 1, d_model 12, d_mlp 48, gelu, mlp_bias, mlp_unembed_bias=false)
computes the same function: concat(E[a], E[b]) W_in + b_in = E[a] W_l + E[b] W_r + (b_l + b_r).
What differs (said in every row): one hidden bias where the notebook has two whose sum acts (its
difference is a flat direction; Adam moves the notebook's sum twice as fast), W_in ~ U(+-1/sqrt(24))
where the notebook's halves are U(+-1/sqrt(12)) (PyTorch's fan-in of the concatenated layer), the
split drawn from data_seed 598 (1,123 training pairs, not the notebook's), seeds 1..N for the init
and batch order; the LLC with groklens' sampler (docs/ANALYSES.md, "llc"): every training pair in
every epoch, L_n(w*) over all training pairs (devinterp: the first minibatches).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from groklens.experiments.core import Context, Experiment, Plan, Published, Row, Scale, register
from groklens.experiments.verdicts import undetermined

DEVINTERP = "devinterp examples/grokking.ipynb (timaeus-research/devinterp; REFERENCES.md)"
N_PAIRS = 53 * 53
NOTEBOOK_TRAIN = int(0.4 * N_PAIRS)  # 1,123: the notebook's int(), which round() would make 1,124
# the notebook's SGLD at every checkpoint (its cell: lr = 3e-3, gamma = 5, nbeta = 2.0, num_draws = 500,
# num_chains = 1, estimate_learning_coeff_with_summary(..., num_chains=1) without burn-in)
NOTEBOOK_SGLD = {"lr": 3e-3, "localization": 5.0, "nbeta": 2.0, "chains": 1, "draws": 500, "burnin": 0,
                 "minibatch": 128}
FLAT_RATIO = 0.25  # "flattens": the LLC's slope after grokking is under a quarter of its slope through grokking
LOCAL_FRACTION = 0.1  # the calibration rule's locality: E[L] - L(w*) < 0.1 x (chance loss - L(w*))

_MODEL = dict(task="add", p=53, train_frac=NOTEBOOK_TRAIN / N_PAIRS, model="mlp", n_layers=1, d_model=12, d_mlp=48,
              act_fn="gelu", mlp_bias=True, mlp_unembed_bias=False, optimizer="adam", lr=5e-3, weight_decay=2e-4,
              betas=[0.9, 0.999], warmup_steps=0, batch_size=128, device="cpu")
_NOTE = ("the notebook's task, MLP, Adam (L2 weight decay) and SGLD settings; differs: one hidden bias for the "
         "notebook's two (their difference is flat), W_in ~ U(+-1/sqrt(24)) for its U(+-1/sqrt(12)), the split "
         "from data_seed 598 (1,123 pairs), groklens' sampler (every pair in every epoch, exact L_n(w*))")
SCALES = {
    "smoke": Scale.of(dict(task="add", p=7, train_frac=0.5, model="mlp", n_layers=1, d_model=4, d_mlp=8, act_fn="gelu",
                         mlp_bias=True, mlp_unembed_bias=False, optimizer="adam", lr=5e-3, weight_decay=2e-4,
                         betas=[0.9, 0.999], warmup_steps=0, batch_size=8, steps=40, eval_every=10,
                         checkpoint_every=10, device="cpu"),
                    "smoke: a tiny pipeline check, not a reproduction (p=7, d_model 4, d_mlp 8, 40 steps)",
                    sgld={**NOTEBOOK_SGLD, "draws": 6, "minibatch": 8}, ledger_curves=["llc"]),
    # the notebook's run with the LLC at every 4th of its checkpoints and 200 draws
    "quick": Scale.of({**_MODEL, "steps": 25_000, "eval_every": 250, "checkpoint_every": 1000},
                    _NOTE + "; the LLC every 1,000 steps with 200 draws (the notebook: every 250, 500 draws)",
                    sgld={**NOTEBOOK_SGLD, "draws": 200}, ledger_curves=["llc"]),
    "paper": Scale.of({**_MODEL, "steps": 25_000, "eval_every": 250, "checkpoint_every": 250}, _NOTE,
                    sgld=dict(NOTEBOOK_SGLD), ledger_curves=["llc"]),
}


def _plan(sc: Scale, scale: str) -> Plan:
    return Plan({"notebook": {}}, None, sc.base)


def _analyses(sc: Scale, scale: str):
    return [("llc", dict(sc.extra["sgld"]), "all")]


# ---------------------------------------------------------------------- the reading
def mean_interval(values: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """Mean and Student-t 95% interval over seeds (None with fewer than 2)."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), None
    half = stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v))
    return float(v.mean()), (float(v.mean() - half), float(v.mean() + half))


def interval_verdict(values: Sequence[float], threshold: float, *, claim_above: bool, missing: str = "") -> str:
    """`agrees` / `disagrees` only when the 95% interval over seeds lies wholly on one side of
    `threshold` (claim: the quantity is above it, or below); otherwise undetermined (why). Written
    here until experiments/verdicts.py has an interval helper for a per-seed quantity."""
    if len(values) < 2:
        return undetermined(missing or f"{len(values)} seed(s) with a value: no interval")
    _, (lo, hi) = mean_interval(values)
    if lo <= threshold <= hi:
        return undetermined(f"the 95% interval [{lo:.3g}, {hi:.3g}] contains {threshold:g}")
    above = lo > threshold
    return "agrees" if above == claim_above else "disagrees"


def _curve(run) -> tuple[np.ndarray, np.ndarray] | None:
    c = run.entry.get("curves", {}).get("llc")
    if not c or not c.get("steps"):
        return None
    return np.asarray(c["steps"], dtype=float), np.asarray([np.nan if v is None else v for v in c["values"]], float)


def _at(steps: np.ndarray, values: np.ndarray, step: float | None) -> float | None:
    if step is None or not len(steps):
        return None
    i = int(np.argmin(np.abs(steps - step)))
    return float(values[i]) if math.isfinite(values[i]) else None


def _slope(steps: np.ndarray, values: np.ndarray, lo: float, hi: float) -> float | None:
    """OLS slope of the LLC on the step over the checkpoints in [lo, hi] (per 1,000 steps)."""
    keep = (steps >= lo) & (steps <= hi) & np.isfinite(values)
    if keep.sum() < 3:
        return None
    return float(np.polyfit(steps[keep] / 1000.0, values[keep], 1)[0])


def seed_quantities(run, nbeta: float) -> dict[str, float | None]:
    """Per seed: the rise (LLC at memorization - at step 0), the fall (at grokking - at memorization),
    the flattening ratio |slope after grokking| / |slope from memorization to grokking|, and the
    sampled loss above L(w*) at the end (llc / nbeta)."""
    out: dict[str, float | None] = {"rise": None, "fall": None, "flat": None, "excursion": None}
    curve = _curve(run)
    if curve is None:
        return out
    steps, llc = curve
    m, g = run.memorization, run.grokking
    at0, atm, atg = _at(steps, llc, steps[0]), _at(steps, llc, m), _at(steps, llc, g)
    if at0 is not None and atm is not None:
        out["rise"] = atm - at0
    if atm is not None and atg is not None:
        out["fall"] = atg - atm
    if m is not None and g is not None:
        s_fall, s_after = _slope(steps, llc, m, g), _slope(steps, llc, g, steps[-1])
        if s_fall not in (None, 0.0) and s_after is not None:
            out["flat"] = abs(s_after) / abs(s_fall)
    end = _at(steps, llc, steps[-1])
    if end is not None:
        out["excursion"] = end / nbeta
    return out


def _row(ctx: Context, measure: str, claim: str, key: str, threshold: float, above: bool) -> Row:
    runs = ctx.group("notebook").runs
    per = [seed_quantities(r, float(ctx.sc.extra["sgld"]["nbeta"]))[key] for r in runs]
    have = [v for v in per if v is not None]
    why = {"rise": "no memorization checkpoint", "fall": "never grokked or no checkpoint there",
           "flat": "never grokked, or too few checkpoints around grokking", "excursion": "no LLC curve"}[key]
    if not have:
        return Row(measure, Published(None, claim, DEVINTERP), None, f"— ({why}; {len(runs)} seed(s))", ctx.sc.note,
                   undetermined(f"missing: {why}"))
    mean, ci = mean_interval(have)
    text = f"{mean:.3g}" + (f" [95% CI {ci[0]:.3g}, {ci[1]:.3g}]" if ci else "") + \
        f" (n={len(have)}" + (f" of {len(runs)} seeds" if len(have) < len(runs) else "") + \
        "; per seed " + ", ".join(f"{v:.3g}" for v in have) + ")"
    return Row(measure, Published(None, claim, DEVINTERP), mean, text, ctx.sc.note,
               interval_verdict(have, threshold, claim_above=above))


def _read(ctx: Context) -> list[Row]:
    runs = ctx.group("notebook").runs
    chance = math.log(int(ctx.sc.base["p"]))
    ends = [float(r.entry.get("final", {}).get("train_loss", float("nan"))) for r in runs]
    l_star = float(np.nanmean(ends)) if ends and np.isfinite(ends).any() else 0.0
    local = LOCAL_FRACTION * (chance - l_star)
    return [
        _row(ctx, "LLC at memorization - LLC at step 0 (rises during memorization)",
             "the LLC first increases during memorization", "rise", 0.0, True),
        _row(ctx, "LLC at grokking - LLC at memorization (falls through grokking)",
             "... and then decreases ~smoothly afterward", "fall", 0.0, False),
        _row(ctx, f"|LLC slope after grokking| / |LLC slope memorization -> grokking| (flattens: < {FLAT_RATIO:g})",
             "... flattening out after the model is done grokking", "flat", FLAT_RATIO, False),
        _row(ctx, f"sampled loss above L(w*) at the end, nats, at the notebook's SGLD setting (local: < {local:.2g} "
                  f"= {LOCAL_FRACTION:g} x (log {ctx.sc.base['p']} - L(w*)))",
             "its calibration guide: loss traces should not diverge away from the initial loss (no number)",
             "excursion", local, False),
    ]


register(Experiment(
    "llc-grokking",
    "devinterp's grokking notebook: the LLC of a p=53 MLP rises during memorization, falls through grokking, "
    "flattens after",
    SCALES, _plan, _read, _analyses, seeds={"smoke": 1, "quick": 3, "paper": 3}))

