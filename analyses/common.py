"""What several analyses share: the evaluation set, the task loss, default hook sites."""

from __future__ import annotations

from typing import TYPE_CHECKING

from groklens.config import CHOICES, RunConfig
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.tasks import TaskData

EVAL_SETS = ("train", "test", "all")
LOSS_NAMES = CHOICES["loss"]  # the config's list; groklens.models.losses.LOSSES registers these (a test checks)


def eval_rows(data: TaskData, eval_set: str) -> torch.Tensor:
    """Row indices of the evaluation set: the run's training inputs, test inputs, or all."""
    import torch

    if eval_set == "train":
        return data.train_idx
    if eval_set == "test":
        return data.test_idx
    if eval_set == "all":
        return torch.arange(len(data.inputs))
    raise BadInput(f"eval_set must be one of {', '.join(EVAL_SETS)}; got {eval_set!r}")


def check_loss(loss) -> str:
    if loss is None:
        return RunConfig.loss  # the config's default loss
    if loss not in LOSS_NAMES:
        raise BadInput(f"loss must be one of {', '.join(LOSS_NAMES)}; got {loss!r}")
    return loss


def task_loss(logits: torch.Tensor, labels: torch.Tensor, data: TaskData, loss: str = "ce",
              reduction: str = "mean") -> torch.Tensor:
    """The training objective's task loss (models/losses.py, the one the trainer uses), read at
    the run's readout position(s); `loss` checked as an analysis argument. logits [b, n_ctx, v],
    labels [b] or [b, K]."""
    from groklens.models.losses import task_loss_at_readout  # imports torch

    return task_loss_at_readout(logits, labels, data, check_loss(loss), reduction=reduction)


def hidden_sites(model) -> list[str]:
    """Each layer's hidden representation: blocks.{l}.hook_resid_post (transformer) or
    layers.{i}.hook_post (MLP), the sites of the activation-norm penalty."""
    from groklens.trainers.regularizers import hidden_sites as _hidden  # imports torch

    return _hidden(model)
