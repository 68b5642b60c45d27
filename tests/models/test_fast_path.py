"""The training fast paths (no hook attached: fused projections and scaled_dot_product_attention,
the CUDA default; or the lean path, the CPU default: few large matmuls, broadcast attention over
the short sequence, fused norms and MLP biases; both with the readout-only last block) gives the
loss and gradients of the explicit full forward pass (a hook attached: every HookPoint fires, all
positions), for every variant."""

import pytest
import torch

from groklens.models import build_model
from groklens.models.transformer import TransformerBlock
from groklens.models.losses import LOSSES
from groklens.tasks import TASKS
from tests.helpers import tiny_config

VARIANTS = {
    "none": dict(norm="none"),
    "ln": dict(norm="ln", mlp_bias=True),
    "ln_post": dict(norm="ln", norm_placement="post"),
    "rms": dict(norm="rms"),
    "rms_post": dict(norm="rms", norm_placement="post", causal=False),
    "sphere": dict(norm="sphere", unembed="bounded", causal=False, mlp_bias=True, init_scheme="torch"),
    "uniform": dict(norm="ln", attention="uniform"),
    "uniform_bidir": dict(norm="sphere", attention="uniform", causal=False),
    # Zhong et al.'s attention rate: the softmax mixed with the uniform pattern
    "rate": dict(norm="ln", attention_rate=0.4),
    "rate_bidir": dict(norm="none", attention_rate=0.7, causal=False, mlp_bias=True),
    "attn_mask": dict(norm="ln", attn_mask="0"),  # the readout query sees key 0 only
    "attn_mask_uniform_bidir": dict(attention="uniform", causal=False, attn_mask="0 2"),
    "digits": dict(task="digits_add", n_digits=1, norm="ln"),
    # 13 keys (more than the broadcast scores' 8): the readout query's mixing still broadcast
    "seq_long": dict(task="seq_add", seq_len=12, n_informative=2, informative_layout="spread", distractor_vocab=2,
                     norm="none"),
    "grokfast": dict(task="mul", op_token=True, nonzero_b=True, norm="ln", norm_placement="in_stream",
                     act_fn="gelu", mlp_bias=True, init_scheme="torch_mha"),
}
# float32 sums in a different order (fused matmuls, SDPA's kernel): agreement to rounding
ATOL, RTOL = 1e-6, 1e-4


def _loss_and_grads(model, x, y, sl, hooked: bool):
    model.zero_grad(set_to_none=True)
    if hooked:  # any attached hook forces the explicit path; run the full forward pass
        with model.hooks(fwd_hooks=[("hook_embed", lambda t, hook: None)]):
            assert model.hooks_attached()
            logits = model(x)[:, sl]
    else:
        assert not model.hooks_attached()
        logits = model(x, readout=sl)
    v = logits.shape[-1]
    loss = LOSSES.get("ce")(logits.reshape(-1, v), y.reshape(-1))
    loss.backward()
    return loss.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


class TableCalls:
    """Counts the first block's table forwards (TransformerBlock.from_table)."""

    def __init__(self, monkeypatch):
        self.n = 0
        original = TransformerBlock.from_table

        def counted(block, *args, **kwargs):
            self.n += 1
            return original(block, *args, **kwargs)
        monkeypatch.setattr(TransformerBlock, "from_table", counted)


# sdpa: the CUDA default, forced on the CPU; lean: the CPU default with the first block on the
# batch's rows; table: the CPU default where the batch is large against the vocabulary (the first
# block from the table of every (position, token)); both layer counts: a one-layer model's first
# block is also its readout block (query positions only), a two-layer model's is not
@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("path", ["sdpa", "lean", "table"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fast_path_equals_full_forward(variant, path, n_layers, monkeypatch):
    cfg = tiny_config(n_layers=n_layers, **VARIANTS[variant])
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    model.fused_attention = path == "sdpa"
    model.embedding_table = path == "table"
    pos = data.readout_positions
    sl = slice(pos[0], pos[-1] + 1)
    x, y = data.inputs[data.train_idx][:64], data.labels[data.train_idx][:64]
    assert model._table_pays(x, sl) or variant == "digits", "the tiny batch should take the table path"
    calls = TableCalls(monkeypatch)
    fast_loss, fast = _loss_and_grads(model, x, y, sl, hooked=False)
    assert calls.n == (path == "table" and model._table_pays(x, sl))
    full_loss, full = _loss_and_grads(model, x, y, sl, hooked=True)
    assert torch.allclose(fast_loss, full_loss, atol=ATOL, rtol=RTOL)
    for name in full:
        if full[name] is None:  # uniform attention: W_Q, W_K get no gradient on either path
            assert fast[name] is None, name
            continue
        assert torch.allclose(fast[name], full[name], atol=ATOL, rtol=RTOL), (
            name, float((fast[name] - full[name]).abs().max()))


@pytest.mark.parametrize("n_layers", [1, 2])
@pytest.mark.parametrize("variant", ["none", "ln_post", "uniform", "grokfast"])
def test_table_path_at_every_position_equals_the_explicit_path(variant, n_layers, monkeypatch):
    """The first block at every position (a model with more blocks, or the activation-norm
    penalty's full forward): a causal position 0 sees only its own key, so it comes from one row
    per token (TransformerBlock.from_table); logits and gradients as the explicit path's."""
    cfg = tiny_config(n_layers=n_layers, **VARIANTS[variant])
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[data.train_idx][:64]
    assert model._table_pays(x, None)
    calls = TableCalls(monkeypatch)
    grads = []
    for hooked in (False, True):
        model.zero_grad(set_to_none=True)
        if hooked:
            with model.hooks(fwd_hooks=[("hook_embed", lambda t, hook: None)]):
                logits = model(x)
        else:
            logits = model(x)
        (logits.double() ** 2).mean().backward()  # every position's logits
        grads.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert calls.n == 1
    (fast, g_fast), (full, g_full) = grads
    assert torch.allclose(fast, full, atol=ATOL, rtol=RTOL)
    assert g_fast.keys() == g_full.keys()
    for name in g_full:
        assert torch.allclose(g_fast[name], g_full[name], atol=ATOL, rtol=RTOL), name


def test_hooks_see_the_explicit_path():
    """With a cache attached every attention hook fires (the fast path would skip them)."""
    cfg = tiny_config(n_layers=1)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    _, cache = model.run_with_cache(data.inputs[:4])
    assert {"blocks.0.attn.hook_q", "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"} <= set(cache.keys())
    assert not model.hooks_attached()  # and nothing is left behind


def test_the_cpu_default_is_the_lean_path():
    """On CPU the fused attention is off by default and the lean path runs when no hook is
    attached: to rounding the numbers of the explicit path (what a hook sees); with
    `lean_path = False` the explicit path itself, bit for bit."""
    cfg = tiny_config(n_layers=2, norm="ln")
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[:16]
    logits, _ = model.run_with_cache(x)
    assert torch.allclose(model(x), logits, atol=ATOL, rtol=RTOL)
    model.lean_path = False
    assert torch.equal(model(x), logits)


def test_table_path_only_where_it_pays(monkeypatch):
    """A batch small against the vocabulary runs the first block on its own rows (the table's
    n V rows would be more work), with the same numbers."""
    cfg = tiny_config(n_layers=1, norm="ln", norm_placement="post")
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    v = model.cfg.d_vocab
    sl = slice(data.readout_positions[0], data.readout_positions[-1] + 1)
    small, large = data.inputs[: 4 * v - 1], data.inputs[: 4 * v]
    assert not model._table_pays(small, sl) and model._table_pays(large, sl)
    calls = TableCalls(monkeypatch)
    table_logits = model(large, readout=sl)
    assert calls.n == 1
    model(small, readout=sl)
    assert calls.n == 1
    model.embedding_table = False
    assert torch.allclose(model(large, readout=sl), table_logits, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("bad", [-1, "vocab"])
def test_table_path_refuses_a_token_outside_the_vocabulary(bad):
    """Token d_vocab at the first position would index the second position's table row; it must
    fail as the embedding of the rows path does."""
    cfg = tiny_config(n_layers=1, norm="ln")
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[: 4 * model.cfg.d_vocab].clone()
    sl = slice(data.readout_positions[0], data.readout_positions[-1] + 1)
    assert model._table_pays(x, sl)
    x[3, 0] = model.cfg.d_vocab if bad == "vocab" else bad
    for table in (True, False):
        model.embedding_table = table
        with pytest.raises(IndexError):
            model(x, readout=sl)


def test_a_folded_model_leaves_the_table_path(monkeypatch):
    """After fold_layer_norm the attention carries ln1's bias as b_Q, b_K, b_V, which the table
    does not hold: a plain forward of a large batch still gives the hooked forward's logits."""
    cfg = tiny_config(n_layers=1, norm="ln")
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    with torch.no_grad():
        model.blocks[0].ln1.b.normal_()  # a bias to fold (zero at initialization)
    model.fold_layer_norm()
    x = data.inputs[: 4 * model.cfg.d_vocab]
    calls = TableCalls(monkeypatch)
    logits, _ = model.run_with_cache(x)
    assert torch.allclose(model(x), logits, atol=ATOL, rtol=RTOL)
    assert calls.n == 0


@pytest.mark.parametrize("causal", [True, False])
def test_table_path_takes_a_readout_counted_from_the_end(causal, monkeypatch):
    """readout=slice(-1, None) is the last position, on the table path as on the rows path."""
    cfg = tiny_config(n_layers=1, norm="ln", causal=causal)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[: 4 * model.cfg.d_vocab]
    n = x.shape[1]
    calls = TableCalls(monkeypatch)
    from_end, explicit = model(x, readout=slice(-1, None)), model(x, readout=slice(n - 1, n))
    assert calls.n == 2
    model.embedding_table = False
    assert torch.allclose(from_end, explicit) and torch.allclose(model(x, readout=slice(-1, None)),
                                                                 from_end, atol=ATOL, rtol=RTOL)
