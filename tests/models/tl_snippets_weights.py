"""Conformance snippets: the weight surface (stacked weights, biases, FactoredMatrix, composition
scores, folding and centring), each against the raw state_dict in float64."""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from transformer_lens import FactoredMatrix, SVDInterpreter

from tests.models.tl_common import NON_ADDITIVE, TRANSFORMERS, Ctx, close


def model_weights(c: Ctx):
    """model.W_Q ... b_out, W_E_pos, W_U, b_U: shapes, values, and logits = x @ W_U + b_U"""
    m, L, sd = c.model, c.L, c.ref.sd
    assert m.W_Q.shape == (L, m.cfg.n_heads, m.cfg.d_model, m.cfg.d_head)
    assert m.W_O.shape == (L, m.cfg.n_heads, m.cfg.d_head, m.cfg.d_model)
    assert m.b_Q.shape == (L, m.cfg.n_heads, m.cfg.d_head) and m.b_O.shape == (L, m.cfg.d_model)
    assert m.W_in.shape == (L, m.cfg.d_model, m.cfg.d_mlp) and m.b_out.shape == (L, m.cfg.d_model)
    for l in range(L):
        for w in ("W_Q", "W_K", "W_V", "W_O"):
            close(getattr(m, w)[l], sd[f"blocks.{l}.attn.{w}"])
        for w in ("W_in", "W_out", "b_in", "b_out"):
            close(getattr(m, w)[l], sd.get(f"blocks.{l}.mlp.{w}", torch.zeros_like(getattr(m, w)[l])))
    close(m.W_E_pos, torch.cat([sd["embed.W_E"], sd["pos_embed.W_pos"]]))
    close(m.W_U, c.ref.W_U)
    x = c.ref.acts[f"blocks.{L - 1}.hook_resid_post"]
    if "ln_final.hook_scale" in c.ref.acts:
        x = F.layer_norm(x, (x.shape[-1],), sd["ln_final.w"], sd["ln_final.b"], 1e-5) if c.cfg.norm == "ln" else \
            c.ref.acts["ln_final.hook_normalized"] * sd["ln_final.w"]
    close(x @ m.W_U.double() + m.b_U.double(), c.ref.logits)


def block_biases(c: Ctx):
    """blocks[l].attn.b_Q / b_K / b_V / b_O (zeros: no attention biases), as model.b_Q[l]"""
    for l, block in enumerate(c.model.blocks):
        for b in ("b_Q", "b_K", "b_V"):
            t = getattr(block.attn, b)
            assert t.shape == (c.cfg.n_heads, c.cfg.d_head) and not t.any()
            close(getattr(c.model, b)[l], t)
        assert block.attn.b_O.shape == (c.cfg.d_model,) and not block.attn.b_O.any()


def factored_ov(c: Ctx):
    """model.OV[1, 0]: FactoredMatrix AB and singular values"""
    ov = c.model.OV[1, 0]
    assert isinstance(ov, FactoredMatrix)
    sd = c.ref.sd
    want = sd["blocks.1.attn.W_V"][0] @ sd["blocks.1.attn.W_O"][0]
    close(ov.AB, want)
    close(ov.S, torch.linalg.svdvals(want)[: ov.S.shape[0]])
    close(ov.norm(), torch.linalg.matrix_norm(want))


def factored_qk(c: Ctx):
    """model.QK[0, 1]: FactoredMatrix AB"""
    sd = c.ref.sd
    close(c.model.QK[0, 1].AB, sd["blocks.0.attn.W_Q"][1] @ sd["blocks.0.attn.W_K"][1].T)


def qk_scores(c: Ctx):
    """attention scores from model.QK and what the attention reads"""
    ref, sd = c.ref, c.ref.sd
    for l in range(c.L):
        x = ref.acts[f"blocks.{l}.hook_resid_pre"]
        if c.variant not in NON_ADDITIVE and c.cfg.norm != "none":
            x = ref.acts[f"blocks.{l}.ln1.hook_normalized"] * sd[f"blocks.{l}.ln1.w"] + sd.get(f"blocks.{l}.ln1.b", 0.0)
        scores = torch.einsum("bqd,hde,bke->bhqk", x, c.model.QK[l].AB.double(), x) / math.sqrt(c.cfg.d_head)
        want = ref.acts[f"blocks.{l}.attn.hook_attn_scores"]
        finite = torch.isfinite(want)
        close(scores[finite], want[finite])


def _composition(c: Ctx, mode: str) -> torch.Tensor:
    sd, L, H = c.ref.sd, c.L, c.cfg.n_heads
    out = torch.zeros(L, H, L, H, dtype=torch.float64)
    for l1 in range(L):
        for h1 in range(H):
            left = sd[f"blocks.{l1}.attn.W_V"][h1] @ sd[f"blocks.{l1}.attn.W_O"][h1]
            for l2 in range(l1 + 1, L):
                for h2 in range(H):
                    a = f"blocks.{l2}.attn."
                    qk = sd[a + "W_Q"][h2] @ sd[a + "W_K"][h2].T
                    right = {"Q": qk, "K": qk.T, "V": sd[a + "W_V"][h2] @ sd[a + "W_O"][h2]}[mode]
                    norm = torch.linalg.matrix_norm
                    out[l1, h1, l2, h2] = norm(left @ right) / (norm(left) * norm(right))
    return out


def composition_scores_q(c: Ctx):
    """model.all_composition_scores('Q')"""
    close(c.model.all_composition_scores("Q"), _composition(c, "Q"))


def composition_scores_k(c: Ctx):
    """model.all_composition_scores('K')"""
    close(c.model.all_composition_scores("K"), _composition(c, "K"))


def composition_scores_v(c: Ctx):
    """model.all_composition_scores('V')"""
    close(c.model.all_composition_scores("V"), _composition(c, "V"))


def svd_interpreter(c: Ctx):
    """SVDInterpreter(model).get_singular_vectors('OV', ...)"""
    svd = SVDInterpreter(c.model)
    vecs = svd.get_singular_vectors("OV", layer_index=0, head_index=1, num_vectors=3)
    sd = c.ref.sd
    _, _, vh = torch.linalg.svd(sd["blocks.0.attn.W_V"][1] @ sd["blocks.0.attn.W_O"][1])
    close(vecs.abs(), (c.ref.W_U.T @ vh[:3].T).unsqueeze(1).abs())


def _folded(c: Ctx):
    m = copy.deepcopy(c.model)
    m.fold_layer_norm()
    return m


def fold_layer_norm(c: Ctx):
    """model.fold_layer_norm(): logits unchanged, every norm weight 1 and bias 0"""
    m = _folded(c)
    with torch.no_grad():
        close(m(c.tokens), c.ref.logits)
    for n, p in m.named_parameters():
        if n.endswith((".w", ".b")):
            assert float((p.detach() - float(n.endswith(".w"))).abs().max()) == 0, n


def fold_layer_norm_q(c: Ctx):
    """after fold_layer_norm: q = ln1's normalized input @ W_Q + b_Q"""
    m = _folded(c)
    _, cache = m.run_with_cache(c.tokens)
    for l in range(c.L):
        q = torch.einsum("bpd,hde->bphe", cache[f"blocks.{l}.ln1.hook_normalized"], m.W_Q[l]) + m.b_Q[l]
        close(q, c.ref.acts[f"blocks.{l}.attn.hook_q"])


def fold_cached_scale_lens(c: Ctx):
    """after fold_layer_norm: apply_ln_to_stack(accumulated_resid) @ W_U + b_U gives the logits"""
    m = _folded(c)
    _, cache = m.run_with_cache(c.tokens)
    lens = cache.apply_ln_to_stack(cache.accumulated_resid(pos_slice=-1), layer=-1, pos_slice=-1)
    close(lens[-1] @ m.W_U + m.b_U, c.ref.logits[:, -1])


def fold_dla(c: Ctx):
    """after fold_layer_norm: logit_attrs(decompose_resid) sums to the logit difference less b_U's"""
    m = _folded(c)
    _, cache = m.run_with_cache(c.tokens)
    attrs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=c.labels,
                              incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs.sum(0) + m.b_U[c.labels] - m.b_U[c.wrong], c.logit_diff())


def center_unembed(c: Ctx):
    """model.center_unembed(): the log-probabilities unchanged, W_U's rows centred"""
    m = copy.deepcopy(c.model)
    m.center_unembed()
    with torch.no_grad():
        close(m(c.tokens).log_softmax(-1), c.ref.logits.log_softmax(-1))
    close(m.W_U.mean(-1), torch.zeros(c.cfg.d_model))


def tokens_to_residual_directions(c: Ctx):
    """model.tokens_to_residual_directions(int / tensor / '3')"""
    m, ref = c.model, c.ref
    close(m.tokens_to_residual_directions(c.labels), ref.direction(c.labels))
    close(m.tokens_to_residual_directions(3), ref.direction(torch.tensor([3]))[0])
    close(m.tokens_to_residual_directions("3"), ref.direction(torch.tensor([3]))[0])


def residual_direction_of_eq(c: Ctx):
    """model.tokens_to_residual_directions('=') (an input-only token)"""
    c.model.tokens_to_residual_directions("=")


SNIPPETS = [model_weights, block_biases, factored_ov, factored_qk, qk_scores, composition_scores_q,
            composition_scores_k, composition_scores_v, svd_interpreter, fold_layer_norm, fold_layer_norm_q,
            fold_cached_scale_lens, fold_dla, center_unembed, tokens_to_residual_directions, residual_direction_of_eq]
MLP_APPLIES: set[str] = set()
_NO_FOLD = NON_ADDITIVE  # a norm after the sums has no matrix of its own to fold into (the sphere: no weights)
EXPECT_REFUSE = {
    # TL's SVDInterpreter asserts d_vocab == d_vocab_out; ours has an input-only '=' token
    "svd_interpreter": set(TRANSFORMERS),
    "factored_qk": {"uniform"}, "qk_scores": {"uniform"}, "composition_scores_q": {"uniform"},
    "composition_scores_k": {"uniform"},
    **{s: set(_NO_FOLD) for s in ("fold_layer_norm", "fold_layer_norm_q", "fold_cached_scale_lens", "fold_dla")},
    "center_unembed": {"sphere"},  # unembed=bounded: tau times unit columns, which centring would break
    "residual_direction_of_eq": set(TRANSFORMERS),
}
NOT_APPLICABLE = {"fold_layer_norm_q": {"none"}}  # no norm: nothing normalizes the attention input
