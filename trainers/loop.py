"""The training loop: AdamW with linear warm-up, float64 loss, periodic evaluation, and a
checkpoint trajectory written as it goes (groklens.checkpoints).

Step s means "after s optimizer updates": step 0 is the initialisation. The same code runs on
CPU and CUDA; on CPU a run is deterministic for a given (seed, data_seed), and a resumed run
ends bit-identical to an uninterrupted one (optimizer and RNG state travel in the file).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory, TrajectoryWriter, recover, sidecar_path
from groklens.checkpoints.writer import config_json
from groklens.config import RunConfig
from groklens.errors import BadInput, RunFailure
from groklens.trainers.models import build_model
from groklens.trainers.tasks import TASKS, TaskData

EVAL_CHUNK = 16_384  # inputs per forward pass during evaluation (bounds memory)
METRIC_NAMES = ["train_loss", "test_loss", "train_acc", "test_acc", "weight_norm", "grad_norm", "lr"]
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")


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
        self.optimizer = torch.optim.AdamW(
            self.params.values(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        self.batch_gen = torch.Generator().manual_seed(cfg.seed + 1)  # mini-batch order only
        self.inputs = data.inputs.to(self.device)
        self.labels = data.labels.to(self.device)
        self.train_idx = data.train_idx.to(self.device)
        self.test_idx = data.test_idx.to(self.device)
        self.train_x = self.inputs[self.train_idx]
        self.train_y = self.labels[self.train_idx]
        self.checkpoints = checkpoint_schedule(cfg)
        self.progress = progress
        self.writer: TrajectoryWriter = writer_factory(self)
        self.writer_path = Path(self.writer.f.filename)
        self.grad_norm = float("nan")

    # ------------------------------------------------------------------ state for the file
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
        torch.set_rng_state(torch.from_numpy(np.array(state["rng.torch"])))
        self.batch_gen.set_state(torch.from_numpy(np.array(state["rng.batch"])))

    # ------------------------------------------------------------------ steps
    def train_step(self, step: int) -> float:
        """One optimizer update taking the model from `step` to `step + 1`; returns the loss."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * warmup_factor(cfg, step)
        if cfg.batch_size and cfg.batch_size < len(self.train_y):
            pick = torch.randperm(len(self.train_y), generator=self.batch_gen)[: cfg.batch_size].to(self.device)
            x, y = self.train_x[pick], self.train_y[pick]
        else:
            x, y = self.train_x, self.train_y
        self.model.train()
        logits = self.model(x)[:, self.data.readout_pos]
        loss = readout_loss(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm(grads)
        loss_value, grad_value = float(loss.detach()), float(grad_norm)  # one sync per step
        if not (math.isfinite(loss_value) and math.isfinite(grad_value)):
            what = "loss" if not math.isfinite(loss_value) else "gradient"
            raise _NonFinite(f"non-finite {what} ({loss_value if what == 'loss' else grad_value}) at step {step}")
        self.grad_norm = grad_value
        self.optimizer.step()
        return loss_value

    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        self.model.eval()
        losses, correct = [], []
        for start in range(0, len(self.inputs), EVAL_CHUNK):
            x = self.inputs[start : start + EVAL_CHUNK]
            y = self.labels[start : start + EVAL_CHUNK]
            logits = self.model(x)[:, self.data.readout_pos]
            losses.append(readout_loss(logits, y, reduction="none"))
            correct.append(logits.argmax(-1) == y)
        loss, hit = torch.cat(losses), torch.cat(correct).double()
        norm = torch.sqrt(sum((p.detach().double() ** 2).sum() for p in self.params.values()))
        return {
            "step": step,
            "train_loss": float(loss[self.train_idx].mean()),
            "test_loss": float(loss[self.test_idx].mean()),
            "train_acc": float(hit[self.train_idx].mean()),
            "test_acc": float(hit[self.test_idx].mean()),
            "weight_norm": float(norm),
            "grad_norm": self.grad_norm,
            "lr": self.cfg.lr * warmup_factor(self.cfg, step),
        }

    # ------------------------------------------------------------------ the run
    def run(self, start_step: int, evals_after_grok: int | None = None) -> TrainResult:
        cfg = self.cfg
        if start_step == 0:
            self._record(0, self.evaluate(0))
            self.writer.write_checkpoint(0, self.host_params(), self.host_state())
        bar = _progress_bar(cfg.steps, start_step, self.progress)
        step = start_step
        status = "completed"
        try:
            while step < cfg.steps:
                try:
                    self.train_step(step)
                except _NonFinite as exc:
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
                    if cfg.stop_after_grok:
                        if evals_after_grok is None and row["test_acc"] >= cfg.grok_threshold:
                            evals_after_grok = 0
                        elif evals_after_grok is not None:
                            evals_after_grok += 1
                        stop = evals_after_grok is not None and evals_after_grok >= cfg.stop_after_grok
                if step in self.checkpoints or stop:
                    self.writer.write_checkpoint(step, self.host_params(), self.host_state())
                if stop:
                    status = f"completed: stopped {cfg.stop_after_grok} evaluations after grokking"
                    break
        except KeyboardInterrupt:
            self.writer.close("stopped: interrupted")
            raise
        finally:
            bar.close()
        self.writer.close(status)
        return TrainResult(self.writer_path, step, status)

    def _record(self, step: int, row: dict[str, float]) -> None:
        self.writer.write_eval(row)


class _NonFinite(Exception):
    pass


def _postfix(row: dict[str, float]) -> str:
    return (f"loss {row['train_loss']:.3g}/{row['test_loss']:.3g} "
            f"acc {row['train_acc']:.3f}/{row['test_acc']:.3f}")


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True,
                desc="train", leave=True)


# ---------------------------------------------------------------------- entry points
def train(cfg: RunConfig, out: str | Path, *, force: bool = False, progress: bool = True) -> TrainResult:
    """Train `cfg` from scratch into the trajectory file `out` (refused if it exists, unless force)."""
    cfg.validate()
    out = Path(out)
    if out.exists() and out.is_dir():
        raise BadInput(f"{out} is a directory; give a file path for --out")
    if out.exists() and not force:
        raise BadInput(f"{out} already exists; use --force to overwrite it or --resume to continue it")
    if not out.parent.exists():
        raise BadInput(f"directory {out.parent} does not exist")
    data = TASKS.get(cfg.task).build(cfg)
    device = resolve_device(cfg.device)  # fail on a missing GPU before touching any file
    del device
    if force:
        out.unlink(missing_ok=True)
        sidecar_path(out).unlink(missing_ok=True)  # analyses of the old run would be stale

    def make_writer(trainer: Trainer) -> TrajectoryWriter:
        state = trainer.host_state()
        return TrajectoryWriter.create(
            out,
            config_json=config_json(cfg),
            data={
                "inputs": data.inputs.numpy(), "labels": data.labels.numpy(),
                "train_idx": data.train_idx.numpy(), "test_idx": data.test_idx.numpy(),
                "informative_mask": data.informative_mask.numpy(),
            },
            data_attrs={"readout_pos": data.readout_pos, "d_vocab": data.d_vocab, "d_vocab_out": data.d_vocab_out},
            params=trainer.host_params(),
            state=state,
            metric_names=METRIC_NAMES,
        )

    trainer = Trainer(cfg, data, make_writer, progress=progress)
    return trainer.run(0)


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
    state = _read_state(path, last)
    evals_after_grok = _evals_after_grok(traj, cfg)
    trainer = Trainer(cfg, traj.dataset(), lambda _t: TrajectoryWriter.reopen(path), progress=progress)
    trainer.load_state(params, state, last)
    trainer.writer.set_status("running")
    return trainer.run(last, evals_after_grok)


def _read_state(path: Path, step: int) -> dict[str, np.ndarray]:
    from groklens.checkpoints import constants as C
    from groklens.checkpoints.reader import open_trajectory_file

    with open_trajectory_file(path) as f:
        g = f[C.STATE]
        slot = int(np.nonzero(g[C.STATE_STEP][:] == step)[0][0])
        return {name: ds[slot] for name, ds in g.items() if name != C.STATE_STEP}


def _evals_after_grok(traj: Trajectory, cfg: RunConfig) -> int | None:
    """How many evaluations ago test accuracy first crossed the threshold (for the stop rule)."""
    acc = traj.metrics["test_acc"]
    hits = np.nonzero(acc >= cfg.grok_threshold)[0]
    return None if len(hits) == 0 else int(len(acc) - 1 - hits[0])


def iter_checkpoint_steps(cfg: RunConfig) -> Iterable[int]:
    return sorted(checkpoint_schedule(cfg))
