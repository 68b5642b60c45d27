"""Grokfast's official setup (ironjr/grokfast main.py and grokfast.py) against groklens' pieces of it.

The references here are re-typings of their code (Block / Decoder with nn.MultiheadAttention,
multiplication_mod_p_data, gradfilter_ma, their training loop with torch.optim.Adam and LambdaLR),
not groklens code: the model pieces are checked against an independent forward pass, the MA filter
against their gradfilter_ma, and a short training run against their loop."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
import torch
from torch import nn

from groklens.config import RunConfig
from groklens.tasks import TASKS
from groklens.models import build_model
from groklens.trainers.step import draw_batch


# ---------------------------------------------------------------------- their code, re-typed
class Block(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, num_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))

    def forward(self, x):
        attn_mask = torch.full((len(x), len(x)), -float("Inf"), device=x.device, dtype=x.dtype)
        attn_mask = torch.triu(attn_mask, diagonal=1)
        x = self.ln_1(x)
        a, _ = self.attn(x, x, x, attn_mask=attn_mask, need_weights=False)
        x = x + a
        m = self.mlp(self.ln_2(x))
        return x + m


class Decoder(nn.Module):
    def __init__(self, dim=128, num_layers=2, num_heads=4, num_tokens=97, seq_len=5):
        super().__init__()
        self.token_embeddings = nn.Embedding(num_tokens, dim)
        self.position_embeddings = nn.Embedding(seq_len, dim)
        self.layers = nn.ModuleList([Block(dim, num_heads) for _ in range(num_layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_tokens, bias=False)

    def forward(self, x):  # x: [seq, batch]
        h = self.token_embeddings(x)
        positions = torch.arange(x.shape[0], device=x.device).unsqueeze(-1)
        h = h + self.position_embeddings(positions).expand_as(h)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.ln_f(h))


def multiplication_mod_p_data(p, eq_token, op_token):
    x = torch.arange(p)
    y = torch.arange(1, p)
    x, y = torch.cartesian_prod(x, y).T
    eq = torch.ones_like(x) * eq_token
    op = torch.ones_like(x) * op_token
    return torch.stack([x, op, y, eq, x * y % p])


def gradfilter_ma(m, grads=None, window_size=100, lamb=5.0, filter_type="mean", warmup=True, trigger=False):
    if grads is None:
        grads = {n: deque(maxlen=window_size) for n, p in m.named_parameters()
                 if p.requires_grad and p.grad is not None}
    for n, p in m.named_parameters():
        if p.requires_grad and p.grad is not None:
            grads[n].append(p.grad.data.detach())
            if not warmup or len(grads[n]) == window_size and not trigger:
                avg = sum(grads[n]) / len(grads[n]) if filter_type == "mean" else sum(grads[n])
                p.grad.data = p.grad.data + avg * lamb
    return grads


# ---------------------------------------------------------------------- helpers
def official_cfg(**over) -> RunConfig:
    base = dict(task="mul", p=7, op_token=True, nonzero_b=True, train_frac=0.5, n_layers=2, d_model=16, n_heads=4,
                d_head=4, d_mlp=64, act_fn="gelu", mlp_bias=True, norm="ln", norm_placement="in_stream",
                init_scheme="torch_mha", causal=True, optimizer="adam", lr=1e-3, betas=(0.9, 0.98), warmup_steps=10,
                batch_size=0, weight_decay=0.0, steps=40, eval_every=10, checkpoint_every=10, device="cpu")
    return RunConfig.from_dict({**base, **over})


@torch.no_grad()
def copy_into_official(model, cfg: RunConfig) -> Decoder:
    """Their Decoder holding our model's weights (attention biases 0: ours has none)."""
    d, h, e = cfg.d_model, cfg.n_heads, cfg.d_head
    ref = Decoder(dim=d, num_layers=cfg.n_layers, num_heads=h, num_tokens=cfg.p + 2, seq_len=5)
    ref.token_embeddings.weight.copy_(model.embed.W_E)
    ref.position_embeddings.weight.zero_()
    ref.position_embeddings.weight[:4].copy_(model.pos_embed.W_pos)
    for blk, ours in zip(ref.layers, model.blocks):
        a = ours.attn
        blk.attn.in_proj_weight.copy_(torch.cat([w.permute(0, 2, 1).reshape(h * e, d) for w in (a.W_Q, a.W_K, a.W_V)]))
        blk.attn.in_proj_bias.zero_()
        blk.attn.out_proj.weight.copy_(a.W_O.reshape(h * e, d).T)
        blk.attn.out_proj.bias.zero_()
        blk.ln_1.weight.copy_(ours.ln1.w)
        blk.ln_1.bias.copy_(ours.ln1.b)
        blk.ln_2.weight.copy_(ours.ln2.w)
        blk.ln_2.bias.copy_(ours.ln2.b)
        blk.mlp[0].weight.copy_(ours.mlp.W_in.T)
        blk.mlp[0].bias.copy_(ours.mlp.b_in)
        blk.mlp[2].weight.copy_(ours.mlp.W_out.T)
        blk.mlp[2].bias.copy_(ours.mlp.b_out)
    ref.ln_f.weight.copy_(model.ln_final.w)
    ref.ln_f.bias.copy_(model.ln_final.b)
    ref.head.weight.copy_(model.unembed.W_U.T)
    return ref


# ---------------------------------------------------------------------- the data
def test_task_is_their_data():
    cfg = official_cfg(p=11)
    data = TASKS.get("mul").build(cfg)
    theirs = multiplication_mod_p_data(11, eq_token=11, op_token=12)  # eq_token = p, op_token = p + 1
    ours = torch.cat([data.inputs, data.labels[:, None]], 1)
    assert sorted(map(tuple, ours.tolist())) == sorted(map(tuple, theirs.T.tolist()))
    assert (data.d_vocab, data.d_vocab_out, data.readout_pos) == (13, 13, 3)  # their head covers p + 2 tokens
    assert len(data.train_idx) == 11 * 10 // 2  # split(N // 2): half of the pairs
    assert data.informative_mask[0].tolist() == [True, False, True, False]


# ---------------------------------------------------------------------- the model
@pytest.mark.parametrize("hooked", [False, True])
def test_forward_equals_their_decoder(hooked):
    cfg = official_cfg()
    data = TASKS.get("mul").build(cfg)
    model = build_model(cfg, data).eval()
    ref = copy_into_official(model, cfg).eval()
    x = data.inputs
    want = ref(x.T).transpose(0, 1)  # their [seq, batch, vocab]
    if hooked:  # the explicit path, every hook firing
        with model.hooks(fwd_hooks=[("hook_embed", lambda t, hook: None)]):
            got = model(x)
    else:  # the training path (lean, table for the first block) at the readout
        got = model(x, readout=slice(3, 4))
        want = want[:, 3:4]
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_torch_mha_init_is_xavier_on_the_stacked_in_proj():
    cfg = official_cfg(d_model=128, n_heads=4, d_head=32, d_mlp=512, p=97)
    model = build_model(cfg, TASKS.get("mul").build(cfg))
    bound = math.sqrt(6 / (128 + 3 * 128))  # xavier_uniform_ of in_proj_weight [384, 128]
    ref = nn.MultiheadAttention(128, 4)
    for w in (model.blocks[0].attn.W_Q, model.blocks[0].attn.W_K, model.blocks[0].attn.W_V):
        assert w.abs().max() <= bound and w.abs().max() > 0.99 * bound
        assert w.std().item() == pytest.approx(ref.in_proj_weight.std().item(), rel=0.05)
    lin = 1 / math.sqrt(128)  # out_proj and the MLP's first Linear keep nn.Linear's kaiming-uniform bound
    assert lin * 0.99 < model.blocks[0].attn.W_O.abs().max() <= lin
    assert model.embed.W_E.std().item() == pytest.approx(1.0, rel=0.05)  # nn.Embedding: N(0, 1)


# ---------------------------------------------------------------------- the MA filter
def test_ma_filter_equals_their_gradfilter_ma():
    from groklens.trainers.optim import stack_of_one
    from groklens.trainers.regularizers import GrokfastMA

    torch.manual_seed(0)
    cfg = official_cfg(grokfast_filter="ma", grokfast_window=3, grokfast_lambda=5.0)
    net = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    params = stack_of_one(dict(net.named_parameters()))
    ours = GrokfastMA([cfg], None, None, params)
    theirs = None
    for _ in range(7):
        raw = {n: torch.randn_like(p) for n, p in net.named_parameters()}
        for n, p in net.named_parameters():
            p.grad = raw[n].clone()
        theirs = gradfilter_ma(net, grads=theirs, window_size=3, lamb=5.0)
        grads = stack_of_one({n: g.clone() for n, g in raw.items()})
        ours.transform(params, grads)
        for n, p in net.named_parameters():
            torch.testing.assert_close(grads[n][0], p.grad, atol=0, rtol=0)


def test_training_equals_their_loop_with_ma():
    """Full-batch training (so the batch order plays no part) with Adam's coupled L2 decay, the
    LambdaLR warm-up and Grokfast-MA, against their loop driving torch.optim.Adam on our model."""
    from groklens.models.losses import task_loss
    from groklens.trainers.single import SingleRun

    cfg = official_cfg(grokfast_filter="ma", grokfast_window=4, grokfast_lambda=5.0, weight_decay=0.01, steps=30)
    data = TASKS.get("mul").build(cfg)
    run = SingleRun(cfg, data)
    model = build_model(cfg, data)
    model.load_state_dict(run.model.state_dict())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda update: 1 if update > 10 else update / 10)
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
    grads = None
    for step in range(cfg.steps):
        run.train_step(step)
        loss = task_loss(model(x, readout=slice(3, 4))[:, 0], y)
        model.zero_grad()
        loss.backward()
        grads = gradfilter_ma(model, grads=grads, window_size=4, lamb=5.0)
        opt.step()
        sched.step()
    for (n, a), b in zip(run.model.named_parameters(), model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=n)


# ---------------------------------------------------------------------- epoch batches
def test_epoch_order_covers_the_training_set_each_epoch():
    cfg = official_cfg(batch_size=4, batch_order="epoch")
    n, gen = 21, torch.Generator().manual_seed(1)
    per_epoch = 6  # ceil(21 / 4): five batches of 4 and one of 1, as torch.split
    for epoch in range(3):
        picks = [draw_batch(n, 4, gen, cfg, epoch * per_epoch + k) for k in range(per_epoch)]
        assert [len(p) for p in picks] == [4, 4, 4, 4, 4, 1]
        assert sorted(torch.cat(picks).tolist()) == list(range(n))
    first = torch.cat([draw_batch(n, 4, gen, cfg, k) for k in range(per_epoch)])
    second = torch.cat([draw_batch(n, 4, gen, cfg, per_epoch + k) for k in range(per_epoch)])
    assert not torch.equal(first, second)  # reshuffled every epoch
    assert np.array_equal(draw_batch(n, 4, gen, cfg, 7).numpy(), draw_batch(n, 4, gen, cfg, 7).numpy())  # no state


def test_resume_is_exact_with_ma_and_epoch_batches(tmp_path):
    from groklens.checkpoints import Trajectory
    from groklens.trainers.train import resume, train
    from tests.helpers import train_interrupted

    cfg = official_cfg(grokfast_filter="ma", grokfast_window=3, grokfast_lambda=5.0, batch_size=8,
                       batch_order="epoch", steps=40, checkpoint_every=10)
    train(cfg, tmp_path / "straight.h5", progress=False)
    train_interrupted(cfg, tmp_path / "resumed.h5", at_step=25)
    resume(tmp_path / "resumed.h5", progress=False)
    a, b = Trajectory(tmp_path / "straight.h5"), Trajectory(tmp_path / "resumed.h5")
    assert list(a.steps) == list(b.steps) == [0, 10, 20, 30, 40]
    for name in a.param_names:
        assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name)), name
    assert np.array_equal(a.metrics["grokfast_ma_norm"], b.metrics["grokfast_ma_norm"], equal_nan=True)
