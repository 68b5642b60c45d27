"""Conformance snippets: transformer_lens.patching, each sweep against the same patches written by
hand on the float64 reference pass."""

from __future__ import annotations

import itertools

import torch
from transformer_lens import patching

from tests.models.tl_common import NON_ADDITIVE, Ctx, close

ATTN = {"z", "q", "k", "v", "pattern"}


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 0].mean()


def _name(act: str, layer: int) -> str:
    return f"blocks.{layer}.attn.hook_{act}" if act in ATTN else f"blocks.{layer}.hook_{act}"


def _setter(kind: str, idx: tuple, clean: torch.Tensor):
    """The hand-written patch: which slice of the activation takes the clean value."""
    where = {"pos": lambda: (slice(None), idx[0]), "pos_head": lambda: (slice(None), idx[0], idx[1]),
             "head": lambda: (slice(None), slice(None), idx[0]), "pattern_head": lambda: (slice(None), idx[0]),
             "pattern_head_dest": lambda: (slice(None), idx[0], idx[1])}[kind]()

    def patch(t):
        t = t.clone()
        t[where] = clean[where]
        return t
    return patch


def _expected(c: Ctx, corrupted: torch.Tensor, act: str, kind: str, shape: tuple) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float64)
    for idx in itertools.product(*map(range, shape)):
        name = _name(act, idx[0])
        out[idx] = _metric(c.reference(corrupted, patch={name: _setter(kind, idx[1:], c.ref.acts[name])}).logits)
    return out


def _sweep(c: Ctx, fn, act: str, kind: str) -> None:
    corrupted = c.data.inputs[6:12]
    _, clean_cache = c.run()
    got = fn(c.model, corrupted, clean_cache, _metric)
    close(got, _expected(c, corrupted, act, kind, tuple(got.shape)))


def patch_resid_pre(c: Ctx):
    """patching.get_act_patch_resid_pre"""
    _sweep(c, patching.get_act_patch_resid_pre, "resid_pre", "pos")


def patch_resid_mid(c: Ctx):
    """patching.get_act_patch_resid_mid"""
    _sweep(c, patching.get_act_patch_resid_mid, "resid_mid", "pos")


def patch_attn_out(c: Ctx):
    """patching.get_act_patch_attn_out"""
    _sweep(c, patching.get_act_patch_attn_out, "attn_out", "pos")


def patch_mlp_out(c: Ctx):
    """patching.get_act_patch_mlp_out"""
    _sweep(c, patching.get_act_patch_mlp_out, "mlp_out", "pos")


def patch_head_out_all_pos(c: Ctx):
    """patching.get_act_patch_attn_head_out_all_pos"""
    _sweep(c, patching.get_act_patch_attn_head_out_all_pos, "z", "head")


def patch_head_out_by_pos(c: Ctx):
    """patching.get_act_patch_attn_head_out_by_pos"""
    _sweep(c, patching.get_act_patch_attn_head_out_by_pos, "z", "pos_head")


def patch_head_q_all_pos(c: Ctx):
    """patching.get_act_patch_attn_head_q_all_pos"""
    _sweep(c, patching.get_act_patch_attn_head_q_all_pos, "q", "head")


def patch_head_k_all_pos(c: Ctx):
    """patching.get_act_patch_attn_head_k_all_pos"""
    _sweep(c, patching.get_act_patch_attn_head_k_all_pos, "k", "head")


def patch_head_v_by_pos(c: Ctx):
    """patching.get_act_patch_attn_head_v_by_pos"""
    _sweep(c, patching.get_act_patch_attn_head_v_by_pos, "v", "pos_head")


def patch_head_pattern_all_pos(c: Ctx):
    """patching.get_act_patch_attn_head_pattern_all_pos"""
    _sweep(c, patching.get_act_patch_attn_head_pattern_all_pos, "pattern", "pattern_head")


def patch_head_pattern_by_pos(c: Ctx):
    """patching.get_act_patch_attn_head_pattern_by_pos"""
    _sweep(c, patching.get_act_patch_attn_head_pattern_by_pos, "pattern", "pattern_head_dest")


def patch_block_every(c: Ctx):
    """patching.get_act_patch_block_every (resid_pre, attn_out, mlp_out)"""
    corrupted = c.data.inputs[6:12]
    _, clean_cache = c.run()
    got = patching.get_act_patch_block_every(c.model, corrupted, clean_cache, _metric)
    for i, act in enumerate(("resid_pre", "attn_out", "mlp_out")):
        close(got[i], _expected(c, corrupted, act, "pos", tuple(got.shape[1:])))


def patch_head_all_pos_every(c: Ctx):
    """patching.get_act_patch_attn_head_all_pos_every (out, q, k, v, pattern)"""
    corrupted = c.data.inputs[6:12]
    _, clean_cache = c.run()
    got = patching.get_act_patch_attn_head_all_pos_every(c.model, corrupted, clean_cache, _metric)
    acts = (("z", "head"), ("q", "head"), ("k", "head"), ("v", "head"), ("pattern", "pattern_head"))
    for i, (act, kind) in enumerate(acts):
        close(got[i], _expected(c, corrupted, act, kind, tuple(got.shape[1:])))


def _direct_path(c: Ctx, component: str) -> None:
    """One source head's clean-minus-corrupted write z @ W_O added to each later head's own input."""
    corrupted = c.data.inputs[6:12]
    _, clean_cache = c.run()
    _, corrupted_cache = c.run(corrupted)
    src_layer, src_head = 0, 1
    got = patching.get_act_patch_direct_path(c.model, corrupted, clean_cache, corrupted_cache, _metric,
                                             src_layer=src_layer, src_head=src_head, component=component, verbose=False)
    corr_ref = c.reference(corrupted)
    W_O = c.ref.sd[f"blocks.{src_layer}.attn.W_O"][src_head]
    z = f"blocks.{src_layer}.attn.hook_z"
    delta = (c.ref.acts[z][:, :, src_head] - corr_ref.acts[z][:, :, src_head]) @ W_O
    want = torch.zeros_like(got, dtype=torch.float64)
    for layer in range(src_layer + 1, c.L):
        for head in range(c.cfg.n_heads):
            def add(t, head=head):
                t = t.clone()
                t[:, :, head] += delta
                return t
            patch = {f"blocks.{layer}.attn.hook_{component}_input": add}
            want[layer, head] = _metric(c.reference(corrupted, patch=patch).logits)
    close(got, want)


def direct_path_q(c: Ctx):
    """patching.get_act_patch_direct_path(component='q')"""
    _direct_path(c, "q")


def direct_path_k(c: Ctx):
    """patching.get_act_patch_direct_path(component='k')"""
    _direct_path(c, "k")


def direct_path_v(c: Ctx):
    """patching.get_act_patch_direct_path(component='v')"""
    _direct_path(c, "v")


SNIPPETS = [patch_resid_pre, patch_resid_mid, patch_attn_out, patch_mlp_out, patch_head_out_all_pos,
            patch_head_out_by_pos, patch_head_q_all_pos, patch_head_k_all_pos, patch_head_v_by_pos,
            patch_head_pattern_all_pos, patch_head_pattern_by_pos, patch_block_every, patch_head_all_pos_every,
            direct_path_q, direct_path_k, direct_path_v]
MLP_APPLIES: set[str] = set()
# a head's write z @ W_O reaches a later head only through the norms after the sums
EXPECT_REFUSE = {f"direct_path_{w}": set(NON_ADDITIVE) for w in "qkv"}
NOT_APPLICABLE: dict[str, set[str]] = {}
