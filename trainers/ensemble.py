"""Batched ensembles: many small runs of one architecture trained together in one process.

Members share the model architecture, the task and the data shape; each keeps its own
`seed` (initialisation and mini-batch order), `data_seed` (its own train/test split), `lr`,
`weight_decay`, `grok_threshold` and `stop_after_grok`. Parameters are stacked along a leading
member dimension (`torch.func.stack_module_state`); one forward/backward runs every member at
once through `torch.func.functional_call` under `torch.func.vmap`, and AdamW is applied to the
stacked tensors with per-member learning rate and weight decay. Each member writes its own
trajectory file, in the same format, at the same steps and with the same metrics as
`groklens.trainers.loop.train` would: a member's trajectory equals the same configuration
trained alone to float tolerance (tests/trainers/test_ensemble.py).

The AdamW update below repeats, operation for operation, the single-tensor AdamW that
`torch.optim.AdamW` runs on CPU (weight decay `p *= 1 - lr*wd`; `m.lerp_(g, 1-b1)`;
`v = v*b2 + (1-b2) g*g`; `p += (-lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)`), only with `lr`
and `wd` as per-member tensors; on CPU it gives the same float32 numbers as the optimizer.

Configurations with options the ensemble does not implement fall back to single runs: see
`ensemble_key`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
from groklens.checkpoints import Trajectory, TrajectoryWriter, recover
from groklens.trainers.loop import (
    EVAL_CHUNK,
    TrainResult,
    evals_after_grok,
    create_trajectory,
    read_state,
    checkpoint_schedule,
    readout_loss,
    resolve_device,
    warmup_factor,
)
from groklens.trainers.models import build_model
from groklens.trainers.tasks import TASKS, TaskData

from groklens.config import RunConfig
from groklens.errors import BadInput, RunFailure

ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which the single-run loop uses

# Fields that may differ between members of one ensemble.
PER_MEMBER_FIELDS = ("seed", "data_seed", "lr", "weight_decay", "grok_threshold", "stop_after_grok")
# Fields the ensemble implements and that members must share (architecture, data shape,
# optimizer constants and schedule). Every other RunConfig field -- options added after this
# module was written, e.g. regularizers -- must be at its default, or the run falls back to a
# single run (`ensemble_key` returns None for it).
SHARED_FIELDS = (
    # task and data shape
    "task", "p", "train_frac", "n_digits", "seq_len", "n_informative", "informative_layout",
    "distractor_vocab",
    # architecture (anything that only changes the forward pass is fine under vmap)
    "model", "n_layers", "d_model", "n_heads", "d_head", "d_mlp", "act_fn", "norm", "attention",
    "unembed", "init", "causal", "mlp_bias", "radius", "tau", "fourier_freqs", "mlp_embed",
    # optimizer constants and schedule
    "betas", "warmup_steps", "batch_size", "steps", "eval_every", "checkpoint_every",
    "log_checkpoints", "device",
)


def unsupported_reason(cfg: RunConfig) -> str | None:
    """Why `cfg` cannot join an ensemble (None when it can)."""
    default = RunConfig()
    known = set(PER_MEMBER_FIELDS) | set(SHARED_FIELDS)
    odd = [f.name for f in fields(RunConfig)
           if f.name not in known and getattr(cfg, f.name) != getattr(default, f.name)]
    if odd:  # loss variants, regularizers, gradient transforms: the single-run loop implements them
        return f"ensembles do not implement {', '.join(f'{n}={getattr(cfg, n)!r}' for n in odd)}"
    if getattr(TASKS.get(cfg.task), "multi_target", False):
        return f"ensembles read out one position; task {cfg.task!r} has several"
    return None


def ensemble_key(cfg: RunConfig) -> tuple | None:
    """What members of one ensemble must share, or None when `cfg` must train as a single run."""
    if unsupported_reason(cfg) is not None:
        return None
    return tuple((name, _hashable(getattr(cfg, name))) for name in SHARED_FIELDS if hasattr(cfg, name))


def _hashable(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


@dataclass
class MemberResult:
    """Outcome of one member: a TrainResult, or the error that stopped it."""

    path: Path
    result: TrainResult | None = None
    error: BaseException | None = None


class _Member:
    def __init__(self, cfg: RunConfig, data: TaskData, path: Path):
        self.cfg = cfg
        self.data = data
        self.path = path
        self.writer: TrajectoryWriter | None = None
        self.batch_gen = torch.Generator().manual_seed(cfg.seed + 1)  # as loop.Trainer
        self.evals_after_grok: int | None = None
        self.grad_norm = float("nan")
        self.outcome: MemberResult = MemberResult(path)


class EnsembleTrainer:
    """Trains members [m] of one architecture together; members leave when they stop or fail."""

    def __init__(self, cfgs: Sequence[RunConfig], datas: Sequence[TaskData], paths: Sequence[Path],
                 progress: bool = False):
        if not cfgs:
            raise BadInput("an ensemble needs at least one member")
        keys = {ensemble_key(c) for c in cfgs}
        if None in keys:
            raise BadInput(unsupported_reason(next(c for c in cfgs if ensemble_key(c) is None)))
        if len(keys) != 1:
            raise BadInput("ensemble members must share architecture, task, data shape and schedule")
        first = datas[0]
        for d in datas[1:]:
            if not (d.inputs.shape == first.inputs.shape and len(d.train_idx) == len(first.train_idx)
                    and d.readout_pos == first.readout_pos):
                raise BadInput("ensemble members must share the task's input shape and the training-set size")
        self.cfg0 = cfgs[0]
        self.device = resolve_device(self.cfg0.device)
        self.progress = progress
        self.members = [_Member(c, d, Path(p)) for c, d, p in zip(cfgs, datas, paths)]
        self.readout_pos = first.readout_pos
        # tasks whose inputs depend on data_seed (seq_*) give each member its own inputs
        self.shared_inputs = all(torch.equal(d.inputs, first.inputs) for d in datas[1:])
        self.n_inputs = len(first.inputs)
        self.checkpoints = checkpoint_schedule(self.cfg0)
        models = [build_model(m.cfg, m.data) for m in self.members]  # each from its own seed
        self.names = [n for n, _ in models[0].named_parameters()]
        self.base = build_model(self.cfg0, first).to("meta")  # the architecture, without storage
        params, buffers = torch.func.stack_module_state(models)
        self.params = {n: params[n].detach().to(self.device).requires_grad_() for n in self.names}
        self.buffers = {n: b.to(self.device) for n, b in buffers.items()}
        self.exp_avg = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.adam_steps = {n: 0 for n in self.names}  # per tensor: one without gradients is not stepped
        self._stack_member_tensors()

    # ------------------------------------------------------------------ member bookkeeping
    def _stack_member_tensors(self) -> None:
        ms = self.members
        if self.shared_inputs:
            self.inputs = ms[0].data.inputs.to(self.device)  # [N, n_ctx], the same for every member
        else:
            self.inputs = torch.stack([m.data.inputs for m in ms]).to(self.device)  # [M, N, n_ctx]
        self.labels = torch.stack([m.data.labels for m in ms]).to(self.device)  # [M, N]
        self.train_idx = torch.stack([m.data.train_idx for m in ms]).to(self.device)  # [M, n_train]
        self.test_idx = torch.stack([m.data.test_idx for m in ms]).to(self.device)  # [M, n_test]
        member_inputs = self.inputs if not self.shared_inputs else self.inputs.expand(len(ms), -1, -1)
        n_ctx = member_inputs.shape[2]
        self.train_x = torch.gather(member_inputs, 1, self.train_idx[:, :, None].expand(-1, -1, n_ctx))
        self.train_y = torch.gather(self.labels, 1, self.train_idx)  # [M, n_train]
        self.lr = torch.tensor([m.cfg.lr for m in ms], dtype=torch.float64)
        self.wd = torch.tensor([m.cfg.weight_decay for m in ms], dtype=torch.float64)

    def _keep(self, keep: list[int]) -> None:
        """Continue with members[keep] only (the others stopped or failed)."""
        if len(keep) == len(self.members):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        with torch.no_grad():
            self.params = {n: p.detach().index_select(0, idx).clone().requires_grad_() for n, p in self.params.items()}
            self.exp_avg = {n: t.index_select(0, idx).clone() for n, t in self.exp_avg.items()}
            self.exp_avg_sq = {n: t.index_select(0, idx).clone() for n, t in self.exp_avg_sq.items()}
            self.buffers = {n: b.index_select(0, idx).clone() for n, b in self.buffers.items()}
        self.members = [self.members[i] for i in keep]
        if self.members:
            self._stack_member_tensors()

    def load_member_state(self, i: int, params: dict[str, torch.Tensor], state: dict[str, np.ndarray],
                          step: int) -> None:
        """Put a checkpoint of member i (from its file) into the stacks (for resume)."""
        with torch.no_grad():
            for n in self.names:
                self.params[n][i].copy_(params[n].to(self.device))
                if step > 0:
                    self.exp_avg[n][i].copy_(torch.from_numpy(np.array(state[f"optim.{n}.exp_avg"])))
                    self.exp_avg_sq[n][i].copy_(torch.from_numpy(np.array(state[f"optim.{n}.exp_avg_sq"])))
        if step > 0:
            self.adam_steps = {n: int(np.array(state[f"optim.{n}.step"])) for n in self.names}
        self.members[i].batch_gen.set_state(torch.from_numpy(np.array(state["rng.batch"])))

    # ------------------------------------------------------------------ state for the files
    def host_params(self) -> list[dict[str, np.ndarray]]:
        host = {n: p.detach().cpu().numpy() for n, p in self.params.items()}
        return [{n: host[n][i] for n in self.names} for i in range(len(self.members))]

    def host_states(self) -> list[dict[str, np.ndarray]]:
        """Per member, the same keys and dtypes as loop.Trainer.host_state()."""
        m1 = {n: t.cpu().numpy() for n, t in self.exp_avg.items()}
        m2 = {n: t.cpu().numpy() for n, t in self.exp_avg_sq.items()}
        rng = torch.get_rng_state().numpy()
        out = []
        for i, member in enumerate(self.members):
            st: dict[str, np.ndarray] = {}
            for n in self.names:
                st[f"optim.{n}.step"] = np.array(self.adam_steps[n], dtype=np.float32)
                st[f"optim.{n}.exp_avg"] = m1[n][i]
                st[f"optim.{n}.exp_avg_sq"] = m2[n][i]
            st["rng.torch"] = rng
            st["rng.batch"] = member.batch_gen.get_state().numpy()
            out.append(st)
        return out

    # ------------------------------------------------------------------ the computation
    def _logits(self, params, buffers, x):
        # the same readout-only forward the single-run trainer uses (loop.Trainer.readout_logits)
        if getattr(self.base, "supports_readout", False):
            pos = slice(self.readout_pos, self.readout_pos + 1)
            return torch.func.functional_call(self.base, (params, buffers), (x,), {"readout": pos})[:, 0]
        return torch.func.functional_call(self.base, (params, buffers), (x,))[:, self.readout_pos]

    def train_step(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """One AdamW update of every member; returns per-member loss and gradient norm (host)."""
        cfg = self.cfg0
        n_train = self.train_y.shape[1]
        if cfg.batch_size and cfg.batch_size < n_train:
            pick = torch.stack([torch.randperm(n_train, generator=m.batch_gen)[: cfg.batch_size]
                                for m in self.members]).to(self.device)
            x = torch.gather(self.train_x, 1, pick[:, :, None].expand(-1, -1, self.train_x.shape[2]))
            y = torch.gather(self.train_y, 1, pick)
        else:
            x, y = self.train_x, self.train_y

        def member_loss(p, b, xm, ym):
            return readout_loss(self._logits(p, b, xm), ym)

        for p in self.params.values():
            p.grad = None
        losses = torch.func.vmap(member_loss)(self.params, self.buffers, x, y)  # [M] float64
        losses.sum().backward()
        # parameters the loss does not reach (W_Q, W_K under uniform attention) get no gradient;
        # torch.optim.AdamW skips them (no decay either), and so do we
        grads = {n: p.grad for n, p in self.params.items() if p.grad is not None}
        # torch.nn.utils.get_total_norm per member: the norm of the per-tensor norms
        per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1)
        grad_norm = torch.linalg.vector_norm(per_tensor, dim=1)
        host = torch.stack([losses.detach(), grad_norm.double()]).cpu().numpy()  # one sync per step
        self._last_grads = grads
        return host[0], host[1]

    @torch.no_grad()
    def adamw_step(self, step: int) -> None:
        """torch.optim.AdamW's single-tensor update on the stacked tensors (lr, wd per member)."""
        b1, b2 = self.cfg0.betas
        lr = self.lr * torch.tensor([warmup_factor(m.cfg, step) for m in self.members], dtype=torch.float64)
        decay = (1 - lr * self.wd).to(torch.float32).to(self.device)  # [M]; as `1 - lr*wd` cast to float32
        per_t: dict[int, tuple[torch.Tensor, float]] = {}  # step count -> (neg_step [M], bias_correction2_sqrt)
        for n, g in self._last_grads.items():
            self.adam_steps[n] += 1
            t = self.adam_steps[n]
            if t not in per_t:  # usually one count for every tensor: computed once per step
                per_t[t] = ((-(lr / (1 - b1**t))).to(torch.float32).to(self.device), (1 - b2**t) ** 0.5)
            neg_step, bias_correction2_sqrt = per_t[t]
            p = self.params[n]
            shape = (-1,) + (1,) * (p.dim() - 1)
            p.mul_(decay.view(shape))
            m, v = self.exp_avg[n], self.exp_avg_sq[n]
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v.sqrt() / bias_correction2_sqrt).add_(ADAM_EPS)
            p.add_(m * neg_step.view(shape) / denom)  # = addcdiv_(m, denom, value=-step_size)
        self._last_grads = {}

    @torch.no_grad()
    def evaluate(self, step: int) -> list[dict[str, float]]:
        """The same rows as loop.Trainer.evaluate, one per member."""
        n_members = len(self.members)
        chunk = max(256, EVAL_CHUNK // n_members)
        x_dim = None if self.shared_inputs else 0
        losses, correct = [], []
        for start in range(0, self.n_inputs, chunk):
            x = self.inputs[..., start : start + chunk, :]
            yl = self.labels[:, start : start + chunk]  # [M, chunk]
            logits = torch.func.vmap(self._logits, in_dims=(0, 0, x_dim))(self.params, self.buffers, x)
            losses.append(torch.func.vmap(lambda lg, y: readout_loss(lg, y, reduction="none"))(logits, yl))
            correct.append(logits.argmax(-1) == yl)
        loss = torch.cat(losses, dim=1)  # [M, N] float64
        hit = torch.cat(correct, dim=1).double()
        train_loss = torch.gather(loss, 1, self.train_idx).mean(1)
        test_loss = torch.gather(loss, 1, self.test_idx).mean(1)
        train_acc = torch.gather(hit, 1, self.train_idx).mean(1)
        test_acc = torch.gather(hit, 1, self.test_idx).mean(1)
        norm = torch.sqrt(sum((p.detach().double() ** 2).flatten(1).sum(1) for p in self.params.values()))
        host = torch.stack([train_loss, test_loss, train_acc, test_acc, norm]).cpu().numpy()
        return [
            {
                "step": step,
                "train_loss": float(host[0, i]), "test_loss": float(host[1, i]),
                "train_acc": float(host[2, i]), "test_acc": float(host[3, i]),
                "weight_norm": float(host[4, i]), "grad_norm": m.grad_norm,
                "lr": m.cfg.lr * warmup_factor(m.cfg, step),
            }
            for i, m in enumerate(self.members)
        ]

    # ------------------------------------------------------------------ the run
    def run(self, start_step: int) -> list[MemberResult]:
        """Train every member from `start_step` to the end; writers must be open."""
        everyone = list(self.members)
        cfg = self.cfg0
        if start_step == 0:
            rows = self.evaluate(0)
            params, states = self.host_params(), self.host_states()
            for i, m in enumerate(self.members):
                self._record(m, rows[i])
                m.writer.write_checkpoint(0, params[i], states[i])
        bar = _progress_bar(cfg.steps, start_step, len(self.members), self.progress)
        step = start_step
        try:
            while step < cfg.steps and self.members:
                losses, gnorms = self.train_step(step)
                bad = [i for i in range(len(self.members))
                       if not (math.isfinite(losses[i]) and math.isfinite(gnorms[i]))]
                for i in bad:
                    self._fail_nonfinite(self.members[i], step, losses[i], gnorms[i])
                for i, m in enumerate(self.members):
                    m.grad_norm = float(gnorms[i])
                if bad:
                    keep = [i for i in range(len(self.members)) if i not in bad]
                    self._last_grads = {n: g.index_select(0, torch.tensor(keep, device=self.device))
                                        for n, g in self._last_grads.items()} if keep else {}
                    self._keep(keep)
                    if not self.members:
                        break
                self.adamw_step(step)
                step += 1
                bar.update(1)
                stopping: list[int] = []
                if step % cfg.eval_every == 0 or step == cfg.steps:
                    rows = self.evaluate(step)
                    for i, m in enumerate(self.members):
                        self._record(m, rows[i])
                        if (m.cfg.stop_after_grok and m.evals_after_grok is not None
                                and m.evals_after_grok >= m.cfg.stop_after_grok):
                            stopping.append(i)
                if step in self.checkpoints or stopping:
                    write = range(len(self.members)) if step in self.checkpoints else stopping
                    params, states = self.host_params(), self.host_states()
                    for i in write:
                        self.members[i].writer.write_checkpoint(step, params[i], states[i])
                for i in stopping:
                    m = self.members[i]
                    status = f"completed: stopped {m.cfg.stop_after_grok} evaluations after grokking"
                    m.writer.close(status)
                    m.outcome.result = TrainResult(m.path, step, status)
                if stopping:
                    self._keep([i for i in range(len(self.members)) if i not in stopping])
        except KeyboardInterrupt:
            for m in self.members:
                m.writer.close("stopped: interrupted")
            raise
        except BaseException:
            for m in self.members:
                m.writer.close("stopped: ensemble failed")
            raise
        finally:
            bar.close()
        for m in self.members:
            m.writer.close("completed")
            m.outcome.result = TrainResult(m.path, step, "completed")
        return [m.outcome for m in everyone]

    @staticmethod
    def _record(m: _Member, row: dict[str, float]) -> None:
        m.writer.write_eval(row)
        # loop.Trainer._record: count evaluations since test accuracy first reached the threshold
        if m.evals_after_grok is not None:
            m.evals_after_grok += 1
        elif row["test_acc"] >= m.cfg.grok_threshold:
            m.evals_after_grok = 0

    def _fail_nonfinite(self, m: _Member, step: int, loss: float, gnorm: float) -> None:
        # the same words as loop.Trainer.run, so a member's file reads like a single run's
        what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient", gnorm)
        exc = f"non-finite {what} ({value}) at step {step}"
        last = int(m.writer.f["steps"][m.writer.n_checkpoints - 1])
        m.writer.close(f"stopped: {exc}")
        m.outcome.error = RunFailure(
            f"training stopped: {exc}; the last good checkpoint (step {last}) is kept in {m.path}")


def _progress_bar(total: int, initial: int, members: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="step", dynamic_ncols=True,
                desc=f"ensemble x{members}", leave=True)


# ---------------------------------------------------------------------- entry points
def train_ensemble(cfgs: Sequence[RunConfig], outs: Sequence[str | Path], *, force: bool = False,
                   progress: bool = False) -> list[MemberResult]:
    """Train `cfgs` as one batched ensemble, member i into the trajectory file outs[i]."""
    if len(cfgs) != len(outs):
        raise BadInput("train_ensemble needs one output file per config")
    outs = [Path(o) for o in outs]
    if len(set(outs)) != len(outs):
        raise BadInput("ensemble members must write to different files")
    for cfg, out in zip(cfgs, outs):
        cfg.validate()
        if out.exists() and not force:
            raise BadInput(f"{out} already exists; use force to overwrite it")
        if not out.parent.exists():
            raise BadInput(f"directory {out.parent} does not exist")
    datas = [TASKS.get(c.task).build(c) for c in cfgs]
    trainer = EnsembleTrainer(cfgs, datas, outs, progress=progress)
    from groklens.checkpoints import sidecar_path

    params, states = trainer.host_params(), trainer.host_states()
    try:
        for i, m in enumerate(trainer.members):
            if force:
                m.path.unlink(missing_ok=True)
                sidecar_path(m.path).unlink(missing_ok=True)
            m.writer = create_trajectory(m.path, m.cfg, m.data, params[i], states[i])
    except BaseException:
        for m in trainer.members:
            if m.writer is not None:
                m.writer.close("stopped: ensemble could not start")
        raise
    return trainer.run(0)


def resume_ensemble(paths: Sequence[str | Path], *, progress: bool = False) -> list[MemberResult]:
    """Continue interrupted members together; all must stop at the same checkpoint step."""
    paths = [Path(p) for p in paths]
    lasts = [recover(p) for p in paths]
    if len(set(lasts)) != 1:
        raise BadInput(f"ensemble members stopped at different steps ({sorted(set(lasts))}); resume them separately")
    last = lasts[0]
    trajs = [Trajectory(p) for p in paths]
    cfgs = [t.config for t in trajs]
    trainer = EnsembleTrainer(cfgs, [t.dataset() for t in trajs], paths, progress=progress)
    for i, (t, m) in enumerate(zip(trajs, trainer.members)):
        trainer.load_member_state(i, t.params(last), read_state(m.path, last), last)
        m.evals_after_grok = evals_after_grok(t, m.cfg)
    try:
        for m in trainer.members:
            m.writer = TrajectoryWriter.reopen(m.path)
            m.writer.set_status("running")
    except BaseException:
        for m in trainer.members:
            if m.writer is not None:
                m.writer.close("interrupted")
        raise
    return trainer.run(last)


__all__ = [
    "PER_MEMBER_FIELDS",
    "SHARED_FIELDS",
    "EnsembleTrainer",
    "MemberResult",
    "ensemble_key",
    "resume_ensemble",
    "train_ensemble",
    "unsupported_reason",
]
