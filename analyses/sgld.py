"""SGLD chains in parallel: devinterp's SGLD step on many lanes at once (torch.func.vmap).

A lane is one chain c of one setting s = (lr, nbeta, localization). From w_0 = w* every lane takes

    w <- w - lr_s / 2 (nbeta_s grad L_B(w) + gamma_s (w - w*)) + sqrt(lr_s) z_c,   z_c ~ N(0, I)

devinterp 2.x's `SGMCMC.sgld` update (noise level 1, no weight decay), and records the loss L_B(w)
of the step's minibatch at the weights before the step, as devinterp's loss trace does. All lanes
run through one `torch.func.functional_call` under `torch.func.vmap` (the parameters stacked
[lanes, *shape], the data shared), so a step costs one batched forward and backward.

- Minibatches: one stream that every lane sees (devinterp's default: the same inputs for every
  chain): the rows of a fresh permutation of all n rows per epoch, taken `minibatch` at a time
  across the epoch boundaries, so every row enters every epoch. (devinterp's DataLoader drops the
  last partial batch and its `cycle` replays the first epoch's order: n - n mod b rows ever enter.)
- Noise: chain c draws from its own generator, seeded from (seed, c): the same stream at every
  checkpoint and for every setting (common random numbers along a curve and across a sweep), and
  independent of how many chains or settings run beside it.
- L_n(w*): the mean loss over all n rows at w* (devinterp: over its first 32 minibatches).
- A lane whose loss turns non-finite (a step too large) is failed: its trace is NaN from there
  and it sits at w* for the rest of the run, so the other lanes go on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

SEED_STRIDE = 1_000_003  # > any number of chains: two seeds share no chain
STREAM_SALT = 999_983  # the minibatch stream's seed is seed * SEED_STRIDE + this
INIT_CHUNK = 4096  # rows per forward pass of the exact L_n(w*)


class _RowLoss(nn.Module):
    """`row_loss(model, rows)` as a module, so functional_call can swap the model's parameters."""

    def __init__(self, inner: nn.Module, fn: Callable):
        super().__init__()
        self.inner, self.fn = inner, fn

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.fn(self.inner, rows)


def minibatch_stream(n_rows: int, minibatch: int, steps: int, seed: int) -> torch.Tensor:
    """[steps, minibatch] row indices: consecutive permutations of 0..n-1, cut into batches."""
    gen = torch.Generator().manual_seed(seed * SEED_STRIDE + STREAM_SALT)
    need = steps * minibatch
    perms = [torch.randperm(n_rows, generator=gen) for _ in range(-(-need // n_rows))]
    return torch.cat(perms)[:need].view(steps, minibatch)


@torch.no_grad()
def full_loss(model: nn.Module, row_loss: Callable, n_rows: int, device) -> float:
    """L_n(w*): the mean of row_loss over all n rows (float64)."""
    total = 0.0
    for start in range(0, n_rows, INIT_CHUNK):
        rows = torch.arange(start, min(n_rows, start + INIT_CHUNK), device=device)
        total += float(row_loss(model, rows).double().sum())
    return total / n_rows


def sample(model: nn.Module, row_loss: Callable, n_rows: int, settings: Sequence[tuple[float, float, float]], *,
           chains: int, burnin: int, draws: int, minibatch: int, seed: int = 0,
           grad_noise: bool = False) -> dict[str, np.ndarray | float]:
    """Run `chains` chains of each setting (lr, nbeta, localization) for burnin + draws steps.

    Returns trace [S, C, steps] (float64, the minibatch loss before each step; NaN after a
    failure), init_loss (L_n(w*)), failed [S, C], distance [S, C] (||w - w*|| at the end) and
    grad_noise [S, C]: the mean over the draws of ||lr/2 nbeta grad|| / ||sqrt(lr) z|| (NaN
    unless asked)."""
    device = next(model.parameters()).device
    steps, S, C = burnin + draws, len(settings), chains
    L = S * C
    init_loss = full_loss(model, row_loss, n_rows, device)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    center = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    fixed = {n: b.detach() for n, b in model.named_buffers()}
    fixed.update({n: p.detach() for n, p in model.named_parameters() if not p.requires_grad})
    dtype = center[names[0]].dtype
    lanes = {n: center[n].unsqueeze(0).repeat(L, *[1] * center[n].dim()).requires_grad_(True) for n in names}
    hyper = torch.tensor([s for s in settings for _ in range(C)], dtype=dtype, device=device)  # [L, 3]
    lr, nbeta, gamma = hyper[:, 0], hyper[:, 1], hyper[:, 2]
    sqrt_lr = lr.sqrt()
    wrapper = _RowLoss(model, row_loss)
    fixed_w = {f"inner.{n}": t for n, t in fixed.items()}

    def lane_loss(params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(wrapper, {**{f"inner.{n}": p for n, p in params.items()}, **fixed_w},
                                          (rows,)).mean()

    batched = torch.func.vmap(lane_loss, in_dims=(0, None))
    stream = minibatch_stream(n_rows, minibatch, steps, seed).to(device)
    gens = [torch.Generator().manual_seed(seed * SEED_STRIDE + c) for c in range(C)]
    sizes = [center[n].numel() for n in names]
    trace = torch.full((steps, L), float("nan"), dtype=torch.float64)
    alive = torch.ones(L, dtype=torch.bool, device=device)
    ratio_sum = torch.zeros(L, dtype=torch.float64, device=device)
    for t in range(steps):
        losses = batched(lanes, stream[t])  # [L]
        ok = torch.isfinite(losses.detach())
        alive &= ok
        grads = torch.autograd.grad(torch.where(alive, losses, torch.zeros_like(losses)).sum(),
                                    [lanes[n] for n in names])
        trace[t] = torch.where(alive, losses.detach(), torch.nan).double().cpu()
        z = torch.stack([torch.randn(sum(sizes), generator=g) for g in gens]).to(device=device, dtype=dtype)
        z = z.unsqueeze(0).expand(S, C, -1).reshape(L, -1)  # chain c's noise in every setting
        drift_sq = torch.zeros(L, dtype=torch.float64, device=device)
        with torch.no_grad():
            for n, g, zn in zip(names, grads, z.split(sizes, dim=1)):
                w, shape = lanes[n], (L,) + (1,) * center[n].dim()
                step = lr.view(shape) / 2 * (nbeta.view(shape) * g + gamma.view(shape) * (w - center[n]))
                noise = sqrt_lr.view(shape) * zn.view_as(w)
                if grad_noise:
                    drift_sq += (lr.view(shape) / 2 * nbeta.view(shape) * g).double().pow(2).flatten(1).sum(1)
                w.add_(noise - step)
                w.copy_(torch.where(alive.view(shape), w, center[n].unsqueeze(0)))  # a failed lane stays at w*
            if grad_noise and t >= burnin:
                ratio_sum += drift_sq.sqrt() / (sqrt_lr.double() * z.double().norm(dim=1))
    with torch.no_grad():
        dist = torch.sqrt(sum((lanes[n] - center[n]).double().pow(2).flatten(1).sum(1) for n in names))
    failed = ~alive.cpu().numpy()
    ratio = (ratio_sum / draws).cpu().numpy() if grad_noise else np.full(L, np.nan)
    return {
        "trace": trace.T.numpy().reshape(S, C, steps),
        "init_loss": init_loss,
        "failed": failed.reshape(S, C),
        "distance": np.where(failed, np.nan, dist.cpu().numpy()).reshape(S, C),
        "grad_noise": np.where(failed, np.nan, ratio).reshape(S, C),
    }
