"""Verdict rules of `groklens reproduce`, in one place.

A claim without a number gets a verdict: `agrees`, `disagrees`, or `undetermined (why)`.

- `agrees` / `disagrees` only when every seed behind the value crossed the threshold, or when a
  censored bound decides the claim on its own:
  * a speed-up of seeds that all crossed is decided by its 95% interval (analyses/speedup.py),
    never by the point estimate alone: an interval wholly above the claim's threshold says
    faster, one wholly at or below it says not faster; an interval that contains the threshold,
    or none (fewer than 2 seeds on a side), is `undetermined`;
  * a speed-up whose baseline is censored is a lower bound (the true value is larger); one whose
    variant is censored is an upper bound. The bound decides "faster" / "not faster" only in the
    direction it bounds (a lower bound above 1 says faster; an upper bound at or below 1 says not
    faster); otherwise the verdict is `undetermined (censored)`.
  * "this run does (not) grok" from runs that never crossed: only when the step cap is at least
    `FAR` times the reference time (the published grokking time, or, where none is published, our
    baseline's measured one); a shorter cap cannot tell "never" from "later".
- a measure read at a phase (at memorization / at grokking): only from the seeds that have a
  value there (compare's phase rule); with none it is `undetermined (missing: why)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

FAR = 10.0  # a cap this many times the reference time decides "does not grok"
UNDETERMINED = "undetermined"


def undetermined(why: str) -> str:
    return f"{UNDETERMINED} ({why})"


def speedup_verdict(sp: dict[str, Any], *, above: float = 1.0, claim_faster: bool = True) -> str:
    """Verdict on "speed-up > above" (claim_faster) or "speed-up <= above" (not), from a speed-up
    dict of `compare.speedup` (value, ci, bound: None | lower | upper, ci_note)."""
    v, bound = sp.get("value"), sp.get("bound")
    if v is None:
        return undetermined(sp.get("ci_note") or "no grokking time")
    faster = v > above
    if bound is None:
        ci = sp.get("ci")
        if ci is None:
            return undetermined(f"no interval: {sp.get('ci_note') or 'too few seeds'}")
        lo, hi = ci
        if lo <= above < hi:
            return undetermined(f"the 95% interval [{lo:.2f}, {hi:.2f}] contains {above:g}")
        holds = lo > above
    elif bound == "lower" and faster:  # the true speed-up is >= v > above
        holds = True
    elif bound == "upper" and not faster:  # the true speed-up is <= v <= above
        holds = False
    else:
        return undetermined(f"censored: the {'baseline' if bound == 'lower' else 'variant'}'s bound "
                            f"({v:.2f}x) does not decide it")
    return "agrees" if holds == claim_faster else "disagrees"


def groks_verdict(runs: Sequence[Any], *, should_grok: bool, reference: float | None, reference_what: str) -> str:
    """Verdict on "these runs grok" (should_grok) or "they do not", from runs with `grok_censored`
    and `last_step`; `reference` is the time the cap is compared with (see the module docstring)."""
    n = len(runs)
    k = sum(not r.grok_censored for r in runs)
    if n == 0:
        return undetermined("no runs")
    if 0 < k < n:
        return undetermined(f"{k} of {n} seeds grokked")
    if k == n:
        return "agrees" if should_grok else "disagrees"
    cap = min(r.last_step for r in runs if r.last_step is not None) if any(r.last_step for r in runs) else 0
    if reference is None or not math.isfinite(reference) or reference <= 0:
        return undetermined(f"censored: no seed grokked by step {cap}, and no {reference_what} to compare the cap with")
    if cap < FAR * reference:
        return undetermined(f"censored: no seed grokked by step {cap}, less than {FAR:g}x the {reference_what} "
                            f"({reference:.0f})")
    return ("disagrees" if should_grok else "agrees") + (f" (no seed grokked by step {cap}, >= {FAR:g}x the "
                                                         f"{reference_what} {reference:.0f})")


def ratio_verdict(ratio: float | None, *, below: bool, missing: str) -> str:
    """Verdict on "ratio < 1" (below) or "ratio > 1" (not) of a measure read at two phases."""
    if ratio is None:
        return undetermined(f"missing: {missing}")
    return "agrees" if (ratio < 1) == below else "disagrees"


def mean_flag(n_have: int, n_row: int) -> str:
    """'(n=3)' or, when fewer seeds than the row has carry the value, '(n=1 of 2 seeds: a partial mean)'."""
    if n_have < n_row:
        return f"(n={n_have} of {n_row} seeds: a partial mean)"
    return f"(n={n_have})"
