"""Grokking and memorization times (docs/ANALYSES.md, "grokking").

The grokking step is the first evaluated step with test accuracy >= threshold; memorization
likewise on train accuracy. The rule is `>=`: the bounded-sphere paper's code uses a strict
`>` (test accuracy > threshold), so a run whose accuracy sits exactly at the threshold (e.g.
0.95 on a test set of a size where 0.95 is an attainable value) groks here one evaluation
earlier than there. A run that never crosses is right-censored: None here, reported as
`> last step` by the CLI, never dropped.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def first_crossing(steps: Sequence[int], values: Sequence[float], threshold: float) -> int | None:
    """First step whose value is >= threshold, or None when the series never crosses."""
    values = np.asarray(values, dtype=float)
    hits = np.nonzero(values >= threshold)[0]
    return int(np.asarray(steps)[hits[0]]) if len(hits) else None


def grokking_times(metrics: Mapping[str, np.ndarray], thresholds: Sequence[float] = (0.95, 0.99)) -> dict:
    """memorization_step / grokking_step keyed by threshold as a string ("0.95"), int or None."""
    steps = metrics["step"]
    out: dict = {"memorization_step": {}, "grokking_step": {}, "last_step": int(steps[-1]) if len(steps) else None}
    for t in thresholds:
        key = f"{t:g}"
        out["memorization_step"][key] = first_crossing(steps, metrics.get("train_acc", []), t) if len(steps) else None
        out["grokking_step"][key] = first_crossing(steps, metrics.get("test_acc", []), t) if len(steps) else None
    return out


def grokking_table(metrics: Mapping[str, np.ndarray], thresholds: Sequence[float] = (0.95, 0.99)) -> dict:
    """Per threshold (in the given order): memorization and grokking steps, -1 where censored,
    and whether each is censored (never crossed by `last_step`, the last evaluated step)."""
    times = grokking_times(metrics, thresholds)
    mem = [times["memorization_step"][f"{t:g}"] for t in thresholds]
    grok = [times["grokking_step"][f"{t:g}"] for t in thresholds]
    return {
        "thresholds": np.asarray(thresholds, dtype=np.float64),
        "memorization_step": np.array([-1 if s is None else s for s in mem], dtype=np.int64),
        "memorization_censored": np.array([s is None for s in mem], dtype=np.int64),
        "grokking_step": np.array([-1 if s is None else s for s in grok], dtype=np.int64),
        "grokking_censored": np.array([s is None for s in grok], dtype=np.int64),
        "last_step": -1 if times["last_step"] is None else int(times["last_step"]),
    }
