"""What the TransformerLens conformance snippets share: a tiny trained-looking model of every
variant, its float64 reference pass, and the comparisons (tests/models/test_tl_conformance.py)."""

from __future__ import annotations

from functools import cached_property, lru_cache

import torch

from groklens.tasks import TASKS
from groklens.models import build_model
from tests.helpers import tiny_config
from tests.models.tl_reference import Reference

try:
    from groklens.models.tl_errors import TLUnsupported
except ImportError:  # before issue 16: nothing refuses
    class TLUnsupported(ValueError):  # type: ignore[no-redef]
        pass

ATOL = 1e-4  # float32 sums of a few dozen terms of size ~1

VARIANTS = {
    "none": dict(norm="none"),
    "ln": dict(norm="ln", mlp_bias=True),
    "ln_post": dict(norm="ln", norm_placement="post", mlp_bias=True),
    "rms": dict(norm="rms"),
    "rms_post": dict(norm="rms", norm_placement="post"),
    "sphere": dict(norm="sphere", unembed="bounded", causal=False, mlp_bias=True, init_scheme="torch"),
    "uniform": dict(norm="ln", attention="uniform"),
    "mlp": dict(model="mlp", mlp_bias=True),
}
NON_ADDITIVE = {"ln_post", "rms_post", "sphere"}  # a norm after every residual sum
TRANSFORMERS = [v for v in VARIANTS if v != "mlp"]
PRE_NORM = {"ln", "rms", "uniform"}  # a norm before every reader, ln_final before the unembedding
NORMED = PRE_NORM | NON_ADDITIVE


class Ctx:
    def __init__(self, variant: str):
        self.variant = variant
        self.cfg = tiny_config(n_layers=2, **VARIANTS[variant])
        self.data = TASKS.get(self.cfg.task).build(self.cfg)
        self.model = build_model(self.cfg, self.data).eval()
        with torch.no_grad():  # trained-looking norms: not all ones and zeros
            for name, p in self.model.named_parameters():
                if name.endswith((".w", ".b")):
                    p.add_(0.3 * torch.randn_like(p))
        self.tokens = self.data.inputs[:6]
        self.labels = self.data.labels[:6]
        self.p = self.cfg.p
        self.wrong = (self.labels + 1) % self.p
        self.L = self.cfg.n_layers

    @cached_property
    def ref(self) -> Reference:
        return Reference(self.model, self.tokens)

    def reference(self, tokens: torch.Tensor | None = None, patch: dict | None = None) -> Reference:
        return Reference(self.model, self.tokens if tokens is None else tokens, patch)

    def run(self, tokens: torch.Tensor | None = None, **kw):
        return self.model.run_with_cache(self.tokens if tokens is None else tokens, **kw)

    def logit_diff(self) -> torch.Tensor:
        """[b]: the reference's logit of each label minus that of the wrong class, last position."""
        last = self.ref.logits[:, -1]
        return last.gather(1, self.labels[:, None])[:, 0] - last.gather(1, self.wrong[:, None])[:, 0]


@lru_cache(maxsize=None)
def ctx(variant: str) -> Ctx:
    torch.manual_seed(0)
    return Ctx(variant)


def close(a, b, atol: float = ATOL) -> None:
    a, b = torch.as_tensor(a).detach().double(), torch.as_tensor(b).detach().double()
    assert a.shape == b.shape, (tuple(a.shape), tuple(b.shape))
    assert torch.allclose(a, b, atol=atol, rtol=1e-4), float((a - b).abs().max())


def heads_of(c: Ctx, ref: Reference, layers: range, target: tuple, pos=None, view: bool = False) -> torch.Tensor:
    """[layers * h, b, (p,) d]: each head's result carried to `target` (reader_view: also TL's
    reader norm), positions `pos`, in stack_head_results' order."""
    rows = []
    for l in layers:
        res = ref.acts[f"blocks.{l}.attn.hook_result"]
        for h in range(c.cfg.n_heads):
            x = res[:, :, h] if pos is None else res[:, pos, h]
            rows.append(ref.reader_view(x, ("attn", l), target, pos) if view else ref.carry(x,
                                                                                            ("attn", l), target, pos))
    return torch.stack(rows)


def neurons_of(c: Ctx, ref: Reference, layers: range, target: tuple, pos=None, view: bool = False,
               neurons=None) -> torch.Tensor:
    """[layers * m, b, (p,) d]: each neuron's output (without b_out) carried to `target`."""
    rows = []
    for l in layers:
        post, W = ref.acts[f"blocks.{l}.mlp.hook_post"], ref.sd[f"blocks.{l}.mlp.W_out"]
        for n in range(c.cfg.d_mlp) if neurons is None else neurons:
            a = post[..., n] if pos is None else post[:, pos, n]
            x = a[..., None] * W[n]
            rows.append(ref.reader_view(x, ("mlp", l), target, pos) if view else ref.carry(x, ("mlp", l), target, pos))
    return torch.stack(rows)
