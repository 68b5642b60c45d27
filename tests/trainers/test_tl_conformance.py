"""A TransformerLens user's everyday code on a tiny model of every variant (issue 16).

Each snippet is written as a TL user writes it and checked against an independent computation
(module calls, autograd, the trainer's own loss path), or, where TL's method cannot be right for
a variant, it must refuse with a one-line TLUnsupported error. EXPECT lists the refusals; every
other (snippet, variant) pair must work. `python -m tests.trainers.test_tl_conformance` prints
the table (works / refuses / BREAKS / WRONG) for docs/TRANSFORMERLENS.md.
"""

from __future__ import annotations

import copy
import math
import traceback
from functools import lru_cache

import pytest
import torch
import torch.nn.functional as F
from transformer_lens import FactoredMatrix, SVDInterpreter, patching
from transformer_lens.utilities import get_act_name

from groklens.trainers.models import build_model
from groklens.tasks import TASKS
from tests.helpers import tiny_config

try:
    from groklens.trainers.models.hooked import TLUnsupported
except ImportError:  # before issue 16: nothing refuses
    class TLUnsupported(ValueError):
        pass

ATOL = 1e-4  # float32 sums of a few dozen terms of size ~1

VARIANTS = {
    "none": dict(norm="none"),
    "ln": dict(norm="ln", mlp_bias=True),
    "ln_post": dict(norm="ln", norm_placement="post", mlp_bias=True),
    "rms": dict(norm="rms"),
    "rms_post": dict(norm="rms", norm_placement="post"),
    "sphere": dict(norm="sphere", unembed="bounded", causal=False, mlp_bias=True, init_scheme="torch"),
    "uniform": dict(norm="ln", attention="uniform"),
    "mlp": dict(model="mlp", mlp_bias=True),
}
NON_ADDITIVE = {"ln_post", "rms_post", "sphere"}  # a norm after every residual sum
TRANSFORMERS = [v for v in VARIANTS if v != "mlp"]


class Ctx:
    def __init__(self, variant: str):
        self.variant = variant
        self.cfg = tiny_config(n_layers=2, **VARIANTS[variant])
        self.data = TASKS.get(self.cfg.task).build(self.cfg)
        self.model = build_model(self.cfg, self.data).eval()
        with torch.no_grad():  # trained-looking norms: not all ones and zeros
            for name, p in self.model.named_parameters():
                if name.endswith((".w", ".b")):
                    p.add_(0.3 * torch.randn_like(p))
        self.tokens = self.data.inputs[:6]
        self.labels = self.data.labels[:6]
        self.p = self.cfg.p


@lru_cache(maxsize=None)
def ctx(variant: str) -> Ctx:
    torch.manual_seed(0)
    return Ctx(variant)


def close(a, b, atol=ATOL) -> None:
    a, b = a.detach().double(), b.detach().double()
    assert torch.allclose(a, b, atol=atol, rtol=1e-4), float((a - b).abs().max())


def final_logits(c: Ctx) -> torch.Tensor:
    with torch.no_grad():
        return c.model(c.tokens)[:, -1]


def bias_term(c: Ctx, direction: torch.Tensor) -> torch.Tensor:
    """What ln_final's bias adds to a logit difference (TL keeps it out of the attributions)."""
    ln = c.model.ln_final
    return ln.b @ direction if hasattr(ln, "b") else torch.zeros(())


# ----------------------------------------------------------------------------- the snippets
def run_with_cache_filters(c: Ctx):
    logits, cache = c.model.run_with_cache(c.tokens)
    close(logits, c.model(c.tokens))
    names = list(c.model.hook_dict)
    for flt, want in ((names[1], {names[1]}), (names[:2], set(names[:2])),
                      (lambda n: n.endswith("hook_post"), {n for n in names if n.endswith("hook_post")})):
        _, sub = c.model.run_with_cache(c.tokens, names_filter=flt)
        assert set(sub.keys()) == want
        for k in want:
            close(sub[k], cache[k])


def get_act_name_pattern(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    pattern = cache[get_act_name("pattern", 0)]
    q, k = cache["q", 0], cache["k", 0]
    n = q.shape[1]
    scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(c.model.cfg.d_head)
    if c.cfg.attention == "uniform":
        scores = torch.zeros_like(scores)
    if c.cfg.causal:
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    close(pattern, scores.softmax(-1))


def hooks_context(c: Ctx):
    """Zero-ablate the last hidden state inside model.hooks(); nothing is left behind."""
    last = c.model.cfg.n_layers - 1
    name = "hook_logits" if c.variant == "mlp" else f"blocks.{last}.hook_resid_post"
    with c.model.hooks(fwd_hooks=[(name, lambda t, hook: torch.zeros_like(t))]):
        out = c.model(c.tokens)[:, -1]
    assert not any(hp._forward_hooks or hp._backward_hooks for hp in c.model.hook_dict.values())
    if c.variant == "mlp":
        want = torch.zeros_like(out)
    else:
        d = c.model.cfg.d_model
        want = c.model.unembed(c.model.ln_final(torch.zeros(1, 1, d)))[0, 0].expand_as(out)
    close(out, want)
    close(c.model(c.tokens)[:, -1], final_logits(c))


def run_with_hooks_fwd_bwd(c: Ctx):
    name = "layers.0.hook_pre" if c.variant == "mlp" else "blocks.0.hook_resid_mid"
    seen = {}

    def keep(t, hook):
        t.retain_grad()
        seen["act"] = t

    def grad(g, hook):
        seen["grad"] = g.detach().clone()

    out = c.model.run_with_hooks(c.tokens, fwd_hooks=[(name, keep)], bwd_hooks=[(name, grad)])
    out[:, -1].pow(2).sum().backward()
    close(seen["grad"], seen["act"].grad)
    c.model.zero_grad(set_to_none=True)


def patching_resid_pre(c: Ctx):
    corrupted = c.data.inputs[6:12]
    _, clean_cache = c.model.run_with_cache(c.tokens)
    metric = lambda logits: logits[:, -1, 0].mean()  # noqa: E731
    got = patching.get_act_patch_resid_pre(c.model, corrupted, clean_cache, metric)
    for layer in range(c.model.cfg.n_layers):
        for pos in range(c.tokens.shape[1]):
            def patch(t, hook, pos=pos, layer=layer):
                t = t.clone()
                t[:, pos] = clean_cache["resid_pre", layer][:, pos]
                return t
            with torch.no_grad():
                by_hand = metric(c.model.run_with_hooks(corrupted, fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", patch)]))
            close(got[layer, pos], by_hand)


def decompose_resid(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels[:2] == ["embed", "pos_embed"]
    close(stack.sum(0), cache["resid_post", -1])


def accumulated_resid(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    acc = cache.accumulated_resid()
    close(acc[-1], cache["resid_post", -1])
    close(acc[0], cache["resid_pre", 0])
    normed = cache.accumulated_resid(apply_ln=True, pos_slice=-1)
    close(normed[-1] @ c.model.W_U + c.model.b_U, final_logits(c))


def stack_head_results(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    heads, labels = cache.stack_head_results(return_labels=True)
    h = c.model.cfg.n_heads
    for layer in range(c.model.cfg.n_layers):
        close(heads[layer * h : (layer + 1) * h].sum(0), cache["attn_out", layer])
    assert labels[0] == "L0H0"


def stack_head_results_remainder(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    stack = cache.stack_head_results(incl_remainder=True)
    close(stack.sum(0), cache["resid_post", -1])


def stack_neuron_results(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    neurons = cache.stack_neuron_results(layer=1)
    b_out = c.model.b_out[0]
    close(neurons.sum(0) + b_out, cache["mlp_out", 0])


def logit_lens(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    res = cache.logit_lens()
    close(res.readout.values[-1], final_logits(c))


def logit_attrs_decomposed(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    stack = cache.decompose_resid(pos_slice=-1)  # logit_attrs applies the final norm itself
    wrong = (c.labels + 1) % c.p
    attrs = cache.logit_attrs(stack, tokens=c.labels, incorrect_tokens=wrong, pos_slice=-1)
    logits = final_logits(c)
    diff = logits.gather(1, c.labels[:, None])[:, 0] - logits.gather(1, wrong[:, None])[:, 0]
    direction = c.model.W_U[:, c.labels] - c.model.W_U[:, wrong]  # [d, b]
    offset = torch.stack([bias_term(c, direction[:, i]) for i in range(len(c.labels))])
    close(attrs.sum(0) + offset, diff)


def logit_attrs_accumulated(c: Ctx):
    """logit_attrs of the stream states: the last one gives the model's logit difference."""
    _, cache = c.model.run_with_cache(c.tokens)
    acc = cache.accumulated_resid(pos_slice=-1)
    wrong = (c.labels + 1) % c.p
    attrs = cache.logit_attrs(acc, tokens=c.labels, incorrect_tokens=wrong, pos_slice=-1)
    logits = final_logits(c)
    diff = logits.gather(1, c.labels[:, None])[:, 0] - logits.gather(1, wrong[:, None])[:, 0]
    direction = c.model.W_U[:, c.labels] - c.model.W_U[:, wrong]
    offset = torch.stack([bias_term(c, direction[:, i]) for i in range(len(c.labels))])
    close(attrs[-1] + offset, diff)


def full_resid_decomposition(c: Ctx):
    _, cache = c.model.run_with_cache(c.tokens)
    stack, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert labels[-1] == "bias" and labels[0] == "L0H0"
    close(stack.sum(0), cache["resid_post", -1])


def svd_interpreter(c: Ctx):
    svd = SVDInterpreter(c.model)
    vecs = svd.get_singular_vectors("OV", layer_index=0, head_index=1, num_vectors=3)
    ov = c.model.blocks[0].attn.W_V[1] @ c.model.blocks[0].attn.W_O[1]
    _, _, vh = torch.linalg.svd(ov)
    want = (c.model.W_U.T @ vh[:3].T).unsqueeze(1)
    close(vecs.abs(), want.abs())


def factored_ov(c: Ctx):
    ov = c.model.OV[1, 0]
    assert isinstance(ov, FactoredMatrix)
    attn = c.model.blocks[1].attn
    close(ov.AB, attn.W_V[0] @ attn.W_O[0])
    close(ov.S, torch.linalg.svdvals(attn.W_V[0] @ attn.W_O[0])[: ov.S.shape[0]])


def factored_qk(c: Ctx):
    qk = c.model.QK[0, 1]
    attn = c.model.blocks[0].attn
    close(qk.AB, attn.W_Q[1] @ attn.W_K[1].T)


def model_weights(c: Ctx):
    m, L = c.model, c.model.cfg.n_layers
    assert m.W_Q.shape == (L, m.cfg.n_heads, m.cfg.d_model, m.cfg.d_head)
    assert m.W_O.shape == (L, m.cfg.n_heads, m.cfg.d_head, m.cfg.d_model)
    assert m.b_Q.shape == (L, m.cfg.n_heads, m.cfg.d_head) and m.b_O.shape == (L, m.cfg.d_model)
    assert m.W_in.shape == (L, m.cfg.d_model, m.cfg.d_mlp) and m.b_out.shape == (L, m.cfg.d_model)
    assert m.W_E_pos.shape == (m.cfg.d_vocab + m.cfg.n_ctx, m.cfg.d_model)
    close(m.W_K[1], m.blocks[1].attn.W_K)
    # the readout is linear in what the unembedding reads: logits = x @ W_U + b_U
    _, cache = m.run_with_cache(c.tokens)
    x = cache["resid_post", -1] if c.variant in NON_ADDITIVE or c.cfg.norm == "none" else m.ln_final(cache["resid_post", -1])
    close(x[:, -1] @ m.W_U + m.b_U, final_logits(c))


def return_type_loss(c: Ctx):
    """model(tokens, return_type='loss') is the trainer's task loss, through the trainer's path."""
    from groklens.trainers.single import SingleRun

    class _W:
        class f:
            filename = "unused.h5"

    tr = SingleRun(c.cfg, c.data, lambda _t: _W(), progress=False)
    tr.model.load_state_dict(c.model.state_dict())
    tr.model.eval()
    with torch.no_grad():
        want = tr.task_loss(tr.readout(tr.forward(tr.train_x)), tr.train_y)
        loss = c.model(tr.train_x, return_type="loss")
        logits, both = c.model(tr.train_x, return_type="both")
        assert c.model(tr.train_x, return_type=None) is None
    close(loss, want, atol=1e-6)
    close(both, want, atol=1e-6)
    close(logits, c.model(tr.train_x))


def incl_bwd(c: Ctx):
    """run_with_cache(incl_bwd=True): the cached gradient at the last hidden state is the loss's."""
    m = c.model
    name = "hook_logits" if c.variant == "mlp" else f"blocks.{m.cfg.n_layers - 1}.hook_resid_post"
    _, cache = m.run_with_cache(c.tokens, return_type="loss", incl_bwd=True, names_filter=name)
    x = cache[name].detach().requires_grad_(True)
    logits = x if c.variant == "mlp" else m.unembed(m.ln_final(x))[:, -1]
    loss = F.cross_entropy(logits.double(), c.labels)
    (want,) = torch.autograd.grad(loss, x)
    close(cache[name + "_grad"], want)
    m.zero_grad(set_to_none=True)


def cache_result(c: Ctx):
    m = c.model
    m.set_use_attn_result(True)
    try:
        _, cache = m.run_with_cache(c.tokens)
    finally:
        m.set_use_attn_result(False)
    result = cache["result", 0]
    close(result[:, :, 1], cache["z", 0][:, :, 1] @ m.blocks[0].attn.W_O[1])
    close(result.sum(-2), cache["attn_out", 0])


def split_qkv_input(c: Ctx):
    m = c.model
    m.set_use_split_qkv_input(True)
    try:
        logits, cache = m.run_with_cache(c.tokens)
    finally:
        m.set_use_split_qkv_input(False)
    h = m.cfg.n_heads
    for name in ("q_input", "k_input", "v_input"):
        close(cache[name, 1], cache["resid_pre", 1][:, :, None].expand(-1, -1, h, -1))
    close(logits, m(c.tokens))


def to_tokens(c: Ctx):
    toks = c.model.to_tokens("3 5 =")
    assert toks.tolist() == [[3, 5, c.p]]
    assert c.model.to_str_tokens(toks[0]) == ["3", "5", "="]
    assert c.model.to_single_token("=") == c.p
    close(c.model("3 5 =")[0], c.model(c.data.inputs[3 * c.p + 5 : 3 * c.p + 6])[0])


def fold_layer_norm(c: Ctx):
    m = copy.deepcopy(c.model)
    before = m(c.tokens)
    m.fold_layer_norm()
    close(m(c.tokens), before)
    assert all(float((p.detach() - 1).abs().max()) == 0 for n, p in m.named_parameters() if n.endswith(".w"))


def mid_layer_apply_ln(c: Ctx):
    """apply_ln_to_stack at the input of layer 1 (what the stack contributes to ln1's output)."""
    _, cache = c.model.run_with_cache(c.tokens)
    acc = cache.accumulated_resid(layer=1)
    scaled = cache.apply_ln_to_stack(acc, layer=1)
    x = cache["resid_pre", 1]
    if c.cfg.norm == "ln":
        x = x - x.mean(-1, keepdim=True)
    want = x / cache["blocks.1.ln1.hook_scale"] if c.cfg.norm in ("ln", "rms") else x
    close(scaled[-1], want)


SNIPPETS = [run_with_cache_filters, get_act_name_pattern, hooks_context, run_with_hooks_fwd_bwd,
            patching_resid_pre, decompose_resid, accumulated_resid, stack_head_results,
            stack_head_results_remainder, stack_neuron_results, logit_lens, logit_attrs_decomposed,
            logit_attrs_accumulated, full_resid_decomposition, mid_layer_apply_ln, svd_interpreter,
            factored_ov, factored_qk, model_weights, return_type_loss, incl_bwd, cache_result,
            split_qkv_input, to_tokens, fold_layer_norm]

# what the MLP model has: no attention, no residual stream, no per-layer block weights
MLP_APPLIES = {"run_with_cache_filters", "hooks_context", "run_with_hooks_fwd_bwd", "return_type_loss",
               "incl_bwd", "to_tokens", "decompose_resid", "accumulated_resid", "logit_lens"}
_STREAM_SUM = {"decompose_resid", "logit_attrs_decomposed", "full_resid_decomposition",
               "stack_head_results_remainder", "mid_layer_apply_ln"}
EXPECT_REFUSE = {
    **{s: set(NON_ADDITIVE) for s in _STREAM_SUM},
    "decompose_resid": NON_ADDITIVE | {"mlp"},
    "accumulated_resid": {"mlp"},
    "logit_lens": {"mlp"},
    # TL's SVDInterpreter asserts d_vocab == d_vocab_out; ours has an input-only '=' token
    "svd_interpreter": set(TRANSFORMERS),
    "factored_qk": {"uniform"},
    # folding needs somewhere to put the norm's bias and weight: only RMS pre-norm (no bias) folds
    "fold_layer_norm": {"ln", "ln_post", "rms_post", "sphere", "uniform"},
}
CASES = [(s, v) for s in SNIPPETS for v in VARIANTS if v != "mlp" or s.__name__ in MLP_APPLIES]


@pytest.mark.parametrize("snippet,variant", CASES, ids=[f"{s.__name__}-{v}" for s, v in CASES])
def test_snippet(snippet, variant):
    c = ctx(variant)
    if variant in EXPECT_REFUSE.get(snippet.__name__, ()):
        with pytest.raises(TLUnsupported) as err:
            snippet(c)
        assert "\n" not in str(err.value) and len(str(err.value)) < 300
    else:
        snippet(c)


def table() -> dict[tuple[str, str], str]:
    """works / refuses (one-line TLUnsupported) / BREAKS (any other error) / WRONG (a wrong number)."""
    out = {}
    for s, v in CASES:
        try:
            s(ctx(v))
            out[s.__name__, v] = "works"
        except TLUnsupported as e:
            out[s.__name__, v] = "refuses" if "\n" not in str(e) else "BREAKS"
        except AssertionError as e:  # WRONG when our check failed, BREAKS when TL's own assert did
            where = traceback.extract_tb(e.__traceback__)[-1].filename
            out[s.__name__, v] = "WRONG" if where == __file__ else "BREAKS"
        except Exception:  # noqa: BLE001 — the table records it
            out[s.__name__, v] = "BREAKS"
    return out


if __name__ == "__main__":
    t = table()
    print("| snippet | " + " | ".join(VARIANTS) + " |")
    print("|---" * (len(VARIANTS) + 1) + "|")
    for s in SNIPPETS:
        print(f"| {s.__name__} | " + " | ".join(t.get((s.__name__, v), "n/a") for v in VARIANTS) + " |")
