"""The optimizer and gradient transforms on stacked parameters [M, *shape] (one row per
ensemble member), each with per-member constants, repeating the single run's operations.

`adamw_step` repeats, operation for operation, the single-tensor AdamW that
`torch.optim.AdamW` runs on CPU (weight decay `p *= 1 - lr*wd`; `m.lerp_(g, 1-b1)`;
`v = v*b2 + (1-b2) g*g`; `p += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)`), with `lr` and `wd`
per member; on CPU it gives the same float32 numbers as the optimizer (tests/trainers/
test_ensemble.py checks it against torch.optim.AdamW). torch.optim itself cannot take a
learning rate per row of one tensor.

A constant all members share is applied as the Python number the single run uses, so the
common case is the single run's exact operation; differing ones broadcast as [M, 1, ...].
"""

from __future__ import annotations

import math

import numpy as np
import torch

ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which the single-run loop uses


def per_member(values: list[float], like: torch.Tensor) -> float | torch.Tensor:
    """A per-member constant: the Python number when all are equal, else [M, 1, ...] like `like`."""
    if len(set(values)) == 1:
        return float(values[0])
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))


def row_sq(t: torch.Tensor) -> torch.Tensor:
    """[M, ...] -> [M]: each member's row's squared norm, in float64."""
    return (t.double() ** 2).flatten(1).sum(1)


@torch.no_grad()
def adamw_step(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], exp_avg: dict, exp_avg_sq: dict,
               counts: dict[str, int], lr: torch.Tensor, wd: torch.Tensor, betas) -> None:
    """torch.optim.AdamW's single-tensor update of every tensor in `grads` (a parameter without
    a gradient is skipped, no decay either, as torch does); lr, wd: float64 [M]."""
    b1, b2 = betas
    device = next(iter(params.values())).device
    decay = (1 - lr * wd).to(torch.float32).to(device)  # [M]; as `1 - lr*wd` cast to float32
    per_t: dict[int, tuple[torch.Tensor, float]] = {}  # step count -> (neg_step [M], bias_correction2_sqrt)
    for n, g in grads.items():
        counts[n] += 1
        t = counts[n]
        if t not in per_t:  # usually one count for every tensor: computed once per step
            per_t[t] = ((-(lr / (1 - b1**t))).to(torch.float32).to(device), (1 - b2**t) ** 0.5)
        neg_step, bias_correction2_sqrt = per_t[t]
        p = params[n]
        shape = (-1,) + (1,) * (p.dim() - 1)
        p.mul_(decay.view(shape))
        m, v = exp_avg[n], exp_avg_sq[n]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v.sqrt() / bias_correction2_sqrt).add_(ADAM_EPS)
        p.add_(m * neg_step.view(shape) / denom)  # = addcdiv_(m, denom, value=-step_size)


class StackedGrokfast:
    """regularizers.Grokfast with alpha and lambda per member (lambda 0: the gradient is kept)."""

    def __init__(self, params: dict[str, torch.Tensor], alphas: list[float], lams: list[float]):
        self.alphas, self.lams = list(alphas), list(lams)
        self.ema = {n: torch.zeros_like(p) for n, p in params.items()}
        self.initialized = False

    @torch.no_grad()
    def transform(self, grads: dict[str, torch.Tensor]) -> None:
        for n, g in grads.items():
            ema = self.ema[n]
            alpha, lam = per_member(self.alphas, g), per_member(self.lams, g)
            if not self.initialized:
                ema.copy_(g)
            elif isinstance(alpha, float):
                ema.mul_(alpha).add_(g, alpha=1 - alpha)
            else:
                ema.mul_(alpha).add_(g * (1 - alpha))
            if isinstance(lam, float):
                g.add_(ema, alpha=lam)
            else:
                g.add_(ema * lam)
        self.initialized = True

    def metrics(self) -> list[dict[str, float]]:
        if not self.initialized:
            return [{"grokfast_ema_norm": math.nan} for _ in self.alphas]
        norms = torch.sqrt(sum(row_sq(e) for e in self.ema.values())).cpu().numpy()
        return [{"grokfast_ema_norm": float(x)} for x in norms]

    def state(self, i: int) -> dict[str, np.ndarray]:
        out = {f"reg.grokfast.{n}.ema": e[i].detach().cpu().numpy() for n, e in self.ema.items()}
        out["reg.grokfast.initialized"] = np.array(float(self.initialized))
        return out

    def load_state(self, i: int, state: dict[str, np.ndarray]) -> None:
        if "reg.grokfast.initialized" not in state:  # a member without Grokfast: its lambda is 0
            return
        for n, e in self.ema.items():
            e[i].copy_(torch.from_numpy(np.array(state[f"reg.grokfast.{n}.ema"])))
        self.initialized = bool(np.array(state["reg.grokfast.initialized"]))

    def keep(self, idx: torch.Tensor) -> None:
        self.ema = {n: e.index_select(0, idx) for n, e in self.ema.items()}
        self.alphas = [self.alphas[i] for i in idx.tolist()]
        self.lams = [self.lams[i] for i in idx.tolist()]


class StackedPerpGrad:
    """regularizers.PerpendicularGradient on the members whose `perp_grad` is on."""

    def __init__(self, on: list[bool], rescale: bool):
        self.on, self.rescale = list(on), rescale
        self.removed: torch.Tensor | None = None

    @torch.no_grad()
    def transform(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        from groklens.trainers.regularizers import perpendicular

        removed, total = [], []
        on = torch.tensor(self.on, device=next(iter(grads.values())).device)
        for n, g in grads.items():
            new, removed_sq = perpendicular(params[n].detach(), g, rows=True, rescale=self.rescale)
            total.append(row_sq(g))
            removed.append(removed_sq)
            g.copy_(new if all(self.on) else torch.where(on.view(-1, *([1] * (g.dim() - 1))), new, g))
        self.removed = torch.sqrt(torch.stack(removed).sum(0) / torch.stack(total).sum(0).clamp_min(1e-300))

    def metrics(self) -> list[dict[str, float]]:
        values = [math.nan] * len(self.on) if self.removed is None else self.removed.cpu().numpy()
        return [{"perp_grad_removed": float(x)} for x in values]

    def keep(self, idx: torch.Tensor) -> None:
        self.on = [self.on[i] for i in idx.tolist()]
        self.removed = None if self.removed is None else self.removed.index_select(0, idx)
