"""The one transformer of groklens, in TransformerLens vocabulary.

Variants are switches of this class, never copies (docs/VARIANTS.md): `norm` (none | ln | rms |
sphere), `attention` (softmax | uniform), `unembed` (linear | bounded), `init` (default |
fourier), `causal`, `readout_keys` (the attention-mask transfer). Pre-norm residual blocks as in TransformerLens:
    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))
    logits     = unembed(ln_final(resid_post))
With norm=sphere the norms move after the sums instead (Yildirim 2026), N(x) = r x / ||x||:
    resid_pre(0) = N(embed + pos_embed)              ln_embed
    resid_mid    = N(resid_pre + attn(resid_pre))    blocks.{l}.ln1
    resid_post   = N(resid_mid + mlp(resid_mid))     blocks.{l}.ln2
so every residual-stream hook lies on the sphere of radius r.
With norm_placement=post (norm ln | rms) a LayerNorm/RMSNorm N takes those places, as in the
sphere paper's baselines (LayerNorm eps 1e-5, RMSNorm eps 1e-8). Norms after the sums have no
ln_final, and on every variant the norms carry the same names (ln_embed, ln1, ln2, ln_final), so
hook names do not change with the variant.
With norm_placement=in_stream (Grokfast's code) the pre-norm's output replaces the stream:
    resid_mid  = ln1(resid_pre) + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))
    logits     = unembed(ln_final(resid_post))
Shapes: b batch, p position, d d_model, h head, e d_head, m d_mlp, v vocab.
The HookedTransformer-style surface (stacked W_Q ... W_U, QK/OV, return_type, ...) and the fast
paths taken when no hook is attached are described in docs/TRANSFORMERLENS.md; the attention's fast
paths are in fast_paths.py, so that this file reads as the hooked reference.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from groklens.models.fast_paths import AttentionFastPaths
from groklens.models.hooked import HookedModel, ModelConfig
from groklens.models.tl_errors import TLUnsupported, TLUnsupportedAttribute
from groklens.models.tl_weights import TransformerLensWeights


@dataclass
class TransformerConfig(ModelConfig):
    """ModelConfig plus the parameters of the variants."""

    radius: float = 1.0  # norm=sphere
    tau: float = 10.0  # unembed=bounded
    fourier_freqs: tuple[int, ...] = ()  # init=fourier: frequencies k_1..k_K
    fourier_p: int = 0  # init=fourier: tokens 0..fourier_p-1 are the residues mod fourier_p
    attention_rate: float = 1.0  # attention=softmax: rate * softmax + (1 - rate) * uniform (Attention)
    readout_keys: tuple[int, ...] = ()  # attn_mask: the keys the last query may attend to (() = all)


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

    def lean(self, x: torch.Tensor) -> torch.Tensor:
        """The same norm by torch's fused kernel (no hook inside; equal to rounding). The scale and
        bias stay apart: under torch.func.vmap (the ensemble) the fused kernel's weight gradient
        rounds differently from the single run's, the separate product and sum do not."""
        if self.kind == "ln":
            return F.layer_norm(x, x.shape[-1:], None, None, self.eps) * self.w + self.b
        return F.rms_norm(x, x.shape[-1:], None, self.eps) * self.w


def norm_of(module: nn.Module, x: torch.Tensor, lean: bool) -> torch.Tensor:
    """module(x), or its fused `lean` form on the lean path (LayerNorm, RMSNorm)."""
    return module.lean(x) if lean and isinstance(module, (Norm, SphereNorm)) else module(x)


class SphereNorm(nn.Module):
    """Projection onto the sphere of radius r: N(x) = r x / ||x|| (no parameters)."""

    def __init__(self, radius: float, eps: float = 1e-12):
        super().__init__()
        self.radius, self.eps = radius, eps
        self.hook_scale = HookPoint()  # [b, p, 1]: ||x|| / r before the projection
        self.hook_normalized = HookPoint()  # [b, p, d]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.hook_scale(x.norm(dim=-1, keepdim=True).clamp_min(self.eps) / self.radius)
        return self.hook_normalized(x / scale)

    def lean(self, x: torch.Tensor) -> torch.Tensor:
        """The same projection without a division or masked norm backward over the whole stream:
        x * (r / max(||x||, eps)) from the squared norm (equal to rounding)."""
        return x * (x.square().sum(-1, keepdim=True).clamp_min(self.eps**2).rsqrt() * self.radius)


def is_post_ln(cfg: ModelConfig) -> bool:
    return cfg.norm in ("ln", "rms") and cfg.norm_placement == "post"


def norms_after_sums(cfg: ModelConfig) -> bool:
    """A norm after the embedding and after every residual sum (post-norm LN/RMS, the sphere)."""
    return is_post_ln(cfg) or cfg.norm == "sphere"


def make_norm(cfg: ModelConfig) -> nn.Module:
    """A LayerNorm/RMSNorm: before a sub-layer (pre) or after a residual sum (post; the sphere
    paper's baselines use RMSNorm eps 1e-8); the sphere projection; or nothing (norm=none)."""
    if cfg.norm == "sphere":
        return SphereNorm(cfg.radius)
    if cfg.norm not in ("ln", "rms"):
        return nn.Identity()
    return Norm(cfg, cfg.norm, eps=1e-8 if cfg.norm == "rms" and is_post_ln(cfg) else 1e-5)


class NoFinalNormalization(nn.Identity):
    """ln_final where the model has none (norm=none; a norm after every sum): the identity, and a
    one-line refusal, instead of AttributeError, for what TransformerLens reads of a final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        last = f"blocks.{cfg.n_layers - 1}"
        self.why = (f"norm=none: no final norm; the unembedding reads {last}.hook_resid_post" if cfg.norm == "none" else
                    f"no final norm: the unembedding reads {last}.hook_resid_post, already normalized by {last}.ln2 "
                    f"(its hooks: {last}.ln2.hook_scale / hook_normalized)")

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            raise TLUnsupportedAttribute(f"ln_final.{name}: {self.__dict__.get('why', 'no final norm')}") from None


class Attention(AttentionFastPaths, nn.Module):
    """Multi-head attention without biases (the sphere paper; Nanda's biases were frozen at 0).

    attention=uniform sets the scores of allowed positions to 0 before the softmax (masked ones
    stay -inf), so the pattern is 1 / (number of allowed positions); q, k and every hook still
    run, and hook_attn_scores / hook_pattern show what the softmax saw and gave. The allowed keys
    (`allowed`): the causal mask (with cfg.causal), and with readout_keys the last query (the
    readout) sees those keys only.

    attention_rate r < 1 (Zhong et al.'s attn_coeff, their code/train-main.py, `Attention.forward`:
    `normalized * attn_coeff + (1 - attn_coeff)`) mixes the softmax with the uniform pattern,
    pattern = r softmax(scores) + (1 - r) / (allowed positions); hook_pattern shows the mixture.
    Their uniform part is all ones (rows sum to r + (1 - r) n); ours keeps every row a
    distribution, so r = 0 is attention=uniform: their rate c equals our r = c / (c + n (1 - c))
    with W_O scaled by c + n (1 - c) (tests/models/test_attention_rate.py).

    `forward` below is the reference: every hook fires, and it is always taken when a hook is
    attached anywhere in the model (bit-identical to earlier versions). Where no hook can see the
    inside, Transformer.forward asks for a fast path with the same result (`fast`: sdpa | lean, and
    the first block's table path), all in models/fast_paths.py (AttentionFastPaths).
    """

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
        self.hook_result = HookPoint()  # [b, p, h, d], with cfg.use_attn_result
        # [b, p, h, d] with cfg.use_split_qkv_input: the names TL 4.3's patching reads (blocks.{l}.hook_q_input too)
        self.hook_q_input = HookPoint()
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        n = cfg.n_ctx
        allowed = torch.tril(torch.ones(n, n, dtype=torch.bool)) if cfg.causal else torch.ones(n, n, dtype=torch.bool)
        if cfg.readout_keys:
            allowed[n - 1] = False
            allowed[n - 1, list(cfg.readout_keys)] = True
        self.register_buffer("allowed", allowed, persistent=False)
        self.masked = cfg.causal or bool(cfg.readout_keys)  # some query does not see every key
        self.last_sees_all = not cfg.readout_keys  # the readout query sees every key (no mask needed there)

    def forward(self, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor,
                query: slice | None = None, fast: str | None = None, xq: torch.Tensor | None = None,
                scores_to: dict | None = None) -> torch.Tensor:
        """Attention output [b, p, d]; with `query`, only for those query positions [b, |query|, d].
        Inputs are [b, p, d], or per head [b, p, h, d] (cfg.use_split_qkv_input / use_attn_in).
        `xq`: the lean path's q_in[:, query] when the caller has it (one slice, one backward).
        `scores_to`: a dict that receives what hook_attn_scores sees, under its name, with no hook
        (Transformer.site_capture); the fused kernel has no scores, so the lean path runs instead."""
        if fast == "sdpa" and not self.folded and scores_to is None:
            return self._sdpa(q_in, query)
        if fast in ("lean", "sdpa") and not self.folded:
            return self._lean(q_in, query, xq, scores_to)
        xq = q_in if query is None else q_in[:, query]
        eq = "bphd,hde->bphe" if q_in.ndim == 4 else "bpd,hde->bphe"
        q, k, v = torch.einsum(eq, xq, self.W_Q), torch.einsum(eq, k_in, self.W_K), torch.einsum(eq, v_in, self.W_V)
        if self.folded:  # fold_layer_norm moved ln1's bias into b_Q, b_K, b_V
            q, k, v = q + self.b_Q, k + self.b_K, v + self.b_V
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(self.cfg.d_head)
        if self.cfg.attention == "uniform":
            scores = torch.zeros_like(scores)  # no gradient reaches W_Q, W_K
        if self.masked:
            n = k_in.shape[1]
            mask = self.allowed[:n, :n]
            scores = scores.masked_fill(~(mask if query is None else mask[query]), float("-inf"))
        scores = self.hook_attn_scores(scores)
        if scores_to is not None:
            scores_to[self.hook_attn_scores.name] = scores
        pattern = self.hook_pattern(self._with_rate(scores.softmax(dim=-1), k_in.shape[1], query, scores))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        if self.cfg.use_attn_result:
            return self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O)).sum(-2)
        return torch.einsum("bqhe,hed->bqd", z, self.W_O)

    # TransformerLens's per-block biases: zeros (the model has none), or what fold_layer_norm moved
    # here from ln1's bias (the buffers folded_b_Q / _K / _V, which the forward pass then adds)
    folded = False
    b_Q = property(lambda self: self._bias("Q"))  # [h, e]
    b_K = property(lambda self: self._bias("K"))
    b_V = property(lambda self: self._bias("V"))
    b_O = property(lambda self: self.W_O.new_zeros(self.cfg.d_model))  # [d]

    def _bias(self, which: str) -> torch.Tensor:
        b = self._buffers.get("folded_b_" + which)
        return b if b is not None else self.W_Q.new_zeros(self.cfg.n_heads, self.cfg.d_head)

    def _uniform(self, n: int, query: slice | None, like: torch.Tensor) -> torch.Tensor:
        """The uniform pattern, 1 / (allowed keys) for every query: [q, k]."""
        allowed = (self.allowed[:n, :n] if query is None else self.allowed[query, :n]).to(like.dtype)
        return allowed / allowed.sum(-1, keepdim=True)

    def _with_rate(self, pattern: torch.Tensor, n: int, query: slice | None, like: torch.Tensor,
                   per_head_last: bool = False) -> torch.Tensor:
        """The softmax `pattern` mixed with the uniform one at attention_rate r (the class doc):
        r pattern + (1 - r) uniform; unchanged at r = 1. `pattern` is [b, h, q, k], or [b, q, k, h]
        on the lean paths (`per_head_last`)."""
        r = self.cfg.attention_rate
        if r == 1:
            return pattern
        uniform = self._uniform_pattern(n, query, like) if per_head_last else self._uniform(n, query, like)
        return pattern * r + uniform * (1 - r)


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

    def lean(self, x: torch.Tensor) -> torch.Tensor:
        """The same output with no hook inside: the biases added by the matmuls (addmm), ReLU in place."""
        flat = x.reshape(-1, x.shape[-1])
        pre = flat @ self.W_in if self.b_in is None else torch.addmm(self.b_in, flat, self.W_in)
        act = F.relu(pre, inplace=True) if self.act is F.relu else self.act(pre)
        out = act @ self.W_out if self.b_out is None else torch.addmm(self.b_out, act, self.W_out)
        return out.view(*x.shape[:-1], -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = x @ self.W_in
        if self.b_in is not None:
            pre = pre + self.b_in
        out = self.hook_post(self.act(self.hook_pre(pre))) @ self.W_out
        return out + self.b_out if self.b_out is not None else out


class TransformerBlock(nn.Module):
    hook_out_is_single_residual_stream = True  # TL 4.3: hook_resid_post is the stream the next block reads

    def __init__(self, cfg: "TransformerConfig"):
        super().__init__()
        self.cfg = cfg
        self.post = norms_after_sums(cfg)  # ln1/ln2 then normalize the sums instead of the sub-layer inputs
        self.in_stream = cfg.norm_placement == "in_stream" and cfg.norm in ("ln", "rms")  # ln1's output is the stream
        self.ln1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm_mid = nn.Identity()  # the pre-norm path's place for a norm after the sum: none
        self.ln2 = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.norm_post = nn.Identity()
        self.hook_resid_pre = HookPoint()  # [b, p, d]
        self.hook_attn_in = HookPoint()  # [b, p, h, d], with cfg.use_attn_in
        self.hook_q_input = HookPoint()  # [b, p, h, d], with cfg.use_split_qkv_input
        self.hook_k_input = HookPoint()
        self.hook_v_input = HookPoint()
        self.hook_attn_out = HookPoint()
        self.hook_resid_mid = HookPoint()
        self.hook_mlp_in = HookPoint()  # [b, p, d], with cfg.use_hook_mlp_in
        self.hook_mlp_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def attn_inputs(self, x: torch.Tensor, lean: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The attention's query, key and value inputs: ln1(resid_pre) (pre-norm; resid_pre itself
        after a sum-norm), or TL's per-head copies when use_attn_in / use_split_qkv_input are set."""
        cfg = self.cfg
        pre = nn.Identity() if self.post or self.in_stream else self.ln1
        if not (cfg.use_attn_in or cfg.use_split_qkv_input):
            a = norm_of(pre, x, lean)
            return a, a, a
        def per_head() -> torch.Tensor:  # noqa: E306 — a copy, so patching may write into it
            return x.unsqueeze(2).repeat(1, 1, cfg.n_heads, 1)
        if cfg.use_split_qkv_input:
            a = self.attn
            ins = (a.hook_q_input(self.hook_q_input(per_head())), a.hook_k_input(self.hook_k_input(per_head())),
                   a.hook_v_input(self.hook_v_input(per_head())))
        else:
            a = self.hook_attn_in(per_head())
            ins = (a, a, a)
        return pre(ins[0]), pre(ins[1]), pre(ins[2])

    @property
    def submodules(self):
        """Read by TransformerLens's edge tools (get_act_patch_direct_path, edge attribution patching)
        to find blocks whose heads do not write additively into the stream; TL's check does not know
        a norm after the residual sum, so such a block refuses here."""
        if self.post or self.in_stream:
            raise TLUnsupported("direct-path / edge patching: a norm " + ("follows every residual sum" if self.post else
                                "replaces the stream before each attention") + " here, so a head's "
                                "write z @ W_O reaches later heads only through it, not added to their input; "
                                "patch hook_z or hook_resid_* with run_with_hooks instead")
        raise AttributeError("submodules")

    def forward(self, x: torch.Tensor, query: slice | None = None, fast: str | None = None,
                scores_to: dict | None = None) -> torch.Tensor:
        """With `query`, the block's output only at those positions (keys and values still see
        every position): what the last block needs for the loss. `fast` ("sdpa" | "lean"): no hook
        is attached (Transformer.forward). `scores_to`: receives the attention scores (Attention.forward)."""
        lean = fast == "lean"
        x = self.hook_resid_pre(x)
        if self.in_stream:
            x = norm_of(self.ln1, x, lean)
        inputs = self.attn_inputs(x, lean)
        rows = x[:, query] if query is not None else None  # the residual at the query positions
        xq = rows if lean and self.post and rows is not None else None  # after a sum-norm, also the queries' input
        attn_out = self.hook_attn_out(self.attn(*inputs, query=query, fast=fast, xq=xq, scores_to=scores_to))
        if query is not None:
            x = rows
        return self._after_attention(x, attn_out, lean)

    def from_table(self, table: torch.Tensor, tokens: torch.Tensor, query: slice | None,
                   scores_to: dict | None = None) -> torch.Tensor:
        """The lean forward of a first block whose input is a function of (position, token):
        `table` [n, V, d] is resid_pre of every position and token (Transformer.forward), and
        the attention runs on it (Attention.table); the residual at the query positions is
        gathered from it. Only a plain input (no TL per-head inputs, no hook) comes here.
        `scores_to`: receives the attention scores (Attention.table), of every query computed."""
        n, V, d = table.shape
        ids = tokens + torch.arange(n, device=tokens.device) * V  # [b, n]: each input's row of table.view(n V, d)
        # a token outside the vocabulary fails in the gathers as in the embedding (IndexError), rather
        # than reading another position's row; no host sync, so it holds under vmap and compile too
        ids = ids.masked_fill((tokens < 0) | (tokens >= V), n * V)
        x_tab = table if self.post else norm_of(self.ln1, table, True)
        stream = x_tab if self.in_stream else table  # in_stream: ln1's output is the residual
        if self.cfg.causal and n > 1 and (query is None or range(n)[query] == range(n)) and scores_to is None:
            # every position (the activation-norm penalty's sites): causal position 0 sees only
            # itself (its pattern is 1 on its own key), so its whole block output is a function of
            # its token, computed once per token and gathered; the others as below (not when the
            # scores are recorded: position 0 would have none)
            own = self.attn.own_value(x_tab[0])  # [V, d]
            head = self._after_attention(stream[0][None], own[None], True)[0]  # [V, d]
            rest = self._from_table(x_tab, stream, ids, slice(1, n))
            return torch.cat([F.embedding(ids[:, :1], head), rest], dim=1)
        return self._from_table(x_tab, stream, ids, query, scores_to)

    def _from_table(self, x_tab: torch.Tensor, stream: torch.Tensor, ids: torch.Tensor, query: slice | None,
                    scores_to: dict | None = None) -> torch.Tensor:
        n, V, d = x_tab.shape
        attn_out = self.attn.table(x_tab, ids, query, scores_to)
        rows = F.embedding(ids if query is None else ids[:, query], stream.reshape(n * V, d))
        return self._after_attention(rows, attn_out, True)

    def _after_attention(self, x: torch.Tensor, attn_out: torch.Tensor, lean: bool) -> torch.Tensor:
        """resid_mid and the MLP, from the residual x and the attention output at the same positions."""
        mlp = self.mlp.lean if lean else self.mlp
        if self.post:  # resid_mid = ln1(resid_pre + attn(resid_pre)), resid_post = ln2(resid_mid + mlp(resid_mid))
            x = self.hook_resid_mid(norm_of(self.ln1, x + attn_out, lean))
            mlp_in = self.hook_mlp_in(x.clone()) if self.cfg.use_hook_mlp_in else x
            return self.hook_resid_post(norm_of(self.ln2, x + self.hook_mlp_out(mlp(mlp_in)), lean))
        x = self.hook_resid_mid(self.norm_mid(x + attn_out))
        mlp_in = self.hook_mlp_in(x.clone()) if self.cfg.use_hook_mlp_in else x
        x = self.hook_resid_post(self.norm_post(x + self.hook_mlp_out(mlp(norm_of(self.ln2, mlp_in, lean)))))
        return x


class Unembed(nn.Module):
    """logits = x W_U, or with unembed=bounded logits = tau x W_U_hat, where W_U_hat has unit
    columns (W_U is [d_model, d_vocab_out], so its columns are the per-class vectors: the rows
    of the paper's W_U). |logit| <= tau ||x||, = tau r on the sphere."""

    def __init__(self, cfg: "TransformerConfig"):
        super().__init__()
        self.bounded, self.tau = cfg.unembed == "bounded", cfg.tau
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out))

    folded = False  # fold_layer_norm moved ln_final's bias into the buffer folded_b_U (TL's b_U)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, p, d] -> [b, p, v]
        if self.bounded:
            return self.tau * (x @ F.normalize(self.W_U, dim=0))
        return x @ self.W_U + self.folded_b_U if self.folded else x @ self.W_U


class Transformer(TransformerLensWeights, HookedModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, TransformerConfig):  # a plain ModelConfig: the variants' defaults
            cfg = TransformerConfig(**dataclasses.asdict(cfg))
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.hook_embed = HookPoint()  # [b, p, d]
        self.hook_pos_embed = HookPoint()  # [b, p, d]
        if cfg.norm == "sphere":  # registered first: its hooks are ln_embed.*, as on post-norm
            self.ln_embed = make_norm(cfg)  # resid_pre(0) = N(embed + pos_embed)
        # what the forward calls on the sphere
        self.norm_embed = self.ln_embed if cfg.norm == "sphere" else nn.Identity()
        if is_post_ln(cfg):
            self.ln_embed = make_norm(cfg)  # post: resid_pre(0) = ln_embed(embed + pos_embed)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = NoFinalNormalization(cfg) if norms_after_sums(cfg) or cfg.norm == "none" else make_norm(cfg)
        self.unembed = Unembed(cfg)
        self.init_weights()
        self.setup()  # registers every HookPoint under its module path

    @torch.no_grad()
    def init_weights(self) -> None:
        """init_scheme=tl: TransformerLens's default, every W_ ~ N(0, 0.8 / sqrt(d_model)); biases 0.
        init_scheme=torch: PyTorch's module defaults for the modules the sphere paper's code builds
        (see torch_default_init).

        init=fourier then overwrites the first 2K columns of W_E for the residue tokens
        x = 0..p-1: W_E[x, 2i] = cos(2 pi k_i x / p), W_E[x, 2i+1] = sin(2 pi k_i x / p)
        (unit amplitude, as the sphere paper's code); other tokens and columns keep the default.
        """
        if self.cfg.init_scheme in ("torch", "torch_mha"):
            torch_default_init(self, mha=self.cfg.init_scheme == "torch_mha")
        else:
            for name, param in self.named_parameters():
                if name.split(".")[-1].startswith("W_"):
                    nn.init.normal_(param, std=self.cfg.initializer_range)
        if self.cfg.init == "fourier":
            p = self.cfg.fourier_p
            x = torch.arange(p, dtype=torch.float64)
            for i, k in enumerate(self.cfg.fourier_freqs):
                angle = 2 * math.pi * k * x / p
                self.embed.W_E[:p, 2 * i] = torch.cos(angle).to(self.embed.W_E.dtype)
                self.embed.W_E[:p, 2 * i + 1] = torch.sin(angle).to(self.embed.W_E.dtype)

    supports_readout = True  # forward(tokens, readout=slice): see below
    # The fused attention path (Attention._sdpa, models/fast_paths.py) when no hook is attached: None = on CUDA only.
    # On CPU it measured no gain for 3-token sequences (benchmarks/train_throughput.py, 0.502 vs
    # 0.503 of the SDPA plain loop), while costing the bit-identity of CPU trajectories with the
    # explicit path, a per-member loop under vmap (no batching rule for CPU SDPA) and double
    # backward (CPU flash attention has none). True / False force it either way.
    fused_attention: bool | None = None
    # Where the fused attention is off (CPU by default) and no hook is attached: the lean path
    # (Attention._lean, models/fast_paths.py; fused norms, MLP.lean): the explicit path's numbers to float32 rounding
    # (tests/models/test_fast_path.py), at 0.4-0.6x its step time at paper scale with the
    # table below (benchmarks/flop_bound.py). False: the explicit path, bit-identical to earlier versions.
    lean_path: bool = True
    # On the lean path, the first block from a table of every (position, token) pair (its
    # projections and scores on n V rows, not b n; TransformerBlock.from_table) where the
    # batch is large against the vocabulary (`_table_pays`): at paper scale (p=113, 3,831 rows)
    # 0.6x the lean step's time (docs/PERFORMANCE.md). False: the first block on the batch's rows.
    embedding_table: bool = True
    # A dict {site: None, ...} set by the trainer for one call, of sites `can_capture` accepts:
    # each is stored in it as its hook would see it, in the graph. blocks.{i}.hook_resid_post: the
    # block's output at every position (with `readout`, the last block then runs at every position
    # if it is named, and only the unembedding at the readout ones; unless capture_all_positions is
    # off, below). blocks.{i}.attn.hook_attn_scores:
    # [b, h, q, k] at the query positions the block computes, so with `readout` the last block's are
    # the readout rows only. A regularizer term that reads only such sites (the activation-norm
    # penalty's defaults, the KL attention term) then needs no TransformerLens hook, whose presence
    # would force the explicit path at every position (docs/PERFORMANCE.md: 0.71x the penalty
    # step's CPU time at paper scale, and 0.2x the KL step's).
    site_capture: dict | None = None
    # With `site_capture` and `readout`: False when every term reads the readout rows only (GeomDR,
    # the KL term): the last block then runs at the readout positions alone, and its resid_post is
    # recorded there only, as its hook would see it (trainers/step.py `model_capture` sets both).
    capture_all_positions: bool = True

    def can_capture(self, site: str) -> bool:
        """True for a site `site_capture` can record: a block's resid_post, or its attention scores
        unless the attention is uniform (its lean paths compute no scores)."""
        if re.fullmatch(r"blocks\.\d+\.hook_resid_post", site):
            return True
        return bool(re.fullmatch(r"blocks\.\d+\.attn\.hook_attn_scores", site)) and self.cfg.attention != "uniform"

    def _table_pays(self, tokens: torch.Tensor, query: slice | None) -> bool:
        """The table path for these inputs (the lean path's first block, so no hook and no TL
        per-head inputs): a contiguous query slice, the table's n V rows at most a quarter of
        the batch's b n (4 V <= b), and the score table, (nq V) x (n V) entries per head, at
        most 8x the b nq n scores the per-input path computes (V^2 <= 8 b): its entries are one
        matmul, the per-input scores broadcast products that run several times slower each."""
        b, v = tokens.shape[0] if tokens.ndim == 2 else 0, self.cfg.d_vocab
        return (query is None or query.step in (None, 1)) and 4 * v <= b and v * v <= 8 * b

    def forward(self, tokens: torch.Tensor | str | list[str], return_type: str | None = "logits",
                loss_per_token: bool = False, readout: slice | None = None):
        """Logits [b, p, v] (or TL's return_type loss | both | None, see HookedModel.output).
        With `readout` (a slice of positions) only the logits there, [b, |readout|, v], equal to
        forward(tokens)[:, readout]: the last block computes its attention queries, MLP and
        unembedding at those positions only (the trainer's fast path, about 2x fewer FLOPs for
        [a, b, =]; its hooks then see only those positions)."""
        tokens = self._as_tokens(tokens)
        cfg = self.cfg
        fused = tokens.is_cuda if self.fused_attention is None else self.fused_attention
        plain = not (cfg.use_attn_result or cfg.use_split_qkv_input or cfg.use_attn_in or self.hooks_attached())
        fast = None if not plain else "sdpa" if fused else "lean" if self.lean_path else None
        lean = fast == "lean"
        last = len(self.blocks) - 1
        capture = self.site_capture
        scores_to = [capture if capture is not None and f"blocks.{i}.attn.hook_attn_scores" in capture else None
                     for i in range(last + 1)]
        # the last block at the readout positions only, unless its resid_post is recorded at every
        # position (the penalty's): then it runs in full and only the unembedding is cut to them
        every = capture is not None and self.capture_all_positions and f"blocks.{last}.hook_resid_post" in capture
        query = None if every else readout
        embed_norm = self.ln_embed if is_post_ln(cfg) else self.norm_embed
        first = 0
        if lean and self.embedding_table and not self.blocks[0].attn.folded and \
                self._table_pays(tokens, query if last == 0 else None):
            # resid_pre of the first block is a function of (position, token): computed once per pair
            n = tokens.shape[-1]
            table = norm_of(embed_norm, self.embed.W_E[None] + self.pos_embed.W_pos[:n, None], True)  # [n, V, d]
            x, first = self.blocks[0].from_table(table, tokens, query if last == 0 else None, scores_to[0]), 1
        else:
            # its backward: ~0.7x indexing's
            embed = F.embedding(tokens, self.embed.W_E) if lean else self.embed(tokens)
            x = self.hook_embed(embed) + self.hook_pos_embed(self.pos_embed(tokens))
            x = norm_of(embed_norm, x, lean)
        if capture is not None and first == 1 and "blocks.0.hook_resid_post" in capture:
            capture["blocks.0.hook_resid_post"] = x
        for i in range(first, last + 1):
            x = self.blocks[i](x, query if i == last else None, fast, scores_to[i])
            if capture is not None and f"blocks.{i}.hook_resid_post" in capture:
                capture[f"blocks.{i}.hook_resid_post"] = x
        if readout is not None and query is None:
            x = x[:, readout]
        logits = self.unembed(norm_of(self.ln_final, x, lean))
        if readout is not None and return_type != "logits":
            raise TLUnsupported("readout= gives logits at the readout positions only; use return_type='logits'")
        return self.output(logits, tokens, return_type, loss_per_token)


@torch.no_grad()
def torch_default_init(model: Transformer, mha: bool = False) -> None:
    """PyTorch's default init of the modules the sphere paper's code builds (its official
    notebooks): nn.Embedding for tokens and positions, N(0, 1); nn.Linear(fan_in, fan_out) for
    W_Q/W_K/W_V/W_O, the MLP and the unembedding, weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    (kaiming_uniform with a = sqrt(5)); norm weights 1, biases 0. Our tensors hold the same
    matrices split per head, so each element gets its Linear's bound.
    `mha`: W_Q, W_K, W_V as nn.MultiheadAttention's in_proj_weight (Grokfast's code), xavier-uniform
    over the stacked [3 d_model, d_model] matrix, U(+-sqrt(6 / (4 d_model))) when n_heads d_head = d_model;
    W_O stays its out_proj, an nn.Linear."""
    cfg = model.cfg

    def uniform(t: torch.Tensor, fan_in: int) -> None:
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(t, -bound, bound)

    nn.init.normal_(model.embed.W_E)
    nn.init.normal_(model.pos_embed.W_pos)
    for block in model.blocks:
        for w in (block.attn.W_Q, block.attn.W_K, block.attn.W_V):
            if mha:  # xavier_uniform_ of in_proj_weight [3 h e, d]: bound sqrt(6 / (fan_in + fan_out))
                bound = math.sqrt(6.0 / (cfg.d_model + 3 * cfg.n_heads * cfg.d_head))
                nn.init.uniform_(w, -bound, bound)
            else:
                uniform(w, cfg.d_model)  # nn.Linear(d_model, n_heads * d_head)
        uniform(block.attn.W_O, cfg.n_heads * cfg.d_head)
        uniform(block.mlp.W_in, cfg.d_model)
        if block.mlp.b_in is not None:
            uniform(block.mlp.b_in, cfg.d_model)
        uniform(block.mlp.W_out, cfg.d_mlp)
        if block.mlp.b_out is not None:
            uniform(block.mlp.b_out, cfg.d_mlp)
    uniform(model.unembed.W_U, cfg.d_model)
