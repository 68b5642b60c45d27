"""Fourier measures against synthetic weights and activations of known frequency content, and
against independent computations (numpy FFT, the official notebook's algorithm, Nanda's
closed-form restricted/excluded logits)."""

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
    assert out["key_frequencies"].tolist() == [2, 7, 11]
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
    assert out["neuron_fve"] == pytest.approx(expected, rel=1e-9)


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
    assert ours["ls_fve"] == pytest.approx(ref.mean(), rel=1e-8)


def test_restricted_and_excluded_loss_match_nandas_closed_form():
    model, data = tiny_transformer(p=11, train_steps=60)
    K = [2, 5]
    out = fourier(model, data, key_frequencies=K)
    # Nanda's linear read-out (1 layer, no norm, no biases): logits = resid_mid W_U + post W_out W_U
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
    assert out["restricted_loss"] == pytest.approx(float(F.cross_entropy(restricted[te], data.labels[te])), rel=1e-5)
    assert out["excluded_loss"] == pytest.approx(float(F.cross_entropy(excluded[tr], data.labels[tr])), rel=1e-5)
    assert out["test_loss"] == pytest.approx(float(F.cross_entropy(logits[te], data.labels[te])), rel=1e-6)
    assert out["key_frequencies"].tolist() == K


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
