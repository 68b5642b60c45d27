"""The one speed-up definition: T_baseline / T_variant as the ratio of the geometric means of
the grokking steps over seeds, with a 95% confidence interval from Welch's t-interval on the
difference of mean log grokking steps (exponentiated); censored seeds make it a bound with a
one-sided interval.
Used by compare (comparison.txt / .csv / .json) and by the experiments (results.json)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CI_LEVEL = 0.95
SPEEDUP_METHOD = "ratio of geometric means; 95% CI: Welch t-interval on mean log grokking step"


@dataclass
class GrokTime:
    """One grokking time as `speedup` reads it: `time` is the censoring step when `censored`."""

    time: float
    censored: bool

    def grok_time(self) -> float:
        return self.time

    @property
    def grok_censored(self) -> bool:
        return self.censored


def collapsed_as_censored(runs: Sequence) -> list:
    """The runs with each collapsed one (`collapsed` true: it crossed and ended below) read as never
    grokked, censored at its last step: the second reading of a collapsed run (experiments/verdicts.py)."""
    return [GrokTime(float(r.last_step), True) if getattr(r, "collapsed", False) else r for r in runs]


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    a = np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def speedup(base: Sequence, runs: Sequence, level: float = CI_LEVEL) -> dict[str, Any]:
    """T_base / T_runs over runs with grok_time() and grok_censored (analyses/phases.PhaseTimes):
    ratio of geometric means of grokking steps, Welch t-interval on logs.

    A censored seed enters at its censoring step (grok_time: a lower bound on its time), so the
    ratio is a bound: a lower one when the baseline has censored seeds, an upper one when the
    variant has. Its interval is then one-sided, in the direction the censoring bounds: [lo, inf)
    for a lower bound, [0, hi] for an upper one, lo and hi the ends of the two-sided interval
    computed as if the censoring steps were grokking times (so a verdict reads it as it reads an
    uncensored interval). Censored on both sides: no value."""
    from scipy import stats

    tb = [r.grok_time() for r in base]
    tr = [r.grok_time() for r in runs]
    out: dict[str, Any] = {"value": None, "ci": None, "bound": None, "ci_note": None, "method": SPEEDUP_METHOD}
    if any(t is None or t <= 0 for t in tb + tr):
        out["ci_note"] = "no evaluated grokking time"
        return out
    cb = any(r.grok_censored for r in base)
    cr = any(r.grok_censored for r in runs)
    if cb and cr:
        out["ci_note"] = "censored on both sides"
        return out
    lb, lr = np.log(tb), np.log(tr)
    diff = float(lb.mean() - lr.mean())
    out["value"] = float(math.exp(diff))
    if cb:
        out["bound"] = "lower"
        out["ci_note"] = "baseline censored at its cap: a lower bound, one-sided interval"
    elif cr:
        out["bound"] = "upper"
        out["ci_note"] = "censored seed(s) at their cap: an upper bound, one-sided interval"
    nb, nr = len(lb), len(lr)
    if nb < 2 or nr < 2:
        out["ci_note"] = "needs >= 2 seeds on both sides" + (f"; {out['ci_note']}" if out["ci_note"] else "")
        return out
    vb, vr = float(lb.var(ddof=1)), float(lr.var(ddof=1))
    se2 = vb / nb + vr / nr
    if se2 == 0:
        lo = hi = out["value"]
    else:
        df = se2 ** 2 / ((vb / nb) ** 2 / (nb - 1) + (vr / nr) ** 2 / (nr - 1))
        half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(se2)
        lo, hi = math.exp(diff - half), math.exp(diff + half)
        out["df"] = df
    out["ci"] = [lo, math.inf] if cb else [0.0, hi] if cr else [lo, hi]
    return out
