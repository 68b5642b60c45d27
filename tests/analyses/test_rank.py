"""Effective ranks of matrices built with prescribed singular values."""

import math

import numpy as np
import pytest
import torch

from groklens.analyses.rank import (
    effective_rank,
    matrix_ranks,
    participation_ratio,
    rankme,
    roy_vetterli,
    singular_values,
)
from groklens.errors import BadInput
from tests.analyses.builders import tiny_transformer


def _with_singular_values(s, n=60, d=None, zero_mean=True, seed=0):
    """X [n, d] = U diag(s) V^T with orthonormal U (orthogonal to the ones vector if zero_mean)."""
    rng = np.random.default_rng(seed)
    r = len(s)
    d = d or r + 3
    G = rng.standard_normal((n, r))
    if zero_mean:
        G -= G.mean(axis=0)
    U = np.linalg.qr(G)[0]
    V = np.linalg.qr(rng.standard_normal((d, r)))[0]
    return U @ np.diag(s) @ V.T


def _entropy_rank(q):
    q = q[q > 0]
    return math.exp(-(q * np.log(q)).sum())


def test_prescribed_singular_values_give_the_closed_forms():
    s = np.array([5.0, 3.0, 2.0, 0.5, 0.1])
    X = _with_singular_values(s)
    np.testing.assert_allclose(np.sort(singular_values(X, centred=False))[::-1][:5], s, rtol=1e-12)
    out = matrix_ranks(X, "X")
    p = s / s.sum()
    assert out["roy_vetterli_uncentred@X"] == pytest.approx(_entropy_rank(p), rel=1e-10)
    assert out["roy_vetterli_centred@X"] == pytest.approx(_entropy_rank(p), rel=1e-10)  # columns have zero mean
    assert out["participation_ratio_uncentred@X"] == pytest.approx((s**2).sum() ** 2 / (s**4).sum(), rel=1e-10)
    # RankMe: p_k = s_k / ||s||_1 + 1e-7 over all min(n, d) singular values (here 3 of them are 0)
    q = np.concatenate([p, np.zeros(3)]) + 1e-7
    assert out["rankme@X"] == pytest.approx(math.exp(-(q * np.log(q)).sum()), rel=1e-8)


def test_equal_singular_values_have_full_effective_rank_and_centring_is_named():
    s = np.ones(4) * 2.0
    X = _with_singular_values(s, d=4)
    assert roy_vetterli(s) == pytest.approx(4.0)
    assert participation_ratio(s) == pytest.approx(4.0)
    assert rankme(np.array([1.0, 0, 0, 0])) == pytest.approx(
        math.exp(-((1 + 1e-7) * math.log(1 + 1e-7) + 3e-7 * math.log(1e-7))), rel=1e-12)
    shifted = X + 100.0  # a large common mean: one dominant uncentred direction, centred unchanged
    out = matrix_ranks(shifted, "X")
    assert out["roy_vetterli_centred@X"] == pytest.approx(4.0, rel=1e-9)
    assert out["participation_ratio_centred@X"] == pytest.approx(4.0, rel=1e-9)
    assert out["participation_ratio_uncentred@X"] < 1.01


def test_hook_sites_and_weights_of_a_model():
    model, data = tiny_transformer(p=7)
    out = effective_rank(model, data, sites=["blocks.0.mlp.hook_post"], weights=["blocks.0.attn.W_Q", "unembed.W_U"])
    # independent capture: one forward pass with a plain PyTorch hook
    seen = {}
    h = model.blocks[0].mlp.hook_post.register_forward_hook(lambda m, i, o: seen.setdefault("x", o.detach()))
    with torch.no_grad():
        model(data.inputs)
    h.remove()
    X = seen["x"][:, 2].double().numpy()
    s_unc = np.linalg.svd(X, compute_uv=False)
    s_cen = np.linalg.svd(X - X.mean(0), compute_uv=False)
    site = "blocks.0.mlp.hook_post"
    assert out[f"roy_vetterli_uncentred@{site}"] == pytest.approx(_entropy_rank(s_unc / s_unc.sum()), rel=1e-9)
    assert out[f"roy_vetterli_centred@{site}"] == pytest.approx(_entropy_rank(s_cen / s_cen.sum()), rel=1e-9)
    W_Q = model.blocks[0].attn.W_Q.detach().double().numpy()  # [h, d, e]
    s_q = np.linalg.svd(np.concatenate(list(W_Q), axis=1), compute_uv=False)  # [d, h*e]
    assert out["roy_vetterli_uncentred@blocks.0.attn.W_Q"] == pytest.approx(_entropy_rank(s_q / s_q.sum()), rel=1e-9)
    assert "roy_vetterli_centred@unembed.W_U" not in out
    with pytest.raises(BadInput, match="unknown weight"):
        effective_rank(model, data, weights=["W_nope"])
