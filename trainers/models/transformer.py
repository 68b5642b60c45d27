"""The one transformer of groklens, in TransformerLens vocabulary.

Variants are switches of this class, never copies (docs/VARIANTS.md): `norm` (none | ln | rms |
sphere), `attention` (softmax | uniform), `unembed` (linear | bounded), `init` (default |
fourier), `causal`. Pre-norm residual blocks as in TransformerLens:
    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))
    logits     = unembed(ln_final(resid_post))
With norm=sphere the norms move after the sums instead (Yildirim 2026), N(x) = r x / ||x||:
    resid_pre(0) = N(embed + pos_embed)
    resid_mid    = N(resid_pre + attn(resid_pre))
    resid_post   = N(resid_mid + mlp(resid_mid))
so every residual-stream hook lies on the sphere of radius r.
With norm_placement=post (norm ln | rms) a LayerNorm/RMSNorm N takes those places, as in the
sphere paper's baselines: ln_embed after the embedding, blocks.{l}.ln1 after the attention sum,
blocks.{l}.ln2 after the MLP sum, no ln_final (LayerNorm eps 1e-5, RMSNorm eps 1e-8).
Shapes: b batch, p position, d d_model, h head, e d_head, m d_mlp, v vocab.
The HookedTransformer-style surface (stacked W_Q ... W_U, QK/OV, return_type, ...) and the fast
path taken when no hook is attached are described in docs/TRANSFORMERLENS.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from groklens.trainers.models.hooked import HookedModel, ModelConfig, TLUnsupported


@dataclass
class TransformerConfig(ModelConfig):
    """ModelConfig plus the parameters of the variants."""

    radius: float = 1.0  # norm=sphere
    tau: float = 10.0  # unembed=bounded
    fourier_freqs: tuple[int, ...] = ()  # init=fourier: frequencies k_1..k_K
    fourier_p: int = 0  # init=fourier: tokens 0..fourier_p-1 are the residues mod fourier_p


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


def is_post_ln(cfg: ModelConfig) -> bool:
    return cfg.norm in ("ln", "rms") and cfg.norm_placement == "post"


def make_norm(cfg: ModelConfig) -> nn.Module:
    """A LayerNorm/RMSNorm: before a sub-layer (pre) or after a residual sum (post; the sphere
    paper's baselines use RMSNorm eps 1e-8). The sphere variant has none."""
    if cfg.norm not in ("ln", "rms"):
        return nn.Identity()
    return Norm(cfg, cfg.norm, eps=1e-8 if cfg.norm == "rms" and is_post_ln(cfg) else 1e-5)


def make_post_norm(cfg: "TransformerConfig") -> nn.Module:
    """The sphere projection after a residual sum, or nothing."""
    return SphereNorm(cfg.radius) if cfg.norm == "sphere" else nn.Identity()


class Attention(nn.Module):
    """Multi-head attention without biases (the sphere paper; Nanda's biases were frozen at 0).

    attention=uniform sets the scores of allowed positions to 0 before the softmax (masked ones
    stay -inf), so the pattern is 1 / (number of allowed positions); q, k and every hook still
    run, and hook_attn_scores / hook_pattern show what the softmax saw and gave.

    Two paths with the same result: the explicit one (every hook fires; always taken when a hook
    is attached anywhere in the model, bit-identical to earlier versions), and the fast one when
    no hook can see the inside (fused projections and torch's scaled_dot_product_attention; for
    uniform attention the fixed pattern times v, without q and k, which get no gradient anyway).
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
        n = cfg.n_ctx
        self.register_buffer("causal_mask", torch.tril(torch.ones(n, n, dtype=torch.bool)), persistent=False)

    def forward(self, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor,
                query: slice | None = None, fast: bool = False) -> torch.Tensor:
        """Attention output [b, p, d]; with `query`, only for those query positions [b, |query|, d].
        Inputs are [b, p, d], or per head [b, p, h, d] (cfg.use_split_qkv_input / use_attn_in)."""
        if fast:
            return self._fast(q_in, query)
        xq = q_in if query is None else q_in[:, query]
        eq = "bphd,hde->bphe" if q_in.ndim == 4 else "bpd,hde->bphe"
        q = self.hook_q(torch.einsum(eq, xq, self.W_Q))
        k = self.hook_k(torch.einsum(eq, k_in, self.W_K))
        v = self.hook_v(torch.einsum(eq, v_in, self.W_V))
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(self.cfg.d_head)
        if self.cfg.attention == "uniform":
            scores = torch.zeros_like(scores)  # no gradient reaches W_Q, W_K
        if self.cfg.causal:
            n = k_in.shape[1]
            mask = self.causal_mask[:n, :n]
            scores = scores.masked_fill(~(mask if query is None else mask[query]), float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        if self.cfg.use_attn_result:
            return self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O)).sum(-2)
        return torch.einsum("bqhe,hed->bqd", z, self.W_O)

    def _fast(self, x: torch.Tensor, query: slice | None) -> torch.Tensor:
        """The same output from [b, p, d] inputs, with no hook inside. The projections are the
        explicit path's einsums (one matmul each; under torch.func.vmap, as in the ensemble, they
        give the single run's numbers bit for bit); the softmax attention is torch's fused kernel."""
        n = x.shape[1]
        mask = self.causal_mask[:n, :n] if query is None else self.causal_mask[query, :n]
        v = torch.einsum("bpd,hde->bhpe", x, self.W_V)
        if self.cfg.attention == "uniform":  # pattern = 1 / (allowed keys), whatever q and k are
            allowed = mask.to(x.dtype) if self.cfg.causal else torch.ones(mask.shape, dtype=x.dtype, device=x.device)
            z = (allowed / allowed.sum(-1, keepdim=True)) @ v  # [b, h, q, e]
        else:
            xq = x if query is None else x[:, query]
            q = torch.einsum("bpd,hde->bhpe", xq, self.W_Q)
            k = torch.einsum("bpd,hde->bhpe", x, self.W_K)
            if not self.cfg.causal or (query is not None and query.start == n - 1):
                mask = None  # every query sees every key (bidirectional, or the last position only)
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=False)
        return torch.einsum("bhqe,hed->bqd", z, self.W_O)


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
    hook_out_is_single_residual_stream = True  # TL 4.3: hook_resid_post is the stream the next block reads

    def __init__(self, cfg: "TransformerConfig"):
        super().__init__()
        self.cfg = cfg
        self.post = is_post_ln(cfg)  # ln1/ln2 then normalize the sums instead of the sub-layer inputs
        self.ln1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.norm_mid = make_post_norm(cfg)  # sphere: resid_mid = N(resid_pre + attn_out)
        self.ln2 = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.norm_post = make_post_norm(cfg)  # sphere: resid_post = N(resid_mid + mlp_out)
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

    def attn_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The attention's query, key and value inputs: ln1(resid_pre) (pre-norm; resid_pre itself
        after a sum-norm), or TL's per-head copies when use_attn_in / use_split_qkv_input are set."""
        cfg = self.cfg
        pre = nn.Identity() if self.post else self.ln1
        if not (cfg.use_attn_in or cfg.use_split_qkv_input):
            a = pre(x)
            return a, a, a
        def per_head() -> torch.Tensor:  # noqa: E306 — a copy, so patching may write into it
            return x.unsqueeze(2).repeat(1, 1, cfg.n_heads, 1)
        if cfg.use_split_qkv_input:
            ins = (self.hook_q_input(per_head()), self.hook_k_input(per_head()), self.hook_v_input(per_head()))
        else:
            a = self.hook_attn_in(per_head())
            ins = (a, a, a)
        return pre(ins[0]), pre(ins[1]), pre(ins[2])

    def forward(self, x: torch.Tensor, query: slice | None = None, fast: bool = False) -> torch.Tensor:
        """With `query`, the block's output only at those positions (keys and values still see
        every position): what the last block needs for the loss. `fast`: no hook is attached."""
        x = self.hook_resid_pre(x)
        attn_out = self.hook_attn_out(self.attn(*self.attn_inputs(x), query=query, fast=fast))
        if query is not None:
            x = x[:, query]
        if self.post:  # resid_mid = ln1(resid_pre + attn(resid_pre)), resid_post = ln2(resid_mid + mlp(resid_mid))
            x = self.hook_resid_mid(self.ln1(x + attn_out))
            mlp_in = self.hook_mlp_in(x.clone()) if self.cfg.use_hook_mlp_in else x
            return self.hook_resid_post(self.ln2(x + self.hook_mlp_out(self.mlp(mlp_in))))
        x = self.hook_resid_mid(self.norm_mid(x + attn_out))
        mlp_in = self.hook_mlp_in(x.clone()) if self.cfg.use_hook_mlp_in else x
        x = self.hook_resid_post(self.norm_post(x + self.hook_mlp_out(self.mlp(self.ln2(mlp_in)))))
        return x


class Unembed(nn.Module):
    """logits = x W_U, or with unembed=bounded logits = tau x W_U_hat, where W_U_hat has unit
    columns (W_U is [d_model, d_vocab_out], so its columns are the per-class vectors: the rows
    of the paper's W_U). |logit| <= tau ||x||, = tau r on the sphere."""

    def __init__(self, cfg: "TransformerConfig"):
        super().__init__()
        self.bounded, self.tau = cfg.unembed == "bounded", cfg.tau
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [b, p, d] -> [b, p, v]
        if self.bounded:
            return self.tau * (x @ F.normalize(self.W_U, dim=0))
        return x @ self.W_U


class Transformer(HookedModel):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if not isinstance(cfg, TransformerConfig):  # a plain ModelConfig: the variants' defaults
            cfg = TransformerConfig(**dataclasses.asdict(cfg))
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.pos_embed = PosEmbed(cfg)
        self.hook_embed = HookPoint()  # [b, p, d]
        self.hook_pos_embed = HookPoint()  # [b, p, d]
        self.norm_embed = make_post_norm(cfg)  # sphere: resid_pre(0) = N(embed + pos_embed)
        if is_post_ln(cfg):
            self.ln_embed = make_norm(cfg)  # post: resid_pre(0) = ln_embed(embed + pos_embed)
        self.blocks = nn.ModuleList([TransformerBlock(cfg) for _ in range(cfg.n_layers)])
        self.ln_final = nn.Identity() if is_post_ln(cfg) else make_norm(cfg)
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
        if self.cfg.init_scheme == "torch":
            torch_default_init(self)
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
    # The fused attention path (Attention._fast) when no hook is attached: None = on CUDA only.
    # On CPU it measured no gain for 3-token sequences (benchmarks/train_throughput.py, 0.502 vs
    # 0.503 of the SDPA plain loop), while costing the bit-identity of CPU trajectories with the
    # explicit path, a per-member loop under vmap (no batching rule for CPU SDPA) and double
    # backward (CPU flash attention has none). True / False force it either way.
    fused_attention: bool | None = None

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
        fast = fused and not (cfg.use_attn_result or cfg.use_split_qkv_input or cfg.use_attn_in
                              or self.hooks_attached())
        x = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(tokens))
        x = self.ln_embed(x) if is_post_ln(cfg) else self.norm_embed(x)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, readout if i == last else None, fast)
        logits = self.unembed(self.ln_final(x))
        if readout is not None and return_type != "logits":
            raise TLUnsupported("readout= gives logits at the readout positions only; use return_type='logits'")
        return self.output(logits, tokens, return_type, loss_per_token)

    # ---------------------------------------------------------------- TransformerLens's weight surface
    # Stacked over layers with HookedTransformer's shapes. The model has no attention biases and
    # (without mlp_bias) no MLP biases: those properties are zeros, which is what they add.
    def _stack(self, get) -> torch.Tensor:
        return torch.stack([get(b) for b in self.blocks])

    W_E = property(lambda self: self.embed.W_E)  # [d_vocab, d_model]
    W_pos = property(lambda self: self.pos_embed.W_pos)  # [n_ctx, d_model]
    W_E_pos = property(lambda self: torch.cat([self.W_E, self.W_pos], dim=0))  # [d_vocab + n_ctx, d_model]
    W_Q = property(lambda self: self._stack(lambda b: b.attn.W_Q))  # [l, h, d, e]
    W_K = property(lambda self: self._stack(lambda b: b.attn.W_K))
    W_V = property(lambda self: self._stack(lambda b: b.attn.W_V))
    W_O = property(lambda self: self._stack(lambda b: b.attn.W_O))  # [l, h, e, d]
    W_in = property(lambda self: self._stack(lambda b: b.mlp.W_in))  # [l, d, m]
    W_out = property(lambda self: self._stack(lambda b: b.mlp.W_out))  # [l, m, d]
    b_Q = property(lambda self: self.W_Q.new_zeros(self.cfg.n_layers, self.cfg.n_heads, self.cfg.d_head))
    b_K = b_Q
    b_V = b_Q
    b_O = property(lambda self: self.W_E.new_zeros(self.cfg.n_layers, self.cfg.d_model))
    b_in = property(lambda self: self._stack(lambda b: b.mlp.b_in if b.mlp.b_in is not None
                                             else b.mlp.W_in.new_zeros(self.cfg.d_mlp)))
    b_out = property(lambda self: self._stack(lambda b: b.mlp.b_out if b.mlp.b_out is not None
                                              else b.mlp.W_out.new_zeros(self.cfg.d_model)))

    @property
    def W_U(self) -> torch.Tensor:
        """[d_model, d_vocab_out] with logits = (what the unembedding reads) @ W_U + b_U; for
        unembed=bounded that is tau * W_U_hat (unit columns), not the parameter unembed.W_U."""
        W = self.unembed.W_U
        return self.cfg.tau * F.normalize(W, dim=0) if self.unembed.bounded else W

    @property
    def b_U(self) -> torch.Tensor:
        return self.unembed.W_U.new_zeros(self.cfg.d_vocab_out)

    @property
    def QK(self):
        """W_Q W_K^T per layer and head, [l, h, d, d] factored (a TransformerLens FactoredMatrix)."""
        from transformer_lens import FactoredMatrix

        if self.cfg.attention == "uniform":
            raise TLUnsupported("QK: with attention=uniform the scores are replaced by zeros, so W_Q W_K^T "
                                "does not act; the pattern is 1 / (allowed positions); use OV")
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self):
        """W_V W_O per layer and head, [l, h, d, d] factored (a TransformerLens FactoredMatrix)."""
        from transformer_lens import FactoredMatrix

        return FactoredMatrix(self.W_V, self.W_O)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """Sum of the biases written into the stream before `layer` (b_O is zero: no attention biases)."""
        bias = self.W_E.new_zeros(self.cfg.d_model)
        if include_mlp_biases:
            for b in self.blocks[:layer]:
                if b.mlp.b_out is not None:
                    bias = bias + b.mlp.b_out
        return bias

    def tokens_to_residual_directions(self, tokens) -> torch.Tensor:
        """The direction in what the unembedding reads whose dot product is each token's logit
        (less b_U and ln_final's bias): W_U[:, token], times ln_final's weight with a pre-norm final
        LN/RMS (what TransformerLens returns after fold_ln). [*tokens.shape, d_model]."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.W_E.device)
        W = self.W_U
        if isinstance(self.ln_final, Norm):
            W = W * self.ln_final.w[:, None]
        return W[:, tokens].movedim(0, -1)

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens-named parameters (what SVDInterpreter reads)."""
        if self.cfg.d_vocab != self.cfg.d_vocab_out:
            raise TLUnsupported(f"SVDInterpreter assumes d_vocab == d_vocab_out, but this task has {self.cfg.d_vocab} "
                                f"input tokens and {self.cfg.d_vocab_out} classes; use model.OV[l, h].svd() with model.W_U")
        return {**dict(self.named_parameters()), "unembed.W_U": self.W_U}

    @torch.no_grad()
    def fold_layer_norm(self) -> None:
        """Fold each norm's weight into the matrices that read its output (the logits do not change;
        the norms keep unit weights). Only RMSNorm before each sub-layer folds exactly: LayerNorm's
        bias would need attention biases this model does not have, a norm after the sums has no
        matrix of its own to fold into, and the bounded unembedding normalizes W_U's columns."""
        cfg = self.cfg
        if cfg.norm == "none":
            return
        if cfg.norm != "rms" or is_post_ln(cfg) or self.unembed.bounded:
            why = ("the sphere projection has no weight" if cfg.norm == "sphere" else
                   "a norm after the residual sums has no matrix of its own to fold into" if is_post_ln(cfg) else
                   "LayerNorm's bias would need attention biases this model does not have" if cfg.norm == "ln" else
                   "unembed=bounded normalizes W_U's columns, so ln_final's weight cannot move into it")
            raise TLUnsupported(f"fold_layer_norm: {why}; read the norms' hooks (hook_scale, hook_normalized) instead")
        for block in self.blocks:
            for name in ("W_Q", "W_K", "W_V"):
                getattr(block.attn, name).mul_(block.ln1.w[None, :, None])
            block.mlp.W_in.mul_(block.ln2.w[:, None])
            block.ln1.w.fill_(1.0)
            block.ln2.w.fill_(1.0)
        self.unembed.W_U.mul_(self.ln_final.w[:, None])
        self.ln_final.w.fill_(1.0)


@torch.no_grad()
def torch_default_init(model: Transformer) -> None:
    """PyTorch's default init of the modules the sphere paper's code builds (its official
    notebooks): nn.Embedding for tokens and positions, N(0, 1); nn.Linear(fan_in, fan_out) for
    W_Q/W_K/W_V/W_O, the MLP and the unembedding, weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    (kaiming_uniform with a = sqrt(5)); norm weights 1, biases 0. Our tensors hold the same
    matrices split per head, so each element gets its Linear's bound."""
    cfg = model.cfg

    def uniform(t: torch.Tensor, fan_in: int) -> None:
        bound = 1.0 / math.sqrt(fan_in)
        nn.init.uniform_(t, -bound, bound)

    nn.init.normal_(model.embed.W_E)
    nn.init.normal_(model.pos_embed.W_pos)
    for block in model.blocks:
        for w in (block.attn.W_Q, block.attn.W_K, block.attn.W_V):
            uniform(w, cfg.d_model)  # nn.Linear(d_model, n_heads * d_head)
        uniform(block.attn.W_O, cfg.n_heads * cfg.d_head)
        uniform(block.mlp.W_in, cfg.d_model)
        if block.mlp.b_in is not None:
            uniform(block.mlp.b_in, cfg.d_model)
        uniform(block.mlp.W_out, cfg.d_mlp)
        if block.mlp.b_out is not None:
            uniform(block.mlp.b_out, cfg.d_mlp)
    uniform(model.unembed.W_U, cfg.d_model)
