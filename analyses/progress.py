"""Nanda et al.'s progress measures along a run, and the three phases located from them.

The curves (`progress_curves`): train and test loss and the total sum of squared weights at every
evaluation (from the run's metrics: `weight_norm` is the L2 norm of all parameters), and the
restricted and excluded loss at the checkpoints where the `fourier` analysis is stored, read
from the stored variant with a fixed key set (`--param fourier.key_frequencies=last`, the key set
of the last checkpoint, as Nanda computes his curves) when there is one, else from the default
variant (each checkpoint's own key set, said in `key_source`).

The phases (`phase_boundaries`), our rule on these curves (Nanda names the phases, his paper's
boundaries are read by eye):
  memorization ends at M      the evaluation where the test loss peaks, among those before it
                              first falls to its drop level (below);
  circuit formation ends at C the checkpoint where the excluded loss peaks, after M;
  cleanup ends at K           the first evaluation after C with test loss <= CLEANUP_LOSS.
A peak at a curve's last point is no boundary: the curve may still be rising where the run
stopped, so that boundary (and the ones after it) is None, not the step the run ended at.
A curve's drop step is its first step after its peak where it is at or below the geometric
midpoint of its peak and its final value (the middle of the fall on the paper's log axis).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from groklens.analyses.measures import stored_analysis

CLEANUP_LOSS = 0.01
PHASE_RULE = ("M = the test-loss peak before its fall; C = the excluded-loss peak after M; K = the first evaluation "
              f"after C with test loss <= {CLEANUP_LOSS:g}; a peak at a curve's last point (still rising where the "
              "run stopped) is no boundary")


@dataclass
class ProgressCurves:
    steps: np.ndarray  # evaluations
    train_loss: np.ndarray
    test_loss: np.ndarray
    weight_sq: np.ndarray  # total sum of squared weights
    ck_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # stored fourier checkpoints
    restricted: np.ndarray = field(default_factory=lambda: np.zeros(0))
    excluded: np.ndarray = field(default_factory=lambda: np.zeros(0))
    key_set: list[int] | None = None  # the fixed key set, None when each checkpoint has its own
    key_source: str = "no fourier analysis stored"


def _fixed_key_variant(run_path: Path, config: dict[str, Any]):
    """(stored fourier results, key set or None): the variant with a fixed key set (the most recently
    updated if several), else the default variant."""
    from groklens.analyses.store import Sidecar, config_sha

    sidecar = Sidecar(run_path)
    sha = config_sha(json.dumps(config, sort_keys=True))
    fixed = []
    for variant, attrs in sidecar.variants("fourier"):
        if _text(attrs.get("run_config_sha256")) != sha:
            continue
        keys = json.loads(_text(attrs.get("params", "{}"))).get("key_frequencies")
        if keys:
            fixed.append((_text(attrs.get("updated", "")), variant, keys))
    if fixed:
        _, variant, keys = max(fixed)
        return sidecar.read("fourier", variant), [int(k) for k in keys]
    return stored_analysis(run_path, config, "fourier"), None


def _text(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


def progress_curves(run_path: str | Path) -> ProgressCurves:
    from groklens.checkpoints import Trajectory

    traj = Trajectory(run_path)
    m = traj.metrics
    curves = ProgressCurves(np.asarray(m["step"]), np.asarray(m["train_loss"], float),
                            np.asarray(m["test_loss"], float),
                            np.asarray(m["weight_norm"], float) ** 2)
    stored, keys = _fixed_key_variant(Path(run_path), traj.config_dict)
    if stored is None or "restricted_loss_all" not in stored.values:
        return curves
    curves.ck_steps = np.asarray(stored.steps, dtype=np.int64)
    curves.restricted = np.array([float(np.asarray(v).reshape(-1)[0]) for v in stored.values["restricted_loss_all"]])
    curves.excluded = np.array([float(np.asarray(v).reshape(-1)[0]) for v in stored.values["excluded_loss_train"]])
    curves.key_set = keys
    curves.key_source = (f"fixed key set {{{', '.join(map(str, keys))}}}" if keys
                         else "each checkpoint's own key set (no fixed set stored: --param "
                              "fourier.key_frequencies=last)")
    return curves


def drop_step(steps: np.ndarray, values: np.ndarray) -> int | None:
    """First step after the curve's peak where it is at or below the geometric midpoint of the peak
    and the final value; None when it does not fall (final >= peak) or has no positive values."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2 or not np.all(np.isfinite(v)) or np.any(v <= 0):
        return None
    i_peak = int(np.argmax(v))
    if v[-1] >= v[i_peak]:
        return None
    level = math.sqrt(v[i_peak] * v[-1])
    after = np.nonzero(v[i_peak:] <= level)[0]
    return int(np.asarray(steps)[i_peak + after[0]]) if len(after) else None


def first_at_or_below(steps: np.ndarray, values: np.ndarray, level: float, after: int = -1) -> int | None:
    hit = np.nonzero((np.asarray(values, float) <= level) & (np.asarray(steps) > after))[0]
    return int(np.asarray(steps)[hit[0]]) if len(hit) else None


def _at(steps: np.ndarray, values: np.ndarray, step: int | None) -> float | None:
    """The value at the evaluation or checkpoint nearest `step`."""
    if step is None or not len(steps):
        return None
    i = int(np.argmin(np.abs(np.asarray(steps) - step)))
    return float(values[i])


def _peak(steps: np.ndarray, values: np.ndarray, last: int) -> int | None:
    """The step of the curve's highest value (the first of equals), None when that is the curve's
    last point `last`: a curve cut off while rising has not shown its peak."""
    step = int(steps[int(np.argmax(values))])
    return None if step == int(last) else step


def phase_boundaries(c: ProgressCurves) -> dict[str, int | None]:
    """M, C, K by PHASE_RULE (None where the curves do not show them)."""
    drop = drop_step(c.steps, c.test_loss)
    upto = c.steps <= drop if drop is not None else np.ones(len(c.steps), bool)
    M = _peak(c.steps[upto], c.test_loss[upto], c.steps[-1]) if upto.any() else None
    C = None
    if M is not None and len(c.ck_steps):
        later = c.ck_steps > M
        if later.any():
            C = _peak(c.ck_steps[later], c.excluded[later], c.ck_steps[-1])
    K = first_at_or_below(c.steps, c.test_loss, CLEANUP_LOSS, after=C) if C is not None else None
    return {"memorization_end": M, "circuit_formation_end": C, "cleanup_end": K}


def progress_summary(run_path: str | Path) -> dict[str, Any]:
    """The run-level numbers the progress-measures experiment reads (JSON values)."""
    c = progress_curves(run_path)
    ph = phase_boundaries(c)
    M, C, K = ph["memorization_end"], ph["circuit_formation_end"], ph["cleanup_end"]
    out: dict[str, Any] = {**ph, "phase_rule": PHASE_RULE, "key_source": c.key_source, "key_set": c.key_set,
                           "test_loss_peak": float(np.max(c.test_loss)) if len(c.test_loss) else None,
                           "test_loss_0.86": first_at_or_below(c.steps, c.test_loss, 0.86, after=M or -1),
                           "test_loss_0.005": first_at_or_below(c.steps, c.test_loss, 0.005, after=M or -1),
                           "test_loss_drop": drop_step(c.steps, c.test_loss),
                           "restricted_loss_drop": drop_step(c.ck_steps, c.restricted) if len(c.ck_steps) else None,
                           "last_step": int(c.steps[-1]) if len(c.steps) else None}
    out["excluded_at_M"] = _at(c.ck_steps, c.excluded, M)
    out["excluded_at_C"] = _at(c.ck_steps, c.excluded, C)
    for name, step in (("M", M), ("C", C), ("K", K)):
        out[f"weight_sq_at_{name}"] = _at(c.steps, c.weight_sq, step)
    return out
