"""Fourier-circuit measures of modular-arithmetic models (REFERENCES.md, definitions 1 and 2).

Basis (definition 1): b_0 = 1/sqrt(p), b_{2k-1} = sqrt(2/p) cos(2 pi k x / p),
b_{2k} = sqrt(2/p) sin(2 pi k x / p) for k = 1..floor(p/2), floor(p/2) included. For even p the
sine of k = p/2 is identically zero and its cosine (-1)^x is normalised by 1/sqrt(p) instead,
so the basis is orthonormal with p rows for every p (for the odd primes we use, exactly def. 1).

Variants (every result names its variant):
  embedding_fve   (2a) power of B W_E (the `=` row dropped) in the key frequencies over all k >= 1.
  neuron_fve      (2b, Nanda) MLP post-activations at the readout position over the p^2 grid,
                  centred per neuron, A_hat = B A B^T; neuron n's fraction for frequency k is its
                  variance in the 3x3 block {0, 2k-1, 2k}^2; its frequency is the argmax, it is
                  clustered when that fraction >= cluster_threshold (0.85); key frequencies are the
                  frequencies owning at least one clustered neuron (or the ones given).
                  neuron_fve = share of all neurons' variance lying in the UNION of the key
                  frequencies' blocks (a union of 3x3 blocks, never the outer product of a 1-D mask,
                  which would add the cross terms (2k-1, 2k') of two different frequencies).
  ls_fve          (2c, bounded-sphere paper, official notebook) W_L = W_U W_out in [vocab, neuron]
                  orientation (W_U's class vectors normalised first for bounded unembeddings); its
                  top `ls_top_k` frequencies by Fourier norm over the vocabulary; for each, the
                  activations projected on u_k = cos(w_k c) @ W_L and v_k = sin(w_k c) @ W_L,
                  centred, regressed by least squares on centred [cos(w_k c), sin(w_k c)] with c the
                  answer ((a + b) mod p for addition); FVE = 1 - Var(resid)/Var(y) clipped at 0.
                  ls_fve is the mean of the 2 * ls_top_k values (our reading of the paper's single
                  number; the notebook prints them per frequency).
  restricted_loss / excluded_loss  (2d, Nanda) neuron activations at the readout position
                  projected on the unit grid vectors cos(w_k c), sin(w_k c), k in K: restricted keeps
                  the per-neuron mean plus that projection, and (as Nanda's code does) replaces the
                  rest of the residual stream entering the unembedding (resid_mid at the readout
                  position) by its grid mean; excluded removes the projection and keeps everything
                  else. Both are interventions through scoped hooks, evaluated as float64
                  cross-entropy: restricted on the test set, excluded on the train set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    from groklens.trainers.tasks import TaskData

CLUSTER_THRESHOLD = 0.85
RESTRICTED_SKIP = ("mean", "keep")


# ---------------------------------------------------------------------- the basis
def fourier_basis(p: int) -> np.ndarray:
    """[p, p] float64, rows = basis vectors over x = 0..p-1 (definition 1, orthonormal)."""
    x = np.arange(p)
    rows = [np.full(p, 1 / np.sqrt(p))]
    for k in range(1, p // 2 + 1):
        if 2 * k == p:  # even p: sin(pi x) = 0, cos(pi x) = (-1)^x has norm sqrt(p)
            rows.append(np.cos(np.pi * x) / np.sqrt(p))
        else:
            rows.append(np.sqrt(2 / p) * np.cos(2 * np.pi * k * x / p))
            rows.append(np.sqrt(2 / p) * np.sin(2 * np.pi * k * x / p))
    return np.stack(rows)


def frequency_rows(p: int, k: int) -> list[int]:
    """Basis rows of frequency k: [2k-1, 2k] (only [2k-1] for k = p/2 when p is even)."""
    if not 1 <= k <= p // 2:
        raise ValueError(f"frequency {k} outside 1..{p // 2}")
    return [2 * k - 1] if 2 * k == p else [2 * k - 1, 2 * k]


def frequency_power(coeffs: np.ndarray, p: int) -> np.ndarray:
    """[p//2] sum of squared Fourier coefficients of each frequency k = 1..p//2 (axis 0 = basis rows)."""
    sq = np.asarray(coeffs, dtype=np.float64) ** 2
    sq = sq.reshape(sq.shape[0], -1).sum(axis=1)
    return np.array([sq[frequency_rows(p, k)].sum() for k in range(1, p // 2 + 1)])


def check_key_frequencies(key_frequencies: Sequence[int] | None, p: int) -> list[int] | None:
    if key_frequencies is None:
        return None
    from groklens.probes.linear import check_frequencies

    return check_frequencies(key_frequencies, p)


# ---------------------------------------------------------------------- 2a embedding
def embedding_fve(W_E: np.ndarray, p: int, key_frequencies: Sequence[int]) -> dict:
    """Definition 2a on W_E [>= p, d_model] (rows 0..p-1 are the residues; `=` is dropped)."""
    W = np.asarray(W_E, dtype=np.float64)[:p]
    power = frequency_power(fourier_basis(p) @ W, p)
    total = power.sum()
    ks = [k - 1 for k in key_frequencies]
    fve = float(power[ks].sum() / total) if total > 0 else float("nan")
    return {"embedding_fve": fve, "embedding_power": power / total if total > 0 else power * np.nan}


# ---------------------------------------------------------------------- 2b neurons
def block_mask(p: int, key_frequencies: Sequence[int]) -> np.ndarray:
    """[p, p] bool: the union over k of the 3x3 blocks {0, 2k-1, 2k}^2 (no cross-frequency terms)."""
    mask = np.zeros((p, p), dtype=bool)
    for k in key_frequencies:
        idx = [0, *frequency_rows(p, k)]
        mask[np.ix_(idx, idx)] = True
    return mask


def neuron_spectrum(acts_grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared 2-D Fourier coefficients E [p, p, m] of the centred activations and each
    neuron's total variance (times p^2) [m]; acts_grid [p, p, m] indexed by (a, b)."""
    A = np.asarray(acts_grid, dtype=np.float64)
    p = A.shape[0]
    A = A - A.mean(axis=(0, 1), keepdims=True)
    B = fourier_basis(p)
    A_hat = np.einsum("ia,abn,jb->ijn", B, A, B, optimize=True)  # B A B^T per neuron
    E = A_hat**2
    return E, E.sum(axis=(0, 1))


def neuron_fractions(E: np.ndarray, total: np.ndarray) -> np.ndarray:
    """[m, p//2]: the fraction of each neuron's variance in each frequency's 3x3 block."""
    p = E.shape[0]
    out = np.zeros((E.shape[2], p // 2))
    safe = np.where(total > 0, total, 1.0)
    for k in range(1, p // 2 + 1):
        out[:, k - 1] = E[block_mask(p, [k])].sum(axis=0) / safe
    out[total <= 0] = 0.0  # a dead neuron has no variance to explain
    return out


def neuron_fve(acts_grid: np.ndarray, key_frequencies: Sequence[int] | None = None,
               cluster_threshold: float = CLUSTER_THRESHOLD) -> dict:
    """Definition 2b on activations [p, p, m]; key frequencies from clustering unless given."""
    E, total = neuron_spectrum(acts_grid)
    p = E.shape[0]
    fractions = neuron_fractions(E, total)
    best = fractions.argmax(axis=1)
    frac = fractions[np.arange(len(best)), best]
    freq = np.where(total > 0, best + 1, 0)
    clustered = (frac >= cluster_threshold) & (total > 0)
    if key_frequencies is None:
        key_frequencies = sorted(int(k) for k in np.unique(freq[clustered]))
    ks = list(key_frequencies)
    all_var = total.sum()
    fve = float(E[block_mask(p, ks)].sum() / all_var) if all_var > 0 else float("nan")
    return {
        "key_frequencies": np.array(ks, dtype=np.int64),
        "neuron_fve": fve,
        "n_clustered": int(clustered.sum()),
        "neuron_frequency": freq.astype(np.int64),
        "neuron_fraction": frac,
    }


# ---------------------------------------------------------------------- 2c least squares
def logit_map(W_out: np.ndarray, W_U: np.ndarray, bounded: bool) -> np.ndarray:
    """W_L [vocab_out, m] = W_U W_out in the paper's orientation, from TransformerLens-shaped
    W_out [m, d_model] and W_U [d_model, vocab_out] (class vectors normalised if bounded)."""
    W_U = np.asarray(W_U, dtype=np.float64)
    if bounded:
        W_U = W_U / np.linalg.norm(W_U, axis=0, keepdims=True)
    return (np.asarray(W_out, dtype=np.float64) @ W_U).T


def least_squares_fve(post: np.ndarray, W_L: np.ndarray, c: np.ndarray, p: int, top_k: int = 5) -> dict:
    """Definition 2c: post [N, m] activations over the grid, W_L [p, m], c [N] answers."""
    W_L = np.asarray(W_L, dtype=np.float64)
    post = np.asarray(post, dtype=np.float64)
    norms = np.sqrt(frequency_power(fourier_basis(p) @ W_L, p))
    top = np.argsort(-norms, kind="stable")[: min(top_k, p // 2)] + 1
    vocab = np.arange(p)
    fves = np.zeros((len(top), 2))
    for i, k in enumerate(top):
        w = 2 * np.pi * k / p
        X = np.stack([np.cos(w * c), np.sin(w * c)], axis=1)
        X = X - X.mean(axis=0)
        for j, wave in enumerate((np.cos(w * vocab), np.sin(w * vocab))):
            y = post @ (wave @ W_L)
            y = y - y.mean()
            var = y.var()
            if var <= 0:
                fves[i, j] = np.nan
                continue
            beta = np.linalg.lstsq(X, y, rcond=None)[0]
            fves[i, j] = max(0.0, 1.0 - (y - X @ beta).var() / var)
    return {
        "ls_key_frequencies": top.astype(np.int64),
        "ls_fve_per_frequency": fves,
        "ls_fve": float(fves.mean()),
    }


# ---------------------------------------------------------------------- 2d restricted / excluded
def key_directions(c: np.ndarray, p: int, key_frequencies: Sequence[int]) -> np.ndarray:
    """[N, 2|K|] unit vectors cos(w_k c), sin(w_k c) over the grid rows (zero vectors dropped)."""
    cols = []
    for k in key_frequencies:
        w = 2 * np.pi * k / p
        for v in (np.cos(w * c), np.sin(w * c)):
            n = np.linalg.norm(v)
            if n > 1e-9 * np.sqrt(len(c)):  # sin(pi c) for k = p/2 is zero
                cols.append(v / n)
    return np.stack(cols, axis=1) if cols else np.zeros((len(c), 0))


def restrict_activations(post: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(restricted, excluded) versions of post [N, m] for the orthonormal directions V [N, r]."""
    proj = V @ (V.T @ post)
    return post.mean(axis=0, keepdims=True) + proj, post - proj


# ---------------------------------------------------------------------- the analysis
def _layer_of(pattern: str, name: str) -> int | None:
    m = re.fullmatch(pattern, name)
    return int(m.group(1)) if m else None


def weight(model, name: str):
    """A weight by its dotted name: a parameter, or a fixed buffer (the MLP's one-hot W_E)."""
    import torch

    try:
        t = model.get_parameter(name)
    except AttributeError:
        module_name, _, attr = name.rpartition(".")
        try:
            t = getattr(model.get_submodule(module_name), attr)
        except AttributeError:
            return None
    return t if isinstance(t, torch.Tensor) else None


def resolve_sites(model, site: str | None) -> dict:
    """Neuron site, the map from its neurons to the logits, and the skip path, or BadInput.

    Transformer: blocks.{l}.mlp.hook_post, neurons -> logits through blocks.{l}.mlp.W_out and
    unembed.W_U, skip path blocks.{l}.hook_resid_mid. MLP model: its last hidden layer
    layers.{L-1}.hook_post, neurons -> logits through unembed.W_U alone, no skip path."""
    from groklens.probes.capture import check_sites

    blocks = sorted(k for n in model.hook_dict if (k := _layer_of(r"blocks\.(\d+)\.mlp\.hook_post", n)) is not None)
    layers = sorted(k for n in model.hook_dict if (k := _layer_of(r"layers\.(\d+)\.hook_post", n)) is not None)
    if site is None:
        if blocks:
            site = f"blocks.{blocks[-1]}.mlp.hook_post"
        elif layers:
            site = f"layers.{layers[-1]}.hook_post"
        else:
            raise BadInput("the Fourier analysis needs MLP neurons: this model has no blocks.{l}.mlp.hook_post "
                           "or layers.{i}.hook_post hook")
    check_sites(model, [site])
    names = {"site": site, "w_out": None, "resid_mid": None}
    if (l := _layer_of(r"blocks\.(\d+)\.mlp\.hook_post", site)) is not None:
        names["w_out"] = f"blocks.{l}.mlp.W_out"
        if f"blocks.{l}.hook_resid_mid" in model.hook_dict:
            names["resid_mid"] = f"blocks.{l}.hook_resid_mid"
        if weight(model, names["w_out"]) is None:
            raise BadInput(f"the Fourier analysis needs the weight {names['w_out']}, which this model does not have")
    elif _layer_of(r"layers\.(\d+)\.hook_post", site) != (layers[-1] if layers else None):
        raise BadInput(f"the Fourier analysis reads MLP neurons feeding the logits (a blocks.{{l}}.mlp.hook_post, "
                       f"or the MLP model's last layers.{{i}}.hook_post); got {site!r}")
    for name in ("unembed.W_U", "embed.W_E"):
        if weight(model, name) is None:
            raise BadInput(f"the Fourier analysis needs the weight {name}, which this model does not have")
    return names


def check(model, data: TaskData, params: dict) -> dict:
    from groklens.probes.grid import modular_grid

    grid = modular_grid(data, "the Fourier analysis")
    if params.get("restricted_skip", "mean") not in RESTRICTED_SKIP:
        raise BadInput(f"restricted_skip must be one of {', '.join(RESTRICTED_SKIP)}; got {params['restricted_skip']!r}")
    thr = params.get("cluster_threshold", CLUSTER_THRESHOLD)
    if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 < thr <= 1:
        raise BadInput(f"cluster_threshold must be in (0, 1]; got {thr!r}")
    top = params.get("ls_top_k", 5)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise BadInput(f"ls_top_k must be a positive integer; got {top!r}")
    check_key_frequencies(params.get("key_frequencies"), grid.p)
    names = resolve_sites(model, params.get("site"))
    if params.get("restricted_skip", "mean") == "mean" and names["w_out"] is not None and names["resid_mid"] is None:
        raise BadInput("restricted loss with restricted_skip='mean' needs the block's hook_resid_mid; "
                       "give restricted_skip='keep'")
    return names


def fourier(
    model,
    data: TaskData,
    *,
    key_frequencies: Sequence[int] | None = None,
    cluster_threshold: float = CLUSTER_THRESHOLD,
    site: str | None = None,
    ls_top_k: int = 5,
    restricted_skip: str = "mean",
    batch_size: int = 4096,
) -> dict:
    """Every Fourier measure of definition 2 at one checkpoint (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    from groklens.probes.capture import capture
    from groklens.probes.grid import modular_grid
    from groklens.probes.interventions import run_patched

    names = check(model, data, {"key_frequencies": key_frequencies, "cluster_threshold": cluster_threshold,
                                "site": site, "ls_top_k": ls_top_k, "restricted_skip": restricted_skip})
    grid = modular_grid(data, "the Fourier analysis")
    p, pos = grid.p, int(data.readout_pos)
    site = names["site"]
    sites = [site] + ([names["resid_mid"]] if names["resid_mid"] else [])
    acts, logits = capture(model, data.inputs, sites, position=pos, batch_size=batch_size, return_logits=True)
    post = acts[site].double().numpy()  # [N, m]
    if post.ndim != 2:
        raise BadInput(f"{site} at the readout position is not a [inputs, neurons] activation (shape {post.shape})")

    out = neuron_fve(grid.to_grid(post), check_key_frequencies(key_frequencies, p), cluster_threshold)
    ks = [int(k) for k in out["key_frequencies"]]

    def w(name):
        return weight(model, name).detach().double().cpu().numpy()

    out.update(embedding_fve(w("embed.W_E"), p, ks))
    bounded = getattr(model.cfg, "unembed", "linear") == "bounded"
    W_U = w("unembed.W_U")
    W_out = w(names["w_out"]) if names["w_out"] else np.eye(W_U.shape[0])  # MLP: neurons feed W_U directly
    W_L = logit_map(W_out, W_U, bounded)
    out.update(least_squares_fve(post, W_L, grid.c, p, ls_top_k))

    labels = data.labels
    clean = logits[:, pos].double()
    V = key_directions(grid.c, p, ks)
    restricted, excluded = restrict_activations(post, V)
    patches = {site: (pos, torch.from_numpy(restricted))}
    if restricted_skip == "mean" and names["resid_mid"]:
        mid = acts[names["resid_mid"]].double()
        patches[names["resid_mid"]] = (pos, mid.mean(dim=0, keepdim=True).expand_as(mid))
    r_logits = run_patched(model, data.inputs, patches, batch_size=batch_size)[:, pos].double()
    e_logits = run_patched(model, data.inputs, {site: (pos, torch.from_numpy(excluded))},
                           batch_size=batch_size)[:, pos].double()
    tr, te = data.train_idx, data.test_idx
    out["restricted_loss"] = float(F.cross_entropy(r_logits[te], labels[te]))
    out["excluded_loss"] = float(F.cross_entropy(e_logits[tr], labels[tr]))
    out["test_loss"] = float(F.cross_entropy(clean[te], labels[te]))
    out["train_loss"] = float(F.cross_entropy(clean[tr], labels[tr]))
    return out
