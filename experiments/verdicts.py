"""Verdict rules of `groklens reproduce`, in one place.

A claim without a number gets a verdict: `agrees`, `disagrees`, or `undetermined (why)`. One
rule decides all of them: **a 95% interval that lies wholly on one side of the claim's
threshold**. An interval that contains the threshold, or no interval (fewer than 2 seeds), is
`undetermined`; the point estimate alone never decides.

- A speed-up (analyses/speedup.py): the ratio of geometric means with Welch's interval on the
  log steps. A censored seed enters at its step cap, which makes the ratio a bound and its
  interval one-sided in the direction the censoring bounds: [lo, inf) when the baseline has
  censored seeds (the true speed-up is larger), [0, hi] when the variant has. So a lower bound
  can only show "faster" (lo above the threshold) and an upper bound only "not faster" (hi at or
  below it). Censored on both sides: undetermined.
- A ratio of one measure at two phases (at grokking / at memorization): the mean of the per-seed
  ratios over the seeds that have both values, with a paired t-interval (n - 1 degrees of
  freedom); the means shown beside it are over the same seeds.
- An end-of-run comparison (a measure of the final model, e.g. sharpness of a flat minimum, or
  rho of the solution found): only between arms whose seeds all generalized; otherwise
  `undetermined (compares a grokked with an ungrokked model: ...)`.
- Collapse: a run that grokked and whose last grok_evals evaluations are below the threshold
  (at grok_evals 1: it crossed and ended below) is collapsed (analyses.grokking.collapse, kept
  in each ledger entry). Such a run has two readings: grokked at its crossing, or never grokked
  (censored at its last step). A speed-up that rests on collapsed runs is computed under both;
  when both give the same verdict (agrees or disagrees), that verdict stands and says so,
  otherwise it is undetermined, with the count and each reading's verdict. "Learns and
  generalizes" that rests on a collapsed run is undetermined. A paper's own code that trains a
  fixed epoch count is read over its log up to where groklens' stop rule would have ended the run
  (experiments/peer.py, OfficialRun's `stop`; where its rows give one), the window a groklens run observes.
- "This run does (not) grok" from runs that never crossed: only when the step cap is at least
  `FAR` times the reference time (the published grokking time, or, where none is published, our
  baseline's measured one); a shorter cap cannot tell "never" from "later". Where the claim is
  that a published run of N steps grokked within them (a figure, no grokking time), a cap of N
  already decides it: no seed grokked by step N disagrees.
- A power law (a fitted exponent, Tobit where runs are censored): disagrees when its 95%
  interval excludes the published exponent, agrees when it holds it and excludes 0 on the
  published side, undetermined when it holds both.
- A measure read at a phase: only from the seeds that have a value there (compare's phase rule);
  with none it is `undetermined (missing: why)`.
- "Near a value" (a phase boundary near weight decay 1.0): within a factor NEAR of it; an
  interval inside [value / NEAR, value x NEAR] agrees, one wholly outside it disagrees.
- A rate over runs ("the weight norm falls monotonically"): the claim is "most runs", the rate
  above 1/2, by the rate's exact binomial interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

FAR = 10.0  # a cap this many times the reference time decides "does not grok"
NEAR = 2.0  # "near a value": within this factor of it
UNDETERMINED = "undetermined"
CI_LEVEL = 0.95


def undetermined(why: str) -> str:
    return f"{UNDETERMINED} ({why})"


def outcome(verdict: str) -> str:
    """A verdict's outcome, 'agrees', 'disagrees' or 'undetermined': its first word (what follows
    in parentheses says why, or under which readings)."""
    return verdict.split(" ", 1)[0]


def fmt_ci(ci: Sequence[float]) -> str:
    lo, hi = ci
    return f"[{lo:.3g}, inf)" if math.isinf(hi) else f"[{lo:.3g}, {hi:.3g}]"


def interval_verdict(ci: Sequence[float] | None, threshold: float, *, claim_above: bool, no_ci: str) -> str:
    """The one rule: `claim_above` is the claim "value > threshold" (else "value <= threshold");
    agrees / disagrees only when the interval lies wholly on one side of the threshold."""
    if ci is None:
        return undetermined(f"no interval: {no_ci}")
    lo, hi = ci
    if lo > threshold:
        above = True
    elif hi <= threshold:
        above = False
    else:
        return undetermined(f"the 95% interval {fmt_ci(ci)} contains {threshold:g}")
    return "agrees" if above == claim_above else "disagrees"


def speedup_verdict(sp: dict[str, Any], *, above: float = 1.0, claim_faster: bool = True,
                    collapsed: int = 0, if_censored: dict[str, Any] | None = None) -> str:
    """Verdict on "speed-up > above" (claim_faster) or "speed-up <= above" (not), from a speed-up
    dict of `analyses.speedup.speedup` (value, ci (one-sided when censored), bound, ci_note);
    `collapsed`: runs behind it that crossed and then ended below the threshold, which `sp` reads
    as grokked at their crossing; `if_censored`: the same speed-up with those runs read as censored
    at their last step (default: sp's own "if_censored", which experiments.core.Context.speedup
    adds). The verdict stands only when both readings give it (module docstring)."""
    def one(s: dict[str, Any]) -> str:
        if s.get("value") is None:
            return undetermined(s.get("ci_note") or "no grokking time")
        return interval_verdict(s.get("ci"), above, claim_above=claim_faster, no_ci=s.get("ci_note") or "too few seeds")

    at_crossing = one(sp)
    if not collapsed:
        return at_crossing
    why = f"{collapsed} run(s) behind it crossed and then collapsed"
    if_censored = if_censored if if_censored is not None else sp.get("if_censored")
    if if_censored is None:
        return undetermined(why)
    censored = one(if_censored)
    if at_crossing == censored and not at_crossing.startswith(UNDETERMINED):
        return f"{at_crossing} (under both readings of the {collapsed} collapsed run(s): grokked at the crossing, " \
               "or censored at the last step)"
    return undetermined(f"{why}; read as grokked at the crossing: {at_crossing}; "
                        f"as censored at the last step: {censored}")


def paired_interval(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, list[float] | None]:
    """(mean, t-interval of the mean) of per-seed values (e.g. paired ratios); no interval for n < 2."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean, [mean - half, mean + half]


def welch_log_ratio(a: Sequence[float], b: Sequence[float],
                    level: float = CI_LEVEL) -> tuple[float | None, list[float] | None]:
    """Ratio of geometric means a / b of two independent positive samples with Welch's interval
    on the difference of mean logs (the speed-up's definition, for any positive measure)."""
    from scipy import stats

    if not a or not b or any(v <= 0 for v in [*a, *b]):
        return None, None
    la, lb = [math.log(v) for v in a], [math.log(v) for v in b]
    ma, mb = sum(la) / len(la), sum(lb) / len(lb)
    ratio = math.exp(ma - mb)
    if len(la) < 2 or len(lb) < 2:
        return ratio, None
    va = sum((x - ma) ** 2 for x in la) / (len(la) - 1)
    vb = sum((x - mb) ** 2 for x in lb) / (len(lb) - 1)
    se2 = va / len(la) + vb / len(lb)
    if se2 == 0:
        return ratio, [ratio, ratio]
    df = se2 ** 2 / ((va / len(la)) ** 2 / (len(la) - 1) + (vb / len(lb)) ** 2 / (len(lb) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
    return ratio, [math.exp(ma - mb - half), math.exp(ma - mb + half)]


def near_verdict(ci: Sequence[float] | None, value: float, no_ci: str) -> str:
    """Verdict on "near `value`": within a factor NEAR, by the 95% interval."""
    if ci is None:
        return undetermined(f"no interval: {no_ci}")
    lo, hi = ci
    if value / NEAR <= lo and hi <= value * NEAR:
        return "agrees"
    if hi < value / NEAR or lo > value * NEAR:
        return "disagrees"
    return undetermined(f"the 95% interval {fmt_ci(ci)} reaches beyond [{value / NEAR:g}, {value * NEAR:g}] and "
                        "into it")


def exponent_verdict(ci: Sequence[float] | None, published: float, *, no_ci: str = "no fit") -> str:
    """Verdict on a published power law "T ~ x^published" (published < 0: T falls with x) from the
    fitted exponent's 95% interval: disagrees when the interval excludes the published exponent;
    agrees when it holds it and lies wholly below 0 (T does fall with x); undetermined when it
    holds both (the data cannot tell the law from no effect)."""
    if ci is None:
        return undetermined(f"no interval: {no_ci}")
    lo, hi = ci
    if not lo <= published <= hi:
        return f"disagrees (the 95% interval {fmt_ci(ci)} excludes {published:g})"
    if hi < 0:
        return "agrees"
    return undetermined(f"the 95% interval {fmt_ci(ci)} holds {published:g} and 0")


def ratio_verdict(ratio: float | None, ci: Sequence[float] | None, *, below: bool, missing: str,
                  n: int | None = None) -> str:
    """Verdict on "ratio < 1" (below) or "ratio > 1" (not), from its interval."""
    if ratio is None:
        return undetermined(f"missing: {missing}")
    no_ci = f"n={n}: a paired interval needs >= 2 seeds" if n is not None else "too few seeds"
    return interval_verdict(ci, 1.0, claim_above=not below, no_ci=no_ci)


def generalized_arms(arms: dict[str, Sequence[Any]]) -> str | None:
    """None when every seed of every named arm generalized (crossed and did not collapse); else
    the reason an end-of-run comparison of them is undetermined."""
    parts = []
    for label, runs in arms.items():
        k = sum(1 for r in runs if not r.grok_censored and not getattr(r, "collapsed", False))
        if k < len(runs) or not runs:
            parts.append(f"{label} generalized on {k} of {len(runs)} seeds")
    if not parts:
        return None
    return "compares a grokked with an ungrokked model: " + "; ".join(parts) if len(arms) > 1 else \
        "read on a model that did not generalize: " + "; ".join(parts)


def groks_verdict(runs: Sequence[Any], *, should_grok: bool, reference: float | None, reference_what: str,
                  within: float | None = None) -> str:
    """Verdict on "these runs grok" (should_grok) or "they do not", from runs with `grok_censored`
    and `last_step`; `reference` is the time the cap is compared with (see the module docstring).
    `within`: the claim is "groks within the published run's `within` steps" (a figure that shows
    grokking inside its run): then every seed censored at a cap of at least that length disagrees."""
    n = len(runs)
    k = sum(not r.grok_censored for r in runs)
    if n == 0:
        return undetermined("no runs")
    if 0 < k < n:
        return undetermined(f"{k} of {n} seeds grokked")
    if k == n:
        collapsed = sum(bool(getattr(r, "collapsed", False)) for r in runs)
        if collapsed:
            return undetermined(f"{collapsed} of {n} seeds crossed and then collapsed")
        return "agrees" if should_grok else "disagrees"
    cap = min(r.last_step for r in runs if r.last_step is not None) if any(r.last_step for r in runs) else 0
    if should_grok and within is not None and cap >= within:
        return f"disagrees (no seed grokked by step {cap}; the published run groks within {within:.0f})"
    if reference is None or not math.isfinite(reference) or reference <= 0:
        return undetermined(f"censored: no seed grokked by step {cap}, and no {reference_what} to compare the cap with")
    if cap < FAR * reference:
        return undetermined(f"censored: no seed grokked by step {cap}, less than {FAR:g}x the {reference_what} "
                            f"({reference:.0f})")
    return ("disagrees" if should_grok else "agrees") + (f" (no seed grokked by step {cap}, >= {FAR:g}x the "
                                                         f"{reference_what} {reference:.0f})")


def mean_flag(n_have: int, n_row: int) -> str:
    """'(n=3)' or, when fewer seeds than the row has carry the value, '(n=1 of 2 seeds: a partial mean)'."""
    if n_have < n_row:
        return f"(n={n_have} of {n_row} seeds: a partial mean)"
    return f"(n={n_have})"
