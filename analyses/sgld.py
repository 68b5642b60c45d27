"""SGLD chains in parallel: devinterp's SGLD step on many lanes at once (torch.func.vmap).

A lane is one chain c of one setting s = (lr, nbeta, localization) at one center w* (a checkpoint;
several centers sample a run's checkpoints at once). From w_0 = w* every lane takes

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
- A lane whose loss turns non-finite or above DIVERGED (a step too large) is failed: it is dropped
  from the batch (its trace NaN from there), and the other lanes go on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

SEED_STRIDE = 1_000_003  # > any number of chains: two seeds share no chain
STREAM_SALT = 999_983  # the minibatch stream's seed is seed * SEED_STRIDE + this
INIT_CHUNK = 4096  # rows per forward pass of the exact L_n(w*)
DIVERGED = 1e12  # a minibatch loss this large (finite or not) fails the lane: it overflows within steps


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
           chains: int, burnin: int, draws: int, minibatch: int, seed: int = 0, grad_noise: bool = False,
           centers: Sequence[nn.Module] | None = None) -> dict[str, np.ndarray]:
    """Run `chains` chains of each setting (lr, nbeta, localization) for burnin + draws steps,
    from `model`'s parameters or, with `centers`, from each of those models' (the same
    architecture as `model`, e.g. the checkpoints of a run: every checkpoint's chains at once).

    Returns, with K = len(centers) (1 without): trace [K, S, C, steps] (float64, the minibatch loss
    before each step; NaN after a failure), init_loss [K] (L_n(w*)), failed [K, S, C], distance
    [K, S, C] (||w - w*|| at the end) and grad_noise [K, S, C]: the mean over the draws of
    ||lr/2 nbeta grad|| / ||sqrt(lr) z|| (NaN unless asked). Chain c of every center and setting
    draws the same noise and minibatches: each lane is what it would be alone."""
    device = next(model.parameters()).device
    centers = [model] if centers is None else list(centers)
    steps, K, S, C = burnin + draws, len(centers), len(settings), chains
    L = K * S * C
    init_loss = np.array([full_loss(m, row_loss, n_rows, device) for m in centers])
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    cen = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in centers]) for n in names}  # [K, ...]
    fixed = {n: b.detach() for n, b in model.named_buffers()}
    fixed.update({n: p.detach() for n, p in model.named_parameters() if not p.requires_grad})
    dtype = cen[names[0]].dtype
    lanes = {n: cen[n].repeat_interleave(S * C, dim=0).clone().requires_grad_(True) for n in names}
    hyper = torch.tensor([s for s in settings for _ in range(C)] * K, dtype=dtype, device=device)  # [L, 3]
    chain_of = torch.arange(L, device=device) % C
    center_of = torch.arange(L, device=device) // (S * C)
    wrapper = _RowLoss(model, row_loss)
    fixed_w = {f"inner.{n}": t for n, t in fixed.items()}

    def lane_loss(params: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(wrapper, {**{f"inner.{n}": p for n, p in params.items()}, **fixed_w},
                                          (rows,)).mean()

    batched = torch.func.vmap(lane_loss, in_dims=(0, None))
    stream = minibatch_stream(n_rows, minibatch, steps, seed).to(device)
    gens = [torch.Generator().manual_seed(seed * SEED_STRIDE + c) for c in range(C)]
    sizes = [cen[n][0].numel() for n in names]
    trace = torch.full((steps, L), float("nan"), dtype=torch.float64)
    active = torch.arange(L, device=device)  # the lanes still running (failed ones are dropped)
    ratio_sum = torch.zeros(L, dtype=torch.float64, device=device)
    for t in range(steps):
        z = torch.stack([torch.randn(sum(sizes), generator=g) for g in gens]).to(device=device, dtype=dtype)
        if not len(active):
            continue  # every lane failed; the generators still advance as if they ran
        losses = batched(lanes, stream[t])  # [active]
        ok = torch.isfinite(losses.detach()) & (losses.detach().abs() < DIVERGED)
        everyone = bool(ok.all())
        if not bool(ok.any()):
            active = active[ok]
            continue
        # the failed lanes get no gradient (their rows of grads are dropped with them)
        grads = torch.autograd.grad((losses if everyone else losses[ok]).sum(), [lanes[n] for n in names])
        if not everyone:
            active, losses, grads = active[ok], losses[ok], [g[ok] for g in grads]
            lanes = {n: w.detach()[ok].requires_grad_(True) for n, w in lanes.items()}
        trace[t, active.cpu()] = losses.detach().double().cpu()
        lr, nbeta, gamma = hyper[active, 0], hyper[active, 1], hyper[active, 2]
        za = z[chain_of[active]]  # chain c's noise, the same in every setting
        drift_sq = torch.zeros(len(active), dtype=torch.float64, device=device)
        with torch.no_grad():
            for n, g, zn in zip(names, grads, za.split(sizes, dim=1)):
                w, shape = lanes[n], (len(active),) + (1,) * (cen[n].dim() - 1)
                w0 = cen[n][0] if K == 1 else cen[n][center_of[active]]
                step = lr.view(shape) / 2 * (nbeta.view(shape) * g + gamma.view(shape) * (w - w0))
                if grad_noise:
                    drift_sq += (lr.view(shape) / 2 * nbeta.view(shape) * g).double().pow(2).flatten(1).sum(1)
                w.add_(lr.sqrt().view(shape) * zn.view_as(w) - step)
            if grad_noise and t >= burnin:
                ratio_sum[active] += drift_sq.sqrt() / (lr.sqrt().double() * za.double().norm(dim=1))
    failed = np.ones(L, dtype=bool)
    failed[active.cpu().numpy()] = False
    dist = np.full(L, np.nan)
    with torch.no_grad():
        if len(active):
            w0 = {n: cen[n][center_of[active]] for n in names}
            dist[active.cpu().numpy()] = torch.sqrt(sum((lanes[n] - w0[n]).double().pow(2).flatten(1).sum(1)
                                                        for n in names)).cpu().numpy()
    ratio = np.where(failed, np.nan, (ratio_sum / draws).cpu().numpy()) if grad_noise else np.full(L, np.nan)
    return {
        "trace": trace.T.numpy().reshape(K, S, C, steps),
        "init_loss": init_loss,
        "failed": failed.reshape(K, S, C),
        "distance": dist.reshape(K, S, C),
        "grad_noise": ratio.reshape(K, S, C),
    }
