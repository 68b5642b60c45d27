import math

import torch
from transformer_lens import ActivationCache

from groklens.config import RunConfig
from groklens.models import build_model
from groklens.tasks import TASKS
from tests.helpers import tiny_config

EXPECTED_HOOKS = [
    "hook_embed", "hook_pos_embed", "blocks.{l}.hook_resid_pre", "blocks.{l}.attn.hook_q",
    "blocks.{l}.attn.hook_k", "blocks.{l}.attn.hook_v", "blocks.{l}.attn.hook_attn_scores",
    "blocks.{l}.attn.hook_pattern", "blocks.{l}.attn.hook_z", "blocks.{l}.hook_attn_out",
    "blocks.{l}.hook_resid_mid", "blocks.{l}.mlp.hook_pre", "blocks.{l}.mlp.hook_post",
    "blocks.{l}.hook_mlp_out", "blocks.{l}.hook_resid_post",
]


def _model(**kw):
    cfg = tiny_config(**kw)
    data = TASKS.get(cfg.task).build(cfg)
    return build_model(cfg, data), data


def test_default_config_is_nandas_canonical_model():
    cfg = RunConfig()
    assert (cfg.task, cfg.p, cfg.train_frac, cfg.batch_size) == ("add", 113, 0.3, 0)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp) == (1, 128, 4, 32, 512)
    assert (cfg.act_fn, cfg.norm, cfg.lr, cfg.weight_decay, tuple(cfg.betas)) == ("relu",
                                                                                  "none", 1e-3, 1.0, (0.9, 0.98))
    model = build_model(cfg, TASKS.get("add").build(cfg))
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes == {
        "embed.W_E": (114, 128), "pos_embed.W_pos": (3, 128),
        "blocks.0.attn.W_Q": (4, 128, 32), "blocks.0.attn.W_K": (4, 128, 32),
        "blocks.0.attn.W_V": (4, 128, 32), "blocks.0.attn.W_O": (4, 32, 128),
        "blocks.0.mlp.W_in": (128, 512), "blocks.0.mlp.W_out": (512, 128), "unembed.W_U": (128, 113),
    }


def test_run_with_cache_returns_activation_cache_with_every_hook():
    model, data = _model(n_layers=2, norm="ln")
    logits, cache = model.run_with_cache(data.inputs[:7])
    assert isinstance(cache, ActivationCache)
    assert logits.shape == (7, 3, data.d_vocab_out)
    for l in range(2):
        for name in EXPECTED_HOOKS:
            assert name.format(l=l) in cache.keys(), name
        assert f"blocks.{l}.ln1.hook_normalized" in cache.keys()
    # the cache helpers work on our models (they read model.cfg)
    resid = cache.decompose_resid(layer=2)
    assert resid.shape[-1] == 16
    assert torch.allclose(resid.sum(0), cache["blocks.1.hook_resid_post"], atol=1e-5)
    assert not model.hook_dict["blocks.0.attn.hook_pattern"].fwd_hooks  # nothing left behind


def test_attention_matches_hand_computation():
    model, data = _model(causal=True)
    x = data.inputs[:5]
    _, cache = model.run_with_cache(x)
    attn = model.blocks[0].attn
    resid = cache["blocks.0.hook_resid_pre"]
    q = torch.einsum("bpd,hde->bhpe", resid, attn.W_Q)
    k = torch.einsum("bpd,hde->bhpe", resid, attn.W_K)
    scores = q @ k.transpose(-1, -2) / math.sqrt(attn.cfg.d_head)
    scores = scores + torch.triu(torch.full((3, 3), float("-inf")), diagonal=1)
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"], scores.softmax(-1), atol=1e-6)
    assert torch.allclose(cache["blocks.0.attn.hook_pattern"][:, :, 0, 1:], torch.zeros(1))


def test_bidirectional_attention_attends_forward():
    model, data = _model(causal=False)
    _, cache = model.run_with_cache(data.inputs[:3])
    assert (cache["blocks.0.attn.hook_pattern"][:, :, 0, 1:] > 0).all()


def test_same_seed_same_init_and_different_seed_differs():
    a, _ = _model(seed=3)
    b, _ = _model(seed=3)
    c, _ = _model(seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embed.W_E, c.embed.W_E)


def test_gelu_and_rms_variants_build_and_run():
    model, data = _model(act_fn="gelu", norm="rms", mlp_bias=True)
    assert "blocks.0.mlp.b_in" in dict(model.named_parameters())
    assert torch.isfinite(model(data.inputs[:4])).all()


import pytest  # noqa: E402


@pytest.mark.parametrize("variant", [
    dict(), dict(norm="ln", n_layers=2), dict(causal=False, norm="rms"), dict(attention="uniform"),
    dict(norm="sphere", unembed="bounded", causal=False, mlp_bias=True),
])
def test_readout_forward_equals_full_forward_at_the_readout(variant):
    # the trainer's fast path computes the last block only at the readout position
    model, data = _model(**variant)
    x = data.inputs[:50]
    full = model(x)
    fast = model(x, readout=slice(2, 3))
    assert fast.shape == (50, 1, data.d_vocab_out)
    assert torch.allclose(fast, full[:, 2:3], rtol=1e-5, atol=1e-6)
    # and the gradients of a readout loss agree
    y = data.labels[:50]
    g_full = torch.autograd.grad(torch.nn.functional.cross_entropy(full[:, 2], y), list(model.parameters()),
                                 allow_unused=True)
    g_fast = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x, readout=slice(2, 3))[:, 0], y),
                                 list(model.parameters()), allow_unused=True)
    for a, b in zip(g_full, g_fast):
        assert (a is None and b is None) or torch.allclose(a, b, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("table", [True, False])
def test_tokens_that_are_not_integer_ids_are_refused(table):
    """A bool tensor took the table path as ids 0 and 1 (a wrong answer, no error); floats, numpy
    arrays, tuples and lists of lists failed deep inside with raw errors."""
    from groklens.models.tl_errors import TLUnsupported

    model, data = _model(p=5)
    model.embedding_table = table
    x = data.inputs
    assert model._table_pays(x, None)  # the whole grid: the table path, when it is on
    for bad in (x.bool(), x.float(), x.to(torch.uint8), x.numpy(), tuple(x.tolist())):
        with pytest.raises(TLUnsupported, match="token ids are an integer torch tensor"):
            model(bad)
    with pytest.raises(TLUnsupported, match="a string of the task's tokens or a list of strings"):
        model(x.tolist())
    assert torch.equal(model(x.int()), model(x))  # int32 ids index as int64 ones do
