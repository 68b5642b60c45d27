"""An independent float64 forward pass of every groklens model, written from the raw state_dict
with plain tensor ops (for the TransformerLens conformance snippets, tests/models/test_tl_conformance.py).

`Reference(model, tokens, patch)` runs the forward pass once and keeps every activation under its
TransformerLens hook name (`acts`); `patch` maps hook names to functions applied to the activation
there (the hand-written counterpart of a hook: ablations, activation patching, leaves for autograd).
Per-head attention inputs always exist as [b, p, h, d] copies (`blocks.l.attn.hook_q_input`, ...), so
a patch on one head's input reaches that head only.

The direct-path bookkeeping (`carry`, `reader_view`, `bias_to`): with every norm's scale held at its
value in this pass, a norm N(x) = centre(x) / s * w + b is affine, so the stream at any point is the
sum of every component's output carried through the norms between where it is added and that point,
plus those norms' biases carried the same way. Points of the stream are ("embed",), ("attn", l),
("mlp", l) where components are added, and ("attn_in", l), ("mlp_in", l), ("final",) where a reader
(attention, MLP, unembedding) reads the stream.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class Reference:
    def __init__(self, model, tokens: torch.Tensor, patch: dict | None = None):
        self.cfg = cfg = model.cfg
        self.sd = {k: v.detach().double() for k, v in model.state_dict().items()}
        self.patch = patch or {}
        self.acts: dict[str, torch.Tensor] = {}
        self.is_mlp = not hasattr(model, "blocks")
        self.kind = getattr(cfg, "norm", "none")
        # a norm after every residual sum (post-norm LN/RMS, the sphere projection) or before every reader
        self.post = self.kind == "sphere" or (self.kind in ("ln", "rms") and cfg.norm_placement == "post")
        self.eps = {"ln": 1e-5, "rms": 1e-8 if self.post else 1e-5}.get(self.kind, 0.0)
        self.stream_norms: list[tuple[tuple, str]] = []  # (point after which it acts, hook prefix), in order
        self.logits = self._mlp(tokens) if self.is_mlp else self._transformer(tokens)

    # ------------------------------------------------------------------ forward
    def _at(self, name: str, x: torch.Tensor) -> torch.Tensor:
        x = self.patch[name](x) if name in self.patch else x
        self.acts[name] = x
        return x

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        """One norm, its hook_scale and hook_normalized recorded under `prefix`."""
        if self.kind == "sphere":
            s = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(1e-12) / self.cfg.radius
            out = x / s
            self.acts[prefix + ".hook_scale"], self.acts[prefix + ".hook_normalized"] = s, out
            return out
        w = self.sd[prefix + ".w"]
        if self.kind == "ln":
            c = x - x.mean(-1, keepdim=True)
            s = torch.sqrt(c.pow(2).mean(-1, keepdim=True) + self.eps)
            out = F.layer_norm(x, (x.shape[-1],), w, self.sd[prefix + ".b"], eps=self.eps)
        else:
            c, s = x, torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
            out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w
        self.acts[prefix + ".hook_scale"], self.acts[prefix + ".hook_normalized"] = s, c / s
        return out

    def _stream_norm(self, x: torch.Tensor, prefix: str, after: tuple) -> torch.Tensor:
        if not self.post:
            return x
        self.stream_norms.append((after, prefix))
        return self._norm(x, prefix)

    def _transformer(self, tokens: torch.Tensor) -> torch.Tensor:
        cfg, sd = self.cfg, self.sd
        b, n = tokens.shape
        x = self._at("hook_embed", sd["embed.W_E"][tokens]) + self._at("hook_pos_embed",
                                                                       sd["pos_embed.W_pos"][:n].expand(b, n, -1))
        x = self._stream_norm(x, "ln_embed", ("embed",))
        for l in range(cfg.n_layers):
            x = self._at(f"blocks.{l}.hook_resid_pre", x)
            x = self._stream_norm(x + self._at(f"blocks.{l}.hook_attn_out", self._attention(l, x)),
                                  f"blocks.{l}.ln1", ("attn", l))
            x = self._at(f"blocks.{l}.hook_resid_mid", x)
            m = f"blocks.{l}.mlp."
            mlp_in = x if self.post or self.kind == "none" else self._norm(x, f"blocks.{l}.ln2")
            pre = self._at(m + "hook_pre", mlp_in @ sd[m + "W_in"] + sd.get(m + "b_in", 0.0))
            act = self._at(m + "hook_post", torch.relu(pre) if cfg.act_fn == "relu" else F.gelu(pre))
            out = self._at(f"blocks.{l}.hook_mlp_out", act @ sd[m + "W_out"] + sd.get(m + "b_out", 0.0))
            x = self._at(f"blocks.{l}.hook_resid_post", self._stream_norm(x + out, f"blocks.{l}.ln2", ("mlp", l)))
        final = x if self.post or self.kind == "none" else self._norm(x, "ln_final")
        return final @ self.W_U

    def _attention(self, l: int, x: torch.Tensor) -> torch.Tensor:
        cfg, sd, a = self.cfg, self.sd, f"blocks.{l}.attn."
        b, n, _ = x.shape
        qkv = []
        for w in ("q", "k", "v"):
            copies = self._at(a + f"hook_{w}_input", x[:, :, None].expand(-1, -1, cfg.n_heads, -1).clone())
            if not self.post and self.kind != "none":
                copies = self._norm(copies, f"blocks.{l}.ln1")  # the same norm on each head's copy
            qkv.append(self._at(a + f"hook_{w}", torch.einsum("bphd,hde->bphe", copies, sd[a + "W_" + w.upper()])))
        q, k, v = qkv
        if not self.post and self.kind != "none":  # record ln1 on the shared stream, not on the copies
            self._norm(x, f"blocks.{l}.ln1")
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(cfg.d_head)
        if cfg.attention == "uniform":
            scores = torch.zeros_like(scores)
        if cfg.causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        pattern = self._at(a + "hook_pattern", self._at(a + "hook_attn_scores", scores).softmax(-1))
        z = self._at(a + "hook_z", torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        result = self._at(a + "hook_result", torch.einsum("bqhe,hed->bqhd", z, sd[a + "W_O"]))
        return result.sum(-2)

    @property
    def W_U(self) -> torch.Tensor:
        """[d, v]: what the unembedding multiplies (tau times unit columns for unembed=bounded)."""
        W = self.sd["unembed.W_U"]
        if self.cfg.unembed != "bounded":
            return W
        return self.cfg.tau * W / torch.linalg.vector_norm(W, dim=0, keepdim=True)

    def _mlp(self, tokens: torch.Tensor) -> torch.Tensor:
        sd = self.sd
        e = self._at("hook_embed",
                     (sd["embed.W_E"] if "embed.W_E" in sd else torch.eye(self.cfg.d_vocab).double())[tokens[:, :-1]])
        x = self._at("hook_input", e.reshape(e.shape[0], -1))
        for i in range(self.cfg.n_layers):
            pre = self._at(f"layers.{i}.hook_pre", x @ sd[f"layers.{i}.W_in"] + sd.get(f"layers.{i}.b_in", 0.0))
            x = self._at(f"layers.{i}.hook_post", torch.relu(pre) if self.cfg.act_fn == "relu" else F.gelu(pre))
        logits = self._at("hook_logits", x @ sd["unembed.W_U"] + sd.get("unembed.b_U", 0.0))
        return torch.cat([logits.new_zeros(logits.shape[0], tokens.shape[1] - 1, logits.shape[-1]), logits[:, None]], 1)

    # ------------------------------------------------------------------ the stream as a sum
    def stream_at(self, point: tuple) -> torch.Tensor:
        """The stream a reader reads: resid_pre l, resid_mid l, or the last resid_post."""
        name = {"attn_in": "hook_resid_pre", "mlp_in": "hook_resid_mid"}.get(point[0])
        if name is None:
            return self.acts[f"blocks.{self.cfg.n_layers - 1}.hook_resid_post"]
        return self.acts[f"blocks.{point[1]}.{name}"]

    def _order(self, point: tuple) -> float:
        """Where a point lies along the stream (adds and reads interleaved)."""
        if point[0] == "embed":
            return 0
        if point[0] == "final":
            return 4 * self.cfg.n_layers + 1
        return 1 + 4 * point[1] + {"attn_in": 0, "attn": 1, "mlp_in": 2, "mlp": 3}[point[0]]

    def carry(self, x: torch.Tensor, entry: tuple, target: tuple, pos=None) -> torch.Tensor:
        """x (added to the stream at `entry`) carried through every norm between `entry` and
        `target`, with this pass's scales; `pos` selects the scales' position (like TL's pos_slice=-1)."""
        assert self._order(entry) < self._order(target)
        for after, prefix in self.stream_norms:
            if self._order(entry) <= self._order(after) < self._order(target):
                x = self._affine(x, prefix, pos, bias=False)
        return x

    def bias_to(self, target: tuple, pos=None, mlp_biases: bool = False) -> torch.Tensor:
        """The norms' biases (and with mlp_biases each b_out) carried to `target`: the stream
        there, less every component carried there."""
        total = torch.zeros(self.cfg.d_model, dtype=torch.float64)
        for l in range(self.cfg.n_layers) if mlp_biases else ():
            if self._order(("mlp", l)) < self._order(target) and f"blocks.{l}.mlp.b_out" in self.sd:
                total = total + self.carry(self.sd[f"blocks.{l}.mlp.b_out"], ("mlp", l), target, pos)
        for after, prefix in self.stream_norms:
            if self._order(after) < self._order(target) and prefix + ".b" in self.sd:
                next_add = self._next_add(after)
                b = self.sd[prefix + ".b"]
                carried = self._order(next_add) < self._order(target)
                total = total + (self.carry(b, next_add, target, pos) if carried else b)
        return total

    def _next_add(self, after: tuple) -> tuple:
        """The point right after the norm that follows the sum at `after` (where its bias enters)."""
        if after[0] == "embed":
            return ("attn", 0)
        return ("mlp", after[1]) if after[0] == "attn" else ("attn", after[1] + 1)

    def _affine(self, x: torch.Tensor, prefix: str, pos, bias: bool) -> torch.Tensor:
        s = self.acts[prefix + ".hook_scale"]
        s = s if pos is None else s[:, pos]
        if self.kind == "ln":
            x = x - x.mean(-1, keepdim=True)
        x = x / s
        if self.kind != "sphere":
            x = x * self.sd[prefix + ".w"]
        return x + self.sd[prefix + ".b"] if bias and self.kind == "ln" else x

    def reader_view(self, x: torch.Tensor, entry: tuple | None, target: tuple, pos=None) -> torch.Tensor:
        """TransformerLens's apply_ln_to_stack meaning: what x contributes to what the reader at
        `target` reads, less the reader norm's weight and bias (TL leaves those to the weights):
        carried through the stream's norms (entry None: x is a stream state), then centred (LN) and
        divided by the reader norm's cached scale on pre-norm models."""
        if entry is not None:
            x = self.carry(x, entry, target, pos)
        if self.post or self.kind == "none":
            return x
        prefix = {"attn_in": f"blocks.{target[-1]}.ln1",
                  "mlp_in": f"blocks.{target[-1]}.ln2"}.get(target[0], "ln_final")
        s = self.acts[prefix + ".hook_scale"]
        s = s if pos is None else s[:, pos]
        return (x - x.mean(-1, keepdim=True) if self.kind == "ln" else x) / s

    def direction(self, tokens: torch.Tensor, wrong: torch.Tensor | None = None) -> torch.Tensor:
        """[b, d]: the readout direction of each example's token (minus the wrong one's), with a
        pre-norm ln_final's weight (TL's tokens_to_residual_directions after folding)."""
        W = self.W_U if self.post or self.kind == "none" else self.W_U * self.sd["ln_final.w"][:, None]
        d = W[:, tokens].T
        return d if wrong is None else d - W[:, wrong].T

    def final_bias_term(self, direction: torch.Tensor) -> torch.Tensor:
        """[b]: what a pre-norm ln_final's bias adds along `direction` (TL keeps it out of the stack)."""
        if self.kind == "ln" and not self.post:
            return direction @ (self.sd["ln_final.b"] / self.sd["ln_final.w"])
        return torch.zeros(direction.shape[0], dtype=torch.float64)
