"""What a training step is made of, written once for every kind of run (single, ensemble,
routed; docs/VARIANTS.md):

    batch (`draw_batch`) -> readout logits (`readout_logits`, with capture hooks in a scope only
    when a regularizer term reads activations) -> objective = task loss + the terms
    (`objective`) -> backward -> gradient norms and the non-finite check (`check_finite`) ->
    the update: gradient transforms, then AdamW (trainers/optim.py `Update`).

The strategies differ only in how they hold parameters and run the forward pass: a module
(single.py, each routed copy), or stacked parameters under torch.func.vmap (ensemble.py). A
run's data on the device is `RunTensors`; an ensemble stacks its members'.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

import numpy as np
import torch

from groklens.config import RunConfig
from groklens.tasks import TaskData
from groklens.trainers.engine import EVAL_CHUNK, nonfinite_reason
from groklens.models.losses import task_loss
from groklens.trainers.regularizers import Batch, Regularizer

REG_EVAL_MAX = EVAL_CHUNK  # training inputs on which regularizer terms are evaluated (a fixed subset if more)


def reg_eval_rows(cfg: RunConfig, n_train: int) -> np.ndarray:
    """Which training inputs the terms are evaluated on: all, or a fixed subset drawn from data_seed."""
    if n_train <= REG_EVAL_MAX:
        return np.arange(n_train)
    return np.sort(np.random.default_rng([cfg.data_seed, 2]).choice(n_train, REG_EVAL_MAX, replace=False))


def draw_batch(n_train: int, batch_size: int, gen: torch.Generator, cfg: RunConfig | None = None,
               step: int = 0) -> torch.Tensor | None:
    """The step's mini-batch, rows of the training set; None when full-batch. batch_order=random
    (or no `cfg`): batch_size rows drawn from `gen`. batch_order=epoch: batch k of epoch e =
    step // ceil(n / batch_size) of a permutation drawn from (cfg.seed, e) alone, so a resume
    needs no state and a seed's order does not depend on the other members of an ensemble."""
    if not (batch_size and batch_size < n_train):
        return None
    if cfg is None or cfg.batch_order == "random":
        return torch.randperm(n_train, generator=gen)[:batch_size]
    epoch, k = divmod(step, -(-n_train // batch_size))
    return torch.from_numpy(epoch_permutation(n_train, cfg.seed, epoch)[k * batch_size:(k + 1) * batch_size])


@functools.lru_cache(maxsize=8)
def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """batch_order=epoch: the order of the training rows in `epoch` (numpy PCG64 from seed, epoch)."""
    return np.random.default_rng([seed, 7, epoch]).permutation(n)


def readout(logits: torch.Tensor, multi_target: bool) -> torch.Tensor:
    """[b, K, v] at the readout positions -> [b, v] (one target), or [b, K, v] (K answer tokens)."""
    return logits if multi_target else logits[:, 0]


def model_captures(model: torch.nn.Module, sites: Sequence[str]) -> bool:
    """True when the model can record these capture sites itself (Transformer.site_capture:
    each block's resid_post, its attention scores), so that the step needs no hook and keeps the lean path."""
    return bool(sites) and hasattr(model, "can_capture") and all(model.can_capture(s) for s in sites)


@contextlib.contextmanager
def model_capture(model: torch.nn.Module, sites: Sequence[str], terms: Sequence[Regularizer]):
    """For the calls inside, the model records `sites` itself (Transformer.site_capture) into the
    dict this yields; at every position unless each term reads the readout rows only
    (`Regularizer.readout_only`: then the last block runs at the readout positions alone)."""
    model.site_capture = {name: None for name in sites}
    model.capture_all_positions = not all(term.readout_only for term in terms)
    try:
        yield model.site_capture
    finally:
        model.site_capture = None
        model.capture_all_positions = True


def readout_logits(call: Callable[..., torch.Tensor], x: torch.Tensor, positions: slice, full: bool,
                   supports_readout: bool) -> torch.Tensor:
    """Logits at the readout positions [b, K, v] of `call(x)` (a model, or a functional call of
    one): the full forward pass when `full` (capture hooks read every site), else just what the
    loss needs where the model can compute only that (`supports_readout`)."""
    if supports_readout and not full:
        return call(x, readout=positions)
    return call(x)[:, positions]


def objective(logits: torch.Tensor, labels: torch.Tensor, loss: str, terms: Sequence[Regularizer],
              acts: dict[str, torch.Tensor], batch: Batch, step: int,
              weights: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(task loss, objective = task loss + each term on the activations just captured). `weights`:
    a vmapped ensemble member's own term weights (None: the one config's)."""
    value = task_loss(logits, labels, loss)
    total = value
    for reg in terms:
        total = total + reg.term(acts, batch, step, weight=None if weights is None else weights[reg.name])[0]
    return value, total


def check_finite(objectives: torch.Tensor, norms: torch.Tensor, step: int, what: Sequence[str] = ("loss", "gradient")
                 ) -> tuple[np.ndarray, list[str | None]]:
    """Objectives [M] and gradient norms [M] on the host in one sync; per member the reason it
    must stop (a non-finite loss or gradient), or None."""
    host = torch.stack([objectives.detach(), norms.double()]).cpu().numpy()
    reasons: list[str | None] = []
    for i in range(host.shape[1]):
        if not np.isfinite(host[0, i]):
            reasons.append(nonfinite_reason(what[0], host[0, i], step))
        elif not np.isfinite(host[1, i]):
            reasons.append(nonfinite_reason(what[1], host[1, i], step))
        else:
            reasons.append(None)
    return host, reasons


class RunTensors:
    """A run's data on the device: every input, the training set, the readout positions."""

    def __init__(self, cfg: RunConfig, data: TaskData, device: torch.device):
        self.positions = data.readout_positions  # [readout_pos], or K consecutive ones (multi-target)
        self.multi_target = data.n_targets > 0
        self.readout_slice = slice(self.positions[0], self.positions[-1] + 1)
        self.device = device
        self.inputs = data.inputs.to(device)
        self.labels = data.labels.to(device)
        self.mask = data.informative_mask.to(device)
        self.train_idx = data.train_idx.to(device)
        self.test_idx = data.test_idx.to(device)
        self.train_x = self.inputs[self.train_idx]
        self.train_y = self.labels[self.train_idx]
        self.train_mask = self.mask[self.train_idx]
        pick = torch.as_tensor(reg_eval_rows(cfg, len(self.train_idx)), device=device)
        self.reg_eval = Batch(self.train_x[pick], self.train_mask[pick], self.positions)

    def batch(self, cfg: RunConfig, gen: torch.Generator, step: int):
        """The step's mini-batch (x, y, mask) (`draw_batch`); the whole training set when full-batch."""
        pick = draw_batch(len(self.train_y), cfg.batch_size, gen, cfg, step)
        if pick is None:
            return self.train_x, self.train_y, self.train_mask
        pick = pick.to(self.device)
        return self.train_x[pick], self.train_y[pick], self.train_mask[pick]

    def readout(self, logits: torch.Tensor) -> torch.Tensor:
        return readout(logits, self.multi_target)
