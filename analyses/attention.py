"""Attention mass on informative tokens (REFERENCES.md, definition 3).

For layer l, head h, input i, with q the readout (query) position and I_i the task's
informative positions (TaskData.informative_mask, e.g. {0, 1} for [a, b, =]):
  mass[i, h]      = sum_{j in I_i} pattern[i, h, q, j]
  min_token[i, h] = min_{j in I_i} pattern[i, h, q, j]      (enough mass on EVERY informative token)
  kl[i, h]        = KL(pi* || pattern[i, h, q, :]) with pi* uniform on I_i (our definition)
Reported per layer and head: means over all inputs (the full grid) and quantiles over inputs
(a mean can hide input-dependent attention); `mass` and `min_token_mass` per layer are also
averaged over heads. Read from `blocks.{l}.attn.hook_pattern`; a model without attention
patterns is a BadInput.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.registry import analysis
from groklens.errors import BadInput
from groklens.probes.capture import capture

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

QUANTILES = (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)


def pattern_sites(model) -> list[str]:
    sites = sorted(
        (int(m.group(1)), name) for name in model.hook_dict
        if (m := re.fullmatch(r"blocks\.(\d+)\.attn\.hook_pattern", name))
    )
    return [name for _, name in sites]


def check(model, data: TaskData, params: dict) -> list[str]:
    sites = pattern_sites(model)
    if not sites:
        raise BadInput("attention mass needs attention layers: this model has no blocks.{l}.attn.hook_pattern hook")
    q = params.get("quantiles", QUANTILES)
    if not isinstance(q, (list, tuple)) or not q or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in q
    ):
        raise BadInput(f"quantiles must be a non-empty list of numbers in [0, 1]; got {q!r}")
    if not bool(data.informative_mask.any()):
        raise BadInput("this task marks no informative positions")
    return sites


def mass_statistics(pattern_q: np.ndarray, informative: np.ndarray, quantiles: Sequence[float]) -> dict:
    """pattern_q [N, H, n_ctx] (the readout query's row), informative [N, n_ctx] bool."""
    P = np.asarray(pattern_q, dtype=np.float64)
    mask = np.asarray(informative, dtype=bool)[:, None, :]
    n_inf = mask.sum(axis=-1)  # [N, 1]
    mass = np.where(mask, P, 0.0).sum(axis=-1)  # [N, H]
    min_token = np.where(mask, P, np.inf).min(axis=-1)
    with np.errstate(divide="ignore"):
        log_p = np.where(mask, np.log(np.where(mask, P, 1.0)), 0.0)
    kl = -np.log(n_inf) - log_p.sum(axis=-1) / n_inf  # sum_j (1/|I|) log((1/|I|) / P_j)
    empty = n_inf[:, 0] == 0
    for arr in (mass, min_token, kl):
        arr[empty] = np.nan
    q = np.asarray(quantiles, dtype=np.float64)
    return {
        "mass_per_head": np.nanmean(mass, axis=0),
        "mass_quantiles": np.nanquantile(mass, q, axis=0).T,  # [H, Q]
        "min_token_mass_per_head": np.nanmean(min_token, axis=0),
        "min_token_mass_quantiles": np.nanquantile(min_token, q, axis=0).T,
        "kl_per_head": np.nanmean(kl, axis=0),
        # the readout query's attention over source positions, averaged over inputs: the pattern
        "pattern": P.mean(axis=0),  # [H, n_ctx]
    }


@analysis("attention", "attention mass of the readout query on informative tokens, per layer and head",
          export="attention_mass",
          check=check, measures=[("attn_mass", "mass", "attention mass on informative tokens", "mean")])
def attention_mass(model, data: TaskData, *, quantiles: Sequence[float] = QUANTILES,
                   batch_size: int = 4096) -> dict:
    """Definition 3 for every attention layer, over all of the task's inputs.

    Returns mass [L], min_token_mass [L] (means over heads and inputs), and per layer and head:
    mass_per_head [L, H], mass_quantiles [L, H, Q], min_token_mass_per_head [L, H],
    min_token_mass_quantiles [L, H, Q], kl_per_head [L, H], pattern [L, H, n_ctx] (the readout
    query's attention over source positions, mean over inputs); quantile_levels [Q].
    """
    sites = check(model, data, {"quantiles": list(quantiles)})
    q = int(data.readout_pos)
    pats = capture(model, data.inputs, sites, position=q, batch_size=batch_size)
    informative = data.informative_mask.numpy()
    per_layer = [mass_statistics(pats[s].double().numpy(), informative, quantiles) for s in sites]
    out = {key: np.stack([layer[key] for layer in per_layer]) for key in per_layer[0]}
    out["mass"] = out["mass_per_head"].mean(axis=1)
    out["min_token_mass"] = out["min_token_mass_per_head"].mean(axis=1)
    out["quantile_levels"] = np.asarray(quantiles, dtype=np.float64)
    return out
