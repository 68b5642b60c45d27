"""The update every strategy applies after backward: the gradient transforms, then AdamW, on
stacked parameters `{name: [M, *shape]}` (one row per member) with per-member constants.

Written once for every kind of run: an ensemble's parameters are stacked, a single run's (and
each routed copy's) are viewed as stacks of one (`stack_of_one`), so a single run is an
ensemble of one here and every transform or optimizer change reaches all three.

`AdamW` repeats, operation for operation, the single-tensor AdamW that `torch.optim.AdamW` runs
on CPU (weight decay `p *= 1 - lr*wd`; `m.lerp_(g, 1-b1)`; `v = v*b2 + (1-b2) g*g`;
`p += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)`, eps = the config's adam_eps), with `lr` and `wd` per member: on CPU it
gives torch's float32 numbers to the bit (tests/trainers/test_optim.py). torch.optim itself
cannot take a learning rate per row of one tensor, and its first call imports torch._dynamo
(about the cost of `import torch`, paid before a run's first step); this one does neither.
A parameter the loss does not reach (no gradient) is not stepped, not even decayed, as in torch.
The update runs tensor by tensor, every operation while the tensor is in cache: `_foreach_*`
ops (one call per operation over all tensors) measured no faster inside the paper-scale step
(0.99-1.11x: each sweeps all ~0.9 MB of parameters, likely beyond L2). With one rate for every
member (a single run) the last operation is torch's own `addcdiv_`, one pass instead of three
(benchmarks/optim_update.py: the update 0.83-1.04x in the step, where it is ~1%; docs/PERFORMANCE.md).

With `optimizer=adam` (config) the same class runs torch.optim.Adam's update instead: weight
decay is the coupled L2 term `g + wd*w` added to the gradient before the moments (rescaled by
Adam like the loss gradient), not AdamW's decoupled `p *= 1 - lr*wd`; devinterp's grokking
notebook trains so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from groklens.trainers.engine import warmup_factor

if TYPE_CHECKING:  # pragma: no cover
    from groklens.config import RunConfig
    from groklens.trainers.regularizers import Regularizer

ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")  # the checkpoint keys optim.<param>.<key>


def stack_of_one(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{name: [1, *shape]} views of a module's parameters (or gradients): updated in place, the
    update changes the module's own tensors."""
    return {n: t.detach().unsqueeze(0) for n, t in tensors.items()}


def grad_norms(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each member's gradient norm [M], as torch.nn.utils.get_total_norm: the norm of the
    per-tensor norms (tensors without a gradient left out)."""
    per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1)
    return torch.linalg.vector_norm(per_tensor, dim=1)


class AdamW:
    """AdamW state (moments, per-tensor step counts) of stacked parameters; see the module docstring."""

    def __init__(self, params: dict[str, torch.Tensor], betas: Sequence[float], coupled_decay: bool = False,
                 eps: float = 1e-8):
        self.betas = tuple(betas)
        self.eps = eps  # added to sqrt(v_hat): the config's adam_eps
        self.coupled_decay = coupled_decay  # Adam's L2 term instead of AdamW's decoupled decay
        self.exp_avg = {n: torch.zeros_like(p) for n, p in params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in params.items()}
        self.steps = {n: 0 for n in params}  # per tensor: one without gradients is not stepped

    @torch.no_grad()
    def step(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], lr: torch.Tensor,
             wd: torch.Tensor) -> None:
        """Update every tensor in `grads`; lr, wd: float64 [M] on the host."""
        b1, b2 = self.betas
        device = next(iter(params.values())).device
        decay = (1 - lr * wd).to(torch.float32).to(device)  # [M]; as `1 - lr*wd` cast to float32
        if self.coupled_decay:
            same_wd = bool((wd == wd[0]).all())
            wd32 = wd.to(torch.float32).to(device)
        one_rate = bool((lr == lr[0]).all())  # a single run, or members of one lr: torch's own addcdiv_
        per_t: dict[int, tuple[torch.Tensor, float, float]] = {}  # step count -> (neg_step [M], its value, bc2_sqrt)
        for n, g in grads.items():
            self.steps[n] += 1
            t = self.steps[n]
            if t not in per_t:  # usually one count for every tensor: computed once per step
                neg = (-(lr / (1 - b1**t))).to(torch.float32)
                per_t[t] = (neg.to(device), float(neg[0]), (1 - b2**t) ** 0.5)
            neg_step, step_value, bias_correction2_sqrt = per_t[t]
            p = params[n]
            shape = (-1,) + (1,) * (p.dim() - 1)
            if not self.coupled_decay:
                p.mul_(decay.view(shape))
            elif same_wd:  # torch.optim.Adam: grad.add(param, alpha=weight_decay)
                g = g.add(p, alpha=float(wd[0]))
            else:
                g = g + wd32.view(shape) * p
            m, v = self.exp_avg[n], self.exp_avg_sq[n]
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(self.eps)
            if one_rate:
                p.addcdiv_(m, denom, value=step_value)
            else:  # a rate per member: addcdiv_'s numbers, (value * m) / denom added, in three passes
                p.add_(m * neg_step.view(shape) / denom)

    def state(self, i: int) -> dict[str, np.ndarray]:
        """Member i's optimizer state under the checkpoint's keys (zeros before its first update)."""
        out = {}
        for n in self.steps:
            out[f"optim.{n}.step"] = np.array(self.steps[n], dtype=np.float32)
            out[f"optim.{n}.exp_avg"] = self.exp_avg[n][i].cpu().numpy()
            out[f"optim.{n}.exp_avg_sq"] = self.exp_avg_sq[n][i].cpu().numpy()
        return out

    def load(self, i: int, state: dict[str, np.ndarray], step: int) -> None:
        """Member i's state from a checkpoint at `step` (step 0: the initial zeros stay)."""
        if step == 0:
            return
        with torch.no_grad():
            for n in self.steps:
                self.exp_avg[n][i].copy_(torch.from_numpy(np.array(state[f"optim.{n}.exp_avg"])))
                self.exp_avg_sq[n][i].copy_(torch.from_numpy(np.array(state[f"optim.{n}.exp_avg_sq"])))
        self.steps = {n: int(np.array(state[f"optim.{n}.step"])) for n in self.steps}  # shared by the members

    def keep(self, idx: torch.Tensor) -> None:
        self.exp_avg = {n: t.index_select(0, idx) for n, t in self.exp_avg.items()}
        self.exp_avg_sq = {n: t.index_select(0, idx) for n, t in self.exp_avg_sq.items()}


class Update:
    """The gradient transforms of the members' regularizers (in composition order), then AdamW
    with each member's lr (after warm-up) and weight decay, on stacked parameters."""

    def __init__(self, cfgs: Sequence["RunConfig"], params: dict[str, torch.Tensor],
                 transforms: Sequence["Regularizer"]):
        self.cfgs = list(cfgs)
        self.transforms = list(transforms)
        # betas, eps and the optimizer are shared (ensemble.py); optimizer=adam: Adam's coupled L2 decay
        self.adamw = AdamW(params, cfgs[0].betas, coupled_decay=cfgs[0].optimizer == "adam", eps=cfgs[0].adam_eps)
        self._constants()

    def _constants(self) -> None:
        self.lr = torch.tensor([c.lr for c in self.cfgs], dtype=torch.float64)
        self.wd = torch.tensor([c.weight_decay for c in self.cfgs], dtype=torch.float64)

    def __call__(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], step: int) -> None:
        """The update from `step` to `step + 1` (grads are rewritten in place by the transforms)."""
        for transform in self.transforms:
            transform.transform(params, grads)
        factor = torch.tensor([warmup_factor(c, step) for c in self.cfgs], dtype=torch.float64)
        self.adamw.step(params, grads, self.lr * factor, self.wd)

    def metrics(self) -> list[dict[str, float]]:
        """Per member, what the transforms report on their last update."""
        rows: list[dict[str, float]] = [{} for _ in self.cfgs]
        for transform in self.transforms:
            for row, metrics in zip(rows, transform.metrics()):
                row.update(metrics)
        return rows

    def state(self, i: int) -> dict[str, np.ndarray]:
        """Member i's optimizer and transform state (e.g. the Grokfast EMA), for an exact resume."""
        out = self.adamw.state(i)
        for transform in self.transforms:
            out.update(transform.state(i))
        return out

    def load(self, i: int, state: dict[str, np.ndarray], step: int) -> None:
        self.adamw.load(i, state, step)
        for transform in self.transforms:
            transform.load_state(i, state)

    def keep(self, idx: torch.Tensor) -> None:
        """Continue with members idx only."""
        self.cfgs = [self.cfgs[i] for i in idx.tolist()]
        self.adamw.keep(idx)
        for transform in self.transforms:
            transform.keep(idx)
        self._constants()
