"""Batched ensembles: many small runs of one architecture trained together in one process.

Members share the model architecture, the task, the data shape, the loss and the schedule;
each keeps its own `seed` (initialisation and mini-batch order), `data_seed` (its own
train/test split), `lr`, `weight_decay`, stop rule and regularizer strengths
(PER_MEMBER_FIELDS): an ensemble may mix regularized and plain members. Parameters are
stacked along a leading member dimension (`torch.func.stack_module_state`); one
forward/backward runs every member at once through `torch.func.functional_call` under
`torch.func.vmap` (with the regularizer terms inside it, each with the member's own weight),
then Grokfast, the perpendicular gradient and AdamW act on the stacked tensors with
per-member constants (trainers/stacked.py). The loop is the one every run goes through
(trainers/engine.py); each member writes its own trajectory file, in the same format, at the
same steps and with the same metrics as `groklens.trainers.loop.train` would: a member's
trajectory equals the same configuration trained alone to float tolerance
(tests/trainers/test_ensemble.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from groklens.checkpoints import Trajectory, TrajectoryWriter, recover
from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.trainers.engine import (
    EVAL_CHUNK, Member, Strategy, TrainResult, nonfinite_reason, resolve_device, restore_counters, run,
    warmup_factor,
)
from groklens.trainers.models import build_model
from groklens.trainers.losses import task_loss
from groklens.trainers.regularizers import Batch, active_regularizers
from groklens.trainers.single import REG_EVAL_MAX
from groklens.trainers.stacked import StackedGrokfast, StackedPerpGrad, adamw_step
from groklens.tasks import TASKS, TaskData

# Fields that may differ between members of one ensemble.
PER_MEMBER_FIELDS = ("seed", "data_seed", "lr", "weight_decay", "grok_threshold", "stop_after_grok",
                     "act_norm_lambda", "geomdr_lambda", "kl_attn_beta", "grokfast_lambda", "grokfast_alpha",
                     "perp_grad")
# Fields the ensemble implements and that members must share (architecture, data shape, loss,
# the regularizers' sites and windows, optimizer constants and schedule). Every other RunConfig
# field (routing) must be at its default, or the run trains alone (`ensemble_key` returns None).
SHARED_FIELDS = (
    # task and data shape
    "task", "p", "train_frac", "n_digits", "seq_len", "n_informative", "informative_layout",
    "distractor_vocab",
    # architecture (anything that only changes the forward pass is fine under vmap)
    "model", "n_layers", "d_model", "n_heads", "d_head", "d_mlp", "act_fn", "norm", "norm_placement", "attention",
    "unembed", "init", "init_scheme", "causal", "mlp_bias", "radius", "tau", "fourier_freqs", "mlp_embed",
    # the loss and the regularizers' knobs other than their strengths
    "loss", "act_norm_sites", "geomdr_target", "geomdr_start", "geomdr_end", "geomdr_site", "kl_attn_layer",
    "perp_grad_scale",
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
    if odd:  # routing: a routed run is its own strategy
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


MemberResult = Member  # what train_ensemble returns per member: .path, .result, .error


class EnsembleRun(Strategy):
    """Members [m] of one architecture, stacked; members leave when they stop or fail."""

    def __init__(self, cfgs: Sequence[RunConfig], datas: Sequence[TaskData], paths: Sequence[Path],
                 progress: bool = False):
        _check_members(cfgs, datas)
        first = datas[0]
        self.cfg0, self.progress, self.label = cfgs[0], progress, f"ensemble x{len(cfgs)}"
        self.device = resolve_device(self.cfg0.device)
        self.members = [Member(c, d, Path(p)) for c, d, p in zip(cfgs, datas, paths)]
        self.gens = [torch.Generator().manual_seed(c.seed + 1) for c in cfgs]  # as a single run's
        self.positions = first.readout_positions
        # tasks whose inputs depend on data_seed (seq_*) give each member its own inputs
        self.shared_inputs = all(torch.equal(d.inputs, first.inputs) for d in datas[1:])
        self.n_inputs = len(first.inputs)
        models = [build_model(m.cfg, m.data) for m in self.members]  # each from its own seed
        self.names = [n for n, _ in models[0].named_parameters()]
        self.base = build_model(self.cfg0, first).to("meta")  # the architecture, without storage
        params, buffers = torch.func.stack_module_state(models)
        self.params = {n: params[n].detach().to(self.device).requires_grad_() for n in self.names}
        self.buffers = {n: b.to(self.device) for n, b in buffers.items()}
        self.exp_avg = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.adam_steps = {n: 0 for n in self.names}  # per tensor: one without gradients is not stepped
        # the union of the members' regularizers; a member's own strength (0: off) weights each
        union = self.cfg0.replace(**{f: max(getattr(c, f) for c in cfgs) for f in PER_MEMBER_FIELDS[6:]})
        self.terms = [cls(union, self.base, first) for cls in active_regularizers(union) if cls.kind == "term"]
        self.hooks = [(n, self._capture) for n in sorted({n for r in self.terms for n in r.hook_names})]
        self.acts: dict[str, torch.Tensor] = {}
        self.grokfast = StackedGrokfast(self.params, [c.grokfast_alpha for c in cfgs],
                                        [c.grokfast_lambda for c in cfgs]) if union.grokfast_lambda else None
        self.perp = StackedPerpGrad([c.perp_grad for c in cfgs], union.perp_grad_scale == "orthograd") \
            if union.perp_grad else None
        self._stack_member_tensors()

    # ------------------------------------------------------------------ member bookkeeping
    def _stack_member_tensors(self) -> None:
        ms, dev = self.members, self.device
        if self.shared_inputs:
            self.inputs = ms[0].data.inputs.to(dev)  # [N, n_ctx], the same for every member
        else:
            self.inputs = torch.stack([m.data.inputs for m in ms]).to(dev)  # [M, N, n_ctx]
        self.labels = torch.stack([m.data.labels for m in ms]).to(dev)  # [M, N]
        self.train_idx = torch.stack([m.data.train_idx for m in ms]).to(dev)  # [M, n_train]
        self.test_idx = torch.stack([m.data.test_idx for m in ms]).to(dev)  # [M, n_test]
        member_inputs = self.inputs if not self.shared_inputs else self.inputs.expand(len(ms), -1, -1)
        n_ctx = member_inputs.shape[2]
        index = self.train_idx[:, :, None].expand(-1, -1, n_ctx)
        self.train_x = torch.gather(member_inputs, 1, index)  # [M, n_train, n_ctx]
        self.train_y = torch.gather(self.labels, 1, self.train_idx)  # [M, n_train]
        self.train_mask = torch.stack([m.data.informative_mask[m.data.train_idx] for m in ms]).to(dev)
        self.lr = torch.tensor([m.cfg.lr for m in ms], dtype=torch.float64)
        self.wd = torch.tensor([m.cfg.weight_decay for m in ms], dtype=torch.float64)
        self.weights = {r.name: torch.tensor([getattr(m.cfg, r.weight_field) for m in ms], dtype=torch.float64,
                                             device=dev) for r in self.terms}
        # members with a term run the full forward pass with capture hooks, as they would alone;
        # plain members keep the readout-only forward a plain single run uses
        regularized = [i for i, m in enumerate(ms) if any(getattr(m.cfg, r.weight_field) for r in self.terms)]
        plain = [i for i in range(len(ms)) if i not in regularized]
        self.groups = [(idx, capture) for idx, capture in ((plain, False), (regularized, True)) if idx]
        if self.terms:  # where terms are evaluated: each member's training inputs (a fixed subset if many)
            n = self.train_x.shape[1]
            picks = torch.stack([torch.as_tensor(np.arange(n) if n <= REG_EVAL_MAX else np.sort(
                np.random.default_rng([m.cfg.data_seed, 2]).choice(n, REG_EVAL_MAX, replace=False)))
                for m in ms]).to(dev)
            self.reg_x = torch.gather(self.train_x, 1, picks[:, :, None].expand(-1, -1, n_ctx))
            self.reg_mask = torch.gather(self.train_mask, 1, picks[:, :, None].expand(-1, -1, n_ctx))

    def keep(self, keep: list[int]) -> None:
        if len(keep) == len(self.members):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        with torch.no_grad():
            self.params = {n: p.detach().index_select(0, idx).clone().requires_grad_() for n, p in self.params.items()}
            self.exp_avg = {n: t.index_select(0, idx).clone() for n, t in self.exp_avg.items()}
            self.exp_avg_sq = {n: t.index_select(0, idx).clone() for n, t in self.exp_avg_sq.items()}
            self.buffers = {n: b.index_select(0, idx).clone() for n, b in self.buffers.items()}
        for transform in (self.grokfast, self.perp):
            if transform is not None:
                transform.keep(idx)
        self.members = [self.members[i] for i in keep]
        self.gens = [self.gens[i] for i in keep]
        if self.members:
            self._stack_member_tensors()

    def load(self, i: int, params: dict[str, torch.Tensor], state: dict[str, np.ndarray], step: int) -> None:
        """Put a checkpoint of member i (from its file) into the stacks (for resume)."""
        with torch.no_grad():
            for n in self.names:
                self.params[n][i].copy_(params[n].to(self.device))
                if step > 0:
                    self.exp_avg[n][i].copy_(torch.from_numpy(np.array(state[f"optim.{n}.exp_avg"])))
                    self.exp_avg_sq[n][i].copy_(torch.from_numpy(np.array(state[f"optim.{n}.exp_avg_sq"])))
        if step > 0:
            self.adam_steps = {n: int(np.array(state[f"optim.{n}.step"])) for n in self.names}
        if self.grokfast is not None:
            self.grokfast.load_state(i, state)
        self.gens[i].set_state(torch.from_numpy(np.array(state["rng.batch"])))

    def payloads(self, indices: list[int]) -> list[tuple[dict, dict, list]]:
        """Per member, the same keys and dtypes as a single run's checkpoint."""
        host = {n: p.detach().cpu().numpy() for n, p in self.params.items()}
        m1 = {n: t.cpu().numpy() for n, t in self.exp_avg.items()}
        m2 = {n: t.cpu().numpy() for n, t in self.exp_avg_sq.items()}
        rng = torch.get_rng_state().numpy()
        out = []
        for i in indices:
            st: dict[str, np.ndarray] = {}
            for n in self.names:
                st[f"optim.{n}.step"] = np.array(self.adam_steps[n], dtype=np.float32)
                st[f"optim.{n}.exp_avg"] = m1[n][i]
                st[f"optim.{n}.exp_avg_sq"] = m2[n][i]
            if self.members[i].cfg.grokfast_lambda:
                st.update(self.grokfast.state(i))
            st["rng.torch"] = rng
            st["rng.batch"] = self.gens[i].get_state().numpy()
            out.append(({n: host[n][i] for n in self.names}, st, []))
        return out

    # ------------------------------------------------------------------ the computation
    def _capture(self, tensor: torch.Tensor, hook) -> None:
        self.acts[hook.name] = tensor  # a member's (batched) activation, read inside the same vmap

    def _logits(self, params, buffers, x, capture: bool = False):
        # the same readout forward a single run uses (single.Lane.forward)
        call, pos = torch.func.functional_call, self.positions[0]
        if capture and self.hooks:
            return call(self.base, (params, buffers), (x,))[:, pos]
        if getattr(self.base, "supports_readout", False):
            return call(self.base, (params, buffers), (x,), {"readout": slice(pos, pos + 1)})[:, 0]
        return call(self.base, (params, buffers), (x,))[:, pos]

    def _vmap(self, fn, *args, in_dims=0, capture: bool = True):
        """fn vmapped over the members, with the terms' capture hooks on the template for the call."""
        if not (self.hooks and capture):
            return torch.func.vmap(fn, in_dims=in_dims)(*args)
        with self.base.hooks(fwd_hooks=self.hooks):
            out = torch.func.vmap(fn, in_dims=in_dims)(*args)
        self.acts = {}
        return out

    def _batch(self):
        cfg, n_train = self.cfg0, self.train_y.shape[1]
        if not (cfg.batch_size and cfg.batch_size < n_train):
            return self.train_x, self.train_y, self.train_mask
        pick = torch.stack([torch.randperm(n_train, generator=g)[: cfg.batch_size] for g in self.gens]).to(self.device)
        rows = pick[:, :, None].expand(-1, -1, self.train_x.shape[2])
        return torch.gather(self.train_x, 1, rows), torch.gather(self.train_y, 1, pick), \
            torch.gather(self.train_mask, 1, rows)

    def _objectives(self, step: int, x, y, mask) -> torch.Tensor:
        """Every member's objective [M] (float64): task loss + its weighted terms, per group."""
        def objective_fn(capture: bool):
            def member_objective(p, b, xm, ym, mm, w):
                objective = task_loss(self._logits(p, b, xm, capture=capture), ym, self.cfg0.loss)
                for reg in self.terms if capture else ():
                    batch = Batch(xm, mm, self.positions)
                    objective = objective + reg.term(self.acts, batch, step, weight=w[reg.name])[0]
                return objective
            return member_objective

        parts, order = [], []
        for idx, capture in self.groups:
            if len(idx) == len(self.members):
                def sub(t):
                    return t
            else:
                rows = torch.tensor(idx, device=self.device)

                def sub(t, rows=rows):
                    return t.index_select(0, rows)
            args = ({n: sub(p) for n, p in self.params.items()}, {n: sub(b) for n, b in self.buffers.items()},
                    sub(x), sub(y), sub(mask), {k: sub(w) for k, w in self.weights.items()})
            parts.append(self._vmap(objective_fn(capture), *args, capture=capture))
            order += idx
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts)[torch.argsort(torch.tensor(order, device=self.device))]

    def train_step(self, step: int) -> list[tuple[Member, str]]:
        x, y, mask = self._batch()
        for p in self.params.values():
            p.grad = None
        objectives = self._objectives(step, x, y, mask)  # [M]
        objectives.sum().backward()
        # parameters the loss does not reach (W_Q, W_K under uniform attention) get no gradient;
        # torch.optim.AdamW skips them (no decay either), and so do we
        grads = {n: p.grad for n, p in self.params.items() if p.grad is not None}
        # torch.nn.utils.get_total_norm per member: the norm of the per-tensor norms
        per_tensor = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads.values()], dim=1)
        grad_norm = torch.linalg.vector_norm(per_tensor, dim=1)
        host = torch.stack([objectives.detach(), grad_norm.double()]).cpu().numpy()  # one sync per step
        failures = []
        for i, m in enumerate(self.members):
            m.grad_norm = float(host[1, i])
            if not np.isfinite(host[:, i]).all():
                what, value = ("loss", host[0, i]) if not np.isfinite(host[0, i]) else ("gradient", host[1, i])
                failures.append((m, nonfinite_reason(what, value, step)))
        if failures:
            keep = [i for i in range(len(self.members)) if np.isfinite(host[:, i]).all()]
            grads = {n: g.index_select(0, torch.tensor(keep, device=self.device)) for n, g in grads.items()}
            self.keep(keep)
            if not self.members:
                return failures
        self._update(step, grads)
        return failures

    def _update(self, step: int, grads: dict[str, torch.Tensor]) -> None:
        """Grokfast, the perpendicular gradient, then AdamW: a single run's order."""
        if self.grokfast is not None:
            self.grokfast.transform(grads)
        if self.perp is not None:
            self.perp.transform(self.params, grads)
        lr = self.lr * torch.tensor([warmup_factor(m.cfg, step) for m in self.members], dtype=torch.float64)
        adamw_step(self.params, grads, self.exp_avg, self.exp_avg_sq, self.adam_steps, lr, self.wd, self.cfg0.betas)

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int) -> list[dict[str, float]]:
        """The same rows as a single run's evaluation, one per member."""
        loss, hit, ce = self._eval_losses()
        norm = torch.sqrt(sum((p.detach().double() ** 2).flatten(1).sum(1) for p in self.params.values()))
        series = {"loss": loss, "acc": hit, **({"ce": ce} if ce is not None else {})}
        columns = {f"{split}_{name}": torch.gather(v, 1, idx).mean(1) for name, v in series.items()
                   for split, idx in (("train", self.train_idx), ("test", self.test_idx))}
        columns["weight_norm"] = norm
        columns.update(self._term_metrics(step))
        keys = list(columns)
        host = torch.stack([columns[k].double() for k in keys]).cpu().numpy()
        extra = [{} for _ in self.members]
        for transform in (self.grokfast, self.perp):
            if transform is not None:
                for row, metrics in zip(extra, transform.metrics()):
                    row.update(metrics)
        return [{"step": step, **{k: float(host[j, i]) for j, k in enumerate(keys)}, "grad_norm": m.grad_norm,
                 "lr": m.cfg.lr * warmup_factor(m.cfg, step), **extra[i]} for i, m in enumerate(self.members)]

    def _eval_losses(self):
        """Per member and input [M, N]: task loss (float64), hit, and with loss != ce the cross-entropy."""
        chunk = max(256, EVAL_CHUNK // len(self.members))
        x_dim = None if self.shared_inputs else 0
        name = self.cfg0.loss
        losses, correct, ces = [], [], []
        for start in range(0, self.n_inputs, chunk):
            x = self.inputs[..., start : start + chunk, :]
            yl = self.labels[:, start : start + chunk]  # [M, chunk]
            logits = torch.func.vmap(self._logits, in_dims=(0, 0, x_dim))(self.params, self.buffers, x)
            losses.append(torch.func.vmap(lambda lg, y: task_loss(lg, y, name, reduction="none"))(logits, yl))
            correct.append(logits.argmax(-1) == yl)
            if name != "ce":
                ces.append(torch.func.vmap(lambda lg, y: task_loss(lg, y, "ce", reduction="none"))(logits, yl))
        ce = torch.cat(ces, dim=1) if ces else None
        return torch.cat(losses, dim=1), torch.cat(correct, dim=1).double(), ce

    def _term_metrics(self, step: int) -> dict[str, torch.Tensor]:
        """Each term's metrics [M] on the members' training inputs, at this step's parameters."""
        if not self.terms:
            return {}

        def member_metrics(p, b, xm, mm, w):
            self._logits(p, b, xm, capture=True)
            out = {}
            for reg in self.terms:
                out.update(reg.term(self.acts, Batch(xm, mm, self.positions), step, evaluating=True,
                                    weight=w[reg.name])[1])
            return out

        return self._vmap(member_metrics, self.params, self.buffers, self.reg_x, self.reg_mask, self.weights)


EnsembleTrainer = EnsembleRun  # the name earlier code used


def _check_members(cfgs: Sequence[RunConfig], datas: Sequence[TaskData]) -> None:
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


# ---------------------------------------------------------------------- entry points
def train_ensemble(cfgs: Sequence[RunConfig], outs: Sequence[str | Path], *, force: bool = False,
                   progress: bool = False, on_commit=None) -> list[Member]:
    """Train `cfgs` as one batched ensemble, member i into the trajectory file outs[i]. With
    force, an existing file is replaced only once its member's first checkpoint is committed
    (the writer stages it, as `train --force`), so a failed start never loses a run."""
    from groklens.checkpoints.locking import describe_holder, writer_alive
    from groklens.trainers.loop import create_trajectory

    if len(cfgs) != len(outs):
        raise BadInput("train_ensemble needs one output file per config")
    outs = [Path(o) for o in outs]
    if len(set(outs)) != len(outs):
        raise BadInput("ensemble members must write to different files")
    for cfg, out in zip(cfgs, outs):
        cfg.validate()
        if out.exists() and not force:
            raise BadInput(f"{out} already exists; use force to overwrite it")
        if out.exists() and writer_alive(out):
            raise BadInput(f"{out} is being written by a live process ({describe_holder(out)}); stop it first")
        if not out.parent.exists():
            raise BadInput(f"directory {out.parent} does not exist")
    strategy = EnsembleRun(cfgs, [TASKS.get(c.task).build(c) for c in cfgs], outs, progress=progress)
    payloads = strategy.payloads(list(range(len(strategy.members))))
    try:
        for m, (params, state, _) in zip(strategy.members, payloads):
            m.writer = create_trajectory(m.path, m.cfg, m.data, params, state,
                                         replace=m.path.exists() or m.path.is_symlink())
    except BaseException:
        for m in strategy.members:
            if m.writer is not None:
                m.writer.close("stopped: ensemble could not start")
        raise
    try:
        return run(strategy, 0, fresh=True, on_commit=on_commit)
    finally:
        for m in strategy.members:
            if m.writer is not None:
                m.writer.close()  # idempotent; a staged member that never committed is deleted


def resume_ensemble(paths: Sequence[str | Path], *, progress: bool = False, on_commit=None) -> list[Member]:
    """Continue interrupted members together; all must stop at the same checkpoint step."""
    paths = [Path(p) for p in paths]
    lasts = [recover(p) for p in paths]
    if len(set(lasts)) != 1:
        raise BadInput(f"ensemble members stopped at different steps ({sorted(set(lasts))}); resume them separately")
    last = lasts[0]
    trajs = [Trajectory(p) for p in paths]
    strategy = EnsembleRun([t.config for t in trajs], [t.dataset() for t in trajs], paths, progress=progress)
    for i, (t, m) in enumerate(zip(trajs, strategy.members)):
        strategy.load(i, t.params(last), t.state(last), last)
        restore_counters(m, t.metrics)
    try:
        for m in strategy.members:
            m.writer = TrajectoryWriter.reopen(m.path)
            m.writer.set_status("running")
    except BaseException:
        for m in strategy.members:
            if m.writer is not None:
                m.writer.close("interrupted")
        raise
    return run(strategy, last, fresh=False, on_commit=on_commit)


__all__ = [
    "PER_MEMBER_FIELDS", "SHARED_FIELDS", "EnsembleRun", "EnsembleTrainer", "MemberResult", "TrainResult",
    "ensemble_key", "resume_ensemble", "train_ensemble", "unsupported_reason",
]
