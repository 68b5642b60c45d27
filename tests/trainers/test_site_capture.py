"""A regularizer term that reads only each block's resid_post (the activation-norm penalty's
default sites) or its attention scores (the KL attention term's), or an MLP's hidden layers, is fed
by the model itself (Transformer.site_capture, MLP.site_capture) instead of TransformerLens hooks,
so its step stays on the lean path: the same activations, loss and gradients as the hooked
explicit path to float32 rounding, and the same training run to the golden tests' tolerance."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from groklens.models import build_model
from groklens.tasks import TASKS
from groklens.trainers.regularizers import REGULARIZERS, Batch
from tests.helpers import tiny_config, train_tiny

ATOL, RTOL = 1e-6, 1e-4  # as tests/models/test_fast_path.py: float32 sums in another order


def _hooked(model, sites, x):
    """(logits, {site: what its TransformerLens hook saw}) on the explicit path."""
    seen: dict = {}
    with model.hooks(fwd_hooks=[(s, lambda t, hook: seen.__setitem__(hook.name, t)) for s in sites]):
        return model(x), seen


def _recorded(model, sites, x, readout=None, all_positions=True):
    """(logits, {site: what the model recorded itself}) with no hook attached."""
    model.site_capture, model.capture_all_positions = {s: None for s in sites}, all_positions
    try:
        assert not model.hooks_attached()
        return (model(x) if readout is None else model(x, readout=readout)), model.site_capture
    finally:
        model.site_capture, model.capture_all_positions = None, True


@pytest.mark.parametrize("variant", [dict(norm="none", n_layers=2), dict(norm="ln", mlp_bias=True),
                                     dict(norm="sphere", unembed="bounded", causal=False)])
def test_the_model_records_the_same_resid_post_as_the_hooks(variant):
    cfg = tiny_config(**variant)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[data.train_idx]
    sites = [f"blocks.{i}.hook_resid_post" for i in range(cfg.n_layers)]
    ref, hooked = _hooked(model, sites, x)
    out, got = _recorded(model, sites, x)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    for s in sites:
        torch.testing.assert_close(got[s], hooked[s], atol=ATOL, rtol=RTOL)
    # the trainer's call: logits at the readout positions only, every site still at every position
    sl = slice(data.readout_pos, data.readout_pos + 1)
    readout, at_readout = _recorded(model, sites, x, sl)
    torch.testing.assert_close(readout, ref[:, sl], atol=ATOL, rtol=RTOL)
    for s in sites:
        torch.testing.assert_close(at_readout[s], hooked[s], atol=ATOL, rtol=RTOL)
    # the penalty's gradient flows through the recorded tensors as through the hooked ones
    params = [p for n, p in model.named_parameters() if n.startswith(("blocks.", "embed."))]
    g_lean = torch.autograd.grad(sum((t.norm(dim=-1) ** 2).mean() for t in got.values()), params, allow_unused=True)
    g_ref = torch.autograd.grad(sum((t.norm(dim=-1) ** 2).mean() for t in hooked.values()), params, allow_unused=True)
    for a, b in zip(g_lean, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=RTOL)


@pytest.mark.parametrize("n_layers", [1, 2])  # one layer: the readout block is the first, on the table
def test_a_penalty_run_trains_the_hooked_runs_trajectory(n_layers, tmp_path, monkeypatch):
    """Trained with the penalty: the lean capture against the hooked explicit path (the path every
    act_norm run took before), metrics and parameters to the golden tests' 1e-3."""
    _same_run_as_hooked(tmp_path, monkeypatch, dict(act_norm_lambda=0.5, n_layers=n_layers, seed=4), "reg_act_norm")


def _same_run_as_hooked(tmp_path, monkeypatch, over: dict, reg_metric: str) -> None:
    from groklens.trainers import single

    cfg = dict(steps=60, eval_every=10, checkpoint_every=20, **over)
    lanes = []
    init = single.Lane.__init__

    def record(self, *a, **kw):
        init(self, *a, **kw)
        lanes.append(self)

    monkeypatch.setattr(single.Lane, "__init__", record)
    train_tiny(tmp_path / "lean.h5", **cfg)
    assert lanes and all(lane.model_captures for lane in lanes)  # the model recorded the sites itself

    def hooked(self, *a, **kw):
        init(self, *a, **kw)
        self.model_captures = False  # the TransformerLens hooks, as before

    monkeypatch.setattr(single.Lane, "__init__", hooked)
    train_tiny(tmp_path / "hooked.h5", **cfg)
    with h5py.File(tmp_path / "lean.h5") as a, h5py.File(tmp_path / "hooked.h5") as b:
        for name in ("test_loss", "train_loss", reg_metric):
            np.testing.assert_allclose(a[f"metrics/{name}"][:], b[f"metrics/{name}"][:], rtol=1e-3)
        for name in a["params"]:
            pa, pb = a[f"params/{name}"][-1], b[f"params/{name}"][-1]
            assert np.linalg.norm(pa - pb) <= 1e-3 * np.linalg.norm(pb), name


SEQ = dict(task="seq_add", seq_len=4, n_informative=2, informative_layout="spread")


@pytest.mark.parametrize("variant", [dict(norm="none"), dict(norm="none", n_layers=2), dict(norm="ln", causal=True),
                                     dict(norm="sphere", unembed="bounded", causal=False)])
@pytest.mark.parametrize("table", [True, False])  # the first block from its (position, token) table, or per input
def test_the_model_records_the_same_attention_scores_as_the_hooks(variant, table, monkeypatch):
    from groklens.models.fast_paths import AttentionFastPaths

    cfg = tiny_config(**SEQ, **variant)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    model.embedding_table = table
    x = data.inputs  # all 121 inputs: enough rows for the table path to pay
    sites = [f"blocks.{i}.attn.hook_attn_scores" for i in range(cfg.n_layers)]
    assert all(model.can_capture(s) for s in sites)
    ref, hooked = _hooked(model, sites, x)
    tables = []
    original = AttentionFastPaths.table
    monkeypatch.setattr(AttentionFastPaths, "table", lambda self, *a: tables.append(1) or original(self, *a))
    q = data.readout_pos
    for readout in (None, slice(q, q + 1)):
        out, got = _recorded(model, sites, x, readout)
        torch.testing.assert_close(out, ref if readout is None else ref[:, readout], atol=ATOL, rtol=RTOL)
        for i, s in enumerate(sites):
            # the last block computes the readout query only, the others every query
            want = hooked[s][:, :, readout] if readout is not None and i == cfg.n_layers - 1 else hooked[s]
            torch.testing.assert_close(got[s], want, atol=ATOL, rtol=RTOL)
    assert bool(tables) == table
    # the KL term reads the readout row from either layout, and its gradient flows as through the hooks
    reg = REGULARIZERS.get("kl_attn")([cfg.replace(kl_attn_beta=1.0, kl_attn_layer=-1)], model, data)
    batch = Batch(x, data.informative_mask, [q])
    params = [p for n, p in model.named_parameters() if n.endswith((".attn.W_Q", ".attn.W_K", "embed.W_E"))]
    value_ref, _ = reg.term(hooked, batch, step=0)
    value, _ = reg.term(got, batch, step=0)
    torch.testing.assert_close(value, value_ref, atol=1e-7, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(value, params), torch.autograd.grad(value_ref, params)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=RTOL)


def test_uniform_attention_scores_are_left_to_the_hooks():
    """The lean paths of uniform attention compute no scores: the trainer keeps the hooks there."""
    cfg = tiny_config(**SEQ, attention="uniform")
    model = build_model(cfg, TASKS.get(cfg.task).build(cfg))
    assert model.can_capture("blocks.0.hook_resid_post")
    assert not model.can_capture("blocks.0.attn.hook_attn_scores")


def test_the_fused_path_gives_way_to_the_lean_one_for_recorded_scores():
    cfg = tiny_config(**SEQ)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    model.fused_attention = True  # the fused kernel (CUDA's default) computes no scores
    x = data.inputs[:7]
    site = "blocks.0.attn.hook_attn_scores"
    _, hooked = _hooked(model, [site], x)
    _, got = _recorded(model, [site], x)
    torch.testing.assert_close(got[site], hooked[site], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("over", [dict(n_layers=1), dict(n_layers=2, kl_attn_layer=-1), dict(causal=True)])
def test_a_kl_run_trains_the_hooked_runs_trajectory(over, tmp_path, monkeypatch):
    """Trained with the KL attention term: the lean capture against the hooked explicit path at every
    position (the path every KL run took before), metrics and parameters to the golden tests' 1e-3."""
    _same_run_as_hooked(tmp_path, monkeypatch, dict(**SEQ, kl_attn_beta=0.5, seed=5, **over), "kl_attn")


@pytest.mark.parametrize("n_layers", [1, 2])
def test_readout_only_terms_let_the_last_block_run_at_the_readout_alone(n_layers):
    """capture_all_positions False (every term reads the readout rows only, as GeomDR): the last
    block's resid_post is recorded at the readout positions only, equal to the hook's rows there."""
    from groklens.trainers.regularizers import readout_rows

    cfg = tiny_config(n_layers=n_layers)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[data.train_idx]
    sites = [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]
    ref, hooked = _hooked(model, sites, x)
    q = data.readout_pos
    out, got = _recorded(model, sites, x, slice(q, q + 1), all_positions=False)
    torch.testing.assert_close(out, ref[:, q : q + 1], atol=ATOL, rtol=RTOL)
    last = sites[-1]
    assert got[last].shape[1] == 1  # the readout row only
    torch.testing.assert_close(got[last], hooked[last][:, q : q + 1], atol=ATOL, rtol=RTOL)
    for s in sites[:-1]:  # earlier blocks: every position, as the next block needs them
        torch.testing.assert_close(got[s], hooked[s], atol=ATOL, rtol=RTOL)
    for s in sites:  # a term's readout rows are the same from either layout
        torch.testing.assert_close(readout_rows(got[s], [q]), hooked[s][:, [q]], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("over", [dict(n_layers=1), dict(n_layers=2),
                                  dict(act_norm_lambda=0.3)])  # with the penalty: every position again
def test_a_geomdr_run_trains_the_hooked_runs_trajectory(over, tmp_path, monkeypatch):
    """Trained with GeomDR (readout rows only, beside the penalty's every position): the lean capture
    against the hooked explicit path, metrics and parameters to the golden tests' 1e-3."""
    _same_run_as_hooked(tmp_path, monkeypatch, dict(geomdr_lambda=0.5, geomdr_target=4.0, seed=7, **over),
                        "geomdr_erank")


# ---------------------------------------------------------------------- the MLP
@pytest.mark.parametrize("variant", [dict(n_layers=1), dict(n_layers=2, mlp_bias=True),
                                     dict(n_layers=3, mlp_embed="onehot")])
def test_the_mlp_records_the_same_hidden_layers_as_the_hooks(variant):
    """The MLP records each hidden layer's hook_post itself (MLP.site_capture) on its lean path
    (first layer from the table): the same tensors as the hooks see on the concatenated matmul,
    and a penalty's gradient through them."""
    cfg = tiny_config(model="mlp", d_mlp=12, **variant)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    x = data.inputs[data.train_idx]
    sites = [f"layers.{i}.hook_post" for i in range(cfg.n_layers)]
    assert all(model.can_capture(s) for s in sites)
    assert not model.can_capture("layers.0.hook_pre") and not model.can_capture(f"layers.{cfg.n_layers}.hook_post")
    ref, hooked = _hooked(model, sites, x)
    out, got = _recorded(model, sites, x)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    params = list(model.parameters())
    g_lean = torch.autograd.grad(sum((t.norm(dim=-1) ** 2).mean() for t in got.values()), params, allow_unused=True)
    g_ref = torch.autograd.grad(sum((t.norm(dim=-1) ** 2).mean() for t in hooked.values()), params, allow_unused=True)
    for s in sites:
        torch.testing.assert_close(got[s], hooked[s], atol=ATOL, rtol=RTOL)
    for a, b in zip(g_lean, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-5, rtol=RTOL)


@pytest.mark.parametrize("over", [dict(act_norm_lambda=0.5), dict(geomdr_lambda=0.5, geomdr_target=4.0),
                                  dict(act_norm_lambda=0.5, mlp_embed="onehot")])
def test_an_mlp_run_with_a_term_trains_the_hooked_runs_trajectory(over, tmp_path, monkeypatch):
    """The activation-norm penalty and GeomDR on the MLP (hidden_sites: each layer's hook_post)
    read the recorded layers on the lean path: the hooked explicit path's run, metrics and
    parameters to the golden tests' 1e-3."""
    _same_run_as_hooked(tmp_path, monkeypatch, dict(model="mlp", n_layers=2, d_mlp=16, seed=3, **over),
                        "reg_geomdr" if "geomdr_lambda" in over else "reg_act_norm")
