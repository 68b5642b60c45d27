"""The weight-space regularization the activation-norm penalty induces (docs/ANALYSES.md,
"induced_reg"; our reading of the activation-norm paper's Proposition i).

The penalty P(theta) = mean_i (||h_i|| - sqrt(d))^2 / d over every vector h_i at the penalty's
hook sites (all inputs of the evaluation set, all positions; lambda = 1, as the trainer's term
at weight 1) acts on a weight matrix W through its gradient G = dP/dW. With W = U S V^T:
  rate_k          u_k^T G v_k / s_k over W's singular directions (s_k > 1e-6 s_max): the shrink
                  rate gradient descent on P applies to singular value k. Weight decay (G = c W)
                  gives rate_k = c for every k.
  anisotropy      std_k(rate_k) / mean_k |rate_k|: 0 for weight decay, > 0 when the penalty
                  shrinks some directions faster than others.
  diag_share      ||diag(U^T G V)||^2 / ||G||^2: 1 for weight decay (it only rescales singular
                  values), < 1 when the penalty also rotates them.
  alignment       cos(G, W) = <G, W> / (||G|| ||W||): 1 for weight decay.
  data_dependence ||rate(train) - rate(other)|| / ||rate(train)||: the rates computed from a
                  second input set (default the test inputs); 0 for weight decay, whose
                  gradient does not see the data.
Values are named `<measure>@<weight>`; `<measure>_mean` averages over the matrices whose
gradient is nonzero. By default only the matrices the penalty reaches (nonzero gradient) are
reported: the unembedding after the last penalized site, for one, has no induced term at all.
Weights are viewed as matrices as in the rank analysis (weight_matrix).
The model runs in float64 so that a penalty already near its minimum keeps its gradient.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.common import eval_rows, hidden_sites
from groklens.analyses.rank import weight_matrix
from groklens.analyses.registry import analysis
from groklens.errors import BadInput
from groklens.probes.capture import check_sites
from groklens.probes.interventions import scoped_hooks

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

RANK_TOL = 1e-6  # singular directions below this fraction of the largest carry no rate


def penalty_gradients(model, inputs, sites: Sequence[str], weights: Sequence[str]) -> tuple[float, dict]:
    """P over the vectors at `sites` for `inputs`, and dP/dW for each named weight (float64)."""
    import torch

    m = copy.deepcopy(model).to(torch.float64).eval()
    if hasattr(m, "lean_path"):
        m.lean_path = False  # the hooked path: every site the penalty reads fires
    named = dict(m.named_parameters())
    for p in m.parameters():
        p.grad = None
    caught: dict = {}
    with torch.enable_grad(), scoped_hooks(m, fwd_hooks=[(s, lambda act, hook: caught.__setitem__(hook.name, act))
                                                         for s in sites]):
        m(inputs.to(next(m.parameters()).device))
        dev = [((caught[s].norm(dim=-1) - math.sqrt(caught[s].shape[-1])) ** 2 / caught[s].shape[-1]).flatten()
               for s in sites]
        value = torch.cat(dev).mean()
        grads = torch.autograd.grad(value, [named[w] for w in weights], allow_unused=True)
    return float(value.detach()), {w: (np.zeros(tuple(named[w].shape)) if g is None else g.detach().cpu().numpy())
                          for w, g in zip(weights, grads)}


def singular_rates(W: np.ndarray, G: np.ndarray) -> np.ndarray:
    """rate_k = u_k^T G v_k / s_k over W's singular directions above RANK_TOL of the largest."""
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    keep = s > RANK_TOL * s.max() if s.size and s.max() > 0 else np.zeros(len(s), bool)
    return np.einsum("ik,ij,jk->k", U[:, keep], G, Vt[keep].T) / s[keep]


def rate_stats(W: np.ndarray, G: np.ndarray) -> dict:
    """The module docstring's anisotropy, diag_share and alignment of G on W, and the rates."""
    nan = float("nan")
    rates = singular_rates(W, G)
    gn2 = float((G * G).sum())
    if gn2 == 0 or not rates.size:
        return {"rates": rates, "rate_mean": float(rates.mean()) if rates.size else nan,
                "anisotropy": nan, "diag_share": nan, "alignment": nan}
    U, s, Vt = np.linalg.svd(W, full_matrices=False)
    diag = np.einsum("ik,ij,jk->k", U, G, Vt.T)
    mean_abs = float(np.abs(rates).mean())
    return {"rates": rates, "rate_mean": float(rates.mean()),
            "anisotropy": float(rates.std() / mean_abs) if mean_abs > 0 else nan,
            "diag_share": float((diag**2).sum() / gn2),
            "alignment": float((G * W).sum() / math.sqrt(gn2 * float((W * W).sum())))}


def check(model, data: TaskData, params: dict) -> tuple[list[str], list[str]]:
    sites = params.get("sites")
    sites = hidden_sites(model) if sites is None else list(sites)
    if not sites:
        raise BadInput("induced_reg: no hook site to penalize")
    check_sites(model, sites)
    named = dict(model.named_parameters())
    weights = params.get("weights")
    if weights is None:
        weights = [n for n, p in named.items() if p.ndim in (2, 3) and p.requires_grad]
    weights = list(weights)
    unknown = [w for w in weights if w not in named]
    if unknown:
        raise BadInput(f"induced_reg: unknown weight(s) {', '.join(unknown)} (known: {', '.join(named)})")
    bad = [w for w in weights if named[w].ndim not in (2, 3)]
    if bad:
        raise BadInput(f"induced_reg: {', '.join(bad)} is not a matrix")
    eval_rows(data, params.get("eval_set", "train"))
    eval_rows(data, params.get("other_set", "test"))
    return sites, weights


@analysis("induced_reg", "the activation-norm penalty's induced weight regularization (Proposition i): rates "
          "along each weight's singular directions, anisotropy, alignment with weight decay, data dependence",
          export="induced_regularization", check=check, tier="named",
          measures=[("induced_anisotropy", "anisotropy_mean", "penalty's induced anisotropy (0 = weight decay)"),
                    ("induced_data_dependence", "data_dependence_mean", "penalty's induced data dependence")], order=60)
def induced_regularization(model, data: TaskData, *, sites: Sequence[str] | None = None,
                           weights: Sequence[str] | None = None, eval_set: str = "train",
                           other_set: str = "test") -> dict:
    """The module docstring's measures for every weight matrix (default: every 2-D or 3-D
    trained parameter) under the penalty at `sites` (default: the penalty's default sites)."""
    weights_given = weights is not None
    sites, weights = check(model, data, {"sites": sites, "weights": weights, "eval_set": eval_set,
                                         "other_set": other_set})
    value, grads = penalty_gradients(model, data.inputs[eval_rows(data, eval_set)], sites, weights)
    _, other = penalty_gradients(model, data.inputs[eval_rows(data, other_set)], sites, weights)
    named = dict(model.named_parameters())
    if not weights_given:  # the default: only the matrices the penalty reaches
        weights = [w for w in weights if np.any(grads[w]) or np.any(other[w])]
    out: dict = {"penalty": value}
    pooled: dict[str, list[float]] = {"anisotropy": [], "diag_share": [], "alignment": [], "data_dependence": []}
    for w in weights:
        W = weight_matrix(w, named[w].detach().cpu().numpy())
        stats = rate_stats(W, weight_matrix(w, grads[w]))
        other_rates = singular_rates(W, weight_matrix(w, other[w]))
        norm = float(np.linalg.norm(stats["rates"]))
        stats["data_dependence"] = (float(np.linalg.norm(stats["rates"] - other_rates) / norm) if norm > 0
                                    else float("nan"))
        for key, val in stats.items():
            out[f"{key}@{w}"] = val
        for key in pooled:
            if np.isfinite(stats[key]):
                pooled[key].append(stats[key])
    for key, vals in pooled.items():
        out[f"{key}_mean"] = float(np.mean(vals)) if vals else float("nan")
    return out
