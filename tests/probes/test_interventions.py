"""Hooks never outlive their scope, even when an analysis raises in the middle of it."""

import pytest
import torch

from groklens.analyses.attention import attention_mass
from groklens.analyses.fourier import fourier
from groklens.analyses.probing import probe
from groklens.analyses.radial import radial
from groklens.analyses.rank import effective_rank
from groklens.analyses.sharpness import sharpness
from groklens.probes.capture import capture
from groklens.probes.interventions import hook_count, run_patched, scoped_hooks
from tests.analyses.builders import all_hooks_clear, tiny_transformer


class Boom(RuntimeError):
    pass


def _explode_in_unembed(model):
    """Make the forward pass raise after every hook upstream of the unembedding has fired."""
    def raise_(x):
        raise Boom("unembed failed")

    model.unembed.forward = raise_


ANALYSES = {
    "fourier": lambda m, d: fourier(m, d),
    "attention": lambda m, d: attention_mass(m, d),
    "rank": lambda m, d: effective_rank(m, d),
    "radial": lambda m, d: radial(m, d),
    "probe": lambda m, d: probe(m, d, site="blocks.0.hook_resid_post", target="a"),
    "sharpness": lambda m, d: sharpness(m, d, top_k=1, trace_samples=1),
    "capture": lambda m, d: capture(m, d.inputs, ["blocks.0.hook_resid_post"], batch_size=7),
}


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_no_hook_left_when_an_analysis_raises_mid_forward(name):
    model, data = tiny_transformer(p=5)
    _explode_in_unembed(model)
    with pytest.raises(Boom):
        ANALYSES[name](model, data)
    assert all_hooks_clear(model)
    assert model.context_level == 0


def test_no_hook_left_when_a_hook_itself_raises_and_outer_hooks_survive():
    model, data = tiny_transformer(p=5)
    outer_calls = []

    def outer(act, hook):
        outer_calls.append(hook.name)

    def bad(act, hook):
        raise Boom("hook failed")

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", outer)]):
        before = hook_count(model)
        with pytest.raises(Boom):
            with scoped_hooks(model, fwd_hooks=[("blocks.0.mlp.hook_post", bad)]):
                model(data.inputs[:3])
        assert hook_count(model) == before == 1  # the caller's hook is still there
        model(data.inputs[:3])
        assert outer_calls == ["blocks.0.hook_resid_pre"] * 2
    assert all_hooks_clear(model)


def test_run_patched_replaces_exactly_one_position():
    model, data = tiny_transformer(p=5)
    x = data.inputs
    acts = capture(model, x, ["blocks.0.mlp.hook_post"])["blocks.0.mlp.hook_post"]
    zero = torch.zeros(len(x), acts.shape[-1])
    patched = run_patched(model, x, {"blocks.0.mlp.hook_post": (2, zero)}, batch_size=4)
    # independently: the readout logits without the MLP's output at position 2 (W_out is linear, no bias)
    with torch.no_grad():
        resid_mid = capture(model, x, ["blocks.0.hook_resid_mid"])["blocks.0.hook_resid_mid"]
        expected = resid_mid @ model.unembed.W_U
        clean = model(x)
    torch.testing.assert_close(patched[:, 2], expected[:, 2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(patched[:, :2], clean[:, :2], rtol=0, atol=1e-6)  # earlier positions untouched
    assert all_hooks_clear(model)
