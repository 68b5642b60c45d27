"""Model registry: a model name (RunConfig.model) -> a builder of a HookedRootModule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from groklens.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from groklens.config import RunConfig
    from groklens.trainers.tasks import TaskData

MODELS: Registry[Callable[["RunConfig", "TaskData"], "nn.Module"]] = Registry("model")


@MODELS.register("transformer")
def _build_transformer(cfg: "RunConfig", data: "TaskData"):
    from groklens.trainers.models.hooked import ModelConfig
    from groklens.trainers.models.transformer import Transformer

    return Transformer(
        ModelConfig(
            d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, n_layers=cfg.n_layers,
            d_mlp=cfg.d_mlp, d_vocab=data.d_vocab, d_vocab_out=data.d_vocab_out, n_ctx=data.n_ctx,
            act_fn=cfg.act_fn, norm=cfg.norm, attention=cfg.attention, unembed=cfg.unembed,
            init=cfg.init, causal=cfg.causal, mlp_bias=cfg.mlp_bias,
        )
    )


def build_model(cfg: "RunConfig", data: "TaskData", seed: int | None = None) -> "nn.Module":
    """Build the configured model, initialised from `seed` (default cfg.seed)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed if seed is None else seed)
        return MODELS.get(cfg.model)(cfg, data)
