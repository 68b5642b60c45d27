"""Proposition (i) as a measurement: the weight-space regularization the activation-norm penalty
induces, checked on a linear model whose answer is written down by hand, against the
gradient of the trainer's own penalty term, and on a trained transformer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from groklens.analyses.induced import induced_regularization, penalty_gradients, rate_stats, singular_rates
from groklens.errors import BadInput
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from tests.analyses.builders import tiny_transformer


class Linear(HookedRootModule):
    """h = x W at one hook point, logits h: the penalty's gradient has a closed form."""

    def __init__(self, W: np.ndarray):
        super().__init__()
        self.W = nn.Parameter(torch.tensor(W, dtype=torch.float64))
        self.hook_h = HookPoint()
        self.setup()

    def forward(self, x):  # x [n, d_in] float
        return self.hook_h(x @ self.W)


def _closed_form_gradient(W, X):
    """dP/dW for P = (1/n) sum_i (||x_i W|| - sqrt(d))^2 / d:
    (2/(n d)) sum_i (||h_i|| - sqrt(d)) x_i (h_i/||h_i||)^T."""
    H = X @ W
    n, d = H.shape
    r = np.linalg.norm(H, axis=1)
    coef = (r - math.sqrt(d)) / r
    return 2.0 / (n * d) * np.einsum("i,ia,ib->ab", coef, X, H)


def test_the_penalty_gradient_is_the_closed_form_on_a_linear_model():
    rng = np.random.default_rng(0)
    W, X = rng.standard_normal((5, 4)), rng.standard_normal((30, 5))
    value, grads = penalty_gradients(Linear(W), torch.tensor(X), ["hook_h"], ["W"])
    H = X @ W
    assert value == pytest.approx(((np.linalg.norm(H, axis=1) - 2.0) ** 2 / 4).mean(), rel=1e-12)
    np.testing.assert_allclose(grads["W"], _closed_form_gradient(W, X), rtol=1e-10, atol=1e-14)


def test_weight_decay_is_isotropic_by_every_measure():
    W = np.random.default_rng(1).standard_normal((6, 4))
    stats = rate_stats(W, 0.3 * W)  # weight decay's gradient is c W
    np.testing.assert_allclose(stats["rates"], 0.3, rtol=1e-12)
    assert stats["anisotropy"] == pytest.approx(0.0, abs=1e-12)
    assert stats["diag_share"] == pytest.approx(1.0) and stats["alignment"] == pytest.approx(1.0)


def test_a_diagonal_model_on_one_hot_inputs_gets_the_hand_derived_rates():
    # W = diag(w), inputs e_1..e_4 (n = d = 4): ||h_j|| = |w_j|, so
    # dP/dW_jj = (2/16)(|w_j| - 2) sign(w_j) and rate_j = (1 - 2/|w_j|) / 8: each singular direction
    # is shrunk at its own rate (anisotropic), and a direction grows when its radius is below sqrt(d)
    w = np.array([4.0, -3.0, 1.0, 0.5])
    model, X = Linear(np.diag(w)), torch.eye(4, dtype=torch.float64)
    _, grads = penalty_gradients(model, X, ["hook_h"], ["W"])
    np.testing.assert_allclose(np.diag(grads["W"]), (np.abs(w) - 2) * np.sign(w) / 8, rtol=1e-12)
    rates = singular_rates(np.diag(w), grads["W"])  # in descending |w| order
    expected = (1 - 2 / np.sort(np.abs(w))[::-1]) / 8
    np.testing.assert_allclose(rates, expected, rtol=1e-12)
    stats = rate_stats(np.diag(w), grads["W"])
    assert stats["anisotropy"] == pytest.approx(expected.std() / np.abs(expected).mean())
    assert stats["diag_share"] == pytest.approx(1.0)  # diagonal W, diagonal G: no rotation
    # data dependence: without the inputs e_3, e_4 the penalty does not act on those directions
    _, half = penalty_gradients(model, X[:2], ["hook_h"], ["W"])
    np.testing.assert_allclose(singular_rates(np.diag(w), half["W"]), [(1 - 2 / 4) / 4, (1 - 2 / 3) / 4, 0, 0],
                               atol=1e-12)


def _second_moment(W, X):
    """M = (2/(n d)) sum_i (1 - sqrt(d)/||h_i||) x_i^T x_i for h_i = x_i W: the penalty's gradient is
    G = M W, so along W's singular directions (W v_k = s_k u_k) rate_k = u_k^T M u_k."""
    H = X @ W
    n, d = H.shape
    coef = 1 - math.sqrt(d) / np.linalg.norm(H, axis=1)
    return 2.0 / (n * d) * np.einsum("i,ia,ib->ab", coef, X, X)


def _linear_data(X_train, X_other):
    """TaskData holding the rows of X_train (the train set) and X_other (the test set)."""
    from groklens.tasks import TaskData

    n, m = len(X_train), len(X_other)
    X = torch.tensor(np.concatenate([X_train, X_other]))
    return TaskData(inputs=X, labels=torch.zeros(n + m, dtype=torch.long), train_idx=torch.arange(n),
                    test_idx=torch.arange(n, n + m), readout_pos=0,
                    informative_mask=torch.ones(X.shape, dtype=torch.bool), d_vocab=0, d_vocab_out=1)


def test_the_rates_are_the_data_weighted_second_moment_along_ws_singular_directions():
    """The induced regularizer in closed form (docs/ANALYSES.md): G = M W, rate_k = u_k^T M u_k,
    the diagonal share sum_k (u_k^T M u_k s_k)^2 / ||M W||^2, and the data dependence from M
    recomputed on the other inputs: the whole analysis against these, on a random W and data."""
    rng = np.random.default_rng(2)
    W = rng.standard_normal((6, 4))
    X, X_other = rng.standard_normal((40, 6)), 2.0 * rng.standard_normal((25, 6))
    out = induced_regularization(Linear(W), _linear_data(X, X_other), sites=["hook_h"], weights=["W"])
    U, s, _ = np.linalg.svd(W, full_matrices=False)
    M, M_other = _second_moment(W, X), _second_moment(W, X_other)
    rates = np.einsum("ak,ab,bk->k", U, M, U)
    np.testing.assert_allclose(out["rates@W"], rates, rtol=1e-9)
    assert out["anisotropy@W"] == pytest.approx(rates.std() / np.abs(rates).mean(), rel=1e-9)
    G = M @ W
    assert out["diag_share@W"] == pytest.approx(((rates * s) ** 2).sum() / (G**2).sum(), rel=1e-9)
    assert out["alignment@W"] == pytest.approx((G * W).sum() / np.linalg.norm(G) / np.linalg.norm(W), rel=1e-9)
    other = np.einsum("ak,ab,bk->k", U, M_other, U)
    assert out["data_dependence@W"] == pytest.approx(np.linalg.norm(rates - other) / np.linalg.norm(rates), rel=1e-9)
    assert out["anisotropy_mean"] == out["anisotropy@W"] and out["data_dependence_mean"] > 0.1


def test_isotropic_data_on_a_conformal_w_is_exactly_weight_decay():
    """W = c Q (Q orthogonal) on an orthonormal basis of inputs: every radius is c, so M = (1 -
    2/c)/8 I and G = (1 - 2/c)/8 W, weight decay: one rate, anisotropy 0, diag share and alignment
    1, and no data dependence against another orthonormal basis (d = n = 4)."""
    rng = np.random.default_rng(3)
    Q = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    R = np.linalg.qr(rng.standard_normal((4, 4)))[0]  # another orthonormal basis, as the other inputs
    c = 3.0
    out = induced_regularization(Linear(c * Q), _linear_data(np.eye(4), R), sites=["hook_h"], weights=["W"])
    np.testing.assert_allclose(out["rates@W"], (1 - 2 / c) / 8, rtol=1e-9)
    assert out["anisotropy@W"] == pytest.approx(0.0, abs=1e-9)
    assert out["diag_share@W"] == pytest.approx(1.0) and out["alignment@W"] == pytest.approx(1.0)
    assert out["data_dependence@W"] == pytest.approx(0.0, abs=1e-9)


def test_on_a_rotated_w_the_rates_follow_its_singular_directions_not_the_basis():
    """W = Q1 diag(w) Q2^T with inputs u_j (W's left singular vectors): ||h_j|| = w_j, so rate_j =
    (1 - 2/w_j)/8 as for the diagonal model, and with only u_1, u_2 as the other inputs the rates
    there are (1 - 2/w_j)/4 for j = 1, 2 and 0 for the others: the data dependence is their distance."""
    rng = np.random.default_rng(4)
    Q1, Q2 = (np.linalg.qr(rng.standard_normal((4, 4)))[0] for _ in range(2))
    w = np.array([4.0, 3.0, 1.0, 0.5])
    out = induced_regularization(Linear(Q1 @ np.diag(w) @ Q2.T), _linear_data(Q1.T, Q1.T[:2]), sites=["hook_h"],
                                 weights=["W"])
    rates = (1 - 2 / w) / 8
    np.testing.assert_allclose(out["rates@W"], rates, rtol=1e-9)
    assert out["diag_share@W"] == pytest.approx(1.0)
    other = np.array([(1 - 2 / 4) / 4, (1 - 2 / 3) / 4, 0.0, 0.0])
    assert out["data_dependence@W"] == pytest.approx(np.linalg.norm(rates - other) / np.linalg.norm(rates), rel=1e-9)


def test_the_analysis_reads_the_trainers_penalty_term():
    """The analysis's P and dP/dW against the trainer's ActivationNormPenalty at weight 1 (its own
    code path: the hooks the trainer registers, its term)."""
    from groklens.config import RunConfig
    from groklens.trainers.regularizers import ActivationNormPenalty, Batch

    model, data = tiny_transformer(p=7, train_steps=30, seed=3)
    model = model.double()
    cfg = RunConfig.from_dict({"task": "add", "p": 7, "act_norm_lambda": 1.0, "device": "cpu"})
    reg = ActivationNormPenalty([cfg], model, data)
    x = data.inputs[data.train_idx]
    acts: dict = {}
    with model.hooks(fwd_hooks=[(s, lambda a, hook: acts.__setitem__(hook.name, a)) for s in reg.hook_names]):
        model(x)
    term, _ = reg.term(acts, Batch(x, torch.ones_like(x, dtype=torch.bool), [data.readout_pos]), 0)
    names = ["blocks.0.mlp.W_in", "embed.W_E"]
    expected = torch.autograd.grad(term, [dict(model.named_parameters())[n] for n in names])
    value, grads = penalty_gradients(model, x, reg.hook_names, names)
    assert value == pytest.approx(float(term.detach()), rel=1e-10)
    for n, g in zip(names, expected):
        np.testing.assert_allclose(grads[n], g.numpy(), rtol=1e-8, atol=1e-14)


def test_on_a_trained_transformer_every_matrix_is_measured_and_the_penalty_is_anisotropic():
    model, data = tiny_transformer(p=7, train_steps=50, seed=0)
    out = induced_regularization(model, data)
    assert out["penalty"] > 0
    assert 0 < out["anisotropy_mean"] and 0 < out["diag_share_mean"] < 1 and out["data_dependence_mean"] > 0
    for w in ("blocks.0.mlp.W_in", "blocks.0.attn.W_Q", "embed.W_E"):
        assert np.isfinite(out[f"anisotropy@{w}"]) and out[f"rates@{w}"].size > 0
    # the unembedding reads the last resid_post: the penalty does not reach it, so by default it is
    # left out; named explicitly, it shows zero rates and no anisotropy
    assert "rates@unembed.W_U" not in out
    named = induced_regularization(model, data, weights=["unembed.W_U", "embed.W_E"])
    np.testing.assert_array_equal(named["rates@unembed.W_U"], 0.0)
    assert np.isnan(named["anisotropy@unembed.W_U"]) and np.isfinite(named["anisotropy@embed.W_E"])


def test_bad_arguments_are_refused_in_one_line():
    model, data = tiny_transformer(p=5, mlp_bias=True)
    with pytest.raises(BadInput, match="unknown weight"):
        induced_regularization(model, data, weights=["nope"])
    bias = next(n for n, p in model.named_parameters() if p.ndim == 1)
    with pytest.raises(BadInput, match="not a matrix"):
        induced_regularization(model, data, weights=[bias])
    with pytest.raises(BadInput, match="eval_set"):
        induced_regularization(model, data, other_set="validation")
