"""Hessian sharpness against the full Hessian from torch.autograd.functional.hessian."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from groklens.analyses.sharpness import (
    HessianOperator,
    hutchinson_trace,
    probe_rng,
    sharpness,
    top_eigenvalues,
)
from groklens.errors import BadInput
from tests.analyses.builders import tiny_transformer

TINY = dict(d_model=4, n_heads=1, d_head=2, d_mlp=8)


def _full_hessian(model, data) -> np.ndarray:
    """Independent route: autograd.functional.hessian of the float64 train loss over the flat parameters."""
    m = copy.deepcopy(model).double()
    names = [n for n, _ in m.named_parameters()]
    shapes = [p.shape for _, p in m.named_parameters()]
    sizes = [p.numel() for _, p in m.named_parameters()]
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]

    def loss(flat):
        params = {n: t.view(s) for n, t, s in zip(names, torch.split(flat, sizes), shapes)}
        return F.cross_entropy(functional_call(m, params, (x,))[:, data.readout_pos], y)

    flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    return torch.autograd.functional.hessian(loss, flat).numpy()


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, data = tiny_transformer(p=5, train_steps=25, **TINY)
    H = _full_hessian(model, data)
    return model, data, H


def test_top_eigenvalues_match_the_full_hessian(tiny):
    model, data, H = tiny
    exact = np.linalg.eigvalsh(H)[::-1][:3]
    res = sharpness(model, data, top_k=3, tol=0, trace_samples=0)
    np.testing.assert_allclose(res["top_eigenvalues"], exact, rtol=1e-6)
    assert res["converged"] == 1 and res["hvp_count"] > 0 and res["n_params"] == H.shape[0]
    assert res["tol"] == 0.0


def test_hessian_vector_products_are_the_full_hessian(tiny):
    model, data, H = tiny
    op = HessianOperator(model, data, data.train_idx)
    np.testing.assert_allclose(op.dense(), H, rtol=1e-7, atol=1e-10)
    assert all(p.dtype == torch.float64 for p in op.model.parameters())
    # the loss is the plain float64 cross-entropy: no weight-decay term
    with torch.no_grad():
        ce = F.cross_entropy(copy.deepcopy(model).double()(data.inputs[data.train_idx])[:, 2],
                             data.labels[data.train_idx])
    assert float(op.loss.detach()) == pytest.approx(float(ce), rel=1e-12)


def test_hutchinson_trace_is_unbiased_with_the_rademacher_variance(tiny):
    model, data, H = tiny
    m = 800
    res = sharpness(model, data, top_k=1, tol=1e-3, trace_samples=m, trace_rel_stderr=None, seed=5)
    assert res["trace_samples"] == m and np.isnan(res["trace_target"])
    exact = np.trace(H)
    # Var(v^T H v) = 2 sum_{i != j} H_ij^2 for Rademacher v
    off = H - np.diag(np.diag(H))
    se = np.sqrt(2 * (off**2).sum() / m)
    assert res["trace_stderr"] == pytest.approx(se, rel=0.2)
    assert abs(res["trace"] - exact) < 4 * se


def test_trace_holds_the_stated_standard_error_against_the_exact_trace(tiny):
    """The default stopping rule: standard error <= 5% of the estimate, and the estimate within
    its stated error of the dense Hessian's exact trace."""
    model, data, H = tiny
    exact = np.trace(H)
    res = sharpness(model, data, top_k=1, step=100)
    assert res["trace_target"] == 0.05
    assert res["trace_stderr"] <= 0.05 * abs(res["trace"]) and res["trace_rel_stderr"] <= 0.05
    assert 10 <= res["trace_samples"] < 1000
    assert abs(res["trace"] - exact) < 4 * res["trace_stderr"]


def test_probes_are_fresh_per_checkpoint_and_reproducible(tiny):
    """Probes seeded by the step: a rerun repeats them, another step draws new ones, so the
    errors along a run are independent (z-scores against the exact trace look standard normal)."""
    model, data, H = tiny
    op = HessianOperator(model, data, data.train_idx)
    exact = np.trace(H)
    a = hutchinson_trace(op.matvec, op.n, 20, rng=probe_rng(0, 250))
    assert hutchinson_trace(op.matvec, op.n, 20, rng=probe_rng(0, 250)) == a
    z = []
    for step in range(0, 3000, 100):
        r = hutchinson_trace(op.matvec, op.n, 20, rng=probe_rng(0, step))
        z.append((r["trace"] - exact) / r["trace_stderr"])
    z = np.array(z)
    assert len(set(np.round(z, 12))) == len(z)  # every step its own probes
    assert abs(z.mean()) < 4 / np.sqrt(len(z)) * 1.2 and 0.4 < z.std() < 1.8


def test_eigsh_is_largest_algebraic_not_largest_magnitude():
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((30, 30)))[0]
    eig = np.concatenate([[-50.0, -40.0], np.linspace(-1, 3, 28)])
    A = Q @ np.diag(eig) @ Q.T
    res = top_eigenvalues(lambda v: A @ v, 30, 3, tol=0)
    np.testing.assert_allclose(res["top_eigenvalues"], np.sort(eig)[::-1][:3], rtol=1e-10)
    exact = hutchinson_trace(lambda v: np.diag(np.diag(A)) @ v, 30, 5)  # diagonal: exact for any v
    assert exact["trace"] == pytest.approx(np.trace(A))


def test_stale_gradients_change_nothing(tiny):
    model, data, _ = tiny
    clean = sharpness(model, data, top_k=2, tol=0, trace_samples=3)
    for p in model.parameters():
        p.grad = torch.full_like(p, 7.0)
    dirty = sharpness(model, data, top_k=2, tol=0, trace_samples=3)
    for p in model.parameters():
        assert torch.all(p.grad == 7.0)  # the caller's model is untouched
        p.grad = None
    np.testing.assert_allclose(dirty["top_eigenvalues"], clean["top_eigenvalues"], rtol=1e-10)
    assert dirty["trace"] == pytest.approx(clean["trace"], rel=1e-10)


def test_bad_parameters():
    model, data = tiny_transformer(p=5, **TINY)
    with pytest.raises(BadInput, match="eval_set"):
        sharpness(model, data, eval_set="validation")
    with pytest.raises(BadInput, match="top_k must be smaller"):
        sharpness(model, data, top_k=10_000)
    with pytest.raises(BadInput, match="trace_rel_stderr must be a positive number"):
        sharpness(model, data, trace_rel_stderr=0)


def test_parameters_the_loss_does_not_use_have_zero_hessian_rows():
    # uniform attention zeroes the scores: W_Q and W_K get no gradient at all
    model, data = tiny_transformer(p=5, train_steps=10, attention="uniform", **TINY)
    H = _full_hessian(model, data)
    res = sharpness(model, data, top_k=2, tol=0, trace_samples=0)
    np.testing.assert_allclose(res["top_eigenvalues"], np.linalg.eigvalsh(H)[::-1][:2], rtol=1e-6)
    op = HessianOperator(model, data, data.train_idx)
    np.testing.assert_allclose(op.dense(), H, rtol=1e-7, atol=1e-10)
