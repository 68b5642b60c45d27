"""The task losses of training and of every analysis, in float64 but for ce_float32 (docs/VARIANTS.md
`loss`): the registry of per-position losses (`LOSSES`: ce, stablemax, ce_float32, perceptron) and `task_loss`,
which reads one at the readout position or over a task's K answer positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from groklens.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

LOSSES: Registry[Callable[..., torch.Tensor]] = Registry("loss")


@LOSSES.register("ce")
def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Softmax cross-entropy in float64 (float32 underflows once a grokked model is confident)."""
    return F.cross_entropy(logits.to(torch.float64), labels, reduction=reduction)


@LOSSES.register("ce_float32")
def cross_entropy_float32(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Softmax cross-entropy in float32, as Prieto et al.'s default (`--softmax_precision 32`): once
    the label's logit leads the others by about ln(2^24 x classes) nats, sum_j exp(x_j - x_label)
    rounds to 1, the label's log-probability to 0 and its logit's gradient to exactly 0 (their
    softmax collapse); float64 delays that to ln(2^53 x classes)."""
    return F.cross_entropy(logits.to(torch.float32), labels, reduction=reduction)


def stablemax_s(x: torch.Tensor) -> torch.Tensor:
    """Prieto et al. 2025: s(x) = x + 1 for x >= 0, 1 / (1 - x) for x < 0 (positive, monotone)."""
    return torch.where(x >= 0, x + 1, 1 / (1 - x.clamp(max=0)))  # the clamp keeps the unused branch finite


def stablemax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """StableMax probabilities s(x_i) / sum_j s(x_j), in float64."""
    s = stablemax_s(logits.to(torch.float64))
    return s / s.sum(dim=dim, keepdim=True)


@LOSSES.register("stablemax")
def stablemax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """-log StableMax(logits)[label], in float64. logits [n, v], labels [n];
    reduction "mean" | "sum" | "none", as F.cross_entropy."""
    s = stablemax_s(logits.to(torch.float64))
    logp = s.log() - s.sum(-1, keepdim=True).log()
    return _reduce(-logp.gather(-1, labels[:, None]).squeeze(-1), reduction)


def _reduce(per_input: torch.Tensor, reduction: str) -> torch.Tensor:
    """F.cross_entropy's reductions of per-input losses: mean | sum | none."""
    if reduction == "mean":
        return per_input.mean()
    if reduction == "sum":
        return per_input.sum()
    if reduction == "none":
        return per_input
    raise ValueError(f"reduction must be mean, sum or none; got {reduction!r}")


@LOSSES.register("perceptron")
def perceptron_criterion(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Rosenblatt's perceptron criterion, max(0, max_{c != label} x_c - x_label), in float64: 0 for
    an input already classified right, so gradient descent on it updates on the errors only (the
    perceptron rule, with two classes and logits (0, h): max(0, -y h), y = +-1). Reductions as
    F.cross_entropy."""
    x = logits.to(torch.float64)
    own = x.gather(-1, labels[:, None]).squeeze(-1)
    other = x.scatter(-1, labels[:, None], float("-inf")).amax(-1)
    return _reduce((other - own).clamp(min=0), reduction)


def task_loss(logits: torch.Tensor, labels: torch.Tensor, loss: str = "ce", reduction: str = "mean") -> torch.Tensor:
    """The task loss of training and of every analysis: `loss` (ce | stablemax | ce_float32) at
    the readout position, logits [b, v] and labels [b], or over K answer positions, logits
    [b, K, v] and labels [b, K]. 'mean' averages every position; 'none' gives one value per
    input (the mean over its K positions); 'sum' sums those."""
    fn = LOSSES.get(loss)
    v = logits.shape[-1]
    if reduction == "mean":
        return fn(logits.reshape(-1, v), labels.reshape(-1), reduction="mean")
    out = fn(logits.reshape(-1, v), labels.reshape(-1), reduction="none")
    per_input = out.reshape(labels.shape).mean(-1) if labels.dim() == 2 else out
    return per_input.sum() if reduction == "sum" else per_input


def task_loss_at_readout(logits: torch.Tensor, labels: torch.Tensor, data: "TaskData", loss: str = "ce",
                         reduction: str = "mean") -> torch.Tensor:
    """`task_loss` of a model's whole output, logits [b, n_ctx, v], read at the run's readout
    position (labels [b]) or its K answer positions (labels [b, K])."""
    positions = data.readout_positions
    out = logits[:, positions[0]] if labels.dim() == 1 else logits[:, positions[0] : positions[-1] + 1]
    return task_loss(out, labels, loss, reduction=reduction)


__all__ = ["LOSSES", "cross_entropy", "cross_entropy_float32", "perceptron_criterion", "stablemax",
           "stablemax_cross_entropy", "stablemax_s", "task_loss",
           "task_loss_at_readout"]
