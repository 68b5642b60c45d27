"""Fourier measures against synthetic weights and activations of known frequency content, and
against independent computations (numpy FFT, the official least-squares notebook's algorithm,
a re-typing of Nanda et al.'s progress-measures code run on real tiny groklens runs)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.analyses.fourier import (
    block_mask,
    embedding_fve,
    fourier,
    fourier_basis,
    frequency_rows,
    least_squares_fve,
    neuron_fve,
)
from groklens.errors import BadInput
from groklens.probes.capture import capture
from groklens.probes.grid import modular_grid
from tests.analyses.builders import NoAttention, modular_data, tiny_transformer


@pytest.mark.parametrize("p", [5, 7, 10, 23, 113])
def test_basis_is_orthonormal_and_includes_the_last_frequency(p):
    B = fourier_basis(p)
    assert B.shape == (p, p)
    np.testing.assert_allclose(B @ B.T, np.eye(p), atol=1e-12)
    k = p // 2
    x = np.arange(p)
    row = B[frequency_rows(p, k)[0]]
    assert abs(abs(row @ np.cos(2 * np.pi * k * x / p)) - np.linalg.norm(np.cos(2 * np.pi * k * x / p))) < 1e-9


def test_basis_coefficients_match_numpy_fft():
    p = 23
    x = np.random.default_rng(1).standard_normal(p)
    coeffs = fourier_basis(p) @ x
    X = np.fft.fft(x)
    assert coeffs[0] == pytest.approx(X[0].real / math.sqrt(p))
    for k in range(1, p // 2 + 1):
        cos_row, sin_row = frequency_rows(p, k)
        assert coeffs[cos_row] == pytest.approx(math.sqrt(2 / p) * X[k].real, abs=1e-12)
        assert coeffs[sin_row] == pytest.approx(-math.sqrt(2 / p) * X[k].imag, abs=1e-12)


def test_embedding_fve_recovers_a_known_fraction_including_k_p_over_2():
    p, d = 23, 12
    rng = np.random.default_rng(0)
    x = np.arange(p)[:, None]
    key = [3, 11]  # 11 = p // 2
    amp = {k: rng.standard_normal((2, d)) for k in range(1, p // 2 + 1)}
    for k in amp:
        if k not in key:
            amp[k] *= 0.15  # "noise": every other frequency, small
    W = 5.0 + sum(amp[k][0] * np.cos(2 * np.pi * k * x / p) + amp[k][1] * np.sin(2 * np.pi * k * x / p) for k in amp)
    W_E = np.vstack([W, 1e6 * np.ones((1, d))])  # the `=` row must be dropped
    # sum_x cos^2 = sum_x sin^2 = p/2 for 1 <= k <= p//2 (p odd): power of k = p/2 * sum of squared amplitudes
    power = {k: (amp[k] ** 2).sum() for k in amp}
    expected = sum(power[k] for k in key) / sum(power.values())
    out = embedding_fve(W_E, p, key)
    assert out["embedding_fve"] == pytest.approx(expected, rel=1e-10)
    top2 = sorted((np.argsort(-out["embedding_power"])[:2] + 1).tolist())
    assert top2 == key


def _grid(p):
    a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
    return a, b


def test_neuron_fve_recovers_frequencies_fractions_and_key_set():
    p = 23
    a, b = _grid(p)
    w = lambda k: 2 * np.pi * k / p
    rng = np.random.default_rng(2)
    neurons, truth = [], []
    for k, amp, noise in [(2, 1.0, 0.3), (7, 2.0, 0.5), (11, 1.5, 0.2), (11, 1.0, 0.1), (7, 0.7, 0.0)]:
        phase = rng.uniform(0, 2 * np.pi)
        # the noise cos(w_5 a) cos(w_9 b) lies in the cross block (2*5-1, 2*9-1): in no frequency's block
        n = 3.0 + amp * np.cos(w(k) * (a + b) + phase) + noise * np.cos(w(5) * a) * np.cos(w(9) * b)
        neurons.append(n)
        # sum over the grid: cos^2(w(a+b)+phi) -> p^2/2, (cos a cos b)^2 -> p^2/4
        truth.append((k, amp**2 / 2 / (amp**2 / 2 + noise**2 / 4)))
    unclustered = rng.standard_normal((p, p))  # spread over every frequency
    acts = np.stack(neurons + [unclustered], axis=-1)
    out = neuron_fve(acts)
    assert out["key_frequencies_clustered"].tolist() == [2, 7, 11]
    assert out["n_clustered"] == 5
    for i, (k, frac) in enumerate(truth):
        assert out["neuron_frequency"][i] == k
        assert out["neuron_fraction"][i] == pytest.approx(frac, rel=1e-10)
    assert out["neuron_fraction"][-1] < 0.85
    # pooled FVE over K: the signal energy of every neuron over all their variance
    centred = acts - acts.mean(axis=(0, 1))
    signal = sum(amp**2 / 2 for _, amp, _ in [(0, 1.0, 0), (0, 2.0, 0), (0, 1.5, 0), (0, 1.0, 0), (0, 0.7, 0)]) * p * p
    U = unclustered - unclustered.mean()
    # the random neuron's share in K's blocks, by an independent route: project on the K-blocks' span with FFT
    F2 = np.fft.fft2(U)
    in_k = np.zeros((p, p), dtype=bool)
    for k in (2, 7, 11):
        for u in (0, k, p - k):
            for v in (0, k, p - k):
                in_k[u, v] = True
    u_in = (np.abs(F2[in_k]) ** 2).sum() / (p * p)  # Parseval
    expected = (signal + u_in) / (centred**2).sum()
    assert out["neuron_fve_clustered"] == pytest.approx(expected, rel=1e-9)
    # Nanda's key set also takes the unclustered neuron's own best frequency (before the 0.85 cut)
    own = [(np.abs(F2[np.ix_((0, k, p - k), (0, k, p - k))]) ** 2).sum() for k in range(1, p // 2 + 1)]
    k_random = int(np.argmax(own)) + 1
    assert out["key_frequencies"].tolist() == sorted({2, 7, 11, k_random})
    if k_random not in (2, 7, 11):
        u_all = u_in + own[k_random - 1] / (p * p)
        assert out["neuron_fve"] == pytest.approx((signal + u_all) / (centred**2).sum(), rel=1e-9)


def test_2d_mask_is_a_union_of_blocks_not_an_outer_product():
    p = 13
    a, b = _grid(p)
    w = lambda k: 2 * np.pi * k / p
    cross = np.cos(w(2) * a) * np.cos(w(5) * b)  # both frequencies key, but a cross term
    assert neuron_fve(cross[..., None], key_frequencies=[2, 5])["neuron_fve"] == pytest.approx(0.0, abs=1e-12)
    linear = np.cos(w(6) * a)[..., None]  # depends on a alone: the (2k-1, 0) entry of k's block
    assert neuron_fve(linear, key_frequencies=[6])["neuron_fve"] == pytest.approx(1.0, rel=1e-12)
    mask = block_mask(p, [2, 5])
    assert mask.sum() == 2 * 9 - 1  # two 3x3 blocks sharing the (0, 0) entry
    assert not mask[3, 9] and not mask[9, 3]


def _notebook_ls_fve(W_L, acts, p, top_k=5):
    """The bounded-sphere paper's official notebook (Fourier_Analysis_Last.ipynb), re-typed in torch."""
    W_L, acts = torch.as_tensor(W_L), torch.as_tensor(acts)
    norms = torch.linalg.norm(torch.abs(torch.fft.fft(W_L, dim=0)), dim=1)[: p // 2 + 1]
    norms[0] = 0
    top = torch.argsort(norms, descending=True)[:top_k].tolist()
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    a, b = a.flatten().double(), b.flatten().double()
    c = torch.arange(p).double()
    out = []
    for k in top:
        wk = 2 * math.pi * k / p
        u, v = torch.cos(wk * c) @ W_L, torch.sin(wk * c) @ W_L
        x1, x2 = torch.cos(wk * (a + b)), torch.sin(wk * (a + b))
        X = torch.stack([x1 - x1.mean(), x2 - x2.mean()], dim=1)
        for act in (acts @ u, acts @ v):
            y = act - act.mean()
            beta = torch.linalg.lstsq(X, y).solution
            out.append(max(0.0, float(1 - torch.var(y - X @ beta) / torch.var(y))))
    return top, np.array(out).reshape(-1, 2)


def test_least_squares_fve_matches_the_official_notebook_algorithm():
    model, data = tiny_transformer(p=11, train_steps=40)
    grid = modular_grid(data)
    post = capture(model, data.inputs, ["blocks.0.mlp.hook_post"], position=2)["blocks.0.mlp.hook_post"].double()
    post_grid_order = post.numpy()[grid.cell.reshape(-1)]  # rows in the notebook's (a, b) meshgrid order
    W_L = (model.unembed.W_U.T.double() @ model.blocks[0].mlp.W_out.T.double()).detach().numpy()
    top, ref = _notebook_ls_fve(W_L, post_grid_order, 11, top_k=3)
    ours = least_squares_fve(post.numpy(), W_L, grid.c, 11, top_k=3)
    assert ours["ls_key_frequencies"].tolist() == top
    np.testing.assert_allclose(ours["ls_fve_per_frequency"], ref, rtol=1e-8, atol=1e-10)
    assert ours["ls_fve_top_k"] == pytest.approx(ref.mean(), rel=1e-8)
    np.testing.assert_allclose(ours["ls_fve_by_frequency"][np.array(top) - 1], ref, rtol=1e-8, atol=1e-10)
    assert np.isnan(ours["ls_fve"])  # no key set given: no summary


def test_the_papers_reading_through_the_analysis_on_a_trained_fully_bounded_sphere(tmp_path):
    """groklens' `fourier` analysis on a trained checkpoint of the fully bounded sphere (wd 0,
    normalized unembedding, the notebook's spherical_nowd) equals the notebook re-typed from the
    raw parameters: W_L = normalize(W_U rows) @ W_out, top 5 by |FFT|, ten U/V values, their mean."""
    import torch.nn.functional as Fn

    from groklens.analyses.runner import choose_checkpoints
    from groklens.checkpoints import Trajectory
    from tests.helpers import train_tiny

    train_tiny(tmp_path / "s.h5", p=11, steps=300, eval_every=20, checkpoint_every=100, lr=1e-2, norm="sphere",
               unembed="bounded", weight_decay=0.0, causal=False, mlp_bias=True, init_scheme="torch")
    traj = Trajectory(tmp_path / "s.h5")
    step = choose_checkpoints(traj, "phases@0.99")[0]  # the first evaluation at 0.99 if reached, else the end
    model, data = traj.model(step), traj.dataset()
    out = fourier(model, data)
    params = traj.params(step)  # the raw tensors, TransformerLens-shaped: W_U [d_model, p], W_out [m, d_model]
    W_L = (Fn.normalize(params["unembed.W_U"].double().T, dim=1) @ params["blocks.0.mlp.W_out"].double().T).numpy()
    grid = modular_grid(data)
    post = capture(model, data.inputs, ["blocks.0.mlp.hook_post"], position=2)["blocks.0.mlp.hook_post"].double()
    top, ref = _notebook_ls_fve(W_L, post.numpy()[grid.cell.reshape(-1)], 11, top_k=5)
    assert out["ls_key_frequencies"].tolist() == top
    np.testing.assert_allclose(out["ls_fve_per_frequency"], ref, rtol=1e-7, atol=1e-9)
    assert out["ls_fve_top_k"] == pytest.approx(ref.mean(), rel=1e-7)


def test_one_planted_frequency_scores_one_as_the_summary():
    """Neurons carrying one frequency k0 of the answer plus small noise: its two directions
    explain ~all their variance, every other frequency ~none. The summary over the key set
    ({k0}, what the neurons own) is ~1; the notebook's top-5 mean dilutes it to ~2/10."""
    p, m, k0 = 23, 40, 6
    a, b = (x.reshape(-1) for x in _grid(p))
    c = (a + b) % p
    rng = np.random.default_rng(3)
    w = 2 * np.pi * k0 / p
    phase, amp = rng.uniform(0, 2 * np.pi, m), rng.uniform(0.5, 2.0, m)
    post = 1.0 + amp * np.cos(w * c[:, None] + phase) + 0.02 * rng.standard_normal((p * p, m))
    W_L = rng.standard_normal((p, m))
    keys = neuron_fve(post.reshape(p, p, m))["key_frequencies"]
    assert keys.tolist() == [k0]
    out = least_squares_fve(post, W_L, c, p, top_k=5, key_frequencies=keys)
    # independently: regress each direction's projection on cos/sin(w_k c) for every k
    for k in range(1, p // 2 + 1):
        wk = 2 * np.pi * k / p
        X = np.stack([np.ones(p * p), np.cos(wk * c), np.sin(wk * c)], axis=1)
        for j, wave in enumerate((np.cos(wk * np.arange(p)), np.sin(wk * np.arange(p)))):
            y = post @ (wave @ W_L)
            r2 = 1 - ((y - X @ np.linalg.lstsq(X, y, rcond=None)[0]) ** 2).sum() / ((y - y.mean()) ** 2).sum()
            assert out["ls_fve_by_frequency"][k - 1, j] == pytest.approx(max(r2, 0.0), abs=1e-9)
    assert out["ls_fve"] > 0.99
    assert out["ls_fve"] == pytest.approx(out["ls_fve_by_frequency"][k0 - 1].mean())
    assert out["ls_fve_top_k"] < 0.25  # the variant the summary replaces


# ---- Nanda et al.'s progress-measures code (helpers.py, transformers.py), re-typed in torch.
# Deliberate differences: float64 cross-entropy (his casts to float32), frequencies up to p//2
# inclusive (his loop `range(1, p//2)` misses the last one), dead neurons own no frequency
# (his loop leaves them at -1 through NaN comparisons).
def _nanda_basis(p):
    rows = [torch.ones(p, dtype=torch.float64) / math.sqrt(p)]
    for i in range(1, p // 2 + 1):
        for f in (torch.cos, torch.sin):
            v = f(2 * math.pi * torch.arange(p, dtype=torch.float64) * i / p)
            rows.append(v / v.norm())
    return torch.stack(rows)


def _nanda_key_freqs(neuron_acts, p, basis, tie=1e-9):
    """calculate_key_freqs: unique best frequency of EVERY neuron, no threshold. Also returns, for
    neurons whose best fractions tie within `tie` (e.g. a neuron active on a single input has a
    flat spectrum), the tied frequencies: there the argmax is decided by the last bit of the
    arithmetic, differently on another CPU, in his code as in ours."""
    centred = neuron_acts - neuron_acts.mean(0, keepdim=True)
    sq = torch.einsum("xyz,fx,Fy->fFz", centred.reshape(p, p, -1), basis, basis)
    freqs, tied = [], []
    for ni in range(sq.shape[-1]):
        den = sq[:, :, ni].pow(2).sum().item()
        if den == 0:
            continue
        best, best_freq, fracs = -1e6, -1, []
        for freq in range(1, p // 2 + 1):
            idx = [0, 2 * freq - 1, 2 * freq]
            frac = sq[:, :, ni][[[i] * 3 for i in idx], [idx] * 3].pow(2).sum() / den
            fracs.append(float(frac))
            if frac > best:
                best, best_freq = frac, freq
        close = [f + 1 for f, v in enumerate(fracs) if v >= float(best) - tie]
        if len(close) > 1:
            tied.append(close)
        else:
            freqs.append(best_freq)
    return np.unique(freqs), tied


def _nanda_term(x, y, basis):
    return (basis[x][:, None] * basis[y][None, :]).flatten()


def _nanda_cos_sin_xpy(logits, freq, basis):
    cos_dir = (_nanda_term(2 * freq - 1, 2 * freq - 1, basis) - _nanda_term(2 * freq, 2 * freq, basis)) / math.sqrt(2)
    sin_dir = (_nanda_term(2 * freq, 2 * freq - 1, basis) + _nanda_term(2 * freq - 1, 2 * freq, basis)) / math.sqrt(2)
    return [d[:, None] @ (d[None, :] @ logits) for d in (cos_dir, sin_dir)]


def _nanda_loss(logits, labels, rows):
    logprobs = F.log_softmax(logits, dim=-1)
    return float(-torch.gather(logprobs, index=labels[:, None], dim=-1)[rows].mean())


@pytest.mark.parametrize("norm", ["none", "ln"])
def test_nandas_measures_equal_his_code_on_real_runs(tmp_path, norm):
    from groklens.checkpoints import Trajectory
    from tests.helpers import train_tiny

    train_tiny(tmp_path / "run.h5", p=11, steps=300, eval_every=50, checkpoint_every=150, lr=1e-2, norm=norm)
    traj = Trajectory(tmp_path / "run.h5")
    model, data = traj.model(traj.steps[-1]), traj.dataset()
    out = fourier(model, data)
    p, grid = 11, modular_grid(data)
    order = torch.from_numpy(grid.cell.reshape(-1))  # his batch: (x, y) row-major
    acts, logits = capture(model, data.inputs[order], ["blocks.0.mlp.hook_post"], position=2, return_logits=True)
    logits, labels = logits[:, 2].double(), data.labels[order]
    is_train = torch.zeros(len(order), dtype=torch.bool)
    is_train[torch.isin(order, data.train_idx)] = True
    basis = _nanda_basis(p)
    strict, tied = _nanda_key_freqs(acts["blocks.0.mlp.hook_post"].double(), p, basis)
    ours = set(out["key_frequencies"].tolist())
    # every untied neuron's frequency is ours; anything more is a tied neuron's pick among its ties
    assert set(strict.tolist()) <= ours and ours - set(strict.tolist()) <= {f for t in tied for f in t}
    assert len(ours) >= len(out["key_frequencies_clustered"])
    keys = out["key_frequencies"]  # his losses below, on the key set (tie picks included)
    comps = {k: _nanda_cos_sin_xpy(logits, int(k), basis) for k in keys}
    trig = sum(c + s for c, s in comps.values())
    restricted = (logits - trig).mean(0) + trig  # calculate_trig_loss: bias_correction=True, mode='all'
    assert out["restricted_loss_all"] == pytest.approx(_nanda_loss(restricted, labels, slice(None)), rel=1e-9)
    assert out["excluded_loss_train"] == pytest.approx(_nanda_loss(logits - trig, labels, is_train), rel=1e-9)
    per_freq = [_nanda_loss(logits - c - s, labels, is_train) for c, s in comps.values()]  # calculate_excluded_loss
    np.testing.assert_allclose(out["excluded_loss_train_per_frequency"], per_freq, rtol=1e-9)
    assert out["all_loss"] == pytest.approx(_nanda_loss(logits, labels, slice(None)), rel=1e-9)


def test_neuron_only_variant_matches_its_closed_form():
    """Our earlier reading, kept as restricted_loss_neuron_test / excluded_loss_neuron_train: the
    key directions projected out of the neuron activations only (not Nanda's logits)."""
    model, data = tiny_transformer(p=11, train_steps=60)
    K = [2, 5]
    out = fourier(model, data, key_frequencies=K)
    # 1 layer, no norm, no biases: logits = resid_mid W_U + post W_out W_U; restricted_skip="mean"
    # replaces resid_mid by its mean, i.e. Nanda-style bias correction of the neuron-only logits
    x = data.inputs
    acts, logits = capture(model, x, ["blocks.0.mlp.hook_post"], position=2, return_logits=True)
    post, logits = acts["blocks.0.mlp.hook_post"].double(), logits[:, 2].double()
    W_L = (model.blocks[0].mlp.W_out @ model.unembed.W_U).detach().double()
    c = data.labels.double()
    approx = post.mean(0, keepdim=True).expand_as(post).clone()
    proj = torch.zeros_like(post)
    for k in K:
        for f in (torch.cos, torch.sin):
            v = f(2 * math.pi * k * c / 11)
            v = v / v.norm()
            proj += v[:, None] * (v @ post)[None, :]
    approx += proj
    restricted = approx @ W_L
    restricted += logits.mean(0, keepdim=True) - restricted.mean(0, keepdim=True)
    excluded = logits - proj @ W_L
    te, tr = data.test_idx, data.train_idx
    assert out["restricted_loss_neuron_test"] == pytest.approx(
        float(F.cross_entropy(restricted[te], data.labels[te])), rel=1e-5)
    assert out["excluded_loss_neuron_train"] == pytest.approx(
        float(F.cross_entropy(excluded[tr], data.labels[tr])), rel=1e-5)
    assert out["test_loss"] == pytest.approx(float(F.cross_entropy(logits[te], data.labels[te])), rel=1e-6)
    assert out["key_frequencies"].tolist() == K == out["key_frequencies_clustered"].tolist()


def test_fourier_refuses_what_it_cannot_measure():
    _, data = modular_data(p=7)
    with pytest.raises(BadInput, match="needs MLP neurons"):
        fourier(NoAttention(8, 7), data)
    model, data = tiny_transformer(p=7)
    with pytest.raises(BadInput, match="frequencies must be integers in 1..3"):
        fourier(model, data, key_frequencies=[0])
    _, div = modular_data(p=7, task="div")
    with pytest.raises(BadInput, match="full p x p grid"):
        fourier(model, div)
