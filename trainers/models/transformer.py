"""The one transformer of groklens, in TransformerLens vocabulary.

Variants are switches of this class, never copies: `norm` (none | ln | rms), `attention`
(softmax), `unembed` (linear), `causal`. Pre-norm residual blocks as in TransformerLens:
    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))
    logits     = unembed(ln_final(resid_post))
Shapes: b batch, p position, d d_model, h head, e d_head, m d_mlp, v vocab.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from groklens.trainers.models.hooked import HookedModel, ModelConfig


class Embed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, p] -> [b, p, d]
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, p] -> [b, p, d]
        # expanded to the batch: ActivationCache.decompose_resid needs a batch dimension
        return self.W_pos[: tokens.shape[1]].expand(tokens.shape[0], -1, -1)


class Norm(nn.Module):
    """LayerNorm or RMSNorm with a learned scale (and bias for LN), TransformerLens hooks."""

    def __init__(self, cfg: ModelConfig, kind: str, eps: float = 1e-5):
        super().__init__()
        self.kind, self.eps = kind, eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        if kind == "ln":
            self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = HookPoint()  # [b, p, 1]
        self.hook_normalized = HookPoint()  # [b, p, d]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "ln":
            x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        x = self.hook_normalized(x / scale)
        return x * self.w + self.b if self.kind == "ln" else x * self.w


def make_norm(cfg: ModelConfig) -> nn.Module:
    return Norm(cfg, cfg.norm) if cfg.norm in ("ln", "rms") else nn.Identity()


class Attention(nn.Module):
    """Multi-head attention without biases (the sphere paper; Nanda's biases were frozen at 0)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h, d, e = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(h, d, e))
        self.W_K = nn.Parameter(torch.empty(h, d, e))
        self.W_V = nn.Parameter(torch.empty(h, d, e))
        self.W_O = nn.Parameter(torch.empty(h, e, d))
        self.hook_q = HookPoint()  # [b, p, h, e]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        self.hook_attn_scores = HookPoint()  # [b, h, q, k]
        self.hook_pattern = HookPoint()  # [b, h, q, k]
        self.hook_z = HookPoint()  # [b, p, h, e]
        n = cfg.n_ctx
        self.register_buffer("causal_mask", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.hook_q(torch.einsum("bpd,hde->bphe", x, self.W_Q))
        k = self.hook_k(torch.einsum("bpd,hde->bphe", x, self.W_K))
        v = self.hook_v(torch.einsum("bpd,hde->bphe", x, self.W_V))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(self.cfg.d_head)
        if self.cfg.causal:
            n = x.shape[1]
            scores = scores.masked_fill(~self.causal_mask[:n, :n], float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        return torch.einsum("bqhe,hed->bqd", z, self.W_O)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.act = {"relu": F.relu, "gelu": F.gelu}[cfg.act_fn]
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        if cfg.mlp_bias:
            self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
            self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        else:
            self.b_in = self.b_out = None
        self.hook_pre = HookPoint()  # [b, p, m]
        self.hook_post = HookPoint()  # [b, p, m]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = x @ self.W_in
        if self.b_in is not None:
            pre = pre + self.b_in
        out = self.hook_post(self.act(self.hook_pre(pre))) @ self.W_out
        return out + self.b_out if self.b_out is not None else out


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.ln2 = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # [b, p, d]
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x))))
        x = self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))
        return x


class Unembed(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, p, d] -> [b, p, v]
        return x @ self.W_U


class Transformer(HookedModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.hook_embed = HookPoint()  # [b, p, d]
        self.hook_pos_embed = HookPoint()  # [b, p, d]
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = make_norm(cfg)
        self.unembed = Unembed(cfg)
        self.init_weights()
        self.setup()  # registers every HookPoint under its module path

    @torch.no_grad()
    def init_weights(self) -> None:
        """TransformerLens's default init: every W_ ~ N(0, 0.8 / sqrt(d_model)); biases 0."""
        for name, param in self.named_parameters():
            if name.split(".")[-1].startswith("W_"):
                nn.init.normal_(param, std=self.cfg.initializer_range)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, p] -> logits [b, p, v]
        x = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(tokens))
        for block in self.blocks:
            x = block(x)
        return self.unembed(self.ln_final(x))
