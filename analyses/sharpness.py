"""Hessian sharpness of the training loss (docs/ANALYSES.md, "sharpness").

L(theta) = the mean task loss (cross-entropy, or the run's `loss` when it trained with
StableMax) at the readout position(s) over a fixed evaluation set (default: the run's training
inputs), in float64, weight decay and regularizer terms excluded (AdamW's decay is decoupled:
it is not part of L). theta = every parameter that requires grad (one the loss does not use,
like W_Q and W_K under uniform attention, has zero rows and columns).
Hessian-vector products by double backward: the gradient graph is built once per checkpoint
(create_graph=True) and each product is one more backward pass through it, on a float64 copy
of the model whose stale .grad are cleared first.
  top_eigenvalues  scipy.sparse.linalg.eigsh(which='LA') (largest algebraic, not magnitude)
                   on a LinearOperator of Hessian-vector products, seeded start vector,
                   relative tolerance `tol`; hvp_count = products eigsh used.
  trace            Hutchinson: mean of v^T H v over Rademacher probes drawn from (seed, step),
                   fresh per checkpoint and the same on a rerun, until trace_stderr (sample
                   std / sqrt(count)) <= trace_rel_stderr x |trace| or trace_samples are drawn.
  eps_dependent    1 when a norm's input is read by nothing but scale-invariant norms (its
                   writers' scale is free: the curvature along them depends on it and on eps).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.common import check_loss, eval_rows, task_loss
from groklens.analyses.radial import EpsDependenceWarning, eps_note, free_scale_norms
from groklens.analyses.registry import analysis
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.tasks import TaskData

MIN_TRACE_SAMPLES = 10  # the stopping rule's standard error is too noisy below this


class HessianOperator:
    """v -> H v for the mean float64 task loss of `model` on rows `rows` of `data`."""

    def __init__(self, model, data: TaskData, rows: torch.Tensor, loss: str = "ce"):
        import torch

        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.model.fused_attention = False  # fused attention kernels have no double backward
        self.model.lean_path = False  # the explicit path: the Hessian's numbers as before the lean path
        for p in self.model.parameters():
            p.grad = None  # never mix stale first-order gradients into a double backward
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        self.shapes = [p.shape for p in self.params]
        self.n = int(sum(p.numel() for p in self.params))
        device = self.params[0].device
        logits = self.model(data.inputs[rows].to(device))
        self.loss = task_loss(logits, data.labels[rows].to(device), data, loss)
        # a parameter the loss does not use (W_Q, W_K under uniform attention) has no gradient:
        # its rows and columns of the Hessian are zero
        self.grads = torch.autograd.grad(self.loss, self.params, create_graph=True, allow_unused=True)
        self.count = 0

    def matvec(self, v: np.ndarray) -> np.ndarray:
        import torch

        v = torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(-1)).to(self.params[0].device)
        parts = torch.split(v, [int(np.prod(s)) for s in self.shapes])
        dot = sum((g * part.view(s)).sum() for g, part, s in zip(self.grads, parts, self.shapes)
                  if g is not None and g.requires_grad)
        self.count += 1
        if not isinstance(dot, torch.Tensor):  # the loss is at most linear in every parameter
            return np.zeros(self.n)
        hv = torch.autograd.grad(dot, self.params, retain_graph=True, allow_unused=True)
        hv = [torch.zeros_like(p) if h is None else h for h, p in zip(hv, self.params)]
        return torch.cat([h.reshape(-1) for h in hv]).detach().cpu().numpy()

    def dense(self) -> np.ndarray:
        """The full Hessian by n products (tests and tiny models only)."""
        return np.stack([self.matvec(e) for e in np.eye(self.n)], axis=1)


def top_eigenvalues(matvec: Callable[[np.ndarray], np.ndarray], n: int, k: int, *, tol: float,
                    seed: int = 0, maxiter: int | None = None, ncv: int | None = None) -> dict:
    """Top-k algebraic eigenvalues of a symmetric operator, descending, by eigsh(which='LA')."""
    from scipy.sparse.linalg import ArpackNoConvergence, LinearOperator, eigsh

    if not 1 <= k < n:
        raise BadInput(f"top_k must be in 1..{n - 1} for {n} parameters; got {k}")
    calls = [0]

    def mv(v):
        calls[0] += 1
        return matvec(v)

    op = LinearOperator((n, n), matvec=mv, dtype=np.float64)
    v0 = np.random.default_rng(seed).standard_normal(n)
    converged = True
    try:
        vals = eigsh(op, k=k, which="LA", tol=tol, v0=v0, maxiter=maxiter, ncv=ncv, return_eigenvectors=False)
    except ArpackNoConvergence as exc:  # keep what converged; the rest is NaN, and we say so
        vals, converged = exc.eigenvalues, False
    vals = np.sort(np.asarray(vals, dtype=np.float64))[::-1]
    padded = np.full(k, np.nan)
    padded[: len(vals)] = vals
    return {"top_eigenvalues": padded, "hvp_count": calls[0], "converged": int(converged)}


def probe_rng(seed: int, step: int | None) -> np.random.Generator:
    """The Hutchinson probes' generator: fresh per checkpoint (seeded by its step), reproducible."""
    return np.random.default_rng([seed, 1] if step is None else [seed, 1, int(step)])


def hutchinson_trace(matvec: Callable[[np.ndarray], np.ndarray], n: int, samples: int, seed: int = 0, *,
                     rel_stderr: float | None = None, min_samples: int = MIN_TRACE_SAMPLES,
                     rng: np.random.Generator | None = None) -> dict:
    """tr(H) ~ mean_s v_s^T H v_s with Rademacher v_s (entries +-1 with probability 1/2).

    Draws until the standard error is at most rel_stderr * |mean| (checked from min_samples on),
    or `samples` (the cap) are drawn; without rel_stderr, exactly `samples`. Returns trace,
    trace_stderr (sample std / sqrt(count)), trace_samples (count), trace_rel_stderr (achieved)."""
    nan = float("nan")
    if samples < 1:
        return {"trace": nan, "trace_stderr": nan, "trace_samples": 0, "trace_rel_stderr": nan}
    rng = np.random.default_rng(seed) if rng is None else rng
    est: list[float] = []
    while len(est) < samples:
        v = rng.choice(np.array([-1.0, 1.0]), size=n)
        est.append(float(v @ matvec(v)))
        if rel_stderr is not None and len(est) >= max(min_samples, 2):
            se = np.std(est, ddof=1) / np.sqrt(len(est))
            if se <= rel_stderr * abs(np.mean(est)):
                break
    mean = float(np.mean(est))
    se = float(np.std(est, ddof=1) / np.sqrt(len(est))) if len(est) > 1 else nan
    return {"trace": mean, "trace_stderr": se, "trace_samples": len(est),
            "trace_rel_stderr": se / abs(mean) if mean != 0 else nan}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check(model, data: TaskData, params: dict) -> None:
    eval_rows(data, params.get("eval_set", "train"))
    check_loss(params.get("loss"))
    for key, lo in (("top_k", 1), ("trace_samples", 0), ("seed", 0)):
        v = params.get(key, lo)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise BadInput(f"{key} must be an integer >= {lo}; got {v!r}")
    tol = params.get("tol", 1e-3)
    if not _number(tol) or not 0 <= tol < 1:
        raise BadInput(f"tol must be a number in [0, 1); got {tol!r}")
    rel = params.get("trace_rel_stderr")
    if rel is not None and (not _number(rel) or rel <= 0):
        raise BadInput(f"trace_rel_stderr must be a positive number or null; got {rel!r}")
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if params.get("top_k", 1) >= n:
        raise BadInput(f"top_k must be smaller than the number of parameters ({n})")


@analysis("sharpness", "top Hessian eigenvalues (eigsh LA) and Hutchinson trace of the float64 training loss",
          export="hessian_sharpness",
          check=check, tier="extended", needs_step=True,
          measures=[("hessian_top", "top_eigenvalues", "Hessian top eigenvalue", "first"),
                    ("hessian_trace", "trace", "Hessian trace (Hutchinson)")], order=30)
def sharpness(
    model,
    data: TaskData,
    *,
    top_k: int = 5,
    tol: float = 1e-3,
    maxiter: int | None = None,
    trace_samples: int = 1000,
    trace_rel_stderr: float | None = 0.05,
    eval_set: str = "train",
    seed: int = 0,
    loss: str | None = None,
    step: int | None = None,
) -> dict:
    """Hessian sharpness at one checkpoint: top_eigenvalues [top_k] (descending), hvp_count,
    converged, the Hutchinson trace with trace_stderr, trace_samples (drawn), trace_rel_stderr
    (achieved), trace_target (the asked fraction, NaN if none), tol, loss (the float64 loss whose
    Hessian this is), n_params, eps_dependent (1 when some activation feeds a scale-invariant
    norm, so the curvature along the weights writing it depends on their scale against the
    norm's eps). Probes: Rademacher, drawn from (seed, step), so each checkpoint has its own and
    a rerun the same; up to `trace_samples` until the standard error is <= trace_rel_stderr x
    |trace|. `loss` None means cross-entropy (`compute` passes the run's training loss and step)."""
    check(model, data, {"top_k": top_k, "tol": tol, "trace_samples": trace_samples, "eval_set": eval_set,
                        "seed": seed, "loss": loss, "trace_rel_stderr": trace_rel_stderr})

    H = HessianOperator(model, data, eval_rows(data, eval_set), check_loss(loss))
    out = top_eigenvalues(H.matvec, H.n, top_k, tol=tol, seed=seed, maxiter=maxiter)
    out.update(hutchinson_trace(H.matvec, H.n, trace_samples, rel_stderr=trace_rel_stderr,
                                rng=probe_rng(seed, step)))
    fed = free_scale_norms(model, data)
    if fed:
        warnings.warn(eps_note("sharpness", fed), EpsDependenceWarning, stacklevel=2)
    out.update({"trace_target": float("nan") if trace_rel_stderr is None else float(trace_rel_stderr),
                "tol": float(tol), "loss": float(H.loss.detach()), "n_params": H.n, "eps_dependent": int(bool(fed))})
    return out
