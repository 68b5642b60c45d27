"""Conformance snippets: decompositions and direct logit attribution, each row against the float64
reference pass: a component's output carried through every norm between where it is added and
where it is read, with the pass's scales held fixed (and, as TransformerLens's apply_ln, divided by
a pre-norm reader's scale)."""

from __future__ import annotations

import torch

from tests.models.tl_common import NON_ADDITIVE, Ctx, close, heads_of, neurons_of

FINAL = ("final",)


def _direction(c: Ctx) -> torch.Tensor:
    """[b, d]: label minus wrong class, as TL's tokens_to_residual_directions gives it."""
    return c.ref.direction(c.labels, c.wrong)


def _dla(rows: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    return (rows * direction).sum(-1)


def _offset(c: Ctx) -> torch.Tensor:
    return c.ref.final_bias_term(_direction(c))


def _decomposition(c: Ctx, layer: int, mlp_input: bool = False, pos=None, view: bool = False,
                   mode: str = "all", embeds: bool = True) -> torch.Tensor:
    """decompose_resid's rows: embed, pos_embed, then each layer's attn_out and mlp_out, carried to
    the input of `layer` (and a row of the norms' carried biases where the stream has them)."""
    ref, L = c.ref, c.L
    target = FINAL if layer == L else ("mlp_in" if mlp_input else "attn_in", layer)
    at = (lambda t: t) if pos is None else (lambda t: t[:, pos])
    go = (lambda x, e: ref.reader_view(x, e, target, pos)) if view else (lambda x, e: ref.carry(x, e, target, pos))
    rows = [go(at(ref.acts[n]), ("embed",)) for n in ("hook_embed", "hook_pos_embed")] if embeds else []
    for l in range(layer + (1 if mlp_input else 0)):
        if mode != "mlp":
            rows.append(go(at(ref.acts[f"blocks.{l}.hook_attn_out"]), ("attn", l)))
        if mode != "attn" and l < layer:
            rows.append(go(at(ref.acts[f"blocks.{l}.hook_mlp_out"]), ("mlp", l)))
    if c.variant == "ln_post" and mode == "all" and embeds:
        rows.append(ref.bias_to(target, pos).expand_as(rows[0]))
    return torch.stack(rows)


def decompose_resid(c: Ctx):
    """cache.decompose_resid(): rows, and their sum is the final stream"""
    _, cache = c.run()
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels[:3] == ["embed", "pos_embed", "0_attn_out"]
    close(stack, _decomposition(c, c.L))
    close(stack.sum(0), c.ref.stream_at(FINAL))


def decompose_resid_layer(c: Ctx):
    """cache.decompose_resid(layer=1): sums to resid_pre 1"""
    _, cache = c.run()
    stack = cache.decompose_resid(layer=1)
    close(stack, _decomposition(c, 1))
    close(stack.sum(0), c.ref.acts["blocks.1.hook_resid_pre"])


def decompose_resid_mlp_input(c: Ctx):
    """cache.decompose_resid(layer=1, mlp_input=True): sums to resid_mid 1"""
    _, cache = c.run()
    stack = cache.decompose_resid(layer=1, mlp_input=True)
    close(stack, _decomposition(c, 1, mlp_input=True))
    close(stack.sum(0), c.ref.acts["blocks.1.hook_resid_mid"])


def decompose_resid_apply_ln(c: Ctx):
    """cache.decompose_resid(apply_ln=True, pos_slice=-1)"""
    _, cache = c.run()
    close(cache.decompose_resid(apply_ln=True, pos_slice=-1), _decomposition(c, c.L, pos=-1, view=True))


def decompose_resid_attn_only(c: Ctx):
    """cache.decompose_resid(mode='attn', incl_embeds=False)"""
    _, cache = c.run()
    close(cache.decompose_resid(mode="attn", incl_embeds=False), _decomposition(c, c.L, mode="attn", embeds=False))


def accumulated_resid(c: Ctx):
    """cache.accumulated_resid(); apply_ln=True at the end reproduces the logits"""
    _, cache = c.run()
    acc = cache.accumulated_resid()
    close(acc[-1], c.ref.stream_at(FINAL))
    close(acc[0], c.ref.acts["blocks.0.hook_resid_pre"])
    normed = cache.accumulated_resid(apply_ln=True, pos_slice=-1)
    close(normed[-1] @ c.model.W_U + c.model.b_U, c.ref.logits[:, -1])


def accumulated_resid_incl_mid(c: Ctx):
    """cache.accumulated_resid(incl_mid=True, return_labels=True)"""
    _, cache = c.run()
    acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    want = [c.ref.acts[f"blocks.{l}.hook_resid_{w}"] for l in range(c.L) for w in ("pre", "mid")]
    close(acc, torch.stack(want + [c.ref.stream_at(FINAL)]))


def accumulated_resid_apply_ln_mid(c: Ctx):
    """cache.accumulated_resid(layer=1, apply_ln=True): the states as layer 1's attention reads them"""
    _, cache = c.run()
    acc = cache.accumulated_resid(layer=1, apply_ln=True)
    states = [c.ref.acts[f"blocks.{l}.hook_resid_pre"] for l in range(2)]
    close(acc, torch.stack([c.ref.reader_view(s, None, ("attn_in", 1)) for s in states]))


def stack_head_results(c: Ctx):
    """cache.stack_head_results(return_labels=True)"""
    _, cache = c.run()
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels[:2] == ["L0H0", "L0H1"] and len(labels) == c.L * c.cfg.n_heads
    close(stack, heads_of(c, c.ref, range(c.L), FINAL))


def stack_head_results_layer(c: Ctx):
    """cache.stack_head_results(layer=1): layer 0's heads at layer 1's input"""
    _, cache = c.run()
    close(cache.stack_head_results(layer=1), heads_of(c, c.ref, range(1), ("attn_in", 1)))


def stack_head_results_remainder(c: Ctx):
    """cache.stack_head_results(incl_remainder=True): sums to the final stream"""
    _, cache = c.run()
    stack = cache.stack_head_results(incl_remainder=True)
    close(stack[:-1], heads_of(c, c.ref, range(c.L), FINAL))
    close(stack.sum(0), c.ref.stream_at(FINAL))


def stack_head_results_apply_ln(c: Ctx):
    """cache.stack_head_results(pos_slice=-1, apply_ln=True)"""
    _, cache = c.run()
    close(cache.stack_head_results(pos_slice=-1, apply_ln=True),
          heads_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True))


def head_dla(c: Ctx):
    """per-head DLA: logit_attrs(stack_head_results(layer=-1, pos_slice=-1), tokens, incorrect_tokens)"""
    _, cache = c.run()
    stack = cache.stack_head_results(layer=-1, pos_slice=-1)
    attrs = cache.logit_attrs(stack, tokens=c.labels, incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs, _dla(heads_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True), _direction(c)))


def head_dla_apply_ln_to_stack(c: Ctx):
    """per-head DLA as TL's tutorial: apply_ln_to_stack(stack, layer=-1, pos_slice=-1) @ directions"""
    _, cache = c.run()
    stack = cache.stack_head_results(layer=-1, pos_slice=-1)
    scaled = cache.apply_ln_to_stack(stack, layer=-1, pos_slice=-1)
    dirs = c.model.tokens_to_residual_directions(c.labels) - c.model.tokens_to_residual_directions(c.wrong)
    close(_dla(scaled, dirs), _dla(heads_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True), _direction(c)))


def head_dla_earlier_layer(c: Ctx):
    """logit_attrs(stack_head_results(layer=1, pos_slice=-1)): layer 0's heads, carried to the logits"""
    _, cache = c.run()
    attrs = cache.logit_attrs(cache.stack_head_results(layer=1, pos_slice=-1), tokens=c.labels,
                              incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs, _dla(heads_of(c, c.ref, range(1), FINAL, pos=-1, view=True), _direction(c)))


def stack_neuron_results(c: Ctx):
    """cache.stack_neuron_results(layer=1)"""
    _, cache = c.run()
    stack, labels = cache.stack_neuron_results(layer=1, return_labels=True)
    assert labels[:2] == ["L0N0", "L0N1"]
    close(stack, neurons_of(c, c.ref, range(1), ("attn_in", 1)))


def stack_neuron_results_remainder(c: Ctx):
    """cache.stack_neuron_results(layer=-1, incl_remainder=True): sums to the final stream"""
    _, cache = c.run()
    close(cache.stack_neuron_results(layer=-1, incl_remainder=True).sum(0), c.ref.stream_at(FINAL))


def neuron_dla(c: Ctx):
    """per-neuron DLA: logit_attrs(stack_neuron_results(layer=-1, pos_slice=-1), ...)"""
    _, cache = c.run()
    attrs = cache.logit_attrs(cache.stack_neuron_results(layer=-1, pos_slice=-1), tokens=c.labels,
                              incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs, _dla(neurons_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True), _direction(c)))


def neuron_projected(c: Ctx):
    """stack_neuron_results(layer=-1, pos_slice=-1, project_output_onto=direction)"""
    _, cache = c.run()
    d = c.model.tokens_to_residual_directions(0) - c.model.tokens_to_residual_directions(1)
    got = cache.stack_neuron_results(layer=-1, pos_slice=-1, project_output_onto=d)
    close(got, neurons_of(c, c.ref, range(c.L), FINAL, pos=-1) @ d.double())


def neuron_projected_apply_ln(c: Ctx):
    """stack_neuron_results(layer=-1, pos_slice=-1, apply_ln=True, project_output_onto=direction)"""
    _, cache = c.run()
    d = c.model.tokens_to_residual_directions(0) - c.model.tokens_to_residual_directions(1)
    got = cache.stack_neuron_results(layer=-1, pos_slice=-1, apply_ln=True, project_output_onto=d)
    close(got, neurons_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True) @ d.double())


def neuron_slice(c: Ctx):
    """stack_neuron_results(layer=-1, neuron_slice=[0, 3])"""
    _, cache = c.run()
    close(cache.stack_neuron_results(layer=-1, neuron_slice=[0, 3]),
          neurons_of(c, c.ref, range(c.L), FINAL, neurons=[0, 3]))


def get_neuron_results(c: Ctx):
    """cache.get_neuron_results(0, neuron_slice=[1, 2]) (the raw outputs)"""
    _, cache = c.run()
    post, W = c.ref.acts["blocks.0.mlp.hook_post"], c.ref.sd["blocks.0.mlp.W_out"]
    close(cache.get_neuron_results(0, neuron_slice=[1, 2]), post[..., [1, 2], None] * W[[1, 2]])


def _full(c: Ctx, layer: int, mlp_input: bool = False, pos=None, view=False, expand=True) -> torch.Tensor:
    ref = c.ref
    target = FINAL if layer == c.L else ("mlp_in" if mlp_input else "attn_in", layer)
    at = (lambda t: t) if pos is None else (lambda t: t[:, pos])
    go = (lambda x, e: ref.reader_view(x, e, target, pos)) if view else (lambda x, e: ref.carry(x, e, target, pos))
    rows = [heads_of(c, ref, range(layer + mlp_input), target, pos, view)]
    if expand:
        rows.append(neurons_of(c, ref, range(layer), target, pos, view))
    else:
        rows.append(torch.stack([go(at(ref.acts[f"blocks.{l}.hook_mlp_out"]), ("mlp", l)) for l in range(layer)]))
    rows += [go(at(ref.acts[n]), ("embed",))[None] for n in ("hook_embed", "hook_pos_embed")]
    bias = ref.bias_to(target, pos, mlp_biases=expand).expand_as(rows[-1][0])
    rows.append((ref.reader_view(bias, None, target, pos) if view else bias)[None])
    return torch.cat(rows)


def full_resid_decomposition(c: Ctx):
    """cache.get_full_resid_decomposition(return_labels=True): sums to the final stream"""
    _, cache = c.run()
    stack, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert labels[0] == "L0H0" and labels[-3:] == ["embed", "pos_embed", "bias"]
    close(stack, _full(c, c.L))
    close(stack.sum(0), c.ref.stream_at(FINAL))


def full_resid_decomposition_mlp_rows(c: Ctx):
    """get_full_resid_decomposition(expand_neurons=False)"""
    _, cache = c.run()
    stack = cache.get_full_resid_decomposition(expand_neurons=False)
    close(stack, _full(c, c.L, expand=False))
    close(stack.sum(0), c.ref.stream_at(FINAL))


def full_resid_decomposition_mlp_input(c: Ctx):
    """get_full_resid_decomposition(layer=1, mlp_input=True): sums to resid_mid 1"""
    _, cache = c.run()
    stack = cache.get_full_resid_decomposition(layer=1, mlp_input=True)
    close(stack, _full(c, 1, mlp_input=True))
    close(stack.sum(0), c.ref.acts["blocks.1.hook_resid_mid"])


def full_resid_decomposition_dla(c: Ctx):
    """get_full_resid_decomposition(apply_ln=True, pos_slice=-1) . directions sums to the logit difference"""
    _, cache = c.run()
    stack = cache.get_full_resid_decomposition(apply_ln=True, pos_slice=-1)
    close(stack, _full(c, c.L, pos=-1, view=True))
    close(_dla(stack, _direction(c)).sum(0) + _offset(c), c.logit_diff())


def full_resid_decomposition_projected(c: Ctx):
    """get_full_resid_decomposition(apply_ln=True, pos_slice=-1, project_output_onto=direction)"""
    _, cache = c.run()
    d = c.model.tokens_to_residual_directions(0) - c.model.tokens_to_residual_directions(1)
    got = cache.get_full_resid_decomposition(apply_ln=True, pos_slice=-1, project_output_onto=d)
    close(got, _full(c, c.L, pos=-1, view=True) @ d.double())


def logit_attrs_decomposed(c: Ctx):
    """logit_attrs(decompose_resid(pos_slice=-1)) sums to the logit difference"""
    _, cache = c.run()
    attrs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), tokens=c.labels,
                              incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs, _dla(_decomposition(c, c.L, pos=-1, view=True), _direction(c)))
    close(attrs.sum(0) + _offset(c), c.logit_diff())


def logit_attrs_accumulated(c: Ctx):
    """logit_attrs(accumulated_resid(pos_slice=-1)): the last state gives the logit difference"""
    _, cache = c.run()
    attrs = cache.logit_attrs(cache.accumulated_resid(pos_slice=-1), tokens=c.labels,
                              incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs[-1] + _offset(c), c.logit_diff())


def logit_attrs_str_tokens(c: Ctx):
    """logit_attrs(stack, tokens='3', incorrect_tokens='4')"""
    _, cache = c.run()
    attrs = cache.logit_attrs(cache.stack_head_results(pos_slice=-1), tokens="3", incorrect_tokens="4", pos_slice=-1)
    d = c.ref.direction(torch.tensor([3]), torch.tensor([4]))
    close(attrs, _dla(heads_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True), d))


def logit_attrs_one_token(c: Ctx):
    """logit_attrs(stack, tokens=labels) (no incorrect tokens)"""
    _, cache = c.run()
    attrs = cache.logit_attrs(cache.stack_head_results(pos_slice=-1), tokens=c.labels, pos_slice=-1)
    close(attrs, _dla(heads_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True), c.ref.direction(c.labels)))


def apply_ln_to_stack_mid(c: Ctx):
    """apply_ln_to_stack(stack_head_results(layer=1), layer=1): what layer 1's attention reads of each head"""
    _, cache = c.run()
    got = cache.apply_ln_to_stack(cache.stack_head_results(layer=1), layer=1)
    close(got, heads_of(c, c.ref, range(1), ("attn_in", 1), view=True))


def dla_of_a_slice(c: Ctx):
    """logit_attrs(stack[:3, :, -1], pos_slice=-1): rows and positions sliced by hand"""
    _, cache = c.run()
    stack = cache.stack_head_results(layer=-1)
    attrs = cache.logit_attrs(stack[:3, :, -1], tokens=c.labels, incorrect_tokens=c.wrong, pos_slice=-1)
    close(attrs, _dla(heads_of(c, c.ref, range(c.L), FINAL, pos=-1, view=True)[:3], _direction(c)))


def hand_made_stack(c: Ctx):
    """apply_ln_to_stack(torch.stack([cache['result', 1][:, :, 0]]), layer=-1): a stack built by hand"""
    _, cache = c.run()
    cache.compute_head_results()
    got = cache.apply_ln_to_stack(torch.stack([cache["result", 1][:, :, 0]]), layer=-1)
    close(got, c.ref.reader_view(c.ref.acts["blocks.1.attn.hook_result"][:, :, 0], ("attn", 1), FINAL)[None])


SNIPPETS = [decompose_resid, decompose_resid_layer, decompose_resid_mlp_input, decompose_resid_apply_ln,
            decompose_resid_attn_only, accumulated_resid, accumulated_resid_incl_mid, accumulated_resid_apply_ln_mid,
            stack_head_results, stack_head_results_layer, stack_head_results_remainder, stack_head_results_apply_ln,
            head_dla, head_dla_apply_ln_to_stack, head_dla_earlier_layer, stack_neuron_results,
            stack_neuron_results_remainder, neuron_dla, neuron_projected, neuron_projected_apply_ln, neuron_slice,
            get_neuron_results, full_resid_decomposition, full_resid_decomposition_mlp_rows,
            full_resid_decomposition_mlp_input, full_resid_decomposition_dla, full_resid_decomposition_projected,
            logit_attrs_decomposed, logit_attrs_accumulated, logit_attrs_str_tokens, logit_attrs_one_token,
            apply_ln_to_stack_mid, dla_of_a_slice, hand_made_stack]
MLP_APPLIES = {"decompose_resid", "accumulated_resid"}
EXPECT_REFUSE = {"decompose_resid": {"mlp"}, "accumulated_resid": {"mlp"},
                 # after a norm on every sum a row's carry depends on where it entered, which a hand-made stack does not
                 # say
                 "hand_made_stack": set(NON_ADDITIVE)}
NOT_APPLICABLE: dict[str, set[str]] = {}
