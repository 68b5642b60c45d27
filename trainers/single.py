"""A model trained as a module: the single-run strategy, and the `Lane` the routed strategy
holds one of per copy.

One step of a lane (docs/VARIANTS.md): forward (with capture hooks, in a scope, only when a
regularizer term reads activations) -> objective = task loss (`loss`: ce | stablemax, float64,
mean over the batch and its readout positions) + the active regularizer terms -> backward ->
gradient transforms (Grokfast, then the perpendicular projection) -> AdamW step (torch's).
On CPU a run is deterministic for a given (seed, data_seed).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from groklens.config import RunConfig
from groklens.trainers.engine import (
    EVAL_CHUNK, Member, Strategy, nonfinite_reason, resolve_device, warmup_factor,
)
from groklens.trainers.models import build_model
from groklens.trainers.optim import AdamW
from groklens.trainers.losses import task_loss
from groklens.trainers.regularizers import Batch, build_regularizers
from groklens.tasks import TaskData

ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
REG_EVAL_MAX = EVAL_CHUNK  # training inputs on which regularizer terms are evaluated (a fixed subset if more)


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
        n = len(self.train_idx)  # where terms are evaluated: the training inputs (a fixed subset if many)
        pick = np.arange(n) if n <= REG_EVAL_MAX else np.sort(
            np.random.default_rng([cfg.data_seed, 2]).choice(n, REG_EVAL_MAX, replace=False))
        pick = torch.as_tensor(pick, device=device)
        self.reg_eval = Batch(self.train_x[pick], self.train_mask[pick], self.positions)

    def batch(self, batch_size: int, gen: torch.Generator):
        """The step's mini-batch (x, y, mask), drawn from `gen`; the whole training set when full-batch."""
        if batch_size and batch_size < len(self.train_y):
            pick = torch.randperm(len(self.train_y), generator=gen)[:batch_size].to(self.device)
            return self.train_x[pick], self.train_y[pick], self.train_mask[pick]
        return self.train_x, self.train_y, self.train_mask

    def readout(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, K, v] at the readout positions -> [b, v] (one target), or [b, K, v] (K answer tokens)."""
        return logits if self.multi_target else logits[:, 0]


class Lane:
    """One model being trained as a module: its parameters, AdamW, regularizers and batch order."""

    def __init__(self, cfg: RunConfig, data: TaskData, t: RunTensors, model: torch.nn.Module, seed: int):
        self.cfg, self.t = cfg, t
        self.model = model.to(t.device)
        self.params = dict(self.model.named_parameters())
        self.optimizer = AdamW(  # torch.optim.AdamW minus its torch._dynamo import (trainers/optim.py)
            self.params.values(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        self.regularizers = build_regularizers(cfg, self.model, data)
        self.terms = [r for r in self.regularizers if r.kind == "term"]
        self.transforms = [r for r in self.regularizers if r.kind == "grad"]
        self.acts: dict[str, torch.Tensor] = {}
        self.capture_hooks = [(name, self._capture) for name in sorted({n for r in self.terms for n in r.hook_names})]
        self.batch_gen = torch.Generator().manual_seed(seed + 1)  # mini-batch order only
        self.grad_norm = math.nan

    # ------------------------------------------------------------------ the step
    def _capture(self, tensor: torch.Tensor, hook) -> None:
        self.acts[hook.name] = tensor  # kept in the graph: the terms backpropagate through it

    def forward(self, x: torch.Tensor, params: dict[str, torch.Tensor] | None = None,
                capture: bool = True) -> torch.Tensor:
        """Logits at the readout positions [b, K, v], of this model or (routing) of `params` in its
        place. Models that can compute just those; with regularizer terms, the full forward pass
        with their hook sites captured in self.acts by hooks that live only for this call."""
        def call(*args, **kwargs):
            if params is None:
                return self.model(*args, **kwargs)
            return torch.func.functional_call(self.model, params, args, kwargs)

        if self.capture_hooks and capture:
            self.acts = {}
            with self.model.hooks(fwd_hooks=self.capture_hooks):
                return call(x)[:, self.t.readout_slice]
        if getattr(self.model, "supports_readout", False):
            return call(x, readout=self.t.readout_slice)
        return call(x)[:, self.t.readout_slice]

    def objective(self, logits: torch.Tensor, y: torch.Tensor, batch: Batch, step: int):
        """(task loss, objective = task loss + the terms on the activations just captured)."""
        loss = task_loss(logits, y, self.cfg.loss)
        objective = loss
        for reg in self.terms:
            objective = objective + reg.term(self.acts, batch, step)[0]
        self.acts = {}
        return loss, objective

    def set_lr(self, step: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr * warmup_factor(self.cfg, step)

    def update(self) -> None:
        """The gradient transforms, then AdamW."""
        for transform in self.transforms:
            transform.transform(self.params)
        self.optimizer.step()

    # ------------------------------------------------------------------ state for the file
    def host_params(self) -> dict[str, np.ndarray]:
        return {n: p.detach().cpu().numpy() for n, p in self.params.items()}

    def host_state(self) -> dict[str, np.ndarray]:
        """Optimizer moments and step counts, regularizer state and the batch order: all an exact
        resume needs of this lane (the strategy adds the process's RNG)."""
        out: dict[str, np.ndarray] = {}
        for name, p in self.params.items():
            st = self.optimizer.state.get(p, {})
            for key in ADAM_STATE:
                t = st.get(key)
                if t is None:  # before the first update the state is empty: store zeros
                    t = torch.zeros(() if key == "step" else p.shape)
                out[f"optim.{name}.{key}"] = t.detach().float().cpu().numpy()
        for reg in self.regularizers:  # e.g. the Grokfast EMA
            out.update(reg.state())
        out["rng.batch"] = self.batch_gen.get_state().numpy()
        return out

    def load_state(self, params: dict[str, torch.Tensor], state: dict[str, np.ndarray], step: int) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(params[name])
        if step > 0:
            for name, p in self.params.items():
                self.optimizer.state[p] = {
                    key: torch.from_numpy(np.array(state[f"optim.{name}.{key}"])).to(self.t.device)
                    for key in ADAM_STATE
                }
                self.optimizer.state[p]["step"] = self.optimizer.state[p]["step"].cpu()
        for reg in self.regularizers:
            reg.load_state(state, self.t.device)
        self.batch_gen.set_state(torch.from_numpy(np.array(state["rng.batch"])))

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int, observe=None) -> dict[str, float]:
        """Loss and accuracy on every input (accuracy = exact match over the K answer positions
        of a multi-target task), norms, and the regularizers' metrics. `observe(logits)` sees
        each chunk's readout logits in input order (routing builds its ensemble from them)."""
        self.model.eval()
        try:
            return self._evaluate(step, observe)
        finally:
            self.model.train()  # the mode training steps run in, set here once instead of every step

    def _evaluate(self, step: int, observe) -> dict[str, float]:
        t, cfg = self.t, self.cfg
        losses, correct, tokens, ces = [], [], [], []
        for start in range(0, len(t.inputs), EVAL_CHUNK):
            x, y = t.inputs[start : start + EVAL_CHUNK], t.labels[start : start + EVAL_CHUNK]
            logits = t.readout(self.forward(x, capture=False))
            if observe is not None:
                observe(logits)
            losses.append(task_loss(logits, y, cfg.loss, reduction="none"))
            hit = logits.argmax(-1) == y
            correct.append(hit.all(-1) if t.multi_target else hit)
            if t.multi_target:
                tokens.append(hit.double().mean(-1))
            if cfg.loss != "ce":
                ces.append(task_loss(logits, y, "ce", reduction="none"))
        norm = torch.sqrt(sum((p.detach().double() ** 2).sum() for p in self.params.values()))
        row = {"step": step, **split_means(t, "loss", torch.cat(losses)),
               **split_means(t, "acc", torch.cat(correct).double()),
               "weight_norm": float(norm), "grad_norm": self.grad_norm, "lr": cfg.lr * warmup_factor(cfg, step)}
        if t.multi_target:
            row.update(split_means(t, "token_acc", torch.cat(tokens)))
        if ces:
            row.update(split_means(t, "ce", torch.cat(ces)))
        if self.terms:  # each term on the training inputs, at this step's parameters
            self.forward(t.reg_eval.x)
            for reg in self.terms:
                _, metrics = reg.term(self.acts, t.reg_eval, step, evaluating=True)
                row.update({k: float(v) for k, v in metrics.items()})
            self.acts = {}
        for reg in self.transforms:
            row.update(reg.last_metrics())
        return row


def split_means(t: RunTensors, name: str, values: torch.Tensor) -> dict[str, float]:
    """train_<name> and test_<name>: the mean of per-input `values` [N] over each split."""
    return {f"train_{name}": float(values[t.train_idx].mean()), f"test_{name}": float(values[t.test_idx].mean())}


class SingleRun(Strategy):
    """One run, one module. `writer_factory(strategy)`, when given, opens its trajectory file."""

    label = "train"

    def __init__(self, cfg: RunConfig, data: TaskData, writer_factory=None, progress: bool = False,
                 path: str | Path = ""):
        self.cfg, self.data, self.progress = cfg, data, progress
        self.t = RunTensors(cfg, data, resolve_device(cfg.device))
        self.lane = Lane(cfg, data, self.t, build_model(cfg, data), cfg.seed)
        self.members = [Member(cfg, data, Path(path))]
        self.last_loss = math.nan  # the task loss of the last step
        if writer_factory is not None:
            self.members[0].writer = writer_factory(self)
            self.members[0].path = Path(self.members[0].writer.f.filename)

    @property
    def model(self) -> torch.nn.Module:
        return self.lane.model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lane.forward(x)

    # what benchmarks/train_throughput.py reads of a single run
    @property
    def train_x(self) -> torch.Tensor:
        return self.t.train_x

    @property
    def train_y(self) -> torch.Tensor:
        return self.t.train_y

    def readout(self, logits: torch.Tensor) -> torch.Tensor:
        return self.t.readout(logits)

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return task_loss(logits, y, self.cfg.loss)

    def train_step(self, step: int) -> list[tuple[Member, str]]:
        lane, member = self.lane, self.members[0]
        lane.set_lr(step)
        x, y, mask = self.t.batch(self.cfg.batch_size, lane.batch_gen)
        loss, objective = lane.objective(self.t.readout(lane.forward(x)), y, Batch(x, mask, self.t.positions), step)
        lane.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in lane.params.values() if p.grad is not None])
        loss_value, grad_value = float(objective.detach()), float(grad_norm)  # one sync per step
        if not (math.isfinite(loss_value) and math.isfinite(grad_value)):
            what, value = ("loss", loss_value) if not math.isfinite(loss_value) else ("gradient", grad_value)
            self.members = []
            return [(member, nonfinite_reason(what, value, step))]
        lane.grad_norm = member.grad_norm = grad_value
        lane.update()
        self.last_loss = float(loss.detach()) if lane.terms else loss_value
        return []

    def evaluate(self, step: int) -> list[dict[str, float]]:
        return [self.lane.evaluate(step)]

    def host_state(self) -> dict[str, np.ndarray]:
        out = self.lane.host_state()
        batch = out.pop("rng.batch")
        out["rng.torch"] = torch.get_rng_state().numpy()
        out["rng.batch"] = batch
        return out

    def payloads(self, indices):
        return [(self.lane.host_params(), self.host_state(), [])]

    def load(self, params, state, copies, step: int) -> None:
        self.lane.load_state(params, state, step)
        torch.set_rng_state(torch.from_numpy(np.array(state["rng.torch"])))

    def keep(self, indices):
        self.members = [self.members[i] for i in indices]
