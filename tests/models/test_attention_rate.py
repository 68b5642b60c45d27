"""attention_rate, Zhong et al.'s interpolation between uniform and learned attention, against a
re-typing of their model (fjzzq2002/pizza, code/train-main.py): the same logits on a tiny model,
rate 0 = attention=uniform and rate 1 = softmax attention on every forward path, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from groklens.errors import BadInput
from groklens.tasks import TASKS
from groklens.models import build_model
from tests.helpers import groklens, tiny_config


# ---------------------------------------------------------------------- their model, re-typed
# code/train-main.py's Embed, PosEmbed, Attention, MLP, Unembed, TransformerBlock and Transformer
# forward passes, without the hook points. Their mask buffer is registered but never applied.
class TheirAttention(nn.Module):
    def __init__(self, W_K, W_Q, W_V, W_O, d_head, attn_coeff):
        super().__init__()
        self.W_K, self.W_Q, self.W_V, self.W_O = W_K, W_Q, W_V, W_O  # [i, h, d] x3, [d, (i h)]
        self.d_head, self.attn_coeff = d_head, attn_coeff

    def forward(self, x):
        k = torch.einsum('ihd,bpd->biph', self.W_K, x)
        q = torch.einsum('ihd,bpd->biph', self.W_Q, x)
        v = torch.einsum('ihd,bpd->biph', self.W_V, x)
        attn_scores_pre = torch.einsum('biph,biqh->biqp', k, q)
        attn_scores_masked = attn_scores_pre
        normalized = attn_scores_masked / np.sqrt(self.d_head)
        normalized = F.softmax(normalized, dim=-1)
        attn_matrix = normalized * self.attn_coeff + (1 - self.attn_coeff)
        z = torch.einsum('biph,biqp->biqh', v, attn_matrix)
        z_flat = z.permute(0, 2, 1, 3).reshape(z.shape[0], z.shape[2], -1)  # einops 'b i q h -> b q (i h)'
        out = torch.einsum('df,bqf->bqd', self.W_O, z_flat)
        return out


def their_forward(w: dict, tokens: torch.Tensor, attn_coeff: float) -> torch.Tensor:
    x = torch.einsum('dbp -> bpd', w["W_E"][:, tokens])  # Embed
    x = x + w["W_pos"][:x.shape[-2]]  # PosEmbed
    attn = TheirAttention(w["W_K"], w["W_Q"], w["W_V"], w["W_O"], w["d_head"], attn_coeff)
    x = x + attn(x)  # TransformerBlock: resid_mid
    h = F.relu(torch.einsum('md,bpd->bpm', w["W_in"], x) + w["b_in"])  # MLP, act_type ReLU
    x = x + torch.einsum('dm,bpm->bpd', w["W_out"], h) + w["b_out"]
    return x @ w["W_U"]  # Unembed


def their_weights(model, o_scale: float = 1.0) -> dict:
    """Our weights in their layout (theirs are [out, in] where ours are [in, out]); W_O times o_scale."""
    a, m = model.blocks[0].attn, model.blocks[0].mlp
    h, e, d = a.W_O.shape
    t = {k: v.detach() for k, v in dict(W_E=model.embed.W_E, W_pos=model.pos_embed.W_pos,
                                         W_U=model.unembed.W_U).items()}
    return {"W_E": t["W_E"].T, "W_pos": t["W_pos"], "W_U": t["W_U"], "d_head": e,
            **{n: getattr(a, n).detach().transpose(1, 2) for n in ("W_K", "W_Q", "W_V")},
            "W_O": a.W_O.detach().reshape(h * e, d).T * o_scale,
            "W_in": m.W_in.detach().T, "b_in": m.b_in.detach(), "W_out": m.W_out.detach().T, "b_out": m.b_out.detach()}


def _theirs_setup(**over):
    """Their architecture: no norm, no mask, MLP biases, d_mlp = 4 d_model; float64."""
    cfg = tiny_config(norm="none", causal=False, mlp_bias=True, d_model=16, d_mlp=64, **over)
    data = TASKS.get(cfg.task).build(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, data).double()
    with torch.no_grad():  # their biases are trained: not zero in general
        for b in (model.blocks[0].mlp.b_in, model.blocks[0].mlp.b_out):
            b.normal_(0, 0.3)
    return model, data


@pytest.mark.parametrize("coeff", [0.0, 0.3, 0.65, 1.0])
def test_their_rate_is_ours_after_rescaling(coeff):
    """Their pattern c softmax + (1 - c) (all ones over n positions) is (c + n (1 - c)) times ours at
    r = c / (c + n (1 - c)); with W_O carrying that factor the logits are theirs, on every path."""
    n = 3  # [a, b, =]
    scale = coeff + n * (1 - coeff)
    model, data = _theirs_setup(attention_rate=coeff / scale)
    x = data.inputs[:50]
    want = their_forward(their_weights(model, o_scale=1 / scale), x, coeff)
    with model.hooks(fwd_hooks=[("hook_embed", lambda t, hook: None)]):  # the explicit path
        explicit = model(x)
    assert torch.allclose(explicit, want, atol=1e-12, rtol=0)
    model.fused_attention = True  # sdpa
    assert torch.allclose(model(x), want, atol=1e-12, rtol=0)
    model.fused_attention = False
    for table in (False, True):  # lean, table
        model.embedding_table = table
        assert torch.allclose(model(x), want, atol=1e-12, rtol=0)


def _same_weights(cfg_a, cfg_b):
    data = TASKS.get(cfg_a.task).build(cfg_a)
    torch.manual_seed(1)
    a = build_model(cfg_a, data)
    b = build_model(cfg_b, data)
    b.load_state_dict(a.state_dict())
    return a, b, data


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("path", ["explicit", "sdpa", "lean", "table"])
def test_rate_zero_is_uniform_and_rate_one_is_softmax(causal, path):
    sl = slice(2, 3)
    for rate, other in ((0.0, dict(attention="uniform")), (1.0, dict())):
        a, b, data = _same_weights(tiny_config(norm="ln", causal=causal, attention_rate=rate),
                                   tiny_config(norm="ln", causal=causal, **other))
        x = data.inputs[:64]
        outs = []
        for m in (a, b):
            m.fused_attention, m.embedding_table = path == "sdpa", path == "table"
            if path == "explicit":
                with m.hooks(fwd_hooks=[("hook_embed", lambda t, hook: None)]):
                    outs.append(m(x)[:, sl])
            else:
                outs.append(m(x, readout=sl))
        assert torch.allclose(outs[0], outs[1], atol=1e-6, rtol=1e-5), (rate, path)
        if rate == 1.0:  # the default itself: the same code, bit for bit
            assert torch.equal(outs[0], outs[1])


def test_hook_pattern_shows_the_mixture():
    rate = 0.25
    cfg = tiny_config(norm="ln", attention_rate=rate)
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data)
    _, cache = model.run_with_cache(data.inputs[:8])
    scores, pattern = cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"]
    causal = torch.tril(torch.ones(3, 3))
    want = rate * scores.softmax(-1) + (1 - rate) * causal / causal.sum(-1, keepdim=True)
    assert torch.allclose(pattern, want, atol=1e-7) and torch.allclose(pattern.sum(-1), torch.ones(()))
    assert (pattern[..., 0, 1:] == 0).all()  # the causal mask holds in the mixture


@pytest.mark.parametrize("args, message", [
    (["--attention-rate", "1.5"], "attention_rate must be in [0, 1]"),
    (["--attention-rate", "0.5", "--attention", "uniform"], "attention=uniform is already uniform"),
    (["--attention-rate", "0.5", "--kl-attn-beta", "0.1"], "kl_attn_beta reads the softmax"),
    (["--attention-rate", "0.5", "--model", "mlp"], "attention_rate=0.5 is an option of model=transformer")])
def test_bad_rates_are_one_line_and_exit_2(args, message, tmp_path):
    proc = groklens("train", "--p", "7", "--steps", "5", "--eval-every", "5", "--checkpoint-every", "5",
                    "-o", str(tmp_path / "r.h5"), *args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.h5").exists()
    with pytest.raises(BadInput, match="attention_rate"):
        tiny_config(attention_rate=float("nan")).validate()
