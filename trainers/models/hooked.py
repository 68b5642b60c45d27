"""What every groklens model shares: TransformerLens's HookedRootModule, and a `cfg` in
TransformerLens vocabulary so ActivationCache's helpers work on our models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformer_lens import ActivationCache, HookedRootModule


@dataclass
class ModelConfig:
    """Dimensions and switches of a built model (TransformerLens field names)."""

    d_model: int
    n_heads: int
    d_head: int
    n_layers: int
    d_mlp: int
    d_vocab: int
    d_vocab_out: int
    n_ctx: int
    act_fn: str = "relu"
    norm: str = "none"
    norm_placement: str = "pre"  # ln/rms: pre (TransformerLens) | post (after every residual sum)
    attention: str = "softmax"
    unembed: str = "linear"
    init: str = "default"
    init_scheme: str = "tl"  # tl: N(0, initializer_range) | torch: PyTorch's module defaults
    causal: bool = True
    mlp_bias: bool = False
    attn_only: bool = False
    positional_embedding_type: str = "standard"
    device: str = "cpu"

    @property
    def normalization_type(self) -> str | None:
        # the name ActivationCache reads (apply_ln_to_stack, decompose_resid, ...)
        return {"none": None, "ln": "LN", "rms": "RMS"}.get(self.norm, self.norm.upper())

    @property
    def initializer_range(self) -> float:
        # TransformerLens's default: the init of Nanda's grokking demo
        return 0.8 / self.d_model**0.5


class HookedModel(HookedRootModule):
    """Base class: call `self.setup()` at the end of `__init__` so hook names are registered."""

    cfg: ModelConfig

    def run_with_cache(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        # TransformerLens 4.x returns a plain dict from HookedRootModule.run_with_cache
        out, cache = super().run_with_cache(*args, **kwargs)
        if not isinstance(cache, ActivationCache):
            cache = ActivationCache(cache, self)
        return out, cache
