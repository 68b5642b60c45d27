"""Attention mass on informative tokens (REFERENCES.md, definition 3), and the task loss's
gradient that reaches attention (`attention_gradient`, below).

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

from groklens.analyses.common import EVAL_SETS, check_loss, eval_rows, task_loss
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
          check=check, measures=[("attn_mass", "mass", "attention mass on informative tokens", "mean"),
                                 ("attn_min_mass", "min_token_mass",
                                  "attention on the least-attended informative token (per input; mean)", "mean")],
          order=20)
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


# ---------------------------------------------------------------------- the gradient that reaches attention
def readout_gradients(model, data: TaskData, rows, *, loss: str = "ce", batch_size: int = 4096) -> dict:
    """The task loss's gradients at the readout query of every attention layer, on inputs `rows`.

    With l_i the loss of input i (summed: each input's pattern moves its own loss only) and
    L = mean_i l_i: per layer, d l_i / d pattern[i, h, q, :] and d l_i / d scores[i, h, q, :]
    ([N, H, n_ctx] each, float64), and the gradients of L for every parameter (what the optimizer
    is given, before AdamW's normalization). Eval mode; the model's own gradients are untouched."""
    import torch

    sites = pattern_sites(model)
    scores_sites = [s.replace("hook_pattern", "hook_attn_scores") for s in sites]
    q = int(data.readout_pos)
    names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
    out = {"pattern": {s: [] for s in sites}, "scores": {s: [] for s in sites}}
    param_grads = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    rows = torch.as_tensor(rows)
    total = 0.0
    for chunk in rows.split(batch_size):
        acts: dict[str, torch.Tensor] = {}

        def keep(act, hook, acts=acts):
            acts[hook.name] = act
            return act

        x, y = data.inputs[chunk], data.labels[chunk]
        with torch.enable_grad(), model.hooks(fwd_hooks=[(s, keep) for s in sites + scores_sites]):
            lsum = task_loss(model(x), y, data, loss, reduction="sum")
            wrt = [acts[s] for s in sites] + [acts[s] for s in scores_sites] + list(params)
            grads = torch.autograd.grad(lsum, wrt, allow_unused=True)
        total += float(lsum.detach())
        n = len(sites)
        for i, s in enumerate(sites):
            out["pattern"][s].append(grads[i][:, :, q].double())
            out["scores"][s].append(torch.nan_to_num(grads[n + i][:, :, q].double()))  # masked keys: 0
        for acc, g in zip(param_grads, grads[2 * n:]):
            if g is not None:
                acc += g.double()
    N = len(rows)
    return {"pattern": {s: torch.cat(v).numpy() for s, v in out["pattern"].items()},
            "scores": {s: torch.cat(v).numpy() for s, v in out["scores"].items()},
            "params": {nm: (g / N).numpy() for nm, g in zip(names, param_grads)}, "loss": total / N, "sites": sites}


def _check_gradient(model, data: TaskData, params: dict) -> list[str]:
    sites = check(model, data, {})
    check_loss(params.get("loss"))
    if params.get("eval_set", "train") not in EVAL_SETS:
        raise BadInput(f"eval_set must be one of {', '.join(EVAL_SETS)}; got {params.get('eval_set')!r}")
    if data.n_targets:
        raise BadInput("the gradient at the readout query needs a single readout position; this task has several")
    return sites


@analysis("attention_gradient",
          "the task loss's gradient that reaches attention at the readout query: dL/dpattern, the pull toward "
          "the informative tokens, and the W_Q/W_K gradient norm", check=_check_gradient, tier="named",
          measures=[("attn_qk_grad", "qk_grad", "gradient norm of W_Q, W_K (task loss)", "mean"),
                    ("attn_qk_share", "qk_grad_share", "W_Q, W_K share of the whole gradient norm", "mean"),
                    ("attn_struct_pull", "struct_pull", "pull of the loss toward the informative tokens", "mean")],
          order=20)
def attention_gradient(model, data: TaskData, *, eval_set: str = "train", loss: str = "ce",
                       batch_size: int = 4096) -> dict:
    """Per attention layer (our measures of "the structural gradient", docs/ANALYSES.md), from the
    task loss on `eval_set` (training: what the optimizer sees), l_i per input, L their mean:

    pattern_grad [L]   sqrt(mean_i sum_{h,k} (d l_i / d pattern[i, h, q, k])^2), q the readout query
    struct_pull [L]    mean_{i,h} of -sum_{j in I_i} d l_i / d scores[i, h, q, j]: how fast l_i falls
                       when every informative key's score rises together (> 0: the loss pulls the
                       readout query toward the informative tokens)
    qk_grad [L]        sqrt(||dL/dW_Q||^2 + ||dL/dW_K||^2) of the layer
    qk_grad_share [L]  qk_grad / the norm of dL/d(every parameter)
    and per head [L, H]: pattern_grad_per_head, struct_pull_per_head; grad_norm, train loss `loss`.
    """
    sites = _check_gradient(model, data, {"eval_set": eval_set, "loss": loss})
    g = readout_gradients(model, data, eval_rows(data, eval_set), loss=loss, batch_size=batch_size)
    rows = eval_rows(data, eval_set).numpy()
    informative = data.informative_mask.numpy()[rows][:, None, :]  # [N, 1, n_ctx]
    grad_norm = float(np.sqrt(sum(float((v ** 2).sum()) for v in g["params"].values())))
    out: dict[str, list] = {k: [] for k in ("pattern_grad", "pattern_grad_per_head", "struct_pull",
                                            "struct_pull_per_head", "qk_grad", "qk_grad_share")}
    for layer, s in enumerate(sites):
        gp, gs = g["pattern"][s], g["scores"][s]  # [N, H, n_ctx]
        out["pattern_grad_per_head"].append(np.sqrt((gp ** 2).sum(-1).mean(0)))
        out["pattern_grad"].append(float(np.sqrt((gp ** 2).sum((1, 2)).mean())))
        pull = -np.where(informative, gs, 0.0).sum(-1)  # [N, H]
        out["struct_pull_per_head"].append(pull.mean(0))
        out["struct_pull"].append(float(pull.mean()))
        qk = float(np.sqrt(sum(float((g["params"][f"blocks.{layer}.attn.{w}"] ** 2).sum()) for w in ("W_Q", "W_K"))))
        out["qk_grad"].append(qk)
        out["qk_grad_share"].append(qk / grad_norm if grad_norm > 0 else float("nan"))
    res = {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
    res["grad_norm"] = grad_norm
    res["loss"] = g["loss"]
    return res
