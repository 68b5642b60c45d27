"""The teacher-student models of the permutation-routing paper (Kashiwamura & Leleu 2026, arXiv
2605.09256; docs/VARIANTS.md): the perceptron and the committee machine, for task=teacher.

An input is an example id and `=` (groklens tasks are token sequences); the example's vector x
[N] is that row of the task's fixed Gaussian table (groklens.tasks.teacher_student), held as a
buffer, not a parameter (rebuilt from the config, as model=mlp's one-hot embedding).

    perceptron   h = x . w / sqrt(N)                       W [N, 1]
                 output sign(h)
    committee    h_k = x . w_k / sqrt(N), k = 1..K          W [N, K], K = d_mlp (odd)
                 s_k = sign(h_k)                            the hidden units
                 phi = sum_k s_k / sqrt(K)                  output sign(phi), the majority
Logits (0, h) (perceptron) or (0, phi) (committee) over the classes (-1, +1): the argmax is
the output sign, and the loss (cross-entropy or the perceptron criterion) reads the output
unit's field. Training mode and evaluation compute the same discrete outputs; the committee's
hidden sign passes gradients straight through where |h_k| <= 1 (the derivative of hardtanh:
the straight-through estimator of Bengio et al. 2013, in the clipped form of binarized
networks), a choice of ours: sign has no gradient, and the paper's committee-machine training
rule is not in what we could read. Init: every weight N(0, 1), so h ~ N(0, |x|^2 / N) ~ N(0, 1).
Hooks: hook_input [b, N], hook_pre [b, K] (fields h), hook_post [b, K] (perceptron: h;
committee: the signs s), hook_logits [b, 2].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from transformer_lens.hook_points import HookPoint

from groklens.models.hooked import HookedModel, ModelConfig


@dataclass
class TeacherStudentConfig(ModelConfig):
    """ModelConfig in TransformerLens words: d_model = N (input dimension), d_mlp = K hidden units
    (1 for the perceptron), d_vocab = the example ids and `=`, d_vocab_out = 2."""

    committee: bool = False

    @property
    def model_name(self) -> str:
        return "groklens-committee" if self.committee else "groklens-perceptron"


class StraightThroughSign(torch.autograd.Function):
    """sign(h) forward; backward the gradient where |h| <= 1, 0 elsewhere (hardtanh's derivative)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(h)
        return torch.sign(h)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (h,) = ctx.saved_tensors
        return grad * (h.abs() <= 1).to(grad.dtype)


class TeacherStudent(HookedModel):
    def __init__(self, cfg: TeacherStudentConfig, table: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("X", table, persistent=False)  # [examples, N]: the task's Gaussian vectors
        self.W = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.hook_input = HookPoint()  # [b, N]
        self.hook_pre = HookPoint()  # [b, K]
        self.hook_post = HookPoint()  # [b, K]
        self.hook_logits = HookPoint()  # [b, 2]
        self._held_rows: tuple[torch.Tensor, int, torch.Tensor] | None = None  # `_rows`
        with torch.no_grad():
            nn.init.normal_(self.W)
        self.setup()

    def _rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """The input rows X[tokens[:, 0]] [b, N]. Full-batch training passes the same token tensor
        at every step, so with no hook attached (a hook could edit them in place) and under autograd
        (training, not evaluation) the rows are read once and kept while that tensor is unchanged
        (its `_version`): a fifth of a routed perceptron's step (docs/PERFORMANCE.md)."""
        keep = torch.is_grad_enabled() and not self.hooks_attached()
        held = self._held_rows
        if keep and held is not None and held[0] is tokens and held[1] == tokens._version:
            return held[2]
        x = self.X.index_select(0, tokens[:, 0])
        self._held_rows = (tokens, tokens._version, x) if keep else None
        return x

    def forward(self, tokens: torch.Tensor | str | list[str], return_type: str | None = "logits",
                loss_per_token: bool = False):
        """[b, 2] (example id, =) -> logits [b, 2, 2], the classes (-1, +1) at the readout position 1."""
        tokens = self._as_tokens(tokens)
        # index_select and linear on W^T: the same values as X[ids] and x @ W (to float rounding),
        # 3-6x faster a routed step on this CPU, where MKL's x @ W with K = 3 columns and its
        # gradient x^T g run at ~1 GFLOP/s (docs/PERFORMANCE.md, 2026-12-06)
        x = self.hook_input(self._rows(tokens))
        n, k = self.cfg.d_model, self.cfg.d_mlp
        h = self.hook_pre(F.linear(x, self.W.t().contiguous()) / n**0.5)
        if self.cfg.committee:
            field = self.hook_post(StraightThroughSign.apply(h)).sum(-1) / k**0.5
        else:
            field = self.hook_post(h)[:, 0]
        logits = self.hook_logits(torch.stack([torch.zeros_like(field), field], dim=-1))
        out = torch.stack([torch.zeros_like(logits), logits], dim=1)
        return self.output(out, tokens, return_type, loss_per_token)


__all__ = ["StraightThroughSign", "TeacherStudent", "TeacherStudentConfig"]
