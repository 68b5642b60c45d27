"""Frequency ablation: remove Fourier frequencies from the embedding or from any hook site,
through a scoped hook, and measure what the loss does (docs/ANALYSES.md, "freq_ablation").

`along` says what a frequency is a frequency of:
  token  the residue tokens: each embedding row e_t (t in Z_p) loses its components on the basis
         vectors cos(w_k t), sin(w_k t) over the vocabulary, k in the set (only for sites that
         depend on the token alone: hook_embed);
  a, b   one operand: the site's activation at `position`, laid out on the p x p grid, loses its
         cos/sin(w_k a) (or b) components along that operand's axis;
  a+b    the answer: the activation over all p^2 inputs loses its components on the unit grid
         vectors cos(w_k (a+b)), sin(w_k (a+b)) (the directions of Nanda's restricted loss).
The grid forms need every input in one forward pass (the projection mixes inputs), so the whole
grid goes through the model at once. Losses are float64 cross-entropy at the readout position
over all inputs and each split; the frequency set defaults to the checkpoint's key frequencies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.registry import analysis, MODULAR_TASKS
from groklens.errors import BadInput
from groklens.analyses.fourier import fourier_basis, frequency_rows, key_directions, neuron_fve, resolve_sites
from groklens.probes.capture import position_axis, check_sites, capture
from groklens.probes.grid import modular_grid
from groklens.probes.interventions import scoped_hooks
from groklens.probes.linear import check_frequencies

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

ALONG = ("token", "a", "b", "a+b")


def _rows(p: int, frequencies: Sequence[int]) -> np.ndarray:
    """[2|K|, p] orthonormal cos/sin rows of the frequencies (analyses/fourier.py's basis)."""
    B = fourier_basis(p)
    return B[[r for k in frequencies for r in frequency_rows(p, int(k))]]


def _projector(model, data: TaskData, frequencies: Sequence[int], site: str, along: str, position: int):
    """The forward hook that removes the frequencies at `site` (inputs in data's row order)."""
    import torch


    grid = modular_grid(data, "frequency ablation")
    p = grid.p
    R = torch.from_numpy(_rows(p, frequencies))  # [r, p]
    tokens = data.inputs

    def hook(act, hook):
        out = act.clone()
        if along == "token":  # e_t -> e_t - R^T R E over the residues, row by row of the batch
            E = model.embed.W_E[:p].detach().double()
            E_abl = (E - R.T @ (R @ E)).to(act.dtype)
            mask = tokens < p
            out[mask] = E_abl[tokens[mask]] + (act[mask] - model.embed.W_E[tokens[mask]].to(act.dtype))
            return out
        axis = position_axis(site, act.ndim)
        X = (act if axis is None else act.select(axis, position)).double()  # [N, ...]
        shape = X.shape
        flat = X.reshape(len(X), -1)
        if along == "a+b":
            D = torch.from_numpy(key_directions(grid.c, p, frequencies))  # [N, 2|K|] unit
            flat = flat - D @ (D.T @ flat)
        else:
            G = flat[torch.from_numpy(grid.cell.reshape(-1))].reshape(p, p, -1)  # [a, b, d]
            if along == "a":
                G = G - torch.einsum("ra,rc,cbd->abd", R, R, G)
            else:
                G = G - torch.einsum("rb,rc,acd->abd", R, R, G)
            back = torch.empty_like(flat)
            back[torch.from_numpy(grid.cell.reshape(-1))] = G.reshape(p * p, -1)
            flat = back
        new = flat.reshape(shape).to(act.dtype)
        if axis is None:
            return new
        index = [slice(None)] * act.ndim
        index[axis] = position
        out[tuple(index)] = new
        return out

    return hook


def _losses(logits, data: TaskData, pos: int, prefix: str) -> dict[str, float]:
    import torch.nn.functional as F

    lg = logits[:, pos].double()
    per = F.cross_entropy(lg, data.labels, reduction="none")
    hit = (lg.argmax(-1) == data.labels).double()
    out = {}
    for split, idx in (("all", slice(None)), ("train", data.train_idx), ("test", data.test_idx)):
        out[f"{prefix}loss_{split}"] = float(per[idx].mean())
        out[f"{prefix}acc_{split}"] = float(hit[idx].mean())
    return out


def check(model, data: TaskData, params: dict) -> None:
    grid = modular_grid(data, "frequency ablation")
    along, site = params.get("along", "token"), params.get("site", "hook_embed")
    if along not in ALONG:
        raise BadInput(f"along must be one of {', '.join(ALONG)}; got {along!r}")
    if along == "token" and site != "hook_embed":
        raise BadInput(f"along='token' removes frequencies of the embedding (site hook_embed); for {site!r} "
                       "use along='a', 'b' or 'a+b'")
    check_sites(model, [site])
    freqs = params.get("frequencies")
    if freqs is not None:
        check_frequencies(freqs, grid.p)


@analysis("freq_ablation",
          "loss and accuracy with Fourier frequencies removed from the embedding or a hook site (through a hook)",
          check=check, tasks=MODULAR_TASKS, tier="named", order=90)
def frequency_ablation(model, data: TaskData, *, frequencies: Sequence[int] | None = None, site: str = "hook_embed",
                       along: str = "token", position: int | None = None) -> dict:
    """Loss and accuracy (all / train / test) without and with `frequencies` removed at `site`
    (default: the checkpoint's key frequencies, Nanda's rule); see the module docstring."""
    import torch


    check(model, data, {"frequencies": frequencies, "site": site, "along": along})
    pos = int(data.readout_pos) if position is None else int(position)
    if frequencies is None:
        names = resolve_sites(model, None)
        post = capture(model, data.inputs, [names["site"]], position=int(data.readout_pos))[names["site"]]
        frequencies = [int(k) for k in neuron_fve(modular_grid(data).to_grid(post.double().numpy()))["key_frequencies"]]
    freqs = sorted({int(k) for k in frequencies})
    device = next(model.parameters()).device
    with torch.no_grad():
        # the clean pass through the same hook (an identity): a model without hooks may take a faster
        # path whose float32 rounding differs, which would enter the ablation's effect
        with scoped_hooks(model, fwd_hooks=[(site, lambda t, hook: t)]):
            clean = model(data.inputs.to(device)).cpu()
        with scoped_hooks(model, fwd_hooks=[(site, _projector(model, data, freqs, site, along, pos))]):
            ablated = model(data.inputs.to(device)).cpu()
    return {**_losses(clean, data, int(data.readout_pos), ""),
            **_losses(ablated, data, int(data.readout_pos), "ablated_"),
            "frequencies": np.array(freqs, dtype=np.int64)}
