"""Regularizers and gradient transforms that the trainer composes with the task loss
(models/losses.py; docs/VARIANTS.md).

A regularizer is either
- a *term* added to the task loss: it names the hook points it reads, and the trainer runs the
  forward pass with capture hooks on them (inside `model.hooks(...)`, so nothing stays behind),
  then asks the term for its value on that batch; or
- a *gradient transform*: it rewrites the gradients in place between backward and the AdamW
  step (trainers/optim.py `Update`). Transforms are written on stacked tensors [M, *shape], one
  row per member, with per-member constants: an ensemble's parameters are stacked, a single
  run's are a stack of one, so one implementation serves every kind of run.
Each declares its place in the composition (`order`): terms act_norm, geomdr, kl_attn, then
transforms grokfast, then perp_grad (the final gradient is orthogonal to the weights). Weight
decay is AdamW's own, set by `weight_decay`, and nowhere else.

A regularizer is built once for all the members trained together (`cfgs`: one config for a
single run, M for an ensemble); the config fields that may differ between them (its strength,
Grokfast's alpha) are declared per_member with the field (groklens/config.py); every other field
it reads (sites, targets, windows, the projection's scale) the members share (trainers/ensemble.py).

Each regularizer names its metrics from the config alone (the trajectory file creates every
metric dataset before SWMR starts), and the trainer logs them at every evaluation: a term is
evaluated on the training inputs at that step (`reg_<name>` = the weighted term as it enters the
objective, plus its raw quantity); a transform reports on its last update.
State that an exact resume needs (the Grokfast EMA) travels in `state(i)` / `load_state(i, ...)`,
per member.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch

from groklens.errors import BadInput
from groklens.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from groklens.config import RunConfig
    from groklens.tasks import TaskData


# ---------------------------------------------------------------------- regularizers
@dataclass
class Batch:
    """What a term sees besides the captured activations."""

    x: torch.Tensor  # [b, n_ctx] tokens
    mask: torch.Tensor  # [b, n_ctx] bool: the informative positions of each input
    positions: list[int]  # the readout position(s)


class Regularizer:
    """Base class. Subclasses set name, kind ('term' | 'grad'), metric_keys and order.

    Built with every member's config (`cfgs`, in member order; `cfg` = the first, for the fields
    they share), the model (a term's hook points; an ensemble's template) and the task data;
    transforms get the stacked parameters `params` [M, *shape] their state is shaped after."""

    name: ClassVar[str]
    kind: ClassVar[str]
    metric_keys: ClassVar[tuple[str, ...]]
    # its place in the composition (lower first): terms are summed into the objective, and
    # transforms rewrite the gradient, in this order (COMPOSITION_ORDER)
    order: ClassVar[int]
    weight_field: ClassVar[str] = ""  # a term's RunConfig weight (an ensemble passes it per member)
    # a term that reads its sites at the readout position(s) only (`readout_rows`): a model that
    # records them itself may then run its last block there alone (trainers/step.py `model_capture`)
    readout_only: ClassVar[bool] = False

    def __init__(self, cfgs: Sequence["RunConfig"], model: "nn.Module", data: "TaskData",
                 params: dict[str, torch.Tensor] | None = None):
        self.cfgs = list(cfgs)
        self.cfg = self.cfgs[0]
        self.hook_names: list[str] = []

    @staticmethod
    def active(cfg: "RunConfig") -> bool:
        raise NotImplementedError

    # terms
    def term(self, acts: dict[str, torch.Tensor], batch: Batch, step: int, evaluating: bool = False,
             weight: float | torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(weighted value as it enters the loss at `step`, {metric: detached tensor}).
        `evaluating`: the metrics are wanted even where the term is switched off. `weight`: in
        place of the config's (a vmapped ensemble member's own, as a 0-d tensor)."""
        raise NotImplementedError

    def weight(self, weight):
        if weight is None:  # a run of one config (a single run, a routed copy)
            assert len(self.cfgs) == 1, "an ensemble passes each member's weight"
            return getattr(self.cfg, self.weight_field)
        return weight

    # gradient transforms, on stacked tensors [M, *shape]
    def transform(self, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
        """Rewrite `grads` (the tensors that have a gradient) in place."""
        raise NotImplementedError

    def metrics(self) -> list[dict[str, float]]:
        """Per member, what the last update reports."""
        return [{} for _ in self.cfgs]

    def keep(self, idx: torch.Tensor) -> None:
        """Continue with members idx only."""
        self.cfgs = [self.cfgs[i] for i in idx.tolist()]

    # exact resume
    def state(self, i: int) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, i: int, state: dict[str, np.ndarray]) -> None:
        pass


REGULARIZERS: Registry[type[Regularizer]] = Registry("regularizer")


def hidden_sites(model: "nn.Module") -> list[str]:
    """The per-layer hidden representations of a model: the residual stream after each block
    (transformer) or each hidden layer's output (MLP)."""
    names = list(model.hook_dict)
    sites = [n for n in names if fnmatch.fnmatchcase(n, "blocks.*.hook_resid_post")]
    return sites or [n for n in names if fnmatch.fnmatchcase(n, "layers.*.hook_post")]


def firing_sites(model: "nn.Module") -> dict[str, bool]:
    """The hook points a training forward pass runs, each with whether its activation is finite:
    one input through the model with a hook on each. TransformerLens' optional ones
    (attn.hook_result, hook_q_input, ...) run only when their flag is set, so a site among them
    would have no activation to read at the first step; a causal mask's -inf scores
    (attn.hook_attn_scores) have no finite norm."""
    fired: dict[str, bool] = {}
    param = next(model.parameters())
    meta = param.device.type == "meta"  # an ensemble's template has no values: whether it runs, only

    def seen(name, out):
        fired[name] = isinstance(out, torch.Tensor) and (meta or bool(torch.isfinite(out).all()))

    handles = [hp.register_forward_hook(lambda _m, _i, out, name=name: seen(name, out))
               for name, hp in model.hook_dict.items()]
    try:
        with torch.no_grad():
            model(torch.zeros(1, model.cfg.n_ctx, dtype=torch.long, device=param.device))
    finally:
        for h in handles:
            h.remove()
    return fired


def _resolve_sites(model: "nn.Module", spec: str, field: str) -> list[str]:
    patterns = [s.strip() for s in spec.split(",") if s.strip()]
    if not patterns:
        return hidden_sites(model)
    names = list(model.hook_dict)
    fired = firing_sites(model)
    out: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise BadInput(f"{field}: no hook point matches {pattern!r} (e.g. {', '.join(hidden_sites(model)[:2])})")
        live = [n for n in hits if fired.get(n)]  # a pattern ('*') keeps the sites that run, finite
        if not live:
            off = [n for n in hits if n not in fired]
            why = (f"{', '.join(off[:3])}: TransformerLens' optional hooks, which a training forward pass does not "
                   "run" if off else f"{', '.join(hits[:3])}: not finite (a causal mask's -inf scores)")
            raise BadInput(f"{field}: {pattern!r} matches no site the penalty can use ({why})")
        out += [n for n in live if n not in out]
    return out


def readout_rows(t: torch.Tensor, positions: list[int], dim: int = 1) -> torch.Tensor:
    """t at the readout positions along `dim`: t holds every position there, or the readout ones
    only (a model that records its sites itself computes the last block at those alone); the two
    are the same tensor when every position is a readout one (the readout is one contiguous slice)."""
    return t if t.shape[dim] == len(positions) else t.index_select(dim, torch.tensor(positions, device=t.device))


def _rows(h: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """[b, p, d] -> the readout positions' vectors [b * K, d]; [b, d] stays."""
    if h.dim() == 3:
        h = readout_rows(h, positions)
    return h.reshape(-1, h.shape[-1])


@REGULARIZERS.register("act_norm")
class ActivationNormPenalty(Regularizer):
    """lambda * mean_i (||h_i|| - sqrt(d))^2 / d over every vector h_i (all inputs, all positions)
    at the chosen hook sites (REFERENCES.md definition 6; default: each block's resid_post)."""

    name, kind, weight_field = "act_norm", "term", "act_norm_lambda"
    metric_keys = ("reg_act_norm", "act_norm_radius")
    order = 10

    def __init__(self, cfgs, model, data, params=None):
        super().__init__(cfgs, model, data)
        self.hook_names = _resolve_sites(model, self.cfg.act_norm_sites, "act_norm_sites")

    @staticmethod
    def active(cfg) -> bool:
        return cfg.act_norm_lambda > 0

    def term(self, acts, batch, step, evaluating=False, weight=None):
        dev, rad = [], []
        for name in self.hook_names:
            h = acts[name]
            d = h.shape[-1]
            norms = h.to(torch.float64).norm(dim=-1).flatten()
            dev.append((norms - math.sqrt(d)) ** 2 / d)
            rad.append(norms.detach() / math.sqrt(d))
        value = self.weight(weight) * torch.cat(dev).mean()
        return value, {"reg_act_norm": value.detach(), "act_norm_radius": torch.cat(rad).mean()}


def effective_rank(h: torch.Tensor, eps: float = 1e-30) -> torch.Tensor:
    """Roy & Vetterli's effective rank exp(-sum p_i log p_i), p_i = s_i / sum s, of the
    batch-centred matrix h [n, d], in float64, differentiable (torch.linalg.svdvals).
    Not from the Gram matrix's eigenvalues, though 0.6x the time at GeomDR's paper size: they
    resolve singular values only above ~sqrt(n eps) s_max (3e-7 at n=500), and on a collapsed h
    (float32 activations, rank k) the gradient along the smaller ones is most of svdvals' (tried
    2026-12-07: value 2e-6 apart, gradient 100%)."""
    h = h.to(torch.float64)
    s = torch.linalg.svdvals(h - h.mean(0, keepdim=True))
    p = s / s.sum().clamp_min(eps)
    return torch.exp(-(p * p.clamp_min(eps).log()).sum())


@REGULARIZERS.register("geomdr")
class GeomDR(Regularizer):
    """Our definition: lambda * ((erank(H) - target) / target)^2 while
    geomdr_start <= step < geomdr_end, where H [n, d] is the batch-centred hidden representation
    at the readout position(s) of one hook site (default: the last block's resid_post, or the
    MLP's last hidden layer) and erank is Roy & Vetterli's effective rank."""

    name, kind, weight_field = "geomdr", "term", "geomdr_lambda"
    metric_keys = ("reg_geomdr", "geomdr_erank")
    order = 20
    readout_only = True

    def __init__(self, cfgs, model, data, params=None):
        super().__init__(cfgs, model, data)
        cfg = self.cfg
        site = cfg.geomdr_site.strip() or hidden_sites(model)[-1]
        if site not in model.hook_dict:
            raise BadInput(f"geomdr_site: no hook point {site!r} (e.g. {hidden_sites(model)[-1]})")
        self.hook_names = [site]
        self.target = cfg.geomdr_target
        self.start, self.end = cfg.geomdr_start, cfg.geomdr_end or math.inf

    @staticmethod
    def active(cfg) -> bool:
        return cfg.geomdr_lambda > 0

    def on(self, step: int) -> bool:
        return self.start <= step < self.end

    def term(self, acts, batch, step, evaluating=False, weight=None):
        h = _rows(acts[self.hook_names[0]], batch.positions)
        if not self.on(step) and not evaluating:  # outside the window: no SVD in training
            zero = h.new_zeros((), dtype=torch.float64)
            return zero, {"reg_geomdr": zero, "geomdr_erank": zero * math.nan}
        erank = effective_rank(h)
        value = (self.weight(weight) * ((erank - self.target) / self.target) ** 2 if self.on(step)
                 else erank.new_zeros(()))
        return value, {"reg_geomdr": value.detach(), "geomdr_erank": erank.detach()}


@REGULARIZERS.register("kl_attn")
class KLAttention(Regularizer):
    """Our definition (REFERENCES.md 3): beta * KL(pi* || pattern[q]) at the readout query q, pi*
    uniform on the input's informative positions, averaged over inputs and heads (and layers with
    kl_attn_layer = -1). log pattern comes from log_softmax of hook_attn_scores, in float64."""

    name, kind, weight_field = "kl_attn", "term", "kl_attn_beta"
    metric_keys = ("reg_kl_attn", "kl_attn")
    order = 30
    readout_only = True

    def __init__(self, cfgs, model, data, params=None):
        super().__init__(cfgs, model, data)
        cfg = self.cfg
        if data.n_targets:
            raise BadInput("kl_attn_beta needs a single readout position")
        if cfg.causal and bool(data.informative_mask[:, data.readout_pos + 1 :].any()):
            raise BadInput("kl_attn_beta: informative positions after the readout query are masked (causal)")
        if not bool(data.informative_mask.any(dim=1).all()):
            raise BadInput("kl_attn_beta: some inputs have no informative position")
        layers = range(cfg.n_layers) if cfg.kl_attn_layer == -1 else [cfg.kl_attn_layer]
        self.hook_names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in layers]

    @staticmethod
    def active(cfg) -> bool:
        return cfg.kl_attn_beta > 0

    def term(self, acts, batch, step, evaluating=False, weight=None):
        mask = batch.mask.bool()  # [b, k]
        pi = mask.to(torch.float64) / mask.sum(-1, keepdim=True)  # uniform on the informative positions
        log_pi = torch.where(mask, pi.log(), 0.0)
        kls = []
        for name in self.hook_names:
            at_q = readout_rows(acts[name], batch.positions, dim=2)[:, :, 0]  # [b, h, q, k] -> [b, h, k]
            logp = torch.log_softmax(at_q.to(torch.float64), dim=-1)
            logp = torch.where(mask[:, None, :], logp, 0.0)
            kls.append((pi[:, None, :] * (log_pi[:, None, :] - logp)).sum(-1).mean())  # mean over b, h
        kl = torch.stack(kls).mean()
        value = self.weight(weight) * kl
        return value, {"reg_kl_attn": value.detach(), "kl_attn": kl.detach()}


def per_member(values: list[float], like: torch.Tensor) -> float | torch.Tensor:
    """A per-member constant: the Python number when all members share it (a single run's exact
    operation), else [M, 1, ...] to broadcast over the rows of `like`."""
    if len(set(values)) == 1:
        return float(values[0])
    return torch.tensor(values, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))


def row_sq(t: torch.Tensor) -> torch.Tensor:
    """[M, ...] -> [M]: each member's row's squared norm, in float64."""
    return (t.double() ** 2).flatten(1).sum(1)


def grokfast_lambdas(cfgs, kind: str) -> list[float]:
    """Each member's Grokfast lambda where its filter is `kind` (ema | ma), else 0 (its gradient is kept)."""
    return [c.grokfast_lambda if c.grokfast_filter == kind else 0.0 for c in cfgs]


@REGULARIZERS.register("grokfast")
class Grokfast(Regularizer):
    """Lee et al. 2024, Grokfast-EMA, as their `gradfilter_ema`: per parameter,
    ema_t = alpha ema_{t-1} + (1 - alpha) g_t (ema_1 = g_1), then g_t <- g_t + lambda ema_t;
    alpha and lambda per member (lambda 0, or the MA filter: the member's gradient is kept)."""

    name, kind = "grokfast", "grad"
    metric_keys = ("grokfast_ema_norm",)
    order = 40

    def __init__(self, cfgs, model, data, params=None):
        super().__init__(cfgs, model, data)
        self.ema = {n: torch.zeros_like(p) for n, p in params.items()}
        self.initialized = False

    @staticmethod
    def active(cfg) -> bool:
        return cfg.grokfast_lambda > 0 and cfg.grokfast_filter == "ema"

    @torch.no_grad()
    def transform(self, params, grads):
        alphas, lams = [c.grokfast_alpha for c in self.cfgs], grokfast_lambdas(self.cfgs, "ema")
        for n, g in grads.items():
            ema = self.ema[n]
            alpha, lam = per_member(alphas, g), per_member(lams, g)
            if not self.initialized:
                ema.copy_(g)
            elif isinstance(alpha, float):
                ema.mul_(alpha).add_(g, alpha=1 - alpha)
            else:
                ema.mul_(alpha).add_(g * (1 - alpha))
            if isinstance(lam, float):
                g.add_(ema, alpha=lam)
            else:
                g.add_(ema * lam)
        self.initialized = True

    def metrics(self):
        if not self.initialized:
            return [{"grokfast_ema_norm": math.nan} for _ in self.cfgs]
        norms = torch.sqrt(sum(row_sq(e) for e in self.ema.values())).cpu().numpy()
        return [{"grokfast_ema_norm": float(x)} for x in norms]

    def keep(self, idx):
        super().keep(idx)
        self.ema = {n: e.index_select(0, idx) for n, e in self.ema.items()}

    def state(self, i):
        if not self.active(self.cfgs[i]):  # an ensemble member without Grokfast
            return {}
        out = {f"reg.grokfast.{n}.ema": e[i].detach().cpu().numpy() for n, e in self.ema.items()}
        out["reg.grokfast.initialized"] = np.array(float(self.initialized))
        return out

    def load_state(self, i, state):
        if "reg.grokfast.initialized" not in state:  # a member without Grokfast: its lambda is 0
            return
        for n, e in self.ema.items():
            e[i].copy_(torch.from_numpy(np.array(state[f"reg.grokfast.{n}.ema"])))
        self.initialized = bool(np.array(state["reg.grokfast.initialized"]))



@REGULARIZERS.register("grokfast_ma")
class GrokfastMA(Regularizer):
    """Lee et al. 2024, Grokfast-MA, as their `gradfilter_ma` (filter_type mean, warmup on): per
    parameter the last `grokfast_window` raw gradients are kept, and once the window is full
    g_t <- g_t + lambda (g_{t-w+1} + ... + g_t) / w, summed oldest first as their `sum(deque)`;
    before that the gradient is kept. lambda per member; the window is shared."""

    name, kind = "grokfast_ma", "grad"
    metric_keys = ("grokfast_ma_norm",)
    order = 50

    def __init__(self, cfgs, model, data, params=None):
        super().__init__(cfgs, model, data)
        self.size = self.cfg.grokfast_window
        self.window: dict[str, deque[torch.Tensor]] = {n: deque(maxlen=self.size) for n in params}  # oldest first
        self.params = params  # the stacked parameters: the window's shapes, dtype and device
        self.last_mean: dict[str, torch.Tensor] = {}  # the last update's window means (its metric, read lazily)

    @staticmethod
    def active(cfg) -> bool:
        return cfg.grokfast_lambda > 0 and cfg.grokfast_filter == "ma"

    @torch.no_grad()
    def transform(self, params, grads):
        lams = grokfast_lambdas(self.cfgs, "ma")
        for n, g in grads.items():
            kept = self.window[n]
            kept.append(g.clone())  # the raw gradient, before the filter adds to it
            if len(kept) < self.size:
                continue
            total = kept[0]
            for h in itertools.islice(kept, 1, None):
                total = total + h
            avg = self.last_mean[n] = total / len(kept)
            g.add_(avg * per_member(lams, g))  # avg * lamb, then the sum: their two roundings

    def metrics(self):
        if not self.last_mean:
            return [{"grokfast_ma_norm": math.nan} for _ in self.cfgs]
        norms = torch.sqrt(sum(row_sq(a) for a in self.last_mean.values())).cpu().numpy()
        return [{"grokfast_ma_norm": float(x)} for x in norms]

    def keep(self, idx):
        super().keep(idx)
        self.window = {n: deque((g.index_select(0, idx) for g in kept), maxlen=self.size)
                       for n, kept in self.window.items()}
        self.last_mean = {n: a.index_select(0, idx) for n, a in self.last_mean.items()}

    def state(self, i):
        # a fixed shape for the file's state slots: [window, *shape], oldest first, zeros past `count`
        if not self.active(self.cfgs[i]):
            return {}
        out = {}
        for n, kept in self.window.items():
            arr = np.zeros((self.size, *self.params[n].shape[1:]), dtype=np.float32)
            for k, g in enumerate(kept):
                arr[k] = g[i].detach().cpu().numpy()
            out[f"reg.grokfast_ma.{n}.window"] = arr
        out["reg.grokfast_ma.count"] = np.array(float(len(next(iter(self.window.values()), []))))
        return out

    def load_state(self, i, state):
        if "reg.grokfast_ma.count" not in state:  # a member without Grokfast-MA
            return
        count = int(np.array(state["reg.grokfast_ma.count"]))
        for n in self.window:
            arr = torch.from_numpy(np.array(state[f"reg.grokfast_ma.{n}.window"]))
            if len(self.window[n]) != count:  # first member loaded: make the window's stacked rows
                self.window[n] = deque((torch.zeros_like(self.params[n]) for _ in range(count)), maxlen=self.size)
            for k in range(count):
                self.window[n][k][i].copy_(arr[k].to(self.params[n].device))


def perpendicular(w: torch.Tensor, g: torch.Tensor, rescale: bool = False):
    """Per member (row of the stacked [M, ...] tensors): the gradient g without its component
    along the weights w, and that component's squared norm [M] (float64). Unscaled:
    g - (w.g / w.w) w (a row with w = 0 keeps its gradient). rescale (Prieto et al.'s OrthoGrad
    as published): proj = w.g / (w.w + 1e-30), g_perp = g - proj w, then
    g_perp * ||g|| / (||g_perp|| + 1e-30)."""
    def total(t: torch.Tensor) -> torch.Tensor:
        return t.flatten(1).sum(1).view(-1, *([1] * (t.dim() - 1)))

    if rescale:
        coef = total(w * g) / (total(w * w) + 1e-30)
        perp = g - coef * w
        out = perp * (total(g * g).sqrt() / (total(perp * perp).sqrt() + 1e-30))
    else:
        coef = total(w * g) / total(w * w).clamp_min(torch.finfo(w.dtype).tiny)
        out = g - coef * w
    removed = coef.double() ** 2 * total(w.double() ** 2)
    return out, removed.flatten()


@REGULARIZERS.register("perp_grad")
class PerpendicularGradient(Regularizer):
    """Prieto et al. 2025, perpendicular gradient, per tensor (`perpendicular`), on the members
    whose perp_grad is on: with perp_grad_scale=orthograd (default) their OrthoGrad as
    published, the projection g - (w.g / w.w) w rescaled to ||g||; with unscaled the projection
    alone. Either way the update has no component along the weights."""

    name, kind = "perp_grad", "grad"
    metric_keys = ("perp_grad_removed",)
    order = 90  # last: the final gradient is orthogonal to the weights

    def __init__(self, cfgs, model, data, params=None):
        super().__init__(cfgs, model, data)
        self.rescale = self.cfg.perp_grad_scale == "orthograd"
        self.removed: torch.Tensor | None = None

    @staticmethod
    def active(cfg) -> bool:
        return bool(cfg.perp_grad)

    @torch.no_grad()
    def transform(self, params, grads):
        on = [bool(c.perp_grad) for c in self.cfgs]
        mask = None if all(on) else torch.tensor(on, device=next(iter(grads.values())).device)
        removed, total = [], []
        for n, g in grads.items():
            new, removed_sq = perpendicular(params[n].detach(), g, rescale=self.rescale)
            total.append(row_sq(g))
            removed.append(removed_sq)
            g.copy_(new if mask is None else torch.where(mask.view(-1, *([1] * (g.dim() - 1))), new, g))
        # the fraction of the gradient's norm that pointed along the weights (no host sync here)
        self.removed = torch.sqrt(torch.stack(removed).sum(0) / torch.stack(total).sum(0).clamp_min(1e-300))

    def metrics(self):
        values = [math.nan] * len(self.cfgs) if self.removed is None else self.removed.cpu().numpy()
        return [{"perp_grad_removed": float(x)} for x in values]

    def keep(self, idx):
        super().keep(idx)
        self.removed = None if self.removed is None else self.removed.index_select(0, idx)


def composition_order() -> tuple[str, ...]:
    """The regularizers' names in the order the trainer composes them (each one's `order`)."""
    return tuple(sorted(REGULARIZERS.names(), key=lambda name: REGULARIZERS.get(name).order))


COMPOSITION_ORDER = composition_order()


def active_regularizers(cfgs: Sequence["RunConfig"]) -> list[type[Regularizer]]:
    """The regularizers active in any of `cfgs`, in composition order."""
    return [REGULARIZERS.get(name) for name in composition_order()
            if any(REGULARIZERS.get(name).active(c) for c in cfgs)]


def regularizer_metric_names(cfg: "RunConfig") -> list[str]:
    """The metric names the active regularizers log, known from the config alone."""
    return [key for cls in active_regularizers([cfg]) for key in cls.metric_keys]


def build_regularizers(cfgs: Sequence["RunConfig"], model: "nn.Module", data: "TaskData",
                       params: dict[str, torch.Tensor]) -> list[Regularizer]:
    """The regularizers of members `cfgs` trained together (params: their stacked parameters)."""
    return [cls(cfgs, model, data, params) for cls in active_regularizers(cfgs)]


__all__ = [
    "COMPOSITION_ORDER", "REGULARIZERS", "Batch", "Regularizer", "build_regularizers", "regularizer_metric_names",
    "effective_rank", "hidden_sites", "perpendicular",
]
