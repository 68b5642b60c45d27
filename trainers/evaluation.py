"""The evaluation row, written once for every kind of run: per-input scores (`score`), their
means over each member's training and test split (`split_columns`), and the rows a member's
file gets (`rows`): task loss and accuracy on every input (accuracy = exact match over the K
answer positions of a multi-target task, with the per-token accuracy beside it), the softmax
cross-entropy beside a non-ce loss, the weight norm, the last step's gradient norm and lr, and
the regularizers' metrics. Values carry a leading member axis [M] (a single run: M = 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from groklens.config import RunConfig
from groklens.trainers.engine import warmup_factor
from groklens.models.losses import task_loss


def score(logits: torch.Tensor, labels: torch.Tensor, loss: str, multi_target: bool) -> dict[str, torch.Tensor]:
    """Per input [b]: the task loss (float64), accuracy, and where they apply the per-token
    accuracy and the cross-entropy. logits [b, v] / labels [b], or [b, K, v] / [b, K]."""
    hit = logits.argmax(-1) == labels
    out = {"loss": task_loss(logits, labels, loss, reduction="none"),
           "acc": (hit.all(-1) if multi_target else hit).double()}
    if multi_target:
        out["token_acc"] = hit.double().mean(-1)
    if loss != "ce":
        out["ce"] = task_loss(logits, labels, "ce", reduction="none")
    return out


def concat(chunks: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Scores of consecutive input chunks joined along the input axis (the last)."""
    return {k: torch.cat([c[k] for c in chunks], dim=-1) for k in chunks[0]}


def split_columns(scores: dict[str, torch.Tensor], train_idx: torch.Tensor, test_idx: torch.Tensor
                  ) -> dict[str, torch.Tensor]:
    """train_<name> and test_<name> [M]: each member's mean of per-input scores [M, N] over its
    split (train_idx, test_idx [M, n])."""
    return {f"{split}_{name}": torch.gather(v, 1, idx).mean(1) for name, v in scores.items()
            for split, idx in (("train", train_idx), ("test", test_idx))}


def weight_norms(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Each member's parameter norm [M] (float64), of stacked parameters [M, *shape]."""
    return torch.sqrt(sum((p.detach().double() ** 2).flatten(1).sum(1) for p in params.values()))


def rows(step: int, columns: dict[str, torch.Tensor], cfgs: Sequence[RunConfig], grad_norms: Sequence[float],
         extras: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """One row per member from columns [M] (one host sync), with each member's last gradient
    norm, its lr at `step` and its extra (host) metrics."""
    keys = list(columns)
    host = torch.stack([columns[k].double() for k in keys]).cpu().numpy()
    return [{"step": step, **{k: float(host[j, i]) for j, k in enumerate(keys)}, "grad_norm": grad_norms[i],
             "lr": cfg.lr * warmup_factor(cfg, step), **extras[i]} for i, cfg in enumerate(cfgs)]
