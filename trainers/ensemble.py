"""Batched ensembles: many small runs of one architecture trained together in one process.

Members share every RunConfig field but the per-member ones (PER_MEMBER_FIELDS): each keeps its
own `seed` (initialisation and mini-batch order), `data_seed` (its own train/test split, and
its own inputs where the task draws them), `lr`, `weight_decay`, stop rule, and its
regularizers' strengths (and Grokfast's alpha and filter): an ensemble may mix
regularized and plain members. Routing (SOLO_FIELDS) is a strategy of its own: a routed
config trains alone. Any task trains in an ensemble, multi-target ones included.

Parameters are stacked along a leading member dimension (`torch.func.stack_module_state`);
one forward/backward runs every member at once through `torch.func.functional_call` under
`torch.func.vmap` (with the regularizer terms inside it, each with the member's own weight).
Everything else is the step every strategy takes (trainers/step.py), the one update
(trainers/optim.py: the gradient transforms, then AdamW, with per-member constants) and the one
evaluation row (trainers/evaluation.py), on the stacked tensors. The loop is the one every run
goes through (trainers/engine.py); each member writes its own trajectory file, in the same
format, at the same steps and with the same metrics as `groklens.trainers.train.train` would: a
member's trajectory equals the same configuration trained alone to float tolerance
(tests/trainers/test_ensemble.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from groklens.checkpoints import Trajectory, TrajectoryWriter, recover
from groklens.checkpoints.locking import describe_holder, writer_alive
from groklens.config import FIELD_FACTS, RunConfig
from groklens.errors import BadInput
from groklens.tasks import TASKS, TaskData
from groklens.trainers.engine import (EVAL_CHUNK, Member, Strategy, flushing_denormals, resolve_device,
                                      restore_counters, run)
from groklens.trainers.evaluation import concat, rows, score, split_columns, weight_norms
from groklens.models import build_model
from groklens.trainers.optim import Update, grad_norms
from groklens.trainers.regularizers import Batch, build_regularizers
from groklens.trainers.train import create_trajectory
from groklens.trainers.step import (
    check_finite, draw_batch, objective, readout, readout_logits, reg_eval_rows, model_capture, model_captures)

# Fields that may differ between members, declared per_member with the field (groklens/config.py):
# the loop's (init and split seeds, optimizer strength, the stop rule; each member's own in
# trainers/engine.py) and the regularizers' strengths.
PER_MEMBER_FIELDS: tuple[str, ...] = tuple(n for n, f in FIELD_FACTS.items() if f.per_member)
# Fields of a strategy of their own, declared solo: a config that sets one trains alone
# (`ensemble_key` None); routing; compile: a vmapped step is not compiled, a compiled config trains
# as a single run; attn_mask_from: each run reads its own mask from another run when it starts
# (trainers/ticket.py).
SOLO_FIELDS: tuple[str, ...] = tuple(n for n, f in FIELD_FACTS.items() if f.solo)


def shared_fields() -> list[str]:
    """Every other RunConfig field: the members of one ensemble share it (architecture, task and
    data shape, loss, the regularizers' sites and windows, betas, schedule, device)."""
    return [f.name for f in fields(RunConfig) if f.name not in PER_MEMBER_FIELDS + SOLO_FIELDS]


def unsupported_reason(cfg: RunConfig) -> str | None:
    """Why `cfg` cannot join an ensemble (None when it can)."""
    default = RunConfig()
    odd = [name for name in SOLO_FIELDS if getattr(cfg, name) != getattr(default, name)]
    if odd:
        return f"ensembles do not implement {', '.join(f'{n}={getattr(cfg, n)!r}' for n in odd)}"
    return None


def ensemble_key(cfg: RunConfig) -> tuple | None:
    """What members of one ensemble must share, or None when `cfg` must train as a single run."""
    if unsupported_reason(cfg) is not None:
        return None
    return tuple((name, _hashable(getattr(cfg, name))) for name in shared_fields())


def _hashable(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _take(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per member m the rows idx[m] of t[m]: t [M, N, ...], idx [M, n] -> [M, n, ...]."""
    return t[torch.arange(len(idx), device=idx.device)[:, None], idx]


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
        self.readout_slice = slice(self.positions[0], self.positions[-1] + 1)
        self.multi_target = first.n_targets > 0
        # tasks whose inputs depend on data_seed (seq_*) give each member its own inputs
        self.shared_inputs = all(torch.equal(d.inputs, first.inputs) for d in datas[1:])
        self.n_inputs = len(first.inputs)
        models = [build_model(m.cfg, m.data) for m in self.members]  # each from its own seed
        self.names = [n for n, _ in models[0].named_parameters()]
        self.base = build_model(self.cfg0, first).to("meta")  # the architecture, without storage
        params, buffers = torch.func.stack_module_state(models)
        self.params = {n: params[n].detach().to(self.device).requires_grad_() for n in self.names}
        self.buffers = {n: b.to(self.device) for n, b in buffers.items()}
        regularizers = build_regularizers(cfgs, self.base, first, self.params)
        self.terms = [r for r in regularizers if r.kind == "term"]
        self.update = Update(cfgs, self.params, [r for r in regularizers if r.kind == "grad"])
        self.hooks = [(n, self._capture) for n in sorted({n for r in self.terms for n in r.hook_names})]
        # sites the template records itself (Transformer.site_capture): the members keep the lean
        # path, as the same run alone does (trainers/single.py)
        self.model_captures = model_captures(self.base, [n for n, _ in self.hooks])
        self.acts: dict[str, torch.Tensor] = {}
        self._stack_member_tensors()

    # ------------------------------------------------------------------ member bookkeeping
    def _stack_member_tensors(self) -> None:
        ms, dev = self.members, self.device
        if self.shared_inputs:
            self.inputs = ms[0].data.inputs.to(dev)  # [N, n_ctx], the same for every member
        else:
            self.inputs = torch.stack([m.data.inputs for m in ms]).to(dev)  # [M, N, n_ctx]
        self.labels = torch.stack([m.data.labels for m in ms]).to(dev)  # [M, N] or [M, N, K]
        self.train_idx = torch.stack([m.data.train_idx for m in ms]).to(dev)  # [M, n_train]
        self.test_idx = torch.stack([m.data.test_idx for m in ms]).to(dev)  # [M, n_test]
        member_inputs = self.inputs if not self.shared_inputs else self.inputs.expand(len(ms), -1, -1)
        self.train_x = _take(member_inputs, self.train_idx)  # [M, n_train, n_ctx]
        self.train_y = _take(self.labels, self.train_idx)  # [M, n_train] or [M, n_train, K]
        self.train_mask = torch.stack([m.data.informative_mask[m.data.train_idx] for m in ms]).to(dev)
        self.weights = {r.name: torch.tensor([getattr(m.cfg, r.weight_field) for m in ms], dtype=torch.float64,
                                             device=dev) for r in self.terms}
        # members with a term run the full forward pass with capture hooks, as they would alone;
        # plain members keep the readout-only forward a plain single run uses
        regularized = [i for i, m in enumerate(ms) if any(getattr(m.cfg, r.weight_field) for r in self.terms)]
        plain = [i for i in range(len(ms)) if i not in regularized]
        self.groups = [(idx, capture) for idx, capture in ((plain, False), (regularized, True)) if idx]
        if self.terms:  # where terms are evaluated: each member's training inputs (a fixed subset if many)
            n = self.train_x.shape[1]
            picks = torch.stack([torch.as_tensor(reg_eval_rows(m.cfg, n)) for m in ms]).to(dev)
            self.reg_x, self.reg_mask = _take(self.train_x, picks), _take(self.train_mask, picks)

    def keep(self, keep: list[int]) -> None:
        if len(keep) == len(self.members):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        with torch.no_grad():
            self.params = {n: p.detach().index_select(0, idx).clone().requires_grad_() for n, p in self.params.items()}
            self.buffers = {n: b.index_select(0, idx).clone() for n, b in self.buffers.items()}
        self.update.keep(idx)
        for reg in self.terms:
            reg.keep(idx)
        self.members = [self.members[i] for i in keep]
        self.gens = [self.gens[i] for i in keep]
        if self.members:
            self._stack_member_tensors()

    def load(self, i: int, params: dict[str, torch.Tensor], state: dict[str, np.ndarray], step: int) -> None:
        """Put a checkpoint of member i (from its file) into the stacks (for resume)."""
        with torch.no_grad():
            for n in self.names:
                self.params[n][i].copy_(params[n].to(self.device))
        self.update.load(i, state, step)
        self.gens[i].set_state(torch.from_numpy(np.array(state["rng.batch"])))

    def payloads(self, indices: list[int]) -> list[tuple[dict, dict, list]]:
        """Per member, the same keys and dtypes as a single run's checkpoint."""
        host = {n: p.detach().cpu().numpy() for n, p in self.params.items()}
        rng = torch.get_rng_state().numpy()
        return [({n: host[n][i] for n in self.names},
                 {**self.update.state(i), "rng.torch": rng, "rng.batch": self.gens[i].get_state().numpy()}, [])
                for i in indices]

    # ------------------------------------------------------------------ the computation
    def _capture(self, tensor: torch.Tensor, hook) -> None:
        self.acts[hook.name] = tensor  # a member's (batched) activation, read inside the same vmap

    def _logits(self, params, buffers, x, capture: bool = False):
        """One member's readout logits (trainers/step.py), its parameters in the template."""
        def call(x, **kwargs):
            return torch.func.functional_call(self.base, (params, buffers), (x,), kwargs)

        full = bool(capture and self.hooks and not self.model_captures)  # the model records its own sites in full
        logits = readout_logits(call, x, self.readout_slice, full, getattr(self.base, "supports_readout", False))
        return readout(logits, self.multi_target)

    def _vmap(self, fn, *args, in_dims=0, capture: bool = True):
        """fn vmapped over the members, with the terms' capture hooks on the template for the call."""
        if not (self.hooks and capture):
            return torch.func.vmap(fn, in_dims=in_dims)(*args)
        if self.model_captures:  # filled inside the vmapped forward, read there by the terms
            try:
                with model_capture(self.base, [n for n, _ in self.hooks], self.terms) as self.acts:
                    return torch.func.vmap(fn, in_dims=in_dims)(*args)
            finally:
                self.acts = {}
        with self.base.hooks(fwd_hooks=self.hooks):
            out = torch.func.vmap(fn, in_dims=in_dims)(*args)
        self.acts = {}
        return out

    def _batch(self, step: int):
        cfg, n_train = self.cfg0, self.train_y.shape[1]
        picks = [draw_batch(n_train, cfg.batch_size, g, m.cfg, step) for g, m in zip(self.gens, self.members)]
        if picks[0] is None:
            return self.train_x, self.train_y, self.train_mask
        pick = torch.stack(picks).to(self.device)
        return _take(self.train_x, pick), _take(self.train_y, pick), _take(self.train_mask, pick)

    def _objectives(self, step: int, x, y, mask) -> torch.Tensor:
        """Every member's objective [M] (float64): task loss + its weighted terms, per group."""
        def objective_fn(capture: bool):
            def member_objective(p, b, xm, ym, mm, w):
                terms = self.terms if capture else ()
                logits = self._logits(p, b, xm, capture=capture)
                return objective(logits, ym, self.cfg0.loss, terms, self.acts, Batch(xm, mm, self.positions), step,
                                 weights=w)[1]
            return member_objective

        parts, order = [], []
        for idx, capture in self.groups:
            if len(idx) == len(self.members):
                def sub(t):
                    return t
            else:
                rows_ = torch.tensor(idx, device=self.device)

                def sub(t, rows_=rows_):
                    return t.index_select(0, rows_)
            args = ({n: sub(p) for n, p in self.params.items()}, {n: sub(b) for n, b in self.buffers.items()},
                    sub(x), sub(y), sub(mask), {k: sub(w) for k, w in self.weights.items()})
            parts.append(self._vmap(objective_fn(capture), *args, capture=capture))
            order += idx
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts)[torch.argsort(torch.tensor(order, device=self.device))]

    def train_step(self, step: int) -> list[tuple[Member, str]]:
        x, y, mask = self._batch(step)
        for p in self.params.values():
            p.grad = None
        objectives = self._objectives(step, x, y, mask)  # [M]
        objectives.sum().backward()
        # parameters the loss does not reach (W_Q, W_K under uniform attention) get no gradient
        grads = {n: p.grad for n, p in self.params.items() if p.grad is not None}
        host, reasons = check_finite(objectives, grad_norms(grads), step)  # one sync per step
        for m, g in zip(self.members, host[1]):
            m.grad_norm = float(g)
        failures = [(m, r) for m, r in zip(self.members, reasons) if r is not None]
        if failures:
            keep = [i for i, r in enumerate(reasons) if r is None]
            grads = {n: g.index_select(0, torch.tensor(keep, device=self.device)) for n, g in grads.items()}
            self.keep(keep)
            if not self.members:
                return failures
        self.update(self.params, grads, step)
        return failures

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int) -> list[dict[str, float]]:
        """The evaluation row of every member (trainers/evaluation.py)."""
        columns = split_columns(self._scores(), self.train_idx, self.test_idx)
        columns["weight_norm"] = weight_norms(self.params)
        columns.update(self._term_metrics(step))
        return rows(step, columns, [m.cfg for m in self.members], [m.grad_norm for m in self.members],
                    self.update.metrics())

    def _scores(self) -> dict[str, torch.Tensor]:
        """Per member and input [M, N]: the scores of trainers/evaluation.py."""
        chunk = max(256, EVAL_CHUNK // len(self.members))
        x_dim = None if self.shared_inputs else 0
        loss, multi = self.cfg0.loss, self.multi_target
        chunks = []
        for start in range(0, self.n_inputs, chunk):
            x = self.inputs[..., start : start + chunk, :]
            labels = self.labels[:, start : start + chunk]  # [M, chunk] or [M, chunk, K]
            logits = torch.func.vmap(self._logits, in_dims=(0, 0, x_dim))(self.params, self.buffers, x)
            chunks.append(torch.func.vmap(lambda lg, y: score(lg, y, loss, multi))(logits, labels))
        return concat(chunks)

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
                   progress: bool = False, on_commit=None, on_eval=None) -> list[Member]:
    """Train `cfgs` as one batched ensemble, member i into the trajectory file outs[i]. With
    force, an existing file is replaced only once its member's first checkpoint is committed
    (the writer stages it, as `train --force`), so a failed start never loses a run.
    `on_eval(member, row)` hears each member's evaluation rows (engine.run)."""
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
    with flushing_denormals(cfgs[0].flush_denormal):  # one process: the members share it (not per member)
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
            return run(strategy, 0, fresh=True, on_commit=on_commit, on_eval=on_eval)
        finally:
            for m in strategy.members:
                if m.writer is not None:
                    m.writer.close()  # idempotent; a staged member that never committed is deleted


def resume_ensemble(paths: Sequence[str | Path], *, progress: bool = False, on_commit=None,
                    on_eval=None) -> list[Member]:
    """Continue interrupted members together; all must stop at the same checkpoint step."""
    paths = [Path(p) for p in paths]
    lasts = [recover(p) for p in paths]
    if len(set(lasts)) != 1:
        raise BadInput(f"ensemble members stopped at different steps ({sorted(set(lasts))}); resume them separately")
    last = lasts[0]
    trajs = [Trajectory(p) for p in paths]
    with flushing_denormals(trajs[0].config.flush_denormal):
        strategy = EnsembleRun([t.config for t in trajs], [t.dataset() for t in trajs], paths, progress=progress)
        for i, (t, m) in enumerate(zip(trajs, strategy.members)):
            strategy.load(i, t.params(last), t.state(last), last)
            restore_counters(m, t.metrics, t.cpu_seconds)
        try:
            for m in strategy.members:
                m.writer = TrajectoryWriter.reopen(m.path)
                m.writer.set_status("running")
        except BaseException:
            for m in strategy.members:
                if m.writer is not None:
                    m.writer.close("interrupted")
            raise
        return run(strategy, last, fresh=False, on_commit=on_commit, on_eval=on_eval)


__all__ = [
    "PER_MEMBER_FIELDS", "SOLO_FIELDS", "EnsembleRun", "ensemble_key",
    "resume_ensemble", "shared_fields", "train_ensemble", "unsupported_reason",
]
