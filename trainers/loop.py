"""The training loop: AdamW with linear warm-up, float64 loss, periodic evaluation, and a
checkpoint trajectory written as it goes (groklens.checkpoints).

Step s means "after s optimizer updates": step 0 is the initialisation. The same code runs on
CPU and CUDA; on CPU a run is deterministic for a given (seed, data_seed), and a resumed run
ends bit-identical to an uninterrupted one (optimizer, regularizer and RNG state travel in the
file).

One training step (docs/VARIANTS.md): forward (with capture hooks, in a scope, only when a
regularizer term reads activations) -> objective = task loss (`loss`: ce | stablemax, float64,
mean over the train batch and its readout positions) + the active regularizer terms ->
backward -> gradient transforms (Grokfast, then the perpendicular projection) -> AdamW step.
With routing_copies > 1, `trainer_class` gives routing.RoutedTrainer, which trains M copies
through permutation routing (docs/VARIANTS.md); routing_copies = 1 runs `Trainer` unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory, TrajectoryWriter, recover
from groklens.checkpoints.writer import config_json
from groklens.config import RunConfig
from groklens.errors import BadInput, RunFailure
from groklens.trainers.models import build_model
from groklens.trainers.optim import AdamW
from groklens.trainers.regularizers import LOSSES, Batch, build_regularizers, regularizer_metric_names
from groklens.trainers.tasks import TASKS, TaskData

EVAL_CHUNK = 16_384  # inputs per forward pass during evaluation (bounds memory)
METRIC_NAMES = ["train_loss", "test_loss", "train_acc", "test_acc", "weight_norm", "grad_norm", "lr"]
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")
REG_EVAL_MAX = EVAL_CHUNK  # training inputs on which regularizer terms are evaluated (a fixed subset if more)


def metric_names(cfg: RunConfig) -> list[str]:
    """Every metric a run of `cfg` logs, known before the file is created (SWMR cannot add any later).

    METRIC_NAMES always; with a multi-target task the per-token accuracies (train_acc / test_acc
    are then exact match over the answer); with loss != ce the softmax cross-entropy beside the
    trained loss; then each active regularizer's metrics."""
    names = list(METRIC_NAMES)
    if TASKS.get(cfg.task).multi_target:
        names += ["train_token_acc", "test_token_acc"]
    if cfg.loss != "ce":
        names += ["train_ce", "test_ce"]
    names += regularizer_metric_names(cfg)
    if cfg.routing_copies > 1:  # per-copy and ensemble columns (trainers/routing.py)
        from groklens.trainers.routing import routed_metric_names

        names = routed_metric_names(names, cfg.routing_copies)
    return names


@dataclass
class TrainResult:
    path: Path
    last_step: int
    status: str


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' asked for, but no CUDA device is available")
    return torch.device(name)


def checkpoint_schedule(cfg: RunConfig) -> set[int]:
    """Step 0, every checkpoint_every steps, the last step, and optional log-spaced early ones."""
    steps = set(range(0, cfg.steps + 1, cfg.checkpoint_every)) | {cfg.steps}
    if cfg.log_checkpoints:
        early = np.geomspace(1, cfg.checkpoint_every, cfg.log_checkpoints + 2)[:-1]
        steps |= {int(s) for s in np.round(early) if 0 < s < cfg.checkpoint_every}
    return steps


def warmup_factor(cfg: RunConfig, step: int) -> float:
    # Nanda's schedule: lr * min(step / warmup, 1), so the very first update has lr 0
    return min(step / cfg.warmup_steps, 1.0) if cfg.warmup_steps else 1.0


def readout_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in float64: float32 underflows once a grokked model is very confident."""
    return F.cross_entropy(logits.to(torch.float64), labels, reduction=reduction)


class Trainer:
    """One run: model, optimizer, data on the device, and the writer of its trajectory."""

    def __init__(self, cfg: RunConfig, data: TaskData, writer_factory, progress: bool = True):
        self.cfg = cfg
        self.data = data
        self.device = resolve_device(cfg.device)
        self.model = build_model(cfg, data).to(self.device)
        self.params = dict(self.model.named_parameters())
        self.optimizer = AdamW(  # torch.optim.AdamW minus its torch._dynamo import (trainers/optim.py)
            self.params.values(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        self.loss_fn = LOSSES.get(cfg.loss)
        self.positions = data.readout_positions  # [readout_pos], or K consecutive ones (multi-target)
        self.multi_target = data.n_targets > 0
        self.readout_slice = slice(self.positions[0], self.positions[-1] + 1)
        self.regularizers = build_regularizers(cfg, self.model, data)
        self.terms = [r for r in self.regularizers if r.kind == "term"]
        self.transforms = [r for r in self.regularizers if r.kind == "grad"]
        self.acts: dict[str, torch.Tensor] = {}
        self.capture_hooks = [(name, self._capture) for name in sorted({n for r in self.terms for n in r.hook_names})]
        self.batch_gen = torch.Generator().manual_seed(cfg.seed + 1)  # mini-batch order only
        self.inputs = data.inputs.to(self.device)
        self.labels = data.labels.to(self.device)
        self.mask = data.informative_mask.to(self.device)
        self.train_idx = data.train_idx.to(self.device)
        self.test_idx = data.test_idx.to(self.device)
        self.train_x = self.inputs[self.train_idx]
        self.train_y = self.labels[self.train_idx]
        self.train_mask = self.mask[self.train_idx]
        if self.terms:  # where terms are evaluated: the training inputs (a fixed subset if many)
            n = len(self.train_idx)
            pick = np.arange(n) if n <= REG_EVAL_MAX else np.sort(
                np.random.default_rng([cfg.data_seed, 2]).choice(n, REG_EVAL_MAX, replace=False))
            pick = torch.as_tensor(pick, device=self.device)
            self.reg_eval = Batch(self.train_x[pick], self.train_mask[pick], self.positions)
        self.checkpoints = checkpoint_schedule(cfg)
        self.progress = progress
        self.grad_norm = float("nan")
        self._setup()
        self.writer: TrajectoryWriter = writer_factory(self)

    @property
    def writer_path(self) -> Path:
        return self.writer.path  # a staged --force run moves to its target at its first commit

    def _setup(self) -> None:
        """Subclasses (routing.RoutedTrainer) build more state here, before the writer sees it."""

    # ------------------------------------------------------------------ state for the file
    def host_copies(self) -> list[dict[str, np.ndarray]]:
        """Parameters of copies 1..M-1 of a routed run; a single run has none."""
        return []

    def host_params(self) -> dict[str, np.ndarray]:
        return {n: p.detach().cpu().numpy() for n, p in self.params.items()}

    def host_state(self) -> dict[str, np.ndarray]:
        """Optimizer moments and step counts, and the RNG states: all an exact resume needs."""
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
        out["rng.torch"] = torch.get_rng_state().numpy()
        out["rng.batch"] = self.batch_gen.get_state().numpy()
        return out

    def load_state(self, params: dict[str, torch.Tensor], state: dict[str, np.ndarray], step: int) -> None:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(params[name])
        if step > 0:
            for name, p in self.params.items():
                self.optimizer.state[p] = {
                    key: torch.from_numpy(np.array(state[f"optim.{name}.{key}"])).to(self.device)
                    for key in ADAM_STATE
                }
                if self.optimizer.state[p]["step"].device.type != "cpu":
                    self.optimizer.state[p]["step"] = self.optimizer.state[p]["step"].cpu()
        for reg in self.regularizers:
            reg.load_state(state, self.device)
        torch.set_rng_state(torch.from_numpy(np.array(state["rng.torch"])))
        self.batch_gen.set_state(torch.from_numpy(np.array(state["rng.batch"])))

    # ------------------------------------------------------------------ steps
    def _capture(self, tensor: torch.Tensor, hook) -> None:
        self.acts[hook.name] = tensor  # kept in the graph: the terms backpropagate through it

    def readout_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits at the readout positions only, [b, K, v]. Models that can (the transformer)
        compute just those; the loss needs nothing else."""
        if getattr(self.model, "supports_readout", False):
            return self.model(x, readout=self.readout_slice)
        return self.model(x)[:, self.readout_slice]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits at the readout positions [b, K, v]; with regularizer terms, the full forward
        pass with their hook sites captured in self.acts by hooks that live only for this call."""
        if not self.capture_hooks:
            return self.readout_logits(x)
        self.acts = {}
        with self.model.hooks(fwd_hooks=self.capture_hooks):
            return self.model(x)[:, self.readout_slice]

    def readout(self, logits: torch.Tensor) -> torch.Tensor:
        """[b, K, v] at the readout positions -> [b, v] (one target), or [b, K, v] (K answer tokens)."""
        return logits if self.multi_target else logits[:, 0]

    def task_loss(self, logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The configured loss over readout positions; per input (mean over its K positions) with
        reduction='none'."""
        v = logits.shape[-1]
        loss = self.loss_fn(logits.reshape(-1, v), y.reshape(-1), reduction=reduction)
        return loss.reshape(y.shape).mean(-1) if reduction == "none" and self.multi_target else loss

    def train_step(self, step: int) -> float:
        """One optimizer update taking the model from `step` to `step + 1`; returns the task loss."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * warmup_factor(cfg, step)
        if cfg.batch_size and cfg.batch_size < len(self.train_y):
            pick = torch.randperm(len(self.train_y), generator=self.batch_gen)[: cfg.batch_size].to(self.device)
            x, y, mask = self.train_x[pick], self.train_y[pick], self.train_mask[pick]
        else:
            x, y, mask = self.train_x, self.train_y, self.train_mask
        self.model.train()
        logits = self.readout(self.forward(x))
        loss = self.task_loss(logits, y)
        objective = loss
        if self.terms:
            batch = Batch(x, mask, self.positions)
            for reg in self.terms:
                objective = objective + reg.term(self.acts, batch, step)[0]
            self.acts = {}
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)
        loss_value, grad_value = float(objective.detach()), float(grad_norm)  # one sync per step
        if not (math.isfinite(loss_value) and math.isfinite(grad_value)):
            what = "loss" if not math.isfinite(loss_value) else "gradient"
            raise NonFiniteStep(f"non-finite {what} ({loss_value if what == 'loss' else grad_value}) at step {step}")
        self.grad_norm = grad_value
        for transform in self.transforms:
            transform.transform(self.params)
        self.optimizer.step()
        return float(loss.detach()) if self.terms else loss_value

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Loss and accuracy on every input (accuracy = exact match over the K answer positions
        of a multi-target task), norms, and the regularizers' metrics."""
        self.model.eval()
        losses, correct, tokens, ces = [], [], [], []
        for start in range(0, len(self.inputs), EVAL_CHUNK):
            x = self.inputs[start : start + EVAL_CHUNK]
            y = self.labels[start : start + EVAL_CHUNK]
            logits = self.readout(self.readout_logits(x))
            self.observe_eval_logits(logits)
            losses.append(self.task_loss(logits, y, reduction="none"))
            hit = logits.argmax(-1) == y
            correct.append(hit.all(-1) if self.multi_target else hit)
            if self.multi_target:
                tokens.append(hit.double().mean(-1))
            if self.cfg.loss != "ce":
                v = logits.shape[-1]
                ce = readout_loss(logits.reshape(-1, v), y.reshape(-1), reduction="none")
                ces.append(ce.reshape(y.shape).mean(-1) if self.multi_target else ce)
        loss, hit = torch.cat(losses), torch.cat(correct).double()
        norm = torch.sqrt(sum((p.detach().double() ** 2).sum() for p in self.params.values()))
        row = {
            "step": step,
            "train_loss": float(loss[self.train_idx].mean()),
            "test_loss": float(loss[self.test_idx].mean()),
            "train_acc": float(hit[self.train_idx].mean()),
            "test_acc": float(hit[self.test_idx].mean()),
            "weight_norm": float(norm),
            "grad_norm": self.grad_norm,
            "lr": self.cfg.lr * warmup_factor(self.cfg, step),
        }
        if self.multi_target:
            token = torch.cat(tokens)
            row["train_token_acc"] = float(token[self.train_idx].mean())
            row["test_token_acc"] = float(token[self.test_idx].mean())
        if ces:
            ce = torch.cat(ces)
            row["train_ce"], row["test_ce"] = float(ce[self.train_idx].mean()), float(ce[self.test_idx].mean())
        if self.terms:  # each term on the training inputs, at this step's parameters
            self.forward(self.reg_eval.x)
            for reg in self.terms:
                _, metrics = reg.term(self.acts, self.reg_eval, step, evaluating=True)
                row.update({k: float(v) for k, v in metrics.items()})
            self.acts = {}
        for reg in self.transforms:
            row.update(reg.last_metrics())
        return row

    def observe_eval_logits(self, logits: torch.Tensor) -> None:
        """Called by evaluate() with each chunk's readout logits, in input order (the routed
        trainer builds its ensemble from them instead of a second forward pass per copy)."""

    # ------------------------------------------------------------------ the run
    def run(self, start_step: int, evals_after_grok: int | None = None, fresh: bool = False) -> TrainResult:
        """Train from `start_step` to cfg.steps; a fresh run first evaluates and checkpoints step 0."""
        cfg = self.cfg
        self.evals_after_grok = evals_after_grok
        bar = _progress_bar(cfg.steps, start_step, self.progress)
        step = start_step
        status = "completed"
        try:
            if fresh:
                self._record(0, self.evaluate(0))
                self._write_checkpoint(0)
            while step < cfg.steps:
                try:
                    self.train_step(step)
                except NonFiniteStep as exc:
                    last = int(self.writer.f["steps"][self.writer.n_checkpoints - 1])
                    self.writer.close(f"stopped: {exc}")
                    raise RunFailure(
                        f"training stopped: {exc}; the last good checkpoint (step {last}) is kept in {self.writer_path}"
                    ) from None
                step += 1
                bar.update(1)
                stop = False
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    row = self.evaluate(step)
                    self._record(step, row)
                    bar.set_postfix_str(_postfix(row), refresh=False)
                    stop = bool(cfg.stop_after_grok) and self.evals_after_grok is not None and (
                        self.evals_after_grok >= cfg.stop_after_grok)
                if step in self.checkpoints or stop:
                    self._write_checkpoint(step)
                if stop:
                    status = f"completed: stopped {cfg.stop_after_grok} evaluations after grokking"
                    break
        except KeyboardInterrupt:
            self.writer.close("stopped: interrupted")
            raise
        except RunFailure as exc:  # e.g. no room for a checkpoint: close the file cleanly
            self.writer.close(f"stopped: {exc}")
            raise
        finally:
            bar.close()
        self.writer.close(status)
        return TrainResult(self.writer_path, step, status)

    def _write_checkpoint(self, step: int) -> None:
        self.writer.write_checkpoint(step, self.host_params(), self.host_state(), self.host_copies())

    def _record(self, step: int, row: dict[str, float]) -> None:
        self.writer.write_eval(row)
        # the stop rule counts evaluations since test accuracy first reached the threshold
        if self.evals_after_grok is not None:
            self.evals_after_grok += 1
        elif stop_accuracy(row, self.cfg) >= self.cfg.grok_threshold:
            self.evals_after_grok = 0


def stop_accuracy(row: dict, cfg: RunConfig):
    """The test accuracy the stop rule watches: test_acc, or with routing the lowest copy's
    (a routed run stops once every copy has grokked). Works on a row or on metric series."""
    if cfg.routing_copies == 1:
        return row["test_acc"]
    return np.min([row[f"copy{m}.test_acc"] for m in range(cfg.routing_copies)], axis=0)


class NonFiniteStep(Exception):
    pass


def _postfix(row: dict[str, float]) -> str:
    return (f"loss {row['train_loss']:.3g}/{row['test_loss']:.3g} "
            f"acc {row['train_acc']:.3f}/{row['test_acc']:.3f}")


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True,
                desc="train", leave=True)


# ---------------------------------------------------------------------- entry points
def train(cfg: RunConfig, out: str | Path, *, force: bool = False, progress: bool = True,
          on_commit=None) -> TrainResult:
    """Train `cfg` from scratch into the trajectory file `out` (refused if it exists, unless force).
    With force, the new run is staged beside `out` and replaces it at its first committed
    checkpoint, so a run that fails before that leaves the old one (checkpoints/writer.py).
    `on_commit(step)` is called after each committed checkpoint."""
    from groklens.checkpoints.locking import describe_holder, writer_alive
    from groklens.checkpoints.validate import check_resources

    cfg.validate()
    out = Path(out)
    if out.exists() and out.is_dir():
        raise BadInput(f"{out} is a directory; give a file path for --out")
    exists = out.exists() or out.is_symlink()
    if exists and not force:
        raise BadInput(f"{out} already exists; use --force to overwrite it or --resume to continue it")
    if exists and writer_alive(out):
        raise BadInput(f"{out} is being written by a live process ({describe_holder(out)}); stop it first")
    if not out.parent.exists():
        raise BadInput(f"directory {out.parent} does not exist")
    check_resources(cfg)  # sizes from the config alone, before any allocation
    data = TASKS.get(cfg.task).build(cfg)
    device = resolve_device(cfg.device)  # fail on a missing GPU before touching any file
    del device

    def make_writer(trainer: Trainer) -> TrajectoryWriter:
        writer = create_trajectory(out, cfg, data, trainer.host_params(), trainer.host_state(),
                                   copies=trainer.host_copies(), replace=exists)
        writer.on_commit = on_commit
        return writer

    trainer = trainer_class(cfg)(cfg, data, make_writer, progress=progress)
    try:
        return trainer.run(0, fresh=True)
    finally:
        trainer.writer.close()  # idempotent; a staged run that never committed is deleted


def trainer_class(cfg: RunConfig) -> type[Trainer]:
    """Trainer, or routing.RoutedTrainer for routing_copies > 1."""
    if cfg.routing_copies == 1:
        return Trainer
    from groklens.trainers.routing import RoutedTrainer

    return RoutedTrainer


def create_trajectory(out: Path, cfg: RunConfig, data: TaskData, params: dict[str, np.ndarray],
                      state: dict[str, np.ndarray], copies: list[dict[str, np.ndarray]] = (),
                      replace: bool = False) -> TrajectoryWriter:
    """A new trajectory file for a run of `cfg` on `data` (single runs and ensemble members alike;
    `copies`: copies 1..M-1 of a routed run)."""
    return TrajectoryWriter.create(
        out,
        config_json=config_json(cfg),
        data={
            "inputs": data.inputs.numpy(), "labels": data.labels.numpy(),
            "train_idx": data.train_idx.numpy(), "test_idx": data.test_idx.numpy(),
            "informative_mask": data.informative_mask.numpy(),
        },
        data_attrs={"readout_pos": data.readout_pos, "d_vocab": data.d_vocab, "d_vocab_out": data.d_vocab_out},
        params=params,
        state=state,
        metric_names=metric_names(cfg),
        copies=copies,
        replace=replace,
    )


def resume(path: str | Path, *, progress: bool = True) -> TrainResult:
    """Continue an interrupted run from its last committed checkpoint (repairing the file first)."""
    path = Path(path)
    traj = Trajectory(path)
    cfg = traj.config
    steps = traj.steps
    if len(steps) and int(steps[-1]) >= cfg.steps:
        return TrainResult(path, int(steps[-1]), "already complete")
    last = recover(path)
    traj = Trajectory(path)
    params = traj.params(last)
    state = read_state(path, last)
    after = evals_after_grok(traj, cfg)
    copies = [Trajectory(path, copy=m).params(last) for m in range(1, cfg.routing_copies)]  # before the writer opens
    trainer = trainer_class(cfg)(cfg, traj.dataset(), lambda _t: TrajectoryWriter.reopen(path), progress=progress)
    if cfg.routing_copies == 1:
        trainer.load_state(params, state, last)
    else:
        trainer.load_copies([params, *copies], state, last)
    trainer.writer.set_status("running")
    return trainer.run(last, after)


def read_state(path: Path, step: int) -> dict[str, np.ndarray]:
    from groklens.checkpoints import constants as C
    from groklens.checkpoints.reader import open_trajectory_file

    with open_trajectory_file(path) as f:
        g = f[C.STATE]
        slot = int(np.nonzero(g[C.STATE_STEP][:] == step)[0][0])
        return {name: ds[slot] for name, ds in g.items() if name != C.STATE_STEP}


def evals_after_grok(traj: Trajectory, cfg: RunConfig) -> int | None:
    """How many evaluations ago test accuracy first crossed the threshold (for the stop rule)."""
    metrics = traj.metrics if traj.copy is None else Trajectory(traj.path).metrics  # the stored columns
    acc = stop_accuracy(metrics, cfg)
    hits = np.nonzero(acc >= cfg.grok_threshold)[0]
    return None if len(hits) == 0 else int(len(acc) - 1 - hits[0])


def iter_checkpoint_steps(cfg: RunConfig) -> Iterable[int]:
    return sorted(checkpoint_schedule(cfg))
