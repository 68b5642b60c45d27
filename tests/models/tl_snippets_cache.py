"""Conformance snippets: the cache and hooks, each against the float64 reference pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformer_lens.utilities import Slice, get_act_name

from tests.models.tl_common import NORMED, PRE_NORM, Ctx, close


def _hooks_of(c: Ctx, suffixes: tuple[str, ...]) -> list[str]:
    return [k for k in c.ref.acts if k.endswith(suffixes)]


def _same(c: Ctx, names: list[str], atol: float = 1e-4) -> None:
    _, cache = c.run()
    assert names
    for name in names:
        close(cache[name], c.ref.acts[name], atol)


def cache_embeddings(c: Ctx):
    """cache['hook_embed'], cache['hook_pos_embed']"""
    _same(c, ["hook_embed"] + ([] if c.variant == "mlp" else ["hook_pos_embed"]))


def cache_resid_stream(c: Ctx):
    """cache['resid_pre' / 'resid_mid' / 'resid_post', l]"""
    _, cache = c.run()
    for l in range(c.L):
        for w in ("pre", "mid", "post"):
            close(cache[f"resid_{w}", l], c.ref.acts[f"blocks.{l}.hook_resid_{w}"])


def cache_norm_scales(c: Ctx):
    """every norm's hook_scale (ln_embed, blocks.l.ln1 / ln2, ln_final)"""
    _same(c, _hooks_of(c, (".hook_scale",)))


def cache_norm_normalized(c: Ctx):
    """every norm's hook_normalized"""
    _same(c, _hooks_of(c, (".hook_normalized",)))


def cache_qkv(c: Ctx):
    """cache['q' / 'k' / 'v', l]"""
    _same(c, _hooks_of(c, ("attn.hook_q", "attn.hook_k", "attn.hook_v")))


def cache_attn_scores(c: Ctx):
    """cache['attn_scores', l] (masked entries -inf)"""
    _, cache = c.run()
    for l in range(c.L):
        got, want = cache["attn_scores", l], c.ref.acts[f"blocks.{l}.attn.hook_attn_scores"]
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        close(got.masked_fill(torch.isinf(got), 0), want.masked_fill(torch.isinf(want), 0))


def cache_pattern(c: Ctx):
    """cache[get_act_name('pattern', l)]"""
    _, cache = c.run()
    for l in range(c.L):
        close(cache[get_act_name("pattern", l)], c.ref.acts[f"blocks.{l}.attn.hook_pattern"])


def cache_z(c: Ctx):
    """cache['z', l]"""
    _same(c, _hooks_of(c, ("attn.hook_z",)))


def cache_attn_out(c: Ctx):
    """cache['attn_out', l]"""
    _same(c, _hooks_of(c, ("hook_attn_out",)))


def cache_mlp_acts(c: Ctx):
    """cache['pre' / 'post', l] (MLP neurons; the MLP model's layers.i.hook_pre / hook_post)"""
    names = ("hook_pre", "hook_post") if c.variant == "mlp" else ("mlp.hook_pre", "mlp.hook_post")
    _same(c, _hooks_of(c, names))


def cache_mlp_out(c: Ctx):
    """cache['mlp_out', l]"""
    _same(c, _hooks_of(c, ("hook_mlp_out",)))


def model_logits(c: Ctx):
    """model(tokens) (logits at every position)"""
    with torch.no_grad():
        close(c.model(c.tokens), c.ref.logits)


def act_name_shorthand(c: Ctx):
    """cache['resid_post', -1], cache['pattern', 1, 'attn'], cache['post', 0]"""
    _, cache = c.run()
    close(cache["resid_post", -1], c.ref.acts[f"blocks.{c.L - 1}.hook_resid_post"])
    close(cache["pattern", 1, "attn"], c.ref.acts["blocks.1.attn.hook_pattern"])
    close(cache["post", 0], c.ref.acts["blocks.0.mlp.hook_post"])


def norm_shorthand(c: Ctx):
    """cache['scale', l, 'ln1'], cache['normalized', l, 'ln2'] (the same names on every normed variant)"""
    _, cache = c.run()
    for l in range(c.L):
        close(cache["scale", l, "ln1"], c.ref.acts[f"blocks.{l}.ln1.hook_scale"])
        close(cache["normalized", l, "ln2"], c.ref.acts[f"blocks.{l}.ln2.hook_normalized"])


def norm_hook_names(c: Ctx):
    """hook names of the norms do not change with the variant (ln1, ln2, ln_embed)"""
    names = set(c.model.hook_dict)
    want = {f"blocks.{l}.ln{i}.hook_{w}" for l in range(c.L) for i in (1, 2) for w in ("scale", "normalized")}
    if c.variant not in PRE_NORM:
        want |= {"ln_embed.hook_scale", "ln_embed.hook_normalized"}
    assert want <= names, sorted(want - names)


def run_with_cache_filters(c: Ctx):
    """run_with_cache(names_filter=str / list / callable)"""
    logits, cache = c.run()
    close(logits, c.ref.logits)
    names = list(c.model.hook_dict)
    for flt, want in ((names[1], {names[1]}), (names[:2], set(names[:2])),
                      (lambda n: n.endswith("hook_post"), {n for n in names if n.endswith("hook_post")})):
        _, sub = c.run(names_filter=flt)
        assert set(sub.keys()) == want
        for k in want:
            close(sub[k], cache[k])


def remove_batch_dim(c: Ctx):
    """run_with_cache(one_input, remove_batch_dim=True)"""
    _, cache = c.run(c.tokens[:1], remove_batch_dim=True)
    name = "hook_logits" if c.variant == "mlp" else "blocks.1.hook_resid_mid"
    close(cache[name], c.ref.acts[name][0])


def cache_remove_batch_dim(c: Ctx):
    """cache.remove_batch_dim() and cache.apply_slice_to_batch_dim"""
    name = "hook_logits" if c.variant == "mlp" else "blocks.0.hook_resid_post"
    _, cache = c.run()
    sub = cache.apply_slice_to_batch_dim(Slice([1, 4]))
    close(sub[name], c.ref.acts[name][[1, 4]])
    _, one = c.run(c.tokens[2:3])
    close(one.remove_batch_dim()[name], c.ref.acts[name][2])


def cache_container(c: Ctx):
    """len / keys / values / items / iter / to('cpu') of the cache"""
    _, cache = c.run()
    keys = list(cache.keys())
    assert keys == list(cache) == [k for k, _ in cache.items()] and len(cache) == len(keys) == len(list(cache.values()))
    assert set(keys) <= set(c.model.hook_dict)
    moved = cache.to("cpu")
    name = "hook_embed"
    close(moved[name], c.ref.acts[name])


def stack_activation(c: Ctx):
    """cache.stack_activation('resid_pre')"""
    _, cache = c.run()
    close(cache.stack_activation("resid_pre"),
          torch.stack([c.ref.acts[f"blocks.{l}.hook_resid_pre"] for l in range(c.L)]))


def compute_head_results(c: Ctx):
    """cache.compute_head_results(); cache['result', l]"""
    _, cache = c.run()
    cache.compute_head_results()
    for l in range(c.L):
        close(cache["result", l], c.ref.acts[f"blocks.{l}.attn.hook_result"])


def use_attn_result(c: Ctx):
    """set_use_attn_result(True); cache['result', l]"""
    m = c.model
    m.set_use_attn_result(True)
    try:
        logits, cache = c.run()
    finally:
        m.set_use_attn_result(False)
    close(logits, c.ref.logits)
    for l in range(c.L):
        close(cache["result", l], c.ref.acts[f"blocks.{l}.attn.hook_result"])


def use_split_qkv_input(c: Ctx):
    """set_use_split_qkv_input(True); cache['q_input', l] and blocks.l.attn.hook_q_input"""
    m = c.model
    m.set_use_split_qkv_input(True)
    try:
        logits, cache = c.run()
    finally:
        m.set_use_split_qkv_input(False)
    close(logits, c.ref.logits)
    for l in range(c.L):
        for w in ("q", "k", "v"):
            close(cache[f"{w}_input", l], c.ref.acts[f"blocks.{l}.attn.hook_{w}_input"])
            close(cache[f"blocks.{l}.attn.hook_{w}_input"], c.ref.acts[f"blocks.{l}.attn.hook_{w}_input"])


def use_attn_in(c: Ctx):
    """set_use_attn_in(True); cache['attn_in', l]"""
    m = c.model
    m.set_use_attn_in(True)
    try:
        logits, cache = c.run()
    finally:
        m.set_use_attn_in(False)
    close(logits, c.ref.logits)
    for l in range(c.L):
        close(cache["attn_in", l], c.ref.acts[f"blocks.{l}.attn.hook_q_input"])


def use_hook_mlp_in(c: Ctx):
    """set_use_hook_mlp_in(True); cache['mlp_in', l]"""
    m = c.model
    m.set_use_hook_mlp_in(True)
    try:
        logits, cache = c.run()
    finally:
        m.set_use_hook_mlp_in(False)
    close(logits, c.ref.logits)
    for l in range(c.L):
        close(cache["mlp_in", l], c.ref.acts[f"blocks.{l}.hook_resid_mid"])


def _last_hidden(c: Ctx) -> str:
    return "layers.0.hook_post" if c.variant == "mlp" else f"blocks.{c.L - 1}.hook_resid_mid"


def hooks_context(c: Ctx):
    """with model.hooks(fwd_hooks=...): a zero ablation, nothing left behind"""
    name = _last_hidden(c)
    with c.model.hooks(fwd_hooks=[(name, lambda t, hook: torch.zeros_like(t))]):
        out = c.model(c.tokens)
    assert not c.model.hooks_attached()
    close(out, c.reference(patch={name: torch.zeros_like}).logits)
    close(c.model(c.tokens), c.ref.logits)


def run_with_hooks_fwd_bwd(c: Ctx):
    """run_with_hooks(fwd_hooks, bwd_hooks, reset_hooks_end=False): the gradient a backward hook sees"""
    name = _last_hidden(c)
    seen = {}
    leaf = c.ref.acts[name].clone().requires_grad_(True)
    ref = c.reference(patch={name: lambda t: leaf})
    (want,) = torch.autograd.grad(ref.logits[:, -1].pow(2).sum(), leaf)
    out = c.model.run_with_hooks(c.tokens,
                                 bwd_hooks=[(name, lambda g, hook: seen.__setitem__("g", g.detach().clone()))],
                                 reset_hooks_end=False)
    out[:, -1].pow(2).sum().backward()
    c.model.reset_hooks()
    c.model.zero_grad(set_to_none=True)
    close(seen["g"], want)


def observer_hook(c: Ctx):
    """a forward hook returning None sees the activation and changes nothing"""
    name = _last_hidden(c)
    seen = {}
    out = c.model.run_with_hooks(c.tokens, fwd_hooks=[(name, lambda t, hook: seen.__setitem__(hook.name, t.detach()))])
    close(out, c.ref.logits)
    close(seen[name], c.ref.acts[name])


def head_ablation(c: Ctx):
    """zero one head through hook_z: logits as the reference with that head zeroed"""
    def zero_head(t, hook=None):
        t = t.clone()
        t[:, :, 0] = 0
        return t
    out = c.model.run_with_hooks(c.tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head)])
    close(out, c.reference(patch={"blocks.1.attn.hook_z": zero_head}).logits)


def mean_ablation(c: Ctx):
    """mean-ablate blocks.0.hook_mlp_out over the batch"""
    mean = lambda t, hook=None: t.mean(0, keepdim=True).expand_as(t)  # noqa: E731
    out = c.model.run_with_hooks(c.tokens, fwd_hooks=[("blocks.0.hook_mlp_out", mean)])
    close(out, c.reference(patch={"blocks.0.hook_mlp_out": mean}).logits)


def permanent_hook(c: Ctx):
    """add_perma_hook survives reset_hooks(), goes with reset_hooks(including_permanent=True)"""
    name = _last_hidden(c)
    half = lambda t, hook=None: t * 0.5  # noqa: E731
    c.model.add_perma_hook(name, half)
    try:
        c.model.reset_hooks()
        out = c.model(c.tokens)
    finally:
        c.model.reset_hooks(including_permanent=True)
    close(out, c.reference(patch={name: half}).logits)
    close(c.model(c.tokens), c.ref.logits)


def incl_bwd(c: Ctx):
    """run_with_cache(return_type='loss', incl_bwd=True): the cached gradient"""
    name = _last_hidden(c)
    _, cache = c.run(return_type="loss", incl_bwd=True, names_filter=name)
    leaf = c.ref.acts[name].clone().requires_grad_(True)
    logits = c.reference(patch={name: lambda t: leaf}).logits[:, -1]
    (want,) = torch.autograd.grad(F.cross_entropy(logits, c.labels), leaf)
    close(cache[name + "_grad"], want)
    c.model.zero_grad(set_to_none=True)


def pattern_gradient(c: Ctx):
    """a backward hook on hook_pattern: d(logit of the label)/d(pattern)"""
    name = "blocks.0.attn.hook_pattern"
    seen = {}
    out = c.model.run_with_hooks(c.tokens,
                                 bwd_hooks=[(name, lambda g, hook: seen.__setitem__("g", g.detach().clone()))],
                                 reset_hooks_end=False)
    out[:, -1].gather(1, c.labels[:, None]).sum().backward()
    c.model.reset_hooks()
    c.model.zero_grad(set_to_none=True)
    leaf = c.ref.acts[name].clone().requires_grad_(True)
    logits = c.reference(patch={name: lambda t: leaf}).logits[:, -1]
    (want,) = torch.autograd.grad(logits.gather(1, c.labels[:, None]).sum(), leaf)
    close(seen["g"], want)


def hook_ln_final(c: Ctx):
    """a hook on ln_final.hook_normalized"""
    seen = {}
    c.model.run_with_hooks(c.tokens, fwd_hooks=[("ln_final.hook_normalized", lambda t, hook: seen.__setitem__("x", t))])
    close(seen["x"], c.ref.acts["ln_final.hook_normalized"])


def cache_ln_final_scale(c: Ctx):
    """cache['ln_final.hook_scale']"""
    _, cache = c.run()
    close(cache["ln_final.hook_scale"], c.ref.acts["ln_final.hook_scale"])


def ln_final_weight(c: Ctx):
    """model.ln_final.w"""
    close(c.model.ln_final.w, c.ref.sd["ln_final.w"])


def unknown_hook_name(c: Ctx):
    """run_with_hooks with a name the model does not have"""
    c.model.run_with_hooks(c.tokens, fwd_hooks=[("blocks.0.hook_resid_pree", lambda t, hook: t)])


SNIPPETS = [cache_embeddings, cache_resid_stream, cache_norm_scales, cache_norm_normalized, cache_qkv,
            cache_attn_scores, cache_pattern, cache_z, cache_attn_out, cache_mlp_acts, cache_mlp_out, model_logits,
            act_name_shorthand, norm_shorthand, norm_hook_names, run_with_cache_filters, remove_batch_dim,
            cache_remove_batch_dim, cache_container, stack_activation, compute_head_results, use_attn_result,
            use_split_qkv_input, use_attn_in, use_hook_mlp_in, hooks_context, run_with_hooks_fwd_bwd, observer_hook,
            head_ablation, mean_ablation, permanent_hook, incl_bwd, pattern_gradient, hook_ln_final,
            cache_ln_final_scale, ln_final_weight, unknown_hook_name]
MLP_APPLIES = {"cache_embeddings", "cache_mlp_acts", "model_logits", "run_with_cache_filters", "remove_batch_dim",
               "cache_remove_batch_dim", "cache_container", "hooks_context", "run_with_hooks_fwd_bwd", "observer_hook",
               "permanent_hook", "incl_bwd", "unknown_hook_name"}
_NO_FINAL_NORM = {"none", "ln_post", "rms_post", "sphere", "mlp"}
EXPECT_REFUSE = {
    "norm_shorthand": {"none"},
    "hook_ln_final": _NO_FINAL_NORM - {"mlp"},
    "cache_ln_final_scale": _NO_FINAL_NORM - {"mlp"},
    "ln_final_weight": _NO_FINAL_NORM - {"mlp"},
    "unknown_hook_name": set(NORMED) | {"none", "mlp"},
}
NOT_APPLICABLE = {"cache_norm_scales": {"none"}, "cache_norm_normalized": {"none"}, "norm_hook_names": {"none"},
                  # attention=uniform: the pattern is a constant (no gradient reaches it, the hook never fires)
                  "pattern_gradient": {"uniform"}}
