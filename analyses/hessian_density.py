"""Hessian eigenvalue density by stochastic Lanczos quadrature (docs/ANALYSES.md, "hessian_density").

PyHessian's method (Yao, Gholami, Keutzer, Mahoney 2020; repository amirgholami/PyHessian,
`pyhessian/hessian.py` `density` and `density_plot.py` `density_generate`), on the float64 task
loss of analyses/sharpness.py (its HessianOperator: same loss, same parameters):
  per run r: v_1 = a Rademacher vector / sqrt(n); m Lanczos steps with full reorthogonalization
  give the tridiagonal T_r (alpha on the diagonal, beta beside it); its eigenvalues theta_rj are
  the nodes and tau_rj = (first component of its j-th unit eigenvector)^2 the weights, so that
  sum_j tau_rj f(theta_rj) = v_1^T f(H) v_1, exactly for polynomials f of degree <= 2m - 1.
  density(t) = mean_r sum_j tau_rj N(t; theta_rj, s), s = sigma_squared x max(1, range), on a grid
  from (mean_r min_j theta_rj) - overhead to (mean_r max_j theta_rj) + overhead, normalized to
  integrate to 1 on the grid (density_generate, with its numbers: sigma_squared 1e-5, overhead 0.01).
The probes come from (seed, step) like sharpness' Hutchinson probes: fresh per checkpoint, the
same on a rerun. A Lanczos breakdown (beta = 0) continues from a fresh random vector
orthonormalized against the basis, as PyHessian does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.common import check_loss, eval_rows
from groklens.analyses.registry import analysis
from groklens.analyses.sharpness import HessianOperator, probe_rng
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData


def lanczos(matvec: Callable[[np.ndarray], np.ndarray], v0: np.ndarray, iters: int,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """alpha [iters], beta [iters - 1] of the Lanczos tridiagonal from v0, fully reorthogonalized
    (rounding would otherwise bring back converged eigenvectors as spurious copies)."""
    basis = [v0 / np.linalg.norm(v0)]
    alpha, beta = [], []
    for i in range(iters):
        w = matvec(basis[-1])
        alpha.append(float(w @ basis[-1]))
        if i == iters - 1:
            break
        Q = np.stack(basis, axis=1)
        w = w - Q @ (Q.T @ w)
        w = w - Q @ (Q.T @ w)  # twice is enough (Kahan-Parlett)
        b = float(np.linalg.norm(w))
        if b <= 1e-12 * max(1.0, abs(alpha[-1])):  # breakdown: an invariant subspace; go on elsewhere
            b, w = 0.0, rng.standard_normal(len(v0))
            w = w - Q @ (Q.T @ w)
            w = w - Q @ (Q.T @ w)
        beta.append(b)
        basis.append(w / np.linalg.norm(w))
    return np.array(alpha), np.array(beta)


def gauss_quadrature(alpha: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes (eigenvalues of T) and weights (squared first components of its eigenvectors)."""
    from scipy.linalg import eigh_tridiagonal

    nodes, vecs = eigh_tridiagonal(alpha, beta)
    return nodes, vecs[0] ** 2


def density_on_grid(nodes: np.ndarray, weights: np.ndarray, num_bins: int = 10_000, sigma_squared: float = 1e-5,
                    overhead: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """PyHessian's density_generate: (density [num_bins], grid [num_bins]) from nodes, weights [runs, m]."""
    hi = float(np.mean(nodes.max(axis=1))) + overhead
    lo = float(np.mean(nodes.min(axis=1))) - overhead
    grid = np.linspace(lo, hi, num_bins)
    s = sigma_squared * max(1.0, hi - lo)  # their `sigma`, passed as the Gaussian's variance
    gauss = np.exp(-(grid[None, None, :] - nodes[..., None]) ** 2 / (2 * s)) / np.sqrt(2 * np.pi * s)
    density = (gauss * weights[..., None]).sum(axis=1).mean(axis=0)
    return density / (density.sum() * (grid[1] - grid[0])), grid


def slq(matvec: Callable[[np.ndarray], np.ndarray], n: int, iters: int, runs: int,
        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """nodes, weights [runs, min(iters, n)] from Rademacher starting vectors."""
    m = min(iters, n)
    quad = [gauss_quadrature(*lanczos(matvec, rng.choice(np.array([-1.0, 1.0]), size=n), m, rng))
            for _ in range(runs)]
    return np.stack([q[0] for q in quad]), np.stack([q[1] for q in quad])


def check(model, data: TaskData, params: dict) -> None:
    eval_rows(data, params.get("eval_set", "train"))
    check_loss(params.get("loss"))
    for key, lo in (("iters", 1), ("runs", 1), ("num_bins", 2), ("seed", 0)):
        v = params.get(key, lo)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise BadInput(f"{key} must be an integer >= {lo}; got {v!r}")
    for key in ("sigma_squared", "overhead"):
        v = params.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or (key == "sigma_squared" and v == 0):
            raise BadInput(f"{key} must be a {'positive' if key == 'sigma_squared' else 'non-negative'} number; "
                           f"got {v!r}")


@analysis("hessian_density", "Hessian eigenvalue density of the float64 training loss by stochastic Lanczos "
          "quadrature (PyHessian's method)", tier="named", check=check, needs_step=True, order=130)
def hessian_density(model, data: TaskData, *, iters: int = 100, runs: int = 1, num_bins: int = 1000,
                    sigma_squared: float = 1e-5, overhead: float = 0.01, eval_set: str = "train", seed: int = 0,
                    loss: str | None = None, step: int | None = None) -> dict:
    """nodes, weights [runs, m] (m = min(iters, n_params)), density and grid [num_bins], lambda_max and
    lambda_min (the largest and smallest node over the runs: Ritz values, which converge to the
    extreme eigenvalues first), trace (n_params x mean_r sum_j tau_rj theta_rj, the SLQ estimate of
    tr H), n_params. PyHessian's defaults but num_bins 1000 (its 10,000 is a finer plot than a
    sidecar needs at every checkpoint)."""
    check(model, data, {"iters": iters, "runs": runs, "num_bins": num_bins, "seed": seed, "eval_set": eval_set,
                        "loss": loss, "sigma_squared": sigma_squared, "overhead": overhead})
    H = HessianOperator(model, data, eval_rows(data, eval_set), check_loss(loss))
    nodes, weights = slq(H.matvec, H.n, iters, runs, probe_rng(seed, step))
    density, grid = density_on_grid(nodes, weights, num_bins, sigma_squared, overhead)
    return {"nodes": nodes, "weights": weights, "density": density, "grid": grid,
            "lambda_max": float(nodes.max()), "lambda_min": float(nodes.min()),
            "trace": float(H.n * np.mean((weights * nodes).sum(axis=1))), "n_params": H.n}
