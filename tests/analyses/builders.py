"""Small models and task data for the probe and analysis tests (no training unless asked)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from groklens.config import RunConfig
from groklens.models import build_model
from groklens.models.hooked import HookedModel, ModelConfig
from groklens.tasks import TASKS, TaskData

TINY_MODEL = dict(d_model=16, n_heads=2, d_head=8, d_mlp=32)


def modular_data(p: int = 7, task: str = "add", train_frac: float = 0.5, **cfg) -> tuple[RunConfig, TaskData]:
    c = RunConfig.from_dict({"task": task, "p": p, "train_frac": train_frac, "device": "cpu", **TINY_MODEL, **cfg})
    return c, TASKS.get(task).build(c)


def tiny_transformer(p: int = 7, train_steps: int = 0, seed: int = 0, **cfg):
    """A tiny transformer on modular addition, optionally trained a few full-batch AdamW steps."""
    c, data = modular_data(p, seed=seed, **cfg)
    model = build_model(c, data)
    if train_steps:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=1.0, betas=(0.9, 0.98))
        x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
        for _ in range(train_steps):
            loss = nn.functional.cross_entropy(model(x)[:, data.readout_pos].double(), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        for prm in model.parameters():
            prm.grad = None
    return model.eval(), data


class NoAttention(HookedModel):
    """A hooked model without attention: logits = f(sum of token embeddings), for BadInput tests
    and for models whose loss depends on a hook's activation only through its norm."""

    def __init__(self, d_vocab: int, d_vocab_out: int, d: int = 6, n_ctx: int = 3, radial_only: bool = False):
        super().__init__()
        self.cfg = ModelConfig(d_model=d, n_heads=0, d_head=0, n_layers=1, d_mlp=d, d_vocab=d_vocab,
                               d_vocab_out=d_vocab_out, n_ctx=n_ctx)
        self.radial_only = radial_only
        self.W_E = nn.Parameter(torch.randn(d_vocab, d))
        self.w = nn.Parameter(torch.randn(d_vocab_out))
        self.c = nn.Parameter(torch.randn(d_vocab_out))
        self.W_U = nn.Parameter(torch.randn(d, d_vocab_out))
        self.hook_h = HookPoint()  # [b, p, d]
        self.setup()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, p] -> [b, p, v]
        h = self.hook_h(self.W_E[tokens] + self.W_E[tokens].sum(1, keepdim=True))
        if self.radial_only:  # the logits see h only through ||h||: every gradient is radial
            return h.norm(dim=-1, keepdim=True) * self.w + self.c
        return h @ self.W_U


def task_data(inputs: np.ndarray, labels: np.ndarray, mask: np.ndarray, d_vocab: int, d_vocab_out: int,
              readout_pos: int, train_frac: float = 0.5) -> TaskData:
    n = len(inputs)
    perm = np.random.default_rng(0).permutation(n)
    k = int(round(train_frac * n))
    return TaskData(
        inputs=torch.as_tensor(inputs, dtype=torch.long), labels=torch.as_tensor(labels, dtype=torch.long),
        train_idx=torch.as_tensor(np.sort(perm[:k])), test_idx=torch.as_tensor(np.sort(perm[k:])),
        readout_pos=readout_pos, informative_mask=torch.as_tensor(mask, dtype=torch.bool),
        d_vocab=d_vocab, d_vocab_out=d_vocab_out,
    )


def all_hooks_clear(model) -> bool:
    from groklens.probes.interventions import hook_count

    return hook_count(model) == 0 and all(not hp.fwd_hooks and not hp.bwd_hooks for hp in model.hook_dict.values())
