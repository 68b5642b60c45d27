"""Effective rank of hidden representations and weight matrices (REFERENCES.md, definition 5).

For a matrix X [N samples, d features] with singular values s (of X, or of X minus its
column means when centred) and l = s^2 (proportional to the covariance / second-moment
eigenvalues):
  roy_vetterli          exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j        (Roy & Vetterli 2007)
  rankme                exp(-sum_i p_i log p_i), p_i = s_i / sum_j s_j + 1e-7, always uncentred
                        (Garrido et al. 2023)
  participation_ratio   (sum_i l_i)^2 / sum_i l_i^2
Every value is named `<measure>_<centred|uncentred>@<site or weight>` (`rankme@...` is always
uncentred). Hidden representations: activations of hook sites over ALL the task's inputs at one
position (default the readout position; 'all' stacks every position as samples). Weights:
2-D parameters as they are ([d_in, d_out] or [vocab, d_model]); 3-D attention weights
[heads, d_model, d_head] as [d_model, heads * d_head] and W_O [heads, d_head, d_model] as
[heads * d_head, d_model]; weights are reported uncentred.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.common import hidden_sites
from groklens.analyses.registry import analysis
from groklens.errors import BadInput
from groklens.probes.capture import capture, check_sites, resolve_position

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

RANKME_EPS = 1e-7


def singular_values(X: np.ndarray, centred: bool) -> np.ndarray:
    import scipy.linalg

    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    if centred:
        X = X - X.mean(axis=0, keepdims=True)
    return scipy.linalg.svdvals(X)


def _entropy_rank(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(np.exp(-(nz * np.log(nz)).sum()))


def roy_vetterli(s: np.ndarray) -> float:
    s = np.asarray(s, dtype=np.float64)
    total = s.sum()
    return _entropy_rank(s / total) if total > 0 else float("nan")


def rankme(s: np.ndarray, eps: float = RANKME_EPS) -> float:
    s = np.asarray(s, dtype=np.float64)
    total = s.sum()
    return _entropy_rank(s / total + eps) if total > 0 else float("nan")


def participation_ratio(s: np.ndarray) -> float:
    lam = np.asarray(s, dtype=np.float64) ** 2
    denom = (lam**2).sum()
    return float(lam.sum() ** 2 / denom) if denom > 0 else float("nan")


def matrix_ranks(X: np.ndarray, label: str, centring: Sequence[bool] = (True, False)) -> dict:
    out = {}
    for centred in centring:
        s = singular_values(X, centred)
        tag = "centred" if centred else "uncentred"
        out[f"roy_vetterli_{tag}@{label}"] = roy_vetterli(s)
        out[f"participation_ratio_{tag}@{label}"] = participation_ratio(s)
        if not centred:
            out[f"rankme@{label}"] = rankme(s)
    return out


def weight_matrix(name: str, W: np.ndarray) -> np.ndarray:
    """A parameter as a 2-D matrix (see the module docstring)."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim == 2:
        return W
    if W.ndim == 3 and name.endswith("W_O"):
        return W.reshape(-1, W.shape[-1])  # [h, e, d] -> [h*e, d]
    if W.ndim == 3:
        return np.transpose(W, (1, 0, 2)).reshape(W.shape[1], -1)  # [h, d, e] -> [d, h*e]
    raise BadInput(f"parameter {name} has shape {W.shape}; effective rank needs a matrix")


def default_sites(model) -> list[str]:
    """Each layer's hidden representation (as the activation-norm penalty and GeomDR read them)
    and, in a transformer, each block's MLP neurons."""
    found = list(hidden_sites(model))
    for name in model.hook_dict:
        if re.fullmatch(r"blocks\.(\d+)\.mlp\.hook_post", name) and name not in found:
            found.append(name)
    return found


def check(model, data: TaskData, params: dict) -> tuple[list[str], list[str]]:
    sites = params.get("sites")
    sites = default_sites(model) if sites is None else list(sites)
    if sites:
        check_sites(model, sites)
    weights = params.get("weights")
    named = dict(model.named_parameters())
    if weights is None:
        weights = [n for n, p in named.items() if p.ndim >= 2]
    unknown = [w for w in weights if w not in named]
    if unknown:
        raise BadInput(f"unknown weight(s) {', '.join(unknown)} (known: {', '.join(named)})")
    for w in weights:
        if named[w].ndim not in (2, 3):
            raise BadInput(f"parameter {w} has shape {tuple(named[w].shape)}; effective rank needs a matrix")
    if not sites and not weights:
        raise BadInput("effective rank: no hook site and no weight to measure")
    resolve_position(params.get("position", "readout"), data)
    return sites, list(weights)


# an SVD of every weight matrix at every checkpoint: the demo's figures show the sites only
@analysis("rank", "effective rank (Roy-Vetterli, RankMe, participation ratio) of hook sites and weights",
          export="effective_rank",
          check=check, cheap_params={"weights": []},
          measures=[("eff_rank", "roy_vetterli_centred@{site}", "effective rank (Roy-Vetterli, centred)")], order=40)
def effective_rank(model, data: TaskData, *, sites: Sequence[str] | None = None,
                   weights: Sequence[str] | None = None, position="readout", batch_size: int = 4096) -> dict:
    """Definition 5 for hook sites (default: every block's resid_post and mlp.hook_post) over all
    inputs, and for weight matrices (default: every parameter with 2 or more dimensions)."""
    sites, weights = check(model, data, {"sites": sites, "weights": weights, "position": position})
    out: dict = {}
    if sites:
        pos = resolve_position(position, data)
        acts = capture(model, data.inputs, sites, position=pos, batch_size=batch_size)
        for s in sites:
            X = acts[s].double().numpy()
            X = X.reshape(-1, X.shape[-1]) if pos is None else X.reshape(len(X), -1)
            out.update(matrix_ranks(X, s))
    named = dict(model.named_parameters())
    for w in weights:
        out.update(matrix_ranks(weight_matrix(w, named[w].detach().cpu().numpy()), w, centring=(False,)))
    return out
