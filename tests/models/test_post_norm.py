"""norm_placement=post (the sphere paper's LayerNorm/RMSNorm baselines) and init_scheme=torch,
checked against an independent re-implementation of the official baselines' forward pass."""

import math

import pytest
import torch
import torch.nn.functional as F

from groklens.errors import BadInput
from groklens.models import build_model
from groklens.tasks import TASKS
from tests.helpers import tiny_config


def _model(**kw):
    cfg = tiny_config(**kw)
    data = TASKS.get(cfg.task).build(cfg)
    return build_model(cfg, data), data, cfg


def _reference_forward(model, tokens, norm: str, causal: bool) -> torch.Tensor:
    """The official baselines' forward, written from their description with plain tensor ops:
    h0 = N(E[x] + P), h1 = N(h0 + Attn(h0)), h2 = N(h1 + MLP(h1)), logits = W_U h2 (all positions)."""
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}

    def N(x, prefix):
        w = sd[prefix + ".w"]
        if norm == "ln":  # torch's LayerNorm: biased variance, eps 1e-5
            return F.layer_norm(x, (x.shape[-1],), w, sd[prefix + ".b"], eps=1e-5)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8) * w  # RMSNorm, eps 1e-8

    b, n = tokens.shape
    h = N(sd["embed.W_E"][tokens] + sd["pos_embed.W_pos"][:n], "ln_embed")
    for l in range(model.cfg.n_layers):
        a = f"blocks.{l}.attn."
        heads = []
        for i in range(model.cfg.n_heads):
            q, k, v = (h @ sd[a + w][i] for w in ("W_Q", "W_K", "W_V"))
            scores = q @ k.transpose(-1, -2) / math.sqrt(model.cfg.d_head)
            if causal:
                scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
            heads.append(scores.softmax(-1) @ v @ sd[a + "W_O"][i])
        h = N(h + sum(heads), f"blocks.{l}.ln1")
        m = f"blocks.{l}.mlp."
        pre = h @ sd[m + "W_in"] + sd.get(m + "b_in", 0)
        h = N(h + torch.relu(pre) @ sd[m + "W_out"] + sd.get(m + "b_out", 0), f"blocks.{l}.ln2")
    return h @ sd["unembed.W_U"]


@pytest.mark.parametrize("norm", ["ln", "rms"])
@pytest.mark.parametrize("causal", [False, True])
def test_post_norm_equals_an_independent_forward_pass(norm, causal):
    model, data, _ = _model(norm=norm, norm_placement="post", n_layers=2, causal=causal, mlp_bias=True)
    with torch.no_grad():  # trained-looking norms: not all ones and zeros
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b")):
                p.add_(0.3 * torch.randn_like(p))
    x = data.inputs[:9]
    ours = model(x).double()
    ref = _reference_forward(model, x, norm, causal)
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4)
    # the readout fast path gives the same logits at the readout position
    last = slice(data.readout_pos, data.readout_pos + 1)
    assert torch.allclose(model(x, readout=last), model(x)[:, last], atol=1e-5)


def test_post_norm_names_and_eps():
    model, data, _ = _model(norm="rms", norm_placement="post", n_layers=2)
    names = {n for n, _ in model.named_parameters()}
    assert {"ln_embed.w", "blocks.0.ln1.w", "blocks.0.ln2.w", "blocks.1.ln2.w"} <= names
    assert not any(n.startswith("ln_final") for n in names)
    assert model.ln_embed.eps == 1e-8 and model.blocks[0].ln1.eps == 1e-8
    _, cache = model.run_with_cache(data.inputs[:4])
    for hook in ("ln_embed.hook_normalized", "blocks.1.ln2.hook_scale", "blocks.0.ln1.hook_normalized"):
        assert hook in cache.keys()
    # resid_mid/resid_post are the normalized sums: RMS 1 per position before the weight (all ones here)
    rms = cache["blocks.0.hook_resid_mid"].pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones_like(rms), atol=1e-4)
    ln, _, _ = _model(norm="ln", norm_placement="post")
    assert ln.ln_embed.eps == 1e-5 and hasattr(ln.ln_embed, "b")
    pre, _, _ = _model(norm="rms")
    assert pre.ln_final.eps == 1e-5 and not hasattr(pre, "ln_embed")  # pre-norm unchanged


@pytest.mark.parametrize("bad",
                         [dict(norm="none"), dict(norm="sphere", unembed="bounded"), dict(model="mlp", norm="none")])
def test_post_placement_needs_a_layernorm_or_rmsnorm(bad):
    with pytest.raises(BadInput, match="norm_placement"):
        tiny_config(norm_placement="post", **bad)


def test_torch_init_matches_pytorch_module_defaults():
    """Each tensor's distribution is PyTorch's for the module the official code builds: checked
    by bounds and moments on a model wide enough for the statistics to be tight."""
    model, _, _ = _model(norm="ln", norm_placement="post", init_scheme="torch", d_model=128, n_heads=4,
                         d_head=32, d_mlp=512, mlp_bias=True, p=97)
    for name in ("embed.W_E", "pos_embed.W_pos"):  # nn.Embedding: N(0, 1)
        w = getattr(model, name.split(".")[0]).__getattr__(name.split(".")[1]).detach()
        assert abs(w.std().item() - 1.0) < 0.1 and abs(w.mean().item()) < 0.1
    blk = model.blocks[0]
    fan_ins = {"W_Q": 128, "W_K": 128, "W_V": 128, "W_O": 128}
    for name, fan_in in fan_ins.items():
        w = getattr(blk.attn, name).detach()
        bound = 1 / math.sqrt(fan_in)
        assert w.abs().max() <= bound and w.abs().max() > 0.95 * bound
        assert abs(w.std().item() - bound / math.sqrt(3)) < 0.05 * bound  # U(-b, b) has std b / sqrt(3)
    for t, fan_in in ((blk.mlp.W_in, 128), (blk.mlp.b_in, 128), (blk.mlp.W_out, 512), (blk.mlp.b_out, 512),
                      (model.unembed.W_U, 128)):
        bound = 1 / math.sqrt(fan_in)
        assert t.abs().max() <= bound and t.abs().max() > 0.9 * bound
    assert torch.equal(blk.ln1.w, torch.ones_like(blk.ln1.w)) and torch.equal(blk.ln1.b, torch.zeros_like(blk.ln1.b))
    tl, _, _ = _model(norm="ln", d_model=128, n_heads=4, d_head=32, d_mlp=512, p=97)
    assert abs(tl.embed.W_E.std().item() - 0.8 / math.sqrt(128)) < 0.01  # the TL default is unchanged


def test_torch_init_keeps_the_fourier_embedding():
    model, _, cfg = _model(norm="sphere", unembed="bounded", init="fourier", init_scheme="torch",
                           fourier_freqs="1 2", d_model=16)
    x = torch.arange(cfg.p, dtype=torch.float64)
    assert torch.allclose(model.embed.W_E[: cfg.p, 2].double(), torch.cos(2 * math.pi * 2 * x / cfg.p), atol=1e-6)
