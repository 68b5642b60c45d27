"""Grokking and memorization times (REFERENCES.md, definition 7).

The grokking step is the first evaluated step with test accuracy >= threshold; memorization
likewise on train accuracy. A run that never crosses is right-censored: None here, reported
as `> last step` by the CLI, never dropped.
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
