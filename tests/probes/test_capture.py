import numpy as np
import pytest
import torch

from groklens.errors import BadInput
from groklens.probes.capture import capture, check_sites, select_position
from groklens.probes.grid import modular_grid
from tests.analyses.builders import all_hooks_clear, modular_data, tiny_transformer


def test_batched_capture_equals_one_forward_pass_with_manual_hooks():
    model, data = tiny_transformer(p=7)
    sites = ["blocks.0.mlp.hook_post", "blocks.0.attn.hook_pattern", "blocks.0.hook_resid_post"]
    acts, logits = capture(model, data.inputs, sites, batch_size=5, return_logits=True)
    # independent path: plain PyTorch forward hooks on the HookPoint modules, one batch
    seen = {}
    handles = [model.get_submodule(s).register_forward_hook(lambda m, i, o, s=s: seen.__setitem__(s, o.detach()))
               for s in sites]
    try:
        with torch.no_grad():
            ref_logits = model(data.inputs)
    finally:
        for h in handles:
            h.remove()
    for s in sites:
        torch.testing.assert_close(acts[s], seen[s], rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-6)
    assert all_hooks_clear(model)


def test_position_selection_uses_the_query_axis_of_patterns():
    model, data = tiny_transformer(p=5)
    full = capture(model, data.inputs, ["blocks.0.attn.hook_pattern", "blocks.0.mlp.hook_post"])
    one = capture(model, data.inputs, ["blocks.0.attn.hook_pattern", "blocks.0.mlp.hook_post"], position=2)
    assert torch.equal(one["blocks.0.attn.hook_pattern"], full["blocks.0.attn.hook_pattern"][:, :, 2, :])
    assert torch.equal(one["blocks.0.mlp.hook_post"], full["blocks.0.mlp.hook_post"][:, 2, :])
    flat = torch.zeros(4, 9)  # [b, d]: no position axis (an MLP model's layer)
    assert select_position(flat, "layers.0.hook_post", 2) is flat


def test_unknown_site_is_bad_input_naming_it():
    model, _ = tiny_transformer(p=5)
    with pytest.raises(BadInput, match="blocks.7.hook_resid_post"):
        check_sites(model, ["blocks.0.hook_resid_post", "blocks.7.hook_resid_post"])


def test_modular_grid_reads_pairs_from_the_data_and_refuses_other_tasks():
    _, data = modular_data(p=7)
    g = modular_grid(data)
    a, b = data.inputs[:, 0].numpy(), data.inputs[:, 1].numpy()
    assert np.array_equal(a[g.cell], np.repeat(np.arange(7)[:, None], 7, axis=1))
    assert np.array_equal(b[g.cell], np.repeat(np.arange(7)[None, :], 7, axis=0))
    assert np.array_equal(g.c, (g.a + g.b) % 7)
    _, div = modular_data(p=7, task="div")
    with pytest.raises(BadInput, match="full p x p grid"):
        modular_grid(div)
