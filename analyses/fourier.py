"""Fourier-circuit measures of modular-arithmetic models (docs/ANALYSES.md, "fourier").

Basis: b_0 = 1/sqrt(p), b_{2k-1} = sqrt(2/p) cos(2 pi k x / p), b_{2k} = sqrt(2/p) sin(2 pi k x / p)
for k = 1..floor(p/2), floor(p/2) included. For even p the sine of k = p/2 is identically zero and
its cosine (-1)^x is normalised by 1/sqrt(p) instead, so the basis is orthonormal with p rows for
every p (for the odd primes we use, exactly the usual basis).

Nanda et al.'s progress measures, as their code computes them:
  key_frequencies  the unique argmax frequencies of ALL live neurons (no threshold: Nanda's
                  `calculate_key_freqs` takes `np.unique(neuron_freqs)` over every neuron), unless
                  given. Neuron n's fraction for frequency k is its variance (MLP post-activations at
                  the readout position over the p^2 grid, centred per neuron, A_hat = B A B^T) in
                  the 3x3 block {0, 2k-1, 2k}^2; its frequency is the argmax over k = 1..p//2.
  neuron_fve      share of all neurons' variance in the UNION of the key frequencies' blocks (a
                  union of 3x3 blocks, never the outer product of a 1-D mask, which would add the
                  cross terms (2k-1, 2k') of two different frequencies).
  embedding_fve   power of B W_E (the `=` row dropped) in the key frequencies over all k >= 1.
  restricted_loss_all / excluded_loss_train  the FULL logits at the readout position (skip path
                  included) projected on (restricted: plus the per-class mean, Nanda's bias
                  correction) or off (excluded) the unit grid vectors cos(w_k c), sin(w_k c), k in
                  K; float64 cross-entropy over all inputs (restricted, Nanda's default) and the
                  train inputs (excluded, Nanda's). Also on the other splits, named by their split.
Named variants (our earlier readings, kept under their own names):
  key_frequencies_clustered  frequencies owning a neuron whose fraction is >= cluster_threshold;
                  neuron_fve_clustered, embedding_fve_clustered over that set.
  restricted_loss_neuron_test / excluded_loss_neuron_train  the projection applied to the neuron
                  activations only (restricted also replaces resid_mid at the readout position by
                  its grid mean, restricted_skip="mean"), over key_frequencies_clustered, through
                  scoped hooks; restricted on the test inputs, excluded on the train inputs.
Least squares (bounded-sphere paper, official notebook): W_L = W_U W_out in [vocab, neuron]
orientation (W_U's class vectors normalised first for bounded unembeddings); for frequency k
the activations projected on u_k = cos(w_k c) @ W_L and v_k = sin(w_k c) @ W_L, centred,
regressed by least squares on centred [cos(w_k c), sin(w_k c)], c the answer; FVE = 1 -
Var(resid)/Var(y) clipped at 0. ls_fve_by_frequency [p//2, 2] gives it for every k;
ls_fve = its mean over the key frequencies' directions; ls_fve_top_k (variant) = the mean over
the notebook's top `ls_top_k` frequencies by Fourier norm of W_L (ls_fve_per_frequency).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.registry import analysis, MODULAR_TASKS
from groklens.errors import BadInput
from groklens.probes.capture import capture, check_sites
from groklens.probes.grid import modular_grid
from groklens.probes.interventions import run_patched
from groklens.probes.linear import check_frequencies

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

CLUSTER_THRESHOLD = 0.85
TRIVIAL_KEY_SHARE = 0.5  # a key set holding more than this share of the frequencies explains little
RESTRICTED_SKIP = ("mean", "keep")


def trivial_key_note(steps: Sequence[int], n_keys: Sequence[float], p: int, where: str = "") -> str | None:
    """A warning when Nanda's key set covers more than TRIVIAL_KEY_SHARE of the p//2 frequencies
    at some trained checkpoint (at small p every frequency owns a neuron): the
    key-set means (neuron and embedding FVE, the LS key mean, restricted loss) then say little."""
    m = p // 2
    # step 0 left out: at initialization the key set holds most frequencies in every run
    hit = [(int(s), int(n)) for s, n in zip(steps, n_keys)
           if s > 0 and n is not None and np.isfinite(n) and n > TRIVIAL_KEY_SHARE * m]
    if not hit:
        return None
    shown = ", ".join(f"{n} at step {s}" for s, n in hit[:3])
    shown += f", ... ({len(hit)} checkpoints)" if len(hit) > 3 else ""
    return (f"warning: {where}Nanda's key set holds more than half of the {m} frequencies ({shown} of {m}): "
            "the key-set FVEs (neuron, embedding, least-squares key mean) are near 1 by construction; read the "
            "top-5 least-squares FVE or the restricted / excluded loss with a fixed key set instead")


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


def union_fve(E: np.ndarray, total: np.ndarray, key_frequencies: Sequence[int]) -> float:
    """Share of all neurons' variance (E, total from neuron_spectrum) in the key blocks' union."""
    all_var = total.sum()
    return float(E[block_mask(E.shape[0], key_frequencies)].sum() / all_var) if all_var > 0 else float("nan")


def neuron_fve(acts_grid: np.ndarray, key_frequencies: Sequence[int] | None = None,
               cluster_threshold: float = CLUSTER_THRESHOLD) -> dict:
    """Neuron FVE on activations [p, p, m]. key_frequencies: the given set, else Nanda's (the
    unique argmax frequencies of every live neuron, before any threshold);
    key_frequencies_clustered: the given set, else the frequencies owning a neuron whose
    fraction is >= cluster_threshold (our earlier rule, a named variant)."""
    E, total = neuron_spectrum(acts_grid)
    fractions = neuron_fractions(E, total)
    best = fractions.argmax(axis=1)  # first maximum on ties, as Nanda's strict `>` loop
    frac = fractions[np.arange(len(best)), best]
    live = total > 0
    freq = np.where(live, best + 1, 0)  # a dead neuron owns no frequency
    clustered = (frac >= cluster_threshold) & live
    if key_frequencies is None:
        nanda = sorted(int(k) for k in np.unique(freq[live]))
        by_cluster = sorted(int(k) for k in np.unique(freq[clustered]))
    else:
        nanda = by_cluster = [int(k) for k in key_frequencies]
    return {
        "key_frequencies": np.array(nanda, dtype=np.int64),
        "neuron_fve": union_fve(E, total, nanda),
        "key_frequencies_clustered": np.array(by_cluster, dtype=np.int64),
        "neuron_fve_clustered": union_fve(E, total, by_cluster),
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


def ls_fve_one(post: np.ndarray, W_L: np.ndarray, c: np.ndarray, p: int, k: int) -> np.ndarray:
    """[2] FVE of the activations' projections on cos(w_k v) @ W_L and sin(w_k v) @ W_L (v the
    vocabulary) regressed on centred [cos(w_k c), sin(w_k c)]; NaN for a constant projection."""
    w = 2 * np.pi * k / p
    X = np.stack([np.cos(w * c), np.sin(w * c)], axis=1)
    X = X - X.mean(axis=0)
    vocab = np.arange(p)
    out = np.full(2, np.nan)
    for j, wave in enumerate((np.cos(w * vocab), np.sin(w * vocab))):
        y = post @ (wave @ W_L)
        y = y - y.mean()
        var = y.var()
        if var <= 1e-300:  # e.g. sin(pi v) = 0 for k = p/2
            continue
        beta = np.linalg.lstsq(X, y, rcond=None)[0]
        out[j] = max(0.0, 1.0 - (y - X @ beta).var() / var)
    return out


def key_mean(by_k: np.ndarray, key_frequencies: Sequence[int]) -> float:
    """Mean of ls_fve_by_frequency's finite values over the key frequencies (NaN if none)."""
    vals = by_k[[int(k) - 1 for k in key_frequencies]]
    return float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")


def least_squares_fve(post: np.ndarray, W_L: np.ndarray, c: np.ndarray, p: int, top_k: int = 5,
                      key_frequencies: Sequence[int] | None = None) -> dict:
    """Least-squares FVE: post [N, m] activations over the grid, W_L [p, m], c [N] answers.

    ls_fve_by_frequency [p//2, 2] for every frequency k = 1..p//2; ls_fve = the mean of the key
    frequencies' values (NaN when none is given); ls_fve_top_k (a named variant) = the mean over
    the notebook's top `top_k` frequencies by Fourier norm of W_L, ls_fve_per_frequency [top_k, 2]."""
    W_L = np.asarray(W_L, dtype=np.float64)
    post = np.asarray(post, dtype=np.float64)
    by_k = np.stack([ls_fve_one(post, W_L, c, p, k) for k in range(1, p // 2 + 1)])
    norms = np.sqrt(frequency_power(fourier_basis(p) @ W_L, p))
    top = np.argsort(-norms, kind="stable")[: min(top_k, p // 2)] + 1
    per_top = by_k[top - 1]
    return {
        "ls_fve": key_mean(by_k, [] if key_frequencies is None else key_frequencies),
        "ls_fve_by_frequency": by_k,
        "ls_key_frequencies": top.astype(np.int64),
        "ls_fve_per_frequency": per_top,
        "ls_fve_top_k": key_mean(by_k, top),
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


def restrict_logits(logits: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nanda's (restricted, excluded) logits [N, v] for the orthonormal grid directions V [N, r]:
    restricted = the projection on V plus the mean over inputs of what it leaves out (his
    bias correction), excluded = the logits minus that projection (no correction)."""
    trig = V @ (V.T @ logits)
    return trig + (logits - trig).mean(axis=0, keepdims=True), logits - trig


def _ce(logits: np.ndarray, labels: np.ndarray, rows) -> float:
    """Float64 cross-entropy over `rows`."""
    import torch
    import torch.nn.functional as F

    rows = np.asarray(rows)
    return float(F.cross_entropy(torch.from_numpy(np.ascontiguousarray(logits[rows])), torch.from_numpy(labels[rows])))


def logit_losses(logits: np.ndarray, labels: np.ndarray, c: np.ndarray, p: int, key_frequencies: Sequence[int],
                 train: np.ndarray, test: np.ndarray) -> dict:
    """Nanda's restricted and excluded losses from the full logits [N, v] (float64), named by split."""
    every = np.arange(len(labels))
    restricted, excluded = restrict_logits(logits, key_directions(c, p, key_frequencies))
    out = {f"{name}_loss_{split}": _ce(x, labels, rows)
           for name, x in (("restricted", restricted), ("excluded", excluded))
           for split, rows in (("all", every), ("train", train), ("test", test))}
    # Nanda's calculate_excluded_loss: one frequency removed at a time, train inputs
    out["excluded_loss_train_per_frequency"] = np.array(
        [_ce(restrict_logits(logits, key_directions(c, p, [k]))[1], labels, train) for k in key_frequencies])
    out.update({f"{split}_loss": _ce(logits, labels, rows) for split, rows in
                (("all", every), ("train", train), ("test", test))})
    return out


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


KEY_SET_LAST = "last"  # key_frequencies="last": the key set of the run's last checkpoint (Nanda's curves)


def resolve_params(traj, params: dict) -> dict:
    """key_frequencies="last" -> the list of Nanda's key frequencies at the run's last checkpoint,
    so that every checkpoint is measured against one fixed set, as his progress-measure curves
    are; the list is what is stored with the results (a later "last" resolves to the same list)."""
    if params.get("key_frequencies") != KEY_SET_LAST:
        return params

    model, data = traj.model(int(traj.steps[-1])), traj.dataset()
    names = resolve_sites(model, params.get("site"))
    grid = modular_grid(data, "the Fourier analysis")
    post = capture(model, data.inputs, [names["site"]], position=int(data.readout_pos))[names["site"]].double().numpy()
    keys = neuron_fve(grid.to_grid(post))["key_frequencies"]
    return {**params, "key_frequencies": [int(k) for k in keys]}


def check(model, data: TaskData, params: dict) -> dict:
    grid = modular_grid(data, "the Fourier analysis")
    if params.get("restricted_skip", "mean") not in RESTRICTED_SKIP:
        raise BadInput(f"restricted_skip must be one of {', '.join(RESTRICTED_SKIP)}; "
                       f"got {params['restricted_skip']!r}")
    thr = params.get("cluster_threshold", CLUSTER_THRESHOLD)
    if isinstance(thr, bool) or not isinstance(thr, (int, float)) or not 0 < thr <= 1:
        raise BadInput(f"cluster_threshold must be in (0, 1]; got {thr!r}")
    top = params.get("ls_top_k", 5)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise BadInput(f"ls_top_k must be a positive integer; got {top!r}")
    check_key_frequencies(params.get("key_frequencies"), grid.p)
    names = resolve_sites(model, params.get("site"))
    if params.get("restricted_skip", "mean") == "mean" and names["w_out"] is not None and names["resid_mid"] is None:
        raise BadInput("the neuron-only restricted loss with restricted_skip='mean' needs the block's hook_resid_mid; "
                       "give restricted_skip='keep'")
    return names


def _neuron_losses(model, data: TaskData, acts: dict, names: dict, c: np.ndarray, p: int,
                   key_frequencies: Sequence[int], restricted_skip: str, batch_size: int) -> dict:
    """The neuron-only variant: restricted_loss_neuron_test, excluded_loss_neuron_train."""
    import torch
    import torch.nn.functional as F

    pos, site = int(data.readout_pos), names["site"]
    post = acts[site].double().numpy()
    restricted, excluded = restrict_activations(post, key_directions(c, p, key_frequencies))
    patches = {site: (pos, torch.from_numpy(restricted))}
    if restricted_skip == "mean" and names["resid_mid"]:
        mid = acts[names["resid_mid"]].double()
        patches[names["resid_mid"]] = (pos, mid.mean(dim=0, keepdim=True).expand_as(mid))
    r_logits = run_patched(model, data.inputs, patches, batch_size=batch_size)[:, pos].double()
    e_logits = run_patched(model, data.inputs, {site: (pos, torch.from_numpy(excluded))},
                           batch_size=batch_size)[:, pos].double()
    labels, tr, te = data.labels, data.train_idx, data.test_idx
    return {"restricted_loss_neuron_test": float(F.cross_entropy(r_logits[te], labels[te])),
            "excluded_loss_neuron_train": float(F.cross_entropy(e_logits[tr], labels[tr]))}


@analysis(
    "fourier", "Fourier circuit: Nanda's key frequencies, neuron/embedding/least-squares FVE, restricted/excluded loss",
    check=check, tasks=MODULAR_TASKS, resolve=resolve_params, export="fourier_analysis",
    measures=[("fve_neuron", "neuron_fve", "Fourier FVE (neuron, Nanda)"),
              ("fve_ls", "ls_fve", "Fourier FVE (least squares, mean over the key frequencies)"),
              ("fve_ls_top5", "ls_fve_top_k", "Fourier FVE (least squares, top-5 mean)"),
              ("n_key_freqs", "n_key_frequencies", "key frequencies (Nanda's set): how many")], order=10)
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
    """Every Fourier measure at one checkpoint (see the module docstring and docs/ANALYSES.md)."""
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
    out["n_key_frequencies"] = len(ks)
    out["key_share"] = len(ks) / (p // 2)  # > TRIVIAL_KEY_SHARE: the key-set FVEs are near 1 by construction
    ks_clustered = [int(k) for k in out["key_frequencies_clustered"]]

    def w(name):
        return weight(model, name).detach().double().cpu().numpy()

    W_E = w("embed.W_E")
    out.update(embedding_fve(W_E, p, ks))
    out["embedding_fve_clustered"] = embedding_fve(W_E, p, ks_clustered)["embedding_fve"]
    bounded = getattr(model.cfg, "unembed", "linear") == "bounded"
    W_U = w("unembed.W_U")
    W_out = w(names["w_out"]) if names["w_out"] else np.eye(W_U.shape[0])  # MLP: neurons feed W_U directly
    out.update(least_squares_fve(post, logit_map(W_out, W_U, bounded), grid.c, p, ls_top_k, ks))
    out["ls_fve_clustered"] = key_mean(out["ls_fve_by_frequency"], ks_clustered)

    labels = data.labels.numpy()
    out.update(logit_losses(logits[:, pos].double().numpy(), labels, grid.c, p, ks,
                            data.train_idx.numpy(), data.test_idx.numpy()))
    out.update(_neuron_losses(model, data, acts, names, grid.c, p, ks_clustered, restricted_skip, batch_size))
    return out
