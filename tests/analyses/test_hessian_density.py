"""Stochastic Lanczos quadrature against the dense Hessian (torch.autograd.functional.hessian,
eigenvalues by torch.linalg.eigvalsh), and the density against PyHessian's code re-typed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from groklens.analyses.hessian_density import gauss_quadrature, hessian_density, lanczos, slq
from groklens.analyses.sharpness import HessianOperator
from groklens.errors import BadInput
from tests.analyses.builders import tiny_transformer
from tests.analyses.test_sharpness import TINY, _full_hessian


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model, data = tiny_transformer(p=5, train_steps=25, **TINY)
    H = _full_hessian(model, data)
    return model, data, H, torch.linalg.eigvalsh(torch.from_numpy(H)).numpy()


def test_quadrature_is_exact_for_low_degree_polynomials(tiny):
    model, data, H, _ = tiny
    op = HessianOperator(model, data, data.train_idx)
    rng = np.random.default_rng(3)
    v = rng.choice([-1.0, 1.0], size=H.shape[0])
    m = 8
    nodes, weights = gauss_quadrature(*lanczos(op.matvec, v, m, rng))
    u = v / np.linalg.norm(v)
    scale = np.abs(np.linalg.eigvalsh(H)).max()
    for k in range(2 * m):  # Gauss quadrature with m nodes: exact up to degree 2m - 1
        exact = u @ np.linalg.matrix_power(H, k) @ u
        assert np.sum(weights * nodes ** k) == pytest.approx(exact, abs=1e-8 * scale ** k)


def test_extreme_nodes_are_the_extreme_eigenvalues(tiny):
    model, data, H, eig = tiny
    res = hessian_density(model, data, iters=H.shape[0], runs=1, step=7)
    scale = np.abs(eig).max()
    assert res["n_params"] == H.shape[0] and res["nodes"].shape == (1, H.shape[0])
    assert res["lambda_max"] == pytest.approx(eig[-1], abs=1e-7 * scale)
    assert res["lambda_min"] == pytest.approx(eig[0], abs=1e-7 * scale)
    few = hessian_density(model, data, iters=40, runs=1, step=7)  # far fewer steps: the top has converged
    assert few["lambda_max"] == pytest.approx(eig[-1], rel=1e-4)


def test_moments_are_the_hutchinson_estimates_of_the_traces(tiny):
    model, data, H, eig = tiny
    n, runs = H.shape[0], 40
    op = HessianOperator(model, data, data.train_idx)
    nodes, weights = slq(op.matvec, n, 12, runs, np.random.default_rng(0))
    for k in (1, 2):
        Hk = np.linalg.matrix_power(H, k)
        est = n * np.mean((weights * nodes ** k).sum(axis=1))
        # Var(v^T A v) for Rademacher v is 2 sum_{i != j} A_ij^2
        sd = np.sqrt(2 * (np.sum(Hk ** 2) - np.sum(np.diag(Hk) ** 2)) / runs)
        assert abs(est - np.sum(eig ** k)) < 4 * sd


def _their_density_generate(eigenvalues, weights, num_bins=10000, sigma_squared=1e-5, overhead=0.01):
    """PyHessian density_plot.py, density_generate and gaussian, re-typed."""
    def gaussian(x, x0, sigma_squared):
        return np.exp(-(x0 - x)**2 / (2.0 * sigma_squared)) / np.sqrt(2 * np.pi * sigma_squared)

    eigenvalues = np.array(eigenvalues)
    weights = np.array(weights)
    lambda_max = np.mean(np.max(eigenvalues, axis=1), axis=0) + overhead
    lambda_min = np.mean(np.min(eigenvalues, axis=1), axis=0) - overhead
    grids = np.linspace(lambda_min, lambda_max, num=num_bins)
    sigma = sigma_squared * max(1, (lambda_max - lambda_min))
    num_runs = eigenvalues.shape[0]
    density_output = np.zeros((num_runs, num_bins))
    for i in range(num_runs):
        for j in range(num_bins):
            x = grids[j]
            tmp_result = gaussian(eigenvalues[i, :], x, sigma)
            density_output[i, j] = np.sum(tmp_result * weights[i, :])
    density = np.mean(density_output, axis=0)
    normalization = np.sum(density) * (grids[1] - grids[0])
    density = density / normalization
    return density, grids


def test_the_density_is_pyhessians(tiny):
    model, data, H, eig = tiny
    res = hessian_density(model, data, iters=30, runs=2, num_bins=500, sigma_squared=1e-3, step=1)
    theirs, grid = _their_density_generate(res["nodes"], res["weights"], num_bins=500, sigma_squared=1e-3)
    np.testing.assert_allclose(res["grid"], grid, rtol=1e-12)
    np.testing.assert_allclose(res["density"], theirs, rtol=1e-9, atol=1e-12)
    dx = grid[1] - grid[0]
    assert np.sum(res["density"]) * dx == pytest.approx(1.0)
    mean = np.sum(grid * res["density"]) * dx  # the broadened density's mean is the quadrature's
    assert mean == pytest.approx(res["trace"] / res["n_params"], abs=1e-3 * (eig[-1] - eig[0]))


def test_uniform_attention_and_breakdown(tiny):
    # W_Q and W_K unused: zero rows and columns, a repeated eigenvalue 0 that Lanczos meets as a breakdown
    model, data = tiny_transformer(p=5, train_steps=10, attention="uniform", **TINY)
    H = _full_hessian(model, data)
    eig = np.linalg.eigvalsh(H)
    res = hessian_density(model, data, iters=H.shape[0], runs=1)
    scale = np.abs(eig).max()
    assert res["lambda_max"] == pytest.approx(eig[-1], abs=1e-7 * scale)
    assert res["lambda_min"] == pytest.approx(eig[0], abs=1e-7 * scale)
    np.testing.assert_allclose(np.sort(res["nodes"][0]), eig, atol=1e-6 * scale)


def test_bad_parameters(tiny):
    model, data, _, _ = tiny
    for bad in ({"iters": 0}, {"runs": 0}, {"num_bins": 1}, {"sigma_squared": 0.0}, {"overhead": -1.0}):
        with pytest.raises(BadInput):
            hessian_density(model, data, **bad)
