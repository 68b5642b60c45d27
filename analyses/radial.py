"""Radial-angular statistics of hidden representations (docs/ANALYSES.md, "radial"; ours).

For each hook site and each activation vector h_i in R^d (one per input and position):
  radius  ||h_i|| / sqrt(d)                      (1 on the sqrt(d) sphere)
  rho     mean_i (g_i . h_i / ||h_i||)^2 / ||g_i||^2,  g_i = dL/dh_i
          the share of the gradient's energy along the radial direction, per vector, then
          averaged; an isotropic gradient gives 1/d in expectation (`rho_baseline`), a purely
          radial one exactly 1.
L is the float64 task loss (cross-entropy, or the run's StableMax loss) at the readout
position(s), summed over the evaluation set (default: the training inputs), so g_i is sample
i's own gradient (our models treat samples independently; the sum's scale cancels in rho).
Default sites: each layer's hidden representation (blocks.{l}.hook_resid_post, or
layers.{i}.hook_post of the MLP), all positions, as the activation-norm penalty. Vectors with
h_i = 0 or g_i = 0 (a position that cannot affect the readout) are left out of rho and counted in
`rho_excluded`.
The model runs in float64 so that confident (grokked) models do not underflow gradients.
eps_dependent@S = 1 (and an EpsDependenceWarning) when S reaches the logits only through
scale-invariant norms (norm_fed_sites): there rho ~ 0 by construction and the radius is free,
so both describe the activations' scale against the norm's eps, not the loss.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.common import check_loss, eval_rows, hidden_sites, task_loss
from groklens.analyses.registry import analysis
from groklens.errors import BadInput
from groklens.probes.capture import check_sites, resolve_position, select_position
from groklens.probes.interventions import scoped_hooks

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData


def radial_energy(h: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-vector (g . h/||h||)^2 / ||g||^2 for h, g [n, d], and the mask of vectors it is defined for."""
    h = np.asarray(h, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    hn = np.linalg.norm(h, axis=-1)
    gn2 = (g * g).sum(axis=-1)
    ok = (hn > 0) & (gn2 > 0)
    rho = np.full(len(h), np.nan)
    rho[ok] = ((g[ok] * h[ok]).sum(-1) / hn[ok]) ** 2 / gn2[ok]
    return rho, ok


class EpsDependenceWarning(UserWarning):
    """A measure read where a scale-invariant norm's eps, not the loss, sets its value."""


def _is_norm(module) -> bool:
    """A normalising module: torch's LayerNorm/RMSNorm or any class named *Norm (ours, TL's)."""
    from torch import nn

    norms = tuple(c for c in (getattr(nn, "LayerNorm", None), getattr(nn, "RMSNorm", None)) if c is not None)
    return isinstance(module, norms) or type(module).__name__.endswith("Norm")


def _readers(model, x, site: str) -> list[str]:
    """The norm modules whose input is the very tensor the hook `site` passes on (a hook point
    returns its input, so readers behind another hook point are found too)."""
    hook = model.hook_dict[site]
    seen: dict = {}
    found: list[str] = []
    handles = [hook.register_forward_hook(lambda mod, args, out: seen.__setitem__("t", out))]
    for name, mod in model.named_modules():
        if _is_norm(mod):
            handles.append(mod.register_forward_pre_hook(
                lambda mod, args, name=name: found.append(name) if args and args[0] is seen.get("t") else None))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return found


def _free_scale(model, data: TaskData, sites: Sequence[str], norms: bool, n_inputs: int = 64) -> tuple:
    """Which of these tensors reach the logits only through scale-invariant norms: the outputs
    of `sites`, and (norms=True) the input of every norm module. On a float64 copy with every
    norm's eps set to 0, a tensor t is so when the gradient g of a random linear function of the
    logits is orthogonal to t in every row that matters (g_i . t_i = 0: scaling t_i changes
    nothing); at least one row must have g_i != 0 (unused tensors are not flagged).
    Returns ({site or norm name: flagged}, the copy, its inputs)."""
    import torch

    m = copy.deepcopy(model).to(torch.float64).eval()
    if hasattr(m, "lean_path"):
        m.lean_path = False  # the explicit path calls the norm modules, which the pre-hooks below watch
    for mod in m.modules():
        if isinstance(getattr(mod, "eps", None), float):
            mod.eps = 0.0
    for prm in m.parameters():
        prm.requires_grad_(True)
    x = data.inputs[:n_inputs].to(next(m.parameters()).device)
    caught: dict = {}
    handles = []
    if norms:
        for name, mod in m.named_modules():
            if _is_norm(mod):
                handles.append(mod.register_forward_pre_hook(
                    lambda mod, args, name=name: caught.__setitem__(name, args[0]) if args else None))
    try:
        with torch.enable_grad(), scoped_hooks(m, fwd_hooks=[(s, lambda act, hook: caught.__setitem__(hook.name, act))
                                                             for s in sites]):
            logits = m(x)
            weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
            keys = [k for k, t in caught.items() if t.requires_grad]
            grads = [] if not keys else torch.autograd.grad((logits * weights.to(logits.device)).sum(),
                                                            [caught[k] for k in keys],
                                        allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    flagged = {k: False for k in caught}
    for k, g in zip(keys, grads):
        if g is None:
            continue
        t, g = caught[k].detach(), g.detach()
        tn, gn = t.norm(dim=-1), g.norm(dim=-1)
        used = (gn > 1e-12 * float(gn.max())) & (tn > 0)
        if used.any():
            cos = (g * t).sum(-1)[used] / (gn[used] * tn[used])
            flagged[k] = bool(cos.abs().max() < 1e-9)
    return flagged, m, x


def norm_fed_sites(model, data: TaskData, sites: Sequence[str]) -> dict[str, list[str]]:
    """{site: the norm modules reading it} for each site that reaches the logits only through
    scale-invariant norms (_free_scale). At such a site the loss sees only the direction (at
    eps = 0): rho is ~0 by construction and the radius, like the Hessian along the weights
    writing it, is set by the activations' scale against the norm's eps."""
    flagged, m, x = _free_scale(model, data, sites, norms=False)
    return {s: _readers(m, x, s) or ["scale-invariant paths"] for s in sites if flagged.get(s)}


def free_scale_norms(model, data: TaskData) -> dict[str, list[str]]:
    """{norm module: [itself]} for each norm whose input is read by nothing but scale-invariant
    norms (pre-norm: ln_final's input; post-norm: e.g. ln_embed's input, the embedding sum):
    the weights writing that input have a free scale, and the Hessian along them scales as
    1/scale^2."""
    flagged, _, _ = _free_scale(model, data, [], norms=True)
    return {k: [k] for k, v in flagged.items() if v}


def eps_note(analysis: str, where: dict[str, list[str]]) -> str:
    """The warning an analysis gives (and stores as eps_dependent = 1) for norm-fed tensors."""
    parts = "; ".join(f"{s} feeds {', '.join(r)}" if [s] != r else f"the input of {s}" for s, r in where.items())
    return (f"{analysis}: {parts} (read only through scale-invariant norms): the value depends on the free scale of "
            f"those activations and the norm's eps, not on the loss's radial geometry (docs/ANALYSES.md)")


def check(model, data: TaskData, params: dict) -> list[str]:
    sites = params.get("sites")
    sites = hidden_sites(model) if sites is None else list(sites)
    if not sites:
        raise BadInput("radial statistics: this model has no hidden-layer hook (give sites=[...])")
    check_sites(model, sites)
    eval_rows(data, params.get("eval_set", "train"))
    check_loss(params.get("loss"))
    resolve_position(params.get("position", "all"), data)
    return sites


@analysis("radial", "activation radius ||h||/sqrt(d) and radial gradient energy rho vs the 1/d baseline",
          export="radial_statistics",
          check=check,
          measures=[("radius", "radius_mean@{site}", "activation radius ||h||/sqrt(d)"),
                    ("rho", "rho@{site}", "radial gradient energy rho"),
                    ("rho_baseline", "rho_baseline@{site}", "isotropic baseline of rho (1/d)")], order=50)
def radial(model, data: TaskData, *, sites: Sequence[str] | None = None, position="all",
           eval_set: str = "train", loss: str | None = None, batch_size: int = 2048) -> dict:
    """Definition 6 per site: radius_mean, radius_std, rho, rho_baseline (1/d), rho_excluded.
    `loss` None means cross-entropy (`compute` passes the run's training loss)."""
    import torch

    sites = check(model, data, {"sites": sites, "eval_set": eval_set, "position": position, "loss": loss})
    pos = resolve_position(position, data)
    rows = eval_rows(data, eval_set)
    m = copy.deepcopy(model).to(torch.float64).eval()
    for p in m.parameters():
        p.grad = None
        p.requires_grad_(False)  # gradients with respect to activations only
    device = next(m.parameters()).device
    radii: dict[str, list[np.ndarray]] = {s: [] for s in sites}
    rhos: dict[str, list[np.ndarray]] = {s: [] for s in sites}
    dims: dict[str, int] = {}
    for start in range(0, len(rows), batch_size):
        idx = rows[start : start + batch_size]
        x = data.inputs[idx].to(device)
        y = data.labels[idx].to(device)
        kept: dict[str, torch.Tensor] = {}

        def keep(act, hook, kept=kept):  # bound now: one dict per batch
            if not act.requires_grad:  # an activation no parameter feeds: make it a leaf to differentiate
                act = act.detach().requires_grad_(True)
                kept[hook.name] = act
                return act
            kept[hook.name] = act
            return None

        with torch.enable_grad(), scoped_hooks(m, fwd_hooks=[(s, keep) for s in sites]):
            total = task_loss(m(x), y, data, check_loss(loss), reduction="sum")
            grads = torch.autograd.grad(total, [kept[s] for s in sites], allow_unused=True)
        for s, g in zip(sites, grads):
            h = kept[s].detach()
            g = torch.zeros_like(h) if g is None else g.detach()
            h, g = select_position(h, s, pos), select_position(g, s, pos)
            d = h.shape[-1]
            dims[s] = d
            h2, g2 = h.reshape(-1, d).numpy(), g.reshape(-1, d).numpy()
            radii[s].append(np.linalg.norm(h2, axis=-1) / np.sqrt(d))
            rhos[s].append(radial_energy(h2, g2)[0])
    fed = norm_fed_sites(model, data, sites)
    if fed:
        warnings.warn(eps_note("radial", fed), EpsDependenceWarning, stacklevel=2)
    out: dict = {}
    for s in sites:
        out[f"eps_dependent@{s}"] = int(s in fed)
        r, rho = np.concatenate(radii[s]), np.concatenate(rhos[s])
        ok = ~np.isnan(rho)
        out[f"radius_mean@{s}"] = float(r.mean())
        out[f"radius_std@{s}"] = float(r.std())
        out[f"rho@{s}"] = float(rho[ok].mean()) if ok.any() else float("nan")
        out[f"rho_baseline@{s}"] = 1.0 / dims[s]
        out[f"rho_excluded@{s}"] = int((~ok).sum())
    return out
