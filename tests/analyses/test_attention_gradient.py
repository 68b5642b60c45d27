"""attention_gradient: the task loss's gradient at the readout query, each quantity checked against
central finite differences of the loss (float64 models), an independent computation that never
calls autograd."""

import numpy as np
import pytest
import torch

from groklens.analyses.attention import attention_gradient, readout_gradients
from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.tasks import TASKS
from groklens.models import build_model
from tests.analyses.builders import NoAttention, all_hooks_clear, modular_data

EPS = 1e-5


def _seq_model(steps: int = 15, wd: float = 1.0, **over):
    """A float64 two-layer transformer on a 5-token sequence task with distractors, a few steps trained."""
    cfg = RunConfig.from_dict({"task": "seq_add", "p": 5, "seq_len": 5, "n_informative": 2,
                               "informative_layout": "spread", "train_frac": 0.6, "d_model": 12, "n_heads": 2,
                               "d_head": 6, "d_mlp": 16, "n_layers": 2, "norm": "ln", "device": "cpu", **over})
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data).double()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=wd)
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x)[:, data.readout_pos], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    for p in model.parameters():
        p.grad = None
    return model.eval(), data


def _mean_loss(model, data, fwd_hooks=()):
    rows = data.train_idx
    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks)):
        logits = model(data.inputs[rows])[:, data.readout_pos]
    return float(torch.nn.functional.cross_entropy(logits, data.labels[rows]))


def _fd(f):
    return (f(EPS) - f(-EPS)) / (2 * EPS)


def test_pull_toward_the_informative_tokens_is_the_derivative_of_a_shift_of_their_scores():
    model, data = _seq_model()
    res = attention_gradient(model, data, batch_size=7)  # several chunks
    q = data.readout_pos
    mask = data.informative_mask[data.train_idx]  # [N, n_ctx]
    for layer in range(2):
        for h in range(2):
            def shifted(c, layer=layer, h=h):
                def hook(act, hook):
                    out = act.clone()
                    out[:, h, q] = out[:, h, q] + c * mask.to(out.dtype)
                    return out
                return _mean_loss(model, data, [(f"blocks.{layer}.attn.hook_attn_scores", hook)])
            # -dL/dc of the mean loss is the mean over inputs of -sum_j dl_i/ds_j: the per-head pull
            assert res["struct_pull_per_head"][layer, h] == pytest.approx(-_fd(shifted), rel=1e-6, abs=1e-9)
        assert res["struct_pull"][layer] == pytest.approx(res["struct_pull_per_head"][layer].mean())
    assert all_hooks_clear(model)


def test_pattern_gradient_matches_directional_derivatives():
    model, data = _seq_model()
    g = readout_gradients(model, data, data.train_idx)
    q = data.readout_pos
    rng = np.random.default_rng(1)
    n = len(data.train_idx)
    for site in g["sites"]:
        u = 0.01 * rng.normal(size=g["pattern"][site].shape)  # [N, H, n_ctx]; small: the loss curves

        def moved(c, site=site, u=u):
            def hook(act, hook):
                out = act.clone()
                out[:, :, q] = out[:, :, q] + c * torch.as_tensor(u, dtype=out.dtype)
                return out
            return _mean_loss(model, data, [(site, hook)])
        # the per-input gradients of the summed loss: <G, u> = n * d(mean loss)/dc
        assert float((g["pattern"][site] * u).sum()) == pytest.approx(n * _fd(moved), rel=1e-6)
    res = attention_gradient(model, data)
    for layer, site in enumerate(g["sites"]):
        gp = g["pattern"][site]
        assert res["pattern_grad"][layer] == pytest.approx(np.sqrt((gp ** 2).sum((1, 2)).mean()))


def test_qk_gradient_norm_and_share_match_parameter_derivatives():
    model, data = _seq_model()
    g = readout_gradients(model, data, data.train_idx)
    params = dict(model.named_parameters())
    rng = np.random.default_rng(2)
    for name in ("blocks.0.attn.W_Q", "blocks.1.attn.W_K", "blocks.0.mlp.W_in", "embed.W_E"):
        u = torch.as_tensor(rng.normal(size=tuple(params[name].shape)))
        base = params[name].detach().clone()

        def moved(c, name=name, u=u, base=base):
            with torch.no_grad():
                params[name].copy_(base + c * u)
            return _mean_loss(model, data)
        d = _fd(moved)
        with torch.no_grad():
            params[name].copy_(base)
        assert float((g["params"][name] * u.numpy()).sum()) == pytest.approx(d, rel=1e-6, abs=1e-10), name
    res = attention_gradient(model, data)
    total = np.sqrt(sum((v ** 2).sum() for v in g["params"].values()))
    for layer in range(2):
        qk = np.sqrt(sum((g["params"][f"blocks.{layer}.attn.{w}"] ** 2).sum() for w in ("W_Q", "W_K")))
        assert res["qk_grad"][layer] == pytest.approx(qk)
        assert res["qk_grad_share"][layer] == pytest.approx(qk / total)
    assert res["grad_norm"] == pytest.approx(total)
    assert res["loss"] == pytest.approx(_mean_loss(model, data))


def test_a_memorized_input_set_starves_the_pull():
    """Planted: a model that fits every training input, its unembedding then scaled up 30x, so
    every margin grows 30x and the per-input loss, and with it every gradient at attention, all
    but vanishes."""
    model, data = _seq_model(steps=300, wd=0.0)
    x = data.inputs[data.train_idx]
    with torch.no_grad():
        assert bool((model(x)[:, data.readout_pos].argmax(-1) == data.labels[data.train_idx]).all())
    before = attention_gradient(model, data)
    with torch.no_grad():
        model.unembed.W_U.mul_(30.0)
    after = attention_gradient(model, data)
    assert after["loss"] < 1e-6 * before["loss"]
    assert after["qk_grad"].max() < 1e-4 * before["qk_grad"].max()
    assert np.abs(after["struct_pull"]).max() < 1e-4 * np.abs(before["struct_pull"]).max()


def test_bad_input():
    _, data = modular_data(p=5)
    with pytest.raises(BadInput, match="attention mass needs attention layers"):
        attention_gradient(NoAttention(6, 5), data)
    model, data = _seq_model()
    with pytest.raises(BadInput, match="loss must be one of"):
        attention_gradient(model, data, loss="mse")
    with pytest.raises(BadInput, match="eval_set must be one of"):
        attention_gradient(model, data, eval_set="val")
