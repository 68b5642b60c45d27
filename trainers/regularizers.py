"""Regularizers and gradient transforms that the trainer composes with the task loss
(trainers/losses.py; docs/VARIANTS.md).

A regularizer is either
- a *term* added to the task loss: it names the hook points it reads, and the trainer runs the
  forward pass with capture hooks on them (inside `model.hooks(...)`, so nothing stays behind),
  then asks the term for its value on that batch; or
- a *gradient transform*: it rewrites `p.grad` in place between backward and the AdamW step.
Terms are composed in registry order (act_norm, geomdr, kl_attn) and so are transforms
(grokfast, then perp_grad: the final gradient is orthogonal to the weights). Weight decay is
AdamW's own, set by `weight_decay`, and nowhere else.

Each regularizer names its metrics from the config alone (the trajectory file creates every
metric dataset before SWMR starts), and the trainer logs them at every evaluation: a term is
evaluated on the training inputs at that step (`reg_<name>` = the weighted term as it enters the
objective, plus its raw quantity); a transform reports on its last update.
State that an exact resume needs (the Grokfast EMA) travels in `state()` / `load_state()`.
"""

from __future__ import annotations

import fnmatch
import math
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
    """Base class. Subclasses set name, kind ('term' | 'grad') and metric_keys."""

    name: ClassVar[str]
    kind: ClassVar[str]
    metric_keys: ClassVar[tuple[str, ...]]
    weight_field: ClassVar[str] = ""  # a term's RunConfig weight (an ensemble passes it per member)

    def __init__(self, cfg: "RunConfig", model: "nn.Module", data: "TaskData"):
        self.cfg = cfg
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
        return getattr(self.cfg, self.weight_field) if weight is None else weight

    # gradient transforms
    def transform(self, params: dict[str, torch.nn.Parameter]) -> None:
        raise NotImplementedError

    def last_metrics(self) -> dict[str, float]:
        return {}

    # exact resume
    def state(self) -> dict[str, np.ndarray]:
        return {}

    def load_state(self, state: dict[str, np.ndarray], device: torch.device) -> None:
        pass


REGULARIZERS: Registry[type[Regularizer]] = Registry("regularizer")


def hidden_sites(model: "nn.Module") -> list[str]:
    """The per-layer hidden representations of a model: the residual stream after each block
    (transformer) or each hidden layer's output (MLP)."""
    names = list(model.hook_dict)
    sites = [n for n in names if fnmatch.fnmatchcase(n, "blocks.*.hook_resid_post")]
    return sites or [n for n in names if fnmatch.fnmatchcase(n, "layers.*.hook_post")]


def _resolve_sites(model: "nn.Module", spec: str, field: str) -> list[str]:
    patterns = [s.strip() for s in spec.split(",") if s.strip()]
    if not patterns:
        return hidden_sites(model)
    names = list(model.hook_dict)
    out: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            raise BadInput(f"{field}: no hook point matches {pattern!r} (e.g. {', '.join(hidden_sites(model)[:2])})")
        out += [n for n in hits if n not in out]
    return out


def _rows(h: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """[b, p, d] -> the readout positions' vectors [b * K, d]; [b, d] stays."""
    if h.dim() == 3:
        h = h[:, positions]
    return h.reshape(-1, h.shape[-1])


@REGULARIZERS.register("act_norm")
class ActivationNormPenalty(Regularizer):
    """lambda * mean_i (||h_i|| - sqrt(d))^2 / d over every vector h_i (all inputs, all positions)
    at the chosen hook sites (REFERENCES.md definition 6; default: each block's resid_post)."""

    name, kind, weight_field = "act_norm", "term", "act_norm_lambda"
    metric_keys = ("reg_act_norm", "act_norm_radius")

    def __init__(self, cfg, model, data):
        super().__init__(cfg, model, data)
        self.hook_names = _resolve_sites(model, cfg.act_norm_sites, "act_norm_sites")

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
    batch-centred matrix h [n, d], in float64, differentiable (torch.linalg.svdvals)."""
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

    def __init__(self, cfg, model, data):
        super().__init__(cfg, model, data)
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

    def __init__(self, cfg, model, data):
        super().__init__(cfg, model, data)
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
        q = batch.positions[0]
        mask = batch.mask.bool()  # [b, k]
        pi = mask.to(torch.float64) / mask.sum(-1, keepdim=True)  # uniform on the informative positions
        log_pi = torch.where(mask, pi.log(), 0.0)
        kls = []
        for name in self.hook_names:
            logp = torch.log_softmax(acts[name][:, :, q, :].to(torch.float64), dim=-1)  # [b, h, k]
            logp = torch.where(mask[:, None, :], logp, 0.0)
            kls.append((pi[:, None, :] * (log_pi[:, None, :] - logp)).sum(-1).mean())  # mean over b, h
        kl = torch.stack(kls).mean()
        value = self.weight(weight) * kl
        return value, {"reg_kl_attn": value.detach(), "kl_attn": kl.detach()}


@REGULARIZERS.register("grokfast")
class Grokfast(Regularizer):
    """Lee et al. 2024, Grokfast-EMA, as their `gradfilter_ema`: per parameter,
    ema_t = alpha ema_{t-1} + (1 - alpha) g_t (ema_1 = g_1), then g_t <- g_t + lambda ema_t."""

    name, kind = "grokfast", "grad"
    metric_keys = ("grokfast_ema_norm",)

    def __init__(self, cfg, model, data):
        super().__init__(cfg, model, data)
        self.alpha, self.lam = cfg.grokfast_alpha, cfg.grokfast_lambda
        self.ema = {n: torch.zeros_like(p, memory_format=torch.preserve_format) for n, p in model.named_parameters()}
        self.initialized = False

    @staticmethod
    def active(cfg) -> bool:
        return cfg.grokfast_lambda > 0

    @torch.no_grad()
    def transform(self, params):
        for n, p in params.items():
            if p.grad is None:
                continue
            if self.initialized:
                self.ema[n].mul_(self.alpha).add_(p.grad, alpha=1 - self.alpha)
            else:
                self.ema[n].copy_(p.grad)
            p.grad.add_(self.ema[n], alpha=self.lam)
        self.initialized = True

    def last_metrics(self):
        norm = torch.sqrt(sum((e.double() ** 2).sum() for e in self.ema.values()))
        return {"grokfast_ema_norm": float(norm) if self.initialized else math.nan}

    def state(self):
        out = {f"reg.grokfast.{n}.ema": e.detach().cpu().numpy() for n, e in self.ema.items()}
        out["reg.grokfast.initialized"] = np.array(float(self.initialized))
        return out

    def load_state(self, state, device):
        for n, e in self.ema.items():
            e.copy_(torch.from_numpy(np.array(state[f"reg.grokfast.{n}.ema"])).to(device))
        self.initialized = bool(np.array(state["reg.grokfast.initialized"]))


def perpendicular(w: torch.Tensor, g: torch.Tensor, rows: bool = False, rescale: bool = False):
    """The gradient g without its component along the weights w, and that component's squared
    norm (float64): over the whole tensor, or with `rows` over each member's row of stacked
    [M, ...] tensors. Unscaled: g - (w.g / w.w) w (a tensor with w = 0 keeps its gradient).
    rescale (Prieto et al.'s OrthoGrad as published): proj = w.g / (w.w + 1e-30),
    g_perp = g - proj w, then g_perp * ||g|| / (||g_perp|| + 1e-30)."""
    def total(t: torch.Tensor) -> torch.Tensor:
        return t.flatten(1).sum(1).view(-1, *([1] * (t.dim() - 1))) if rows else t.sum()

    if rescale:
        coef = total(w * g) / (total(w * w) + 1e-30)
        perp = g - coef * w
        out = perp * (total(g * g).sqrt() / (total(perp * perp).sqrt() + 1e-30))
    else:
        coef = total(w * g) / total(w * w).clamp_min(torch.finfo(w.dtype).tiny)
        out = g - coef * w
    removed = coef.double() ** 2 * total(w.double() ** 2)
    return out, removed.flatten() if rows else removed


@REGULARIZERS.register("perp_grad")
class PerpendicularGradient(Regularizer):
    """Prieto et al. 2025, perpendicular gradient, per tensor (`perpendicular`): with
    perp_grad_scale=orthograd (default) their OrthoGrad as published, the projection
    g - (w.g / w.w) w rescaled to ||g||; with unscaled the projection alone. Either way the
    update has no component along the weights."""

    name, kind = "perp_grad", "grad"
    metric_keys = ("perp_grad_removed",)

    def __init__(self, cfg, model, data):
        super().__init__(cfg, model, data)
        self.rescale = cfg.perp_grad_scale == "orthograd"
        self._removed: torch.Tensor | None = None

    @staticmethod
    def active(cfg) -> bool:
        return bool(cfg.perp_grad)

    @torch.no_grad()
    def transform(self, params):
        removed, total = [], []
        for p in params.values():
            g = p.grad
            if g is None:
                continue
            new, removed_sq = perpendicular(p.detach(), g, rescale=self.rescale)
            total.append((g.double() ** 2).sum())
            removed.append(removed_sq)
            g.copy_(new)
        # the fraction of the gradient's norm that pointed along the weights (no host sync here)
        self._removed = torch.sqrt(torch.stack(removed).sum() / torch.stack(total).sum().clamp_min(1e-300))

    def last_metrics(self):
        return {"perp_grad_removed": float(self._removed) if self._removed is not None else math.nan}


# the order in which the trainer composes them: terms, then transforms (perp_grad last)
COMPOSITION_ORDER = ("act_norm", "geomdr", "kl_attn", "grokfast", "perp_grad")
assert set(COMPOSITION_ORDER) == set(REGULARIZERS.names())


def active_regularizers(cfg: "RunConfig") -> list[type[Regularizer]]:
    return [REGULARIZERS.get(name) for name in COMPOSITION_ORDER if REGULARIZERS.get(name).active(cfg)]


def regularizer_metric_names(cfg: "RunConfig") -> list[str]:
    """The metric names the active regularizers log, known from the config alone."""
    return [key for cls in active_regularizers(cfg) for key in cls.metric_keys]


def build_regularizers(cfg: "RunConfig", model: "nn.Module", data: "TaskData") -> list[Regularizer]:
    return [cls(cfg, model, data) for cls in active_regularizers(cfg)]


__all__ = [
    "REGULARIZERS", "Batch", "Regularizer", "build_regularizers", "regularizer_metric_names", "effective_rank",
    "hidden_sites",
]
