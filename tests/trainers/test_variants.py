"""Model variants (docs/VARIANTS.md), each checked against an independent computation written here."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory
from groklens.config import PRESETS, RunConfig, preset
from groklens.errors import BadInput
from groklens.trainers.train import train
from groklens.models import MODELS, build_model
from groklens.tasks import TASKS
from tests.helpers import tiny_config

SMALL = dict(p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, device="cpu")


def _build(cfg: RunConfig):
    data = TASKS.get(cfg.task).build(cfg)
    return build_model(cfg, data), data


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


# ---------------------------------------------------------------------- bounded sphere
@pytest.mark.parametrize("radius", [1.0, 2.5])
def test_sphere_residual_norms_equal_the_radius_at_every_hook(radius):
    model, data = _build(tiny_config(norm="sphere", unembed="bounded", radius=radius, n_layers=2, mlp_bias=True))
    with torch.no_grad():  # large, varied weights: the projection must still land on the sphere
        for p in model.parameters():
            p.normal_(0, 3.0)
    _, cache = model.run_with_cache(data.inputs)
    names = ["ln_embed.hook_normalized"] + [
        f"blocks.{l}.hook_resid_{w}" for l in range(2) for w in ("pre", "mid", "post")
    ]
    for name in names:
        norms = torch.linalg.vector_norm(cache[name].double(), dim=-1)
        assert torch.allclose(norms, torch.full_like(norms, radius), atol=1e-5 * radius), name
    # and the pre-projection radius is what hook_scale reports (||x|| / r)
    raw = cache["hook_embed"] + cache["hook_pos_embed"]
    assert torch.allclose(cache["ln_embed.hook_scale"][..., 0], raw.norm(dim=-1) / radius, rtol=1e-5)


def test_bounded_logits_are_tau_times_a_cosine_and_never_exceed_tau():
    tau = 7.0
    model, data = _build(tiny_config(norm="sphere", unembed="bounded", tau=tau))
    with torch.no_grad():
        model.unembed.W_U.mul_(1000.0)  # the scale of W_U must not matter
        model.embed.W_E.mul_(50.0)
    logits, cache = model.run_with_cache(data.inputs)
    assert logits.abs().max() <= tau + 1e-4
    h = cache["blocks.0.hook_resid_post"].double()
    W = model.unembed.W_U.detach().double()  # [d_model, classes]: a column per class
    cos = torch.einsum("bpd,dv->bpv", _unit(h), W / torch.linalg.vector_norm(W, dim=0, keepdim=True))
    assert torch.allclose(logits.double(), tau * cos, atol=1e-4)
    # a plain unembedding on the sphere is unbounded in W_U (the paper's softmax collapse)
    plain, _ = _build(tiny_config(norm="sphere", unembed="linear"))
    with torch.no_grad():
        plain.unembed.W_U.mul_(1000.0)
    assert plain(data.inputs).abs().max() > 100


def test_sphere_preset_matches_the_papers_equations():
    """h0 = N(E[x] + P), h1 = N(h0 + Attn(h0)), h2 = N(h1 + W_out relu(W_in h1 + b_in) + b_out),
    logits = tau * normalize_rows(W_U) h2[2]: bidirectional attention without biases (REFERENCES.md)."""
    cfg = RunConfig.from_dict({**PRESETS["sphere"], **SMALL})
    assert (cfg.norm, cfg.unembed, cfg.causal, cfg.mlp_bias) == ("sphere", "bounded", False, True)
    assert (cfg.radius, cfg.tau, tuple(cfg.betas)) == (1.0, 10.0, (0.9, 0.999))
    model, data = _build(cfg)
    assert data.readout_pos == 2
    with torch.no_grad():  # non-zero biases, so the bias path is checked too
        model.blocks[0].mlp.b_in.normal_()
        model.blocks[0].mlp.b_out.normal_()
    P = {n: p.detach().double() for n, p in model.named_parameters()}
    assert not any("attn.b_" in n for n in P)  # no attention biases
    x = data.inputs[:40]

    def N(v):
        return v / torch.sqrt((v**2).sum(-1, keepdim=True))

    h0 = N(P["embed.W_E"][x] + P["pos_embed.W_pos"][None])  # [b, 3, d]
    attn = torch.zeros_like(h0)
    for head in range(cfg.n_heads):
        q = h0 @ P["blocks.0.attn.W_Q"][head]
        k = h0 @ P["blocks.0.attn.W_K"][head]
        v = h0 @ P["blocks.0.attn.W_V"][head]
        scores = q @ k.transpose(1, 2) / math.sqrt(cfg.d_head)  # no mask: every query sees every key
        weights = torch.exp(scores - scores.max(-1, keepdim=True).values)
        weights = weights / weights.sum(-1, keepdim=True)
        attn = attn + (weights @ v) @ P["blocks.0.attn.W_O"][head]
    h1 = N(h0 + attn)
    hidden = torch.relu(h1 @ P["blocks.0.mlp.W_in"] + P["blocks.0.mlp.b_in"])
    mlp = hidden @ P["blocks.0.mlp.W_out"] + P["blocks.0.mlp.b_out"]
    h2 = N(h1 + mlp)
    W_rows = P["unembed.W_U"].T  # the paper's W_U: one row per class
    W_rows = W_rows / torch.sqrt((W_rows**2).sum(-1, keepdim=True))
    expected = cfg.tau * h2[:, 2] @ W_rows.T
    got = model(x)[:, 2].double()
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


# ---------------------------------------------------------------------- uniform attention
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("norm", ["none", "ln", "sphere"])
def test_uniform_pattern_is_one_over_the_allowed_positions(causal, norm):
    model, data = _build(tiny_config(attention="uniform", causal=causal, norm=norm, task="seq_add",
                                     seq_len=4, n_informative=2))
    fired = []
    _, cache = model.run_with_cache(data.inputs[:9])
    model.run_with_hooks(data.inputs[:2],
                         fwd_hooks=[("blocks.0.attn.hook_pattern", lambda t, hook: fired.append(t.shape))])
    assert fired == [(2, 2, 5, 5)]
    pattern = cache["blocks.0.attn.hook_pattern"]  # [b, h, q, k]
    n = pattern.shape[-1]
    for q in range(n):
        allowed = q + 1 if causal else n
        assert torch.allclose(pattern[:, :, q, :allowed], torch.full_like(pattern[:, :, q, :allowed], 1 / allowed))
        assert (pattern[:, :, q, allowed:] == 0).all()
    scores = cache["blocks.0.attn.hook_attn_scores"]
    allowed_mask = torch.tril(torch.ones(n, n, dtype=torch.bool)) if causal else torch.ones(n, n, dtype=torch.bool)
    assert (scores[..., allowed_mask] == 0).all() and torch.isinf(scores[..., ~allowed_mask]).all()
    # q and k still run (their hooks fire) but receive no gradient
    assert "blocks.0.attn.hook_q" in cache.keys()
    model(data.inputs[:9])[:, -1].logsumexp(-1).sum().backward()
    assert model.blocks[0].attn.W_Q.grad is None or (model.blocks[0].attn.W_Q.grad == 0).all()
    assert model.blocks[0].attn.W_V.grad.abs().sum() > 0


# ---------------------------------------------------------------------- Fourier init
def test_fourier_init_sets_the_first_2k_embedding_columns_and_nothing_else():
    p, freqs = 13, (2, 5, 6)
    fourier, _ = _build(tiny_config(p=p, init="fourier", fourier_freqs="2, 5 6"))
    plain, _ = _build(tiny_config(p=p))
    W, W0 = fourier.embed.W_E.detach().double(), plain.embed.W_E.detach().double()
    for i, k in enumerate(freqs):
        for x in range(p):
            assert W[x, 2 * i].item() == pytest.approx(math.cos(2 * math.pi * k * x / p), abs=1e-6)
            assert W[x, 2 * i + 1].item() == pytest.approx(math.sin(2 * math.pi * k * x / p), abs=1e-6)
    keep = torch.ones_like(W, dtype=torch.bool)
    keep[:p, : 2 * len(freqs)] = False
    assert torch.equal(W[keep], W0[keep])  # the `=` row and the other columns keep the default init
    for (n, a), (_, b) in zip(fourier.named_parameters(), plain.named_parameters()):
        if n != "embed.W_E":
            assert torch.equal(a, b), n
    assert preset("nanda").replace(init="fourier").fourier_frequencies() == (14, 35, 41, 42, 52)
    # a YAML list is accepted too, and gives the same model
    listed, _ = _build(tiny_config(p=p, init="fourier", fourier_freqs=[2, 5, 6]))
    assert torch.equal(listed.embed.W_E, fourier.embed.W_E)


# ---------------------------------------------------------------------- MLP
@pytest.mark.parametrize("embed", ["learned", "onehot"])
def test_mlp_forward_matches_hand_computation_and_hooks_every_layer(embed):
    cfg = tiny_config(model="mlp", n_layers=2, mlp_embed=embed, mlp_bias=True, d_model=5, d_mlp=7)
    model, data = _build(cfg)
    x = data.inputs[:6]
    logits, cache = model.run_with_cache(x)
    assert logits.shape == (6, 3, data.d_vocab_out)
    P = {n: p.detach().double() for n, p in model.named_parameters()}
    E = P["embed.W_E"] if embed == "learned" else torch.eye(data.d_vocab, dtype=torch.float64)
    h = torch.cat([E[x[:, 0]], E[x[:, 1]]], dim=1)  # the operands a, b; `=` is not an input
    for i in range(2):
        h = torch.relu(h @ P[f"layers.{i}.W_in"] + P[f"layers.{i}.b_in"])
        assert torch.allclose(cache[f"layers.{i}.hook_post"].double(), h, atol=1e-5)
    out = h @ P["unembed.W_U"] + P["unembed.b_U"]
    assert torch.allclose(logits[:, 2].double(), out, atol=1e-5)
    assert (logits[:, :2] == 0).all()
    assert set(cache.keys()) >= {"hook_embed", "hook_input", "layers.0.hook_pre", "layers.1.hook_post", "hook_logits"}
    assert ("embed.W_E" in P) == (embed == "learned")
    assert P["layers.0.W_in"].shape == ((2 * (5 if embed == "learned" else data.d_vocab)), 7)


@pytest.mark.parametrize("embed, bias", [("onehot", True), ("onehot_residues", False), ("learned", True),
                                         ("learned", False)])
def test_mlp_lean_path_reads_the_first_layer_from_rows_with_the_matmuls_forward_and_gradients(embed, bias):
    """With no hook attached, the first layer reads rows of a table (MLP.lean_path): W_in's rows
    (one-hot: logits equal to the one-hot matmul's to the bit) or E W_in's blocks (learned: to
    float32 rounding), gradients to rounding, checked against float64 arithmetic written out here;
    an operand token outside the table still fails rather than reading the next operand's rows."""
    cfg = tiny_config(model="mlp", n_layers=2, mlp_embed=embed, mlp_bias=bias, d_mlp=7)
    model, data = _build(cfg)
    x, y = data.inputs, data.labels
    grads, logits = {}, {}
    for lean in (True, False):
        model.lean_path = lean
        model.zero_grad()
        out = model(x)
        F.cross_entropy(out[:, -1].double(), y).backward()
        logits[lean] = out.detach()
        grads[lean] = {n: p.grad.clone() for n, p in model.named_parameters()}
    if embed != "learned":
        assert torch.equal(logits[True], logits[False])
    P = {n: p.detach().double().requires_grad_() for n, p in model.named_parameters()}
    E = P["embed.W_E"] if embed == "learned" else torch.eye(model.cfg.d_model, dtype=torch.float64)
    h = torch.cat([E[x[:, 0]], E[x[:, 1]]], dim=1)
    for i in range(2):
        h = h @ P[f"layers.{i}.W_in"]
        h = torch.relu(h + P[f"layers.{i}.b_in"] if bias else h)
    ref = h @ P["unembed.W_U"] + (P["unembed.b_U"] if bias else 0)
    F.cross_entropy(ref, y).backward()
    for lean in (True, False):
        torch.testing.assert_close(logits[lean][:, -1].double(), ref.detach(), rtol=1e-5, atol=1e-6)
        for name, g in grads[lean].items():
            torch.testing.assert_close(g.double(), P[name].grad, rtol=1e-4, atol=1e-7, msg=name)
    model.lean_path = True
    bad = x[:2].clone()
    bad[:, 0] = model.cfg.d_model if embed != "learned" else model.cfg.d_vocab  # one past the table's rows
    with pytest.raises(IndexError):
        model(bad)
    # a hook anywhere takes the concatenated matmul, so the embedding and input hooks still fire
    _, cache = model.run_with_cache(x[:3])
    assert {"hook_embed", "hook_input"} <= set(cache.keys())


# ---------------------------------------------------------------------- presets
def test_nanogpt_presets_are_causal_multilayer_digit_models_of_the_stated_size():
    cfg = preset("nanogpt_10m")
    assert (cfg.task, cfg.causal, cfg.n_layers) == ("digits_add", True, 6)
    model, data = _build(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert 9.5e6 < n < 11e6, n
    assert data.inputs.shape == (10**6, 11) and data.labels.shape == (10**6, 4)
    tiny = preset("nanogpt_tiny")
    assert (tiny.task, tiny.causal, tiny.norm, tiny.act_fn) == (cfg.task, True, cfg.norm, cfg.act_fn)
    assert sum(p.numel() for p in _build(tiny)[0].parameters()) < 50_000


# ---------------------------------------------------------------------- every variant trains and reloads
def _stablemax_nll(logits, y):
    x = logits.double()
    s = torch.where(x >= 0, x + 1, 1 / (1 - torch.minimum(x, torch.zeros_like(x))))
    return -(s.gather(-1, y[:, None]).squeeze(-1) / s.sum(-1)).log()


VARIANTS = {
    "sphere": dict(norm="sphere", unembed="bounded", causal=False, mlp_bias=True),
    "sphere_plain_unembed": dict(norm="sphere"),
    "uniform": dict(attention="uniform"),
    "uniform_rms": dict(attention="uniform", norm="rms"),
    "fourier": dict(init="fourier", fourier_freqs="1 4"),
    "mlp_learned": dict(model="mlp", n_layers=2, mlp_bias=True),
    "mlp_onehot": dict(model="mlp", n_layers=2, mlp_embed="onehot"),
    "mlp_prieto": dict(model="mlp", n_layers=2, mlp_embed="onehot_residues", loss="ce_float32", adam_eps=1e-25),
    "act_norm": dict(act_norm_lambda=0.1),
    "act_norm_sites": dict(act_norm_lambda=0.1, act_norm_sites="blocks.*.hook_resid_mid, hook_embed"),
    "geomdr": dict(geomdr_lambda=0.5, geomdr_target=3, geomdr_start=10, geomdr_end=30),
    "kl_attn": dict(task="seq_add", seq_len=4, n_informative=2, informative_layout="spread", kl_attn_beta=0.5),
    "grokfast": dict(grokfast_lambda=2.0, grokfast_alpha=0.9),
    "perp_grad": dict(perp_grad=True),
    "stablemax": dict(loss="stablemax"),
    "digits": dict(preset="nanogpt_tiny"),
    "seq_random": dict(task="seq_mul", seq_len=5, n_informative=2, informative_layout="random", distractor_vocab=3),
    "mlp_act_norm_geomdr": dict(model="mlp", n_layers=2, act_norm_lambda=0.1, geomdr_lambda=0.1),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_trains_writes_a_trajectory_and_reloads(tmp_path, name):
    kw = dict(VARIANTS[name])
    if kw.pop("preset", None):
        cfg = RunConfig.from_dict({**PRESETS["nanogpt_tiny"], "steps": 40, "eval_every": 10,
                                   "checkpoint_every": 20, "device": "cpu", "n_digits": 1, "train_frac": 0.5})
    else:
        cfg = tiny_config(steps=40, eval_every=10, checkpoint_every=20, **kw)
    path = tmp_path / f"{name}.h5"
    result = train(cfg, path, progress=False)
    assert result.status == "completed" and result.last_step == 40
    run = Trajectory(path)
    assert list(run.steps) == [0, 20, 40]
    m, data = run.metrics, run.dataset()
    assert run.config == cfg
    for step in run.steps:
        model = run.model(int(step))
        row = int(np.nonzero(m["step"] == step)[0][0])
        with torch.no_grad():
            logits = model(data.inputs)
        if data.labels.dim() == 2:  # digits: CE over the answer positions, exact match
            k = data.labels.shape[1]
            ans = logits[:, data.readout_pos : data.readout_pos + k]
            nll = torch.nn.functional.cross_entropy(ans.double().reshape(-1, ans.shape[-1]),
                                                    data.labels.reshape(-1), reduction="none").reshape(-1, k).mean(1)
            hit = (ans.argmax(-1) == data.labels).all(-1)
        else:
            out = logits[:, data.readout_pos]
            nll = (_stablemax_nll(out, data.labels) if cfg.loss == "stablemax"
                   else torch.nn.functional.cross_entropy(out.double(), data.labels, reduction="none"))
            hit = out.argmax(-1) == data.labels
        assert float(nll[data.train_idx].mean()) == pytest.approx(m["train_loss"][row], rel=1e-6)
        assert float(hit[data.test_idx].double().mean()) == pytest.approx(m["test_acc"][row], abs=1e-12)
        assert float(hit[data.train_idx].double().mean()) == pytest.approx(m["train_acc"][row], abs=1e-12)
        assert torch.isfinite(logits).all()
    # the stored parameters moved, and the rebuilt model's parameters are exactly the stored ones
    first, last = run.params(0), run.params(40)
    assert any(not torch.equal(first[n], last[n]) for n in first)
    assert all(torch.equal(t, last[n]) for n, t in run.model(40).state_dict().items())


# ---------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(radius=0.0), "radius"),
        (dict(tau=-1.0), "tau"),
        (dict(fourier_freqs="1 x"), "fourier_freqs"),
        (dict(fourier_freqs="2 2"), "fourier_freqs"),
        (dict(init="fourier"), "fourier_freqs must be in 1..p//2"),  # default keys 14..52 > 11 // 2
        (dict(init="fourier", fourier_freqs="1 2 3 4 5", d_model=8), "d_model"),
        (dict(init="fourier", fourier_freqs="1", task="s5"), "residues"),
        (dict(model="mlp", norm="sphere"), "norm=sphere is an option of model=transformer"),
        (dict(model="mlp", kl_attn_beta=1.0), "kl_attn_beta"),
        (dict(model="mlp", task="digits_add"), "needs model=transformer"),
        (dict(task="digits_add", kl_attn_beta=1.0), "single readout position"),
        (dict(norm="cube"), "norm must be one of"),
        (dict(attention="hard"), "attention must be one of"),
        (dict(unembed="tanh"), "unembed must be one of"),
        (dict(mlp_embed="hash"), "mlp_embed must be one of"),
        (dict(loss="mse"), "loss must be one of"),
        (dict(act_norm_lambda=-1.0), "act_norm_lambda"),
        (dict(geomdr_lambda=float("nan")), "geomdr_lambda"),
        (dict(geomdr_target=0.5), "geomdr_target"),
        (dict(geomdr_start=50, geomdr_end=20), "geomdr_end"),
        (dict(kl_attn_layer=3), "kl_attn_layer"),
        (dict(grokfast_alpha=1.0), "grokfast_alpha"),
        (dict(grokfast_lambda=-2.0), "grokfast_lambda"),
    ],
)
def test_bad_variant_values_are_one_line_bad_input(overrides, match):
    with pytest.raises(BadInput, match=match) as info:
        tiny_config(**overrides)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(act_norm_lambda=0.1, act_norm_sites="blocks.*.hook_nothing"), "no hook point matches"),
        (dict(geomdr_lambda=0.1, geomdr_site="blocks.7.hook_resid_post"), "geomdr_site"),
    ],
)
def test_bad_sites_are_refused_before_any_file_is_made(tmp_path, overrides, match):
    path = tmp_path / "r.h5"
    with pytest.raises(BadInput, match=match) as info:
        train(tiny_config(**overrides), path, progress=False)
    assert "\n" not in str(info.value) and not path.exists()


def test_mlp_refuses_a_multi_target_task():
    cfg = tiny_config(model="mlp", task="seq_add", seq_len=3)
    _build(cfg)  # single target, readout last: fine
    data = TASKS.get("digits_add").build(tiny_config(task="digits_add", n_digits=1))
    with pytest.raises(BadInput, match="model=mlp needs a single-target task"):
        build_model(cfg, data)


def test_mlp_without_unembed_bias_is_devinterps_grokking_mlp():
    """mlp_unembed_bias=false: the hidden layer keeps its bias, the unembedding has none, and the
    logits are gelu(E[a] W_l + E[b] W_r + b) W_U with W_in = [W_l; W_r] (the notebook's two Linears)."""
    cfg = RunConfig(task="add", p=7, model="mlp", n_layers=1, d_model=4, d_mlp=8, act_fn="gelu", mlp_bias=True,
                    mlp_unembed_bias=False)
    data = TASKS.get("add").build(cfg)
    model = build_model(cfg, data)
    names = dict(model.named_parameters())
    assert "unembed.b_U" not in names and "layers.0.b_in" in names
    x = data.inputs[:5]
    e, w = model.embed.W_E, model.layers[0].W_in
    by_hand = torch.nn.functional.gelu(e[x[:, 0]] @ w[:4] + e[x[:, 1]] @ w[4:] + model.layers[0].b_in) @ model.W_U
    torch.testing.assert_close(model(x)[:, -1], by_hand)
    with pytest.raises(BadInput, match="mlp_unembed_bias=false"):
        RunConfig.from_dict({"mlp_unembed_bias": False})  # the transformer has no such bias to drop


# ---------------------------------------------------------------------- the memory estimate's width
# small settings of every model's knobs; a model is checked on those it accepts
MODEL_SETTINGS = [{}, {"mlp_embed": "onehot", "p": 23, "d_model": 8},
                  {"mlp_embed": "onehot_residues", "p": 23, "d_model": 8},
                  {"n_layers": 2, "d_model": 24, "d_mlp": 64},
                  {"task": "teacher", "teacher_dim": 12, "teacher_alpha": 2.0, "teacher_test": 20, "d_mlp": 3}]


@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_every_model_declares_a_width_the_memory_estimate_counts_enough_parameters_with(name):
    """The estimate made before a run starts (checkpoints/validate.estimate_memory, with each
    model's declared width) counts at least the parameters the built model really has."""
    from groklens.checkpoints.validate import estimate_memory

    checked = 0
    for extra in MODEL_SETTINGS:
        try:
            cfg = tiny_config(model=name, **{**SMALL, **extra})
        except BadInput:
            continue
        model, _ = _build(cfg)
        real = sum(p.numel() for p in model.parameters())
        # the estimate holds 8 float32 numbers per parameter it counts (weights, gradient, Adam's
        # moments, with room to spare)
        assert estimate_memory(cfg)["parameters and optimizer state"] / (8 * 4) >= real, (name, extra)
        checked += 1
    assert checked, f"model {name} accepts none of the small settings: give it one in MODEL_SETTINGS"
