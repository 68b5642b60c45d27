"""A model trained as a module: the single-run strategy, and the `Lane` the routed strategy
holds one of per copy.

One step of a lane is the step every strategy takes (trainers/step.py): forward (with capture
hooks, in a scope, only when a regularizer term reads activations) -> objective = task loss
(`loss`: ce | stablemax, float64, mean over the batch and its readout positions) + the active
regularizer terms -> backward -> the update (trainers/optim.py: the gradient transforms, then
AdamW, or Adam with an L2 weight-decay term with `optimizer=adam`), here on the module's
parameters viewed as stacks of one. On CPU a run is deterministic for a given (seed, data_seed).
With `compile=true` a single run's training forward (and its backward) is the model under
torch.compile (`Lane.train_logits`); evaluation stays eager.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.tasks import TaskData
from groklens.trainers.engine import EVAL_CHUNK, Member, Strategy, resolve_device
from groklens.models.losses import task_loss
from groklens.trainers.evaluation import concat, rows, score, split_columns, weight_norms
from groklens.models import build_model
from groklens.trainers.optim import Update, grad_norms, stack_of_one
from groklens.trainers.regularizers import Batch, active_regularizers, build_regularizers
from groklens.trainers.step import (
    RunTensors, check_finite, model_capture, model_captures, objective, readout_logits)


def compile_refusal(cfg: RunConfig) -> str | None:
    """Why `cfg` cannot train with compile=true (None: it can): torch.compile takes the hook-free
    step of a single run; a routed run and regularizer terms (they read activations through
    hooks) train eagerly."""
    if cfg.routing_copies > 1:
        return "a routed run (routing_copies > 1) trains eagerly"
    terms = [cls.weight_field for cls in active_regularizers([cfg]) if cls.kind == "term"]
    if terms:
        return f"regularizer terms read activations through hooks ({', '.join(terms)})"
    return None


def check_compiler(device: str = "cpu") -> None:
    """A one-line BadInput where torch.compile cannot build kernels for `device` (CPU kernels are
    C++), before any file is written, not at the first step."""
    try:
        if device == "cpu":
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
    except RuntimeError as exc:  # no C++ compiler, or a Python or platform torch.compile does not support
        raise BadInput(f"compile=true: torch.compile is unavailable here ({str(exc).splitlines()[0]})") from None


def compiled(model: torch.nn.Module):
    """compile=true: `model` under torch.compile, which compiles its forward and (AOTAutograd) its
    backward at the first call; fixed shapes (the step's batch never changes)."""
    check_compiler(next(model.parameters()).device.type)
    try:
        return torch.compile(model, dynamic=False)
    except RuntimeError as exc:  # a Python or platform torch.compile does not support
        raise BadInput(f"compile=true: torch.compile is unavailable here ({str(exc).splitlines()[0]})") from None


class Lane:
    """One model being trained as a module: its parameters, regularizers, update and batch order."""

    def __init__(self, cfg: RunConfig, data: TaskData, t: RunTensors, model: torch.nn.Module, seed: int):
        self.cfg, self.t = cfg, t
        self.model = model.to(t.device)
        self.params = dict(self.model.named_parameters())
        self.stacked = stack_of_one(self.params)  # views: the update writes the module's parameters
        self.regularizers = build_regularizers([cfg], self.model, data, self.stacked)
        self.terms = [r for r in self.regularizers if r.kind == "term"]
        self.update = Update([cfg], self.stacked, [r for r in self.regularizers if r.kind == "grad"])
        self.acts: dict[str, torch.Tensor] = {}
        self.capture_hooks = [(name, self._capture) for name in sorted({n for r in self.terms for n in r.hook_names})]
        # sites the model records itself (Transformer.site_capture): the step keeps its lean path
        self.model_captures = model_captures(self.model, [name for name, _ in self.capture_hooks])
        self.batch_gen = torch.Generator().manual_seed(seed + 1)  # mini-batch order only
        self.grad_norm = math.nan
        refusal = compile_refusal(cfg) if cfg.compile else None
        if refusal:  # refused before inductor is imported or anything compiled
            raise BadInput(f"compile=true compiles the hook-free training step of a single run; {refusal}: "
                           "train it without compile")
        self.compiled = compiled(self.model) if cfg.compile else None

    # ------------------------------------------------------------------ the step
    def _capture(self, tensor: torch.Tensor, hook) -> None:
        self.acts[hook.name] = tensor  # kept in the graph: the terms backpropagate through it

    def forward(self, x: torch.Tensor, params: dict[str, torch.Tensor] | None = None,
                capture: bool = True) -> torch.Tensor:
        """Logits at the readout positions [b, K, v], of this model or (routing) of `params` in its
        place; with regularizer terms, their hook sites are captured in self.acts by hooks that
        live only for this call."""
        def call(x, **kwargs):
            if params is None:
                return self.model(x, **kwargs)
            return torch.func.functional_call(self.model, params, (x,), kwargs)

        supports = getattr(self.model, "supports_readout", False)
        if self.capture_hooks and capture and self.model_captures:
            # the model records its sites itself and unembeds the readout positions only
            with model_capture(self.model, [name for name, _ in self.capture_hooks], self.terms) as self.acts:
                return readout_logits(call, x, self.t.readout_slice, False, supports)
        if self.capture_hooks and capture:
            self.acts = {}
            with self.model.hooks(fwd_hooks=self.capture_hooks):
                return readout_logits(call, x, self.t.readout_slice, True, supports)
        return readout_logits(call, x, self.t.readout_slice, False, supports)

    def train_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The training step's logits at the readout positions: `forward`'s, by the compiled model
        with compile=true (evaluation stays eager: other shapes, no gradient)."""
        if self.compiled is None:
            return self.forward(x)
        return readout_logits(self.compiled, x, self.t.readout_slice, False,
                              getattr(self.model, "supports_readout", False))

    def objective(self, logits: torch.Tensor, y: torch.Tensor, batch: Batch, step: int):
        """(task loss, objective = task loss + the terms on the activations just captured)."""
        out = objective(logits, y, self.cfg.loss, self.terms, self.acts, batch, step)
        self.acts = {}
        return out

    def grads(self) -> dict[str, torch.Tensor]:
        """The gradients of the last backward, as stacks of one (a parameter the loss does not
        reach, e.g. W_Q under uniform attention, has none and is not stepped)."""
        return stack_of_one({n: p.grad for n, p in self.params.items() if p.grad is not None})

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def step(self, step: int, grads: dict[str, torch.Tensor]) -> None:
        """The update from `step` to `step + 1`: the gradient transforms, then AdamW."""
        self.update(self.stacked, grads, step)

    # ------------------------------------------------------------------ state for the file
    def host_params(self) -> dict[str, np.ndarray]:
        return {n: p.detach().cpu().numpy() for n, p in self.params.items()}

    def host_state(self) -> dict[str, np.ndarray]:
        """Optimizer moments and step counts, regularizer state and the batch order: all an exact
        resume needs of this lane (the strategy adds the process's RNG)."""
        return {**self.update.state(0), "rng.batch": self.batch_gen.get_state().numpy()}

    def load_state(self, params: dict[str, torch.Tensor], state: dict[str, np.ndarray], step: int) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(params[name])
        self.update.load(0, state, step)
        self.batch_gen.set_state(torch.from_numpy(np.array(state["rng.batch"])))

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int, observe=None) -> dict[str, float]:
        """The evaluation row (trainers/evaluation.py) of this model. `observe(logits)` sees each
        chunk's readout logits in input order (routing builds its ensemble from them)."""
        self.model.eval()
        try:
            return self._evaluate(step, observe)
        finally:
            self.model.train()  # the mode training steps run in, set here once instead of every step

    def _evaluate(self, step: int, observe) -> dict[str, float]:
        t, cfg = self.t, self.cfg
        chunks = []
        for start in range(0, len(t.inputs), EVAL_CHUNK):
            logits = t.readout(self.forward(t.inputs[start : start + EVAL_CHUNK], capture=False))
            if observe is not None:
                observe(logits)
            chunks.append(score(logits, t.labels[start : start + EVAL_CHUNK], cfg.loss, t.multi_target))
        scores = {k: v[None] for k, v in concat(chunks).items()}
        columns = split_columns(scores, t.train_idx[None], t.test_idx[None])
        columns["weight_norm"] = weight_norms(self.stacked)
        if self.terms:  # each term on the training inputs, at this step's parameters
            self.forward(t.reg_eval.x)
            for reg in self.terms:
                _, metrics = reg.term(self.acts, t.reg_eval, step, evaluating=True)
                columns.update({k: v.reshape(1) for k, v in metrics.items()})
            self.acts = {}
        return rows(step, columns, [cfg], [self.grad_norm], self.update.metrics())[0]


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
            # a writer that keeps no file (tests, benchmarks) leaves the given path
            self.members[0].path = Path(getattr(self.members[0].writer, "path", path))

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
        x, y, mask = self.t.batch(self.cfg, lane.batch_gen, step)
        loss, total = lane.objective(self.t.readout(lane.train_logits(x)), y, Batch(x, mask, self.t.positions), step)
        lane.zero_grad()
        total.backward()
        grads = lane.grads()
        host, (reason,) = check_finite(total.reshape(1), grad_norms(grads), step)  # one sync per step
        if reason is not None:
            self.members = []
            return [(member, reason)]
        lane.grad_norm = member.grad_norm = float(host[1, 0])
        lane.step(step, grads)
        self.last_loss = float(loss.detach()) if lane.terms else float(host[0, 0])
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
