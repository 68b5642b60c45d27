"""The transformer's HookedTransformer-style weight surface (docs/TRANSFORMERLENS.md): stacked
weights and biases with TransformerLens's shapes, QK / OV as FactoredMatrix, composition scores,
the readout directions, and the two weight processings TL users rely on, fold_layer_norm and
center_unembed. A mixin of `Transformer`; nothing here runs in the forward pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from groklens.models.tl_errors import TLUnsupported


class TransformerLensWeights:
    """Stacked over layers with HookedTransformer's shapes. The model has no attention biases and
    (without mlp_bias) no MLP biases: those are zeros, which is what they add, until
    fold_layer_norm moves a LayerNorm's bias into them."""

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
    b_Q = property(lambda self: self._stack(lambda b: b.attn.b_Q))  # [l, h, e]
    b_K = property(lambda self: self._stack(lambda b: b.attn.b_K))
    b_V = property(lambda self: self._stack(lambda b: b.attn.b_V))
    b_O = property(lambda self: self._stack(lambda b: b.attn.b_O))  # [l, d]
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
        """Zeros, or what fold_layer_norm moved here from ln_final's bias."""
        return self.unembed.folded_b_U if self.unembed.folded else self.unembed.W_U.new_zeros(self.cfg.d_vocab_out)

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

    def all_composition_scores(self, mode: str) -> torch.Tensor:
        """HookedTransformer's composition scores [l, h, l, h] (Elhage et al. 2021): ||W_OV(A) M(B)||_F /
        (||W_OV(A)||_F ||M(B)||_F) for head A in an earlier layer than head B, with M = W_QK (mode Q),
        W_QK^T (K) or W_OV (V); 0 elsewhere. Weights only, as in TL: norms between A and B are not in it."""
        from transformer_lens.utilities import composition_scores

        if mode not in ("Q", "K", "V"):
            raise TLUnsupported(f"all_composition_scores: mode must be 'Q', 'K' or 'V', not {mode!r}")
        left = self.OV
        right = {"Q": lambda: self.QK, "K": lambda: self.QK.T, "V": lambda: left}[mode]()
        scores = composition_scores(left, right, broadcast_dims=True)
        layer = torch.arange(self.cfg.n_layers, device=scores.device)
        mask = layer[:, None, None, None] < layer[None, None, :, None]
        return torch.where(mask, scores, torch.zeros_like(scores))

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
        LN/RMS (what TransformerLens returns after fold_ln). [*tokens.shape, d_model]. Tokens name the
        output classes; an input-only token (the task's '=') has no logit."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        tokens = torch.as_tensor(tokens, device=self.W_E.device)
        n = self.cfg.d_vocab_out
        if tokens.numel() and (int(tokens.max()) >= n or int(tokens.min()) < 0):
            bad = int(tokens.max()) if int(tokens.max()) >= n else int(tokens.min())
            raise TLUnsupported(f"tokens_to_residual_directions: token {bad} is not one of the {n} output classes "
                                f"(0..{n - 1}): an input-only token such as '=' has no logit")
        W = self.W_U
        if hasattr(self.ln_final, "w"):
            W = W * self.ln_final.w[:, None]
        return W[:, tokens].movedim(0, -1)

    def tl_parameters(self) -> dict[str, torch.Tensor]:
        """TransformerLens-named parameters (what SVDInterpreter reads)."""
        if self.cfg.d_vocab != self.cfg.d_vocab_out:
            raise TLUnsupported(f"SVDInterpreter assumes d_vocab == d_vocab_out, but this task has {self.cfg.d_vocab} "
                                f"input tokens and {self.cfg.d_vocab_out} classes; use model.OV[l, h].svd() with "
                                "model.W_U")
        return {**dict(self.named_parameters()), "unembed.W_U": self.W_U}

    def _fold_refusal(self) -> str | None:
        cfg = self.cfg
        if cfg.norm == "sphere":
            return "the sphere projection has no weight or bias, and it follows every residual sum"
        if cfg.norm_placement == "post":
            return ("a norm after the residual sums has no matrix of its own to fold into (the stream itself carries "
                    "its weight)")
        if cfg.norm_placement == "in_stream":
            return ("ln1's output is the residual stream itself (norm_placement=in_stream), not only the attention's "
                    "input")
        if self.unembed.bounded:
            return "unembed=bounded normalizes W_U's columns, so ln_final's weight cannot move into it"
        return None

    @torch.no_grad()
    def fold_layer_norm(self) -> None:
        """TransformerLens's fold_layer_norm (fold_biases=True, center_weights=True for LayerNorm;
        neither for RMSNorm): each pre-norm's weight moves into the matrices that read its output
        (W_Q, W_K, W_V; W_in; W_U), its bias into their biases (b_Q, b_K, b_V; b_in; b_U), and for
        LayerNorm those matrices are centred along d_model (the normalized input has mean zero, so
        nothing changes); the norms keep weight 1 and bias 0 (TL's LNPre / RMSPre). The logits do
        not change, and a cached-scale logit lens times W_U (+ b_U) reproduces them."""
        if self.cfg.norm == "none":
            return
        why = self._fold_refusal()
        if why is not None:
            raise TLUnsupported(f"fold_layer_norm: {why}; read the norms' hooks (hook_scale, hook_normalized) instead")
        centre = self.cfg.norm == "ln"
        for block in self.blocks:
            attn, ln1 = block.attn, block.ln1
            biases = {w: attn._bias(w) + (torch.einsum("d,hde->he", ln1.b, getattr(attn, "W_" + w)) if centre else 0)
                      for w in ("Q", "K", "V")}
            for w in ("Q", "K", "V"):
                W = getattr(attn, "W_" + w)
                W.mul_(ln1.w[None, :, None])
                if centre:
                    W.sub_(W.mean(1, keepdim=True))
                attn.register_buffer("folded_b_" + w, biases[w])
            attn.folded = True
            mlp, ln2 = block.mlp, block.ln2
            if centre:
                b_in = ln2.b @ mlp.W_in
                if mlp.b_in is None:
                    mlp.b_in = nn.Parameter(b_in)
                else:
                    mlp.b_in.add_(b_in)
            mlp.W_in.mul_(ln2.w[:, None])
            if centre:
                mlp.W_in.sub_(mlp.W_in.mean(0, keepdim=True))
            _unit(ln1)
            _unit(ln2)
        self._fold_final(centre)

    def _fold_final(self, centre: bool) -> None:
        unembed, ln = self.unembed, self.ln_final
        b_U = self.b_U + (ln.b @ unembed.W_U if centre else 0)
        unembed.W_U.mul_(ln.w[:, None])
        if centre:
            unembed.W_U.sub_(unembed.W_U.mean(0, keepdim=True))
        unembed.register_buffer("folded_b_U", b_U)
        unembed.folded = True
        _unit(ln)

    @torch.no_grad()
    def center_unembed(self) -> None:
        """TransformerLens's center_unembed: W_U (and b_U) minus their mean over the classes. Every
        logit of a position moves by the same amount, so the softmax and the cross-entropy do not
        change (the logits themselves do)."""
        if self.unembed.bounded:
            raise TLUnsupported("center_unembed: unembed=bounded gives tau times unit columns of W_U; centring the "
                                "parameter would change every logit differently; its logits are bounded already")
        if self.task_loss_name == "stablemax":
            raise TLUnsupported("center_unembed: the run's stablemax loss is not invariant to a shift of the logits, "
                                "so centring would change the model's loss")
        W = self.unembed.W_U
        W.sub_(W.mean(-1, keepdim=True))
        if self.unembed.folded:
            self.unembed.folded_b_U.sub_(self.unembed.folded_b_U.mean())


def _unit(norm: nn.Module) -> None:
    norm.w.fill_(1.0)
    if getattr(norm, "b", None) is not None:
        norm.b.fill_(0.0)
