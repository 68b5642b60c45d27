"""The MLP of the scaling-law and activation-norm studies, with TransformerLens hooks.

The operand tokens (every position but the last, which is the readout `=` token) are embedded,
learned (W_E [d_vocab, d_model]) or one-hot (a fixed identity, no parameter: over every token, or
over the residues 0..p-1 only with onehot_residues), concatenated, and
passed through n_layers hidden layers of width d_mlp:
    x0         = concat_j E[tokens_j]                    j = 0 .. n_ctx-2, [b, (n_ctx-1) e]
    pre_i      = x_i W_in^(i) (+ b_in^(i))               [b, m]
    x_{i+1}    = act(pre_i)                              [b, m]
    logits     = x_L W_U (+ b_U)                         [b, v]
The forward returns [b, n_ctx, v] as every groklens model does: the logits sit at the readout
position (the last), the other positions hold zeros (the MLP makes no prediction there).
Hooks: hook_embed [b, n_ctx-1, e], hook_input [b, (n_ctx-1) e], layers.{i}.hook_pre / hook_post
[b, m], hook_logits [b, v].
With no hook attached the first layer reads rows of a table instead of multiplying the batch's
concatenated embeddings (`MLP.lean_path`): x0 W_in = sum_j T_j[tokens_j], where T_j = E W_in^(j)
[d_vocab, m] is operand j's block of W_in seen through the embedding. One-hot: T_j is that block
itself, the same forward to the bit (the other terms are exact zeros). Learned: T_j costs
d_vocab e m multiply-adds against the batch's b e m, so a full batch of b >> d_vocab pays a
fraction of the first layer's products and of their gradients; the sums run in another order
(float32 rounding). The trainer's regularizer terms read the hidden layers through
`site_capture` (below), not hooks, so their runs keep this path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformer_lens.hook_points import HookPoint

from groklens.models.hooked import HookedModel, ModelConfig


@dataclass
class MLPConfig(ModelConfig):
    """ModelConfig in TransformerLens words; n_layers counts hidden layers, d_model is the width of
    a learned embedding (the one-hot width with one-hot: d_vocab, or p residues), d_mlp the hidden width."""

    embed: str = "learned"  # learned | onehot | onehot_residues
    unembed_bias: bool = True  # with mlp_bias: b_U too (False: the hidden layers' biases only)

    @property
    def d_in(self) -> int:
        return (self.n_ctx - 1) * self.d_model


class MLPLayer(nn.Module):
    def __init__(self, d_in: int, d_out: int, act_fn: str, bias: bool):
        super().__init__()
        self.act = {"relu": F.relu, "gelu": F.gelu}[act_fn]
        self.W_in = nn.Parameter(torch.empty(d_in, d_out))
        self.b_in = nn.Parameter(torch.empty(d_out)) if bias else None
        self.hook_pre = HookPoint()  # [b, m]
        self.hook_post = HookPoint()  # [b, m]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = x @ self.W_in
        if self.b_in is not None:
            pre = pre + self.b_in
        return self.hook_post(self.act(self.hook_pre(pre)))


class MLPUnembed(nn.Module):
    def __init__(self, d_in: int, d_vocab_out: int, bias: bool):
        super().__init__()
        self.W_U = nn.Parameter(torch.empty(d_in, d_vocab_out))
        self.b_U = nn.Parameter(torch.empty(d_vocab_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.W_U
        return out + self.b_U if self.b_U is not None else out


class OperandEmbed(nn.Module):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        if cfg.embed == "learned":
            self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))
        else:  # one-hot: a fixed identity d_model wide, not a parameter (and not in the state dict)
            self.register_buffer("W_E", torch.eye(cfg.d_model), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, j] -> [b, j, e]
        return self.W_E[tokens]


class MLP(HookedModel):
    def __init__(self, cfg: MLPConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = OperandEmbed(cfg)
        self.hook_embed = HookPoint()  # [b, n_ctx-1, e]
        self.hook_input = HookPoint()  # [b, (n_ctx-1) e]
        widths = [cfg.d_in] + [cfg.d_mlp] * cfg.n_layers
        self.layers = nn.ModuleList(
            [MLPLayer(widths[i], widths[i + 1], cfg.act_fn, cfg.mlp_bias) for i in range(cfg.n_layers)]
        )
        self.unembed = MLPUnembed(cfg.d_mlp, cfg.d_vocab_out, cfg.mlp_bias and cfg.unembed_bias)
        self.hook_logits = HookPoint()  # [b, v]
        self.init_weights()
        self.setup()

    @torch.no_grad()
    def init_weights(self) -> None:
        """PyTorch's defaults: nn.Embedding N(0, 1); nn.Linear weights and biases U(+-1/sqrt(fan_in))."""
        if isinstance(self.embed.W_E, nn.Parameter):
            nn.init.normal_(self.embed.W_E)
        for layer in [*self.layers, self.unembed]:
            w = layer.W_in if isinstance(layer, MLPLayer) else layer.W_U
            bound = 1.0 / w.shape[0] ** 0.5  # fan_in = rows: our weights are [d_in, d_out]
            nn.init.uniform_(w, -bound, bound)
            b = layer.b_in if isinstance(layer, MLPLayer) else layer.b_U
            if b is not None:
                nn.init.uniform_(b, -bound, bound)

    # With no hook attached, the first layer from rows of a table (the module docstring): at
    # Prieto et al.'s one-hot paper scale (5,107 rows, 226 -> 200) 0.81x the step's CPU time, at
    # the learned-embedding p=113 MLP (3,830 rows, 2 x 128 -> 256) about 0.72x (docs/PERFORMANCE.md).
    # False: the concatenated matmul (the path every run took before the tables).
    lean_path: bool = True
    # A dict {site: None, ...} set by the trainer for one call (trainers/step.py `model_capture`),
    # of sites `can_capture` accepts (each hidden layer's hook_post): each is stored in it as the
    # hook would see it, in the graph, so a regularizer term (the activation-norm penalty, GeomDR)
    # needs no hook, whose presence would force the concatenated matmul.
    site_capture: dict | None = None

    def can_capture(self, site: str) -> bool:
        """True for a site `site_capture` can record: a hidden layer's output (hook_post)."""
        return bool(re.fullmatch(r"layers\.\d+\.hook_post", site)) and int(site.split(".")[1]) < len(self.layers)

    def _first_layer_rows(self, operands: torch.Tensor) -> torch.Tensor:
        """The first layer's output on operands [b, j]: act(sum_j T_j[t_j] + b_in), T_j operand j's
        block of W_in (one-hot) or E times it (learned): [j, V, m] stacked, read as j V rows."""
        layer, e, j = self.layers[0], self.cfg.d_model, operands.shape[1]
        blocks = layer.W_in.view(j, e, layer.W_in.shape[1])
        table = blocks if self.cfg.embed != "learned" else self.embed.W_E @ blocks  # [j, V, m]
        v = table.shape[1]
        ids = operands + torch.arange(j, device=operands.device) * v
        # a token outside the table fails as the embedding's index does (IndexError), instead of
        # reading the next operand's rows; no host sync, so it holds under vmap
        ids = ids.masked_fill((operands < 0) | (operands >= v), j * v)
        pre = F.embedding(ids, table.reshape(j * v, -1)).sum(1)
        return layer.act(pre if layer.b_in is None else pre + layer.b_in)

    def forward(self, tokens: torch.Tensor | str | list[str], return_type: str | None = "logits",
                loss_per_token: bool = False):
        """[b, n_ctx] -> logits [b, n_ctx, v] (or TL's return_type loss | both | None)."""
        tokens = self._as_tokens(tokens)
        capture = self.site_capture
        lean = self.lean_path and len(self.layers) > 0 and not self.hooks_attached()
        if not lean:
            e = self.hook_embed(self.embed(tokens[:, :-1]))
            x = self.hook_input(e.reshape(e.shape[0], -1))
        for i, layer in enumerate(self.layers):
            x = self._first_layer_rows(tokens[:, :-1]) if lean and i == 0 else layer(x)
            if capture is not None and f"layers.{i}.hook_post" in capture:
                capture[f"layers.{i}.hook_post"] = x
        logits = self.hook_logits(self.unembed(x))
        zeros = logits.new_zeros(logits.shape[0], tokens.shape[1] - 1, logits.shape[-1])
        return self.output(torch.cat([zeros, logits[:, None]], dim=1), tokens, return_type, loss_per_token)

    @property
    def W_E(self) -> torch.Tensor:  # [d_vocab, d_model]
        return self.embed.W_E

    @property
    def W_U(self) -> torch.Tensor:  # [d_mlp, d_vocab_out]: reads the last hidden layer
        return self.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.unembed.b_U if self.unembed.b_U is not None else self.W_U.new_zeros(self.cfg.d_vocab_out)
