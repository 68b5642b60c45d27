import numpy as np
import pytest
import torch

from groklens.analyses.attention import attention_mass
from groklens.errors import BadInput
from tests.analyses.builders import (
    NoAttention,
    all_hooks_clear,
    modular_data,
    task_data,
    tiny_transformer,
)


def _hand_pattern(inputs: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[N, H, 3, 3]: query 2 of head h attends (x, y, 1 - x - y) with x, y set by the operands."""
    a, b = inputs[:, 0].double(), inputs[:, 1].double()
    rows = []
    for h in range(n_heads):
        x = (a + 1) / (4 * (h + 1) + 20)
        y = (b + 1) / 30 if h == 0 else torch.full_like(b, 0.05)
        rows.append(torch.stack([x, y, 1 - x - y], dim=-1))
    q = torch.stack(rows, dim=1)  # [N, H, 3]
    pat = torch.zeros(len(inputs), n_heads, 3, 3, dtype=torch.float64)
    pat[:, :, 0, 0] = 1
    pat[:, :, 1, :2] = 0.5
    pat[:, :, 2] = q
    return pat


def test_mass_minimum_quantiles_and_kl_on_a_hand_set_pattern():
    model, data = tiny_transformer(p=7)
    pattern = _hand_pattern(data.inputs, 2)
    offset = [0]

    def set_pattern(act, hook):  # the analysis batches inputs; serve each batch its rows
        out = pattern[offset[0] : offset[0] + len(act)].to(act.dtype)
        offset[0] += len(act)
        return out

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", set_pattern)]):
        res = attention_mass(model, data, quantiles=[0.0, 0.5, 1.0], batch_size=10)
    assert all_hooks_clear(model)
    q = pattern[:, :, 2].numpy()  # [N, H, 3]; informative positions are 0 and 1
    mass = q[..., 0] + q[..., 1]
    mn = np.minimum(q[..., 0], q[..., 1])
    kl = 0.5 * np.log(0.5 / q[..., 0]) + 0.5 * np.log(0.5 / q[..., 1])
    np.testing.assert_allclose(res["mass_per_head"][0], mass.mean(0), rtol=1e-6)
    np.testing.assert_allclose(res["min_token_mass_per_head"][0], mn.mean(0), rtol=1e-6)
    np.testing.assert_allclose(res["kl_per_head"][0], kl.mean(0), rtol=1e-5)
    np.testing.assert_allclose(res["mass_quantiles"][0, :, 0], mass.min(0), rtol=1e-6)
    np.testing.assert_allclose(res["mass_quantiles"][0, :, 2], mass.max(0), rtol=1e-6)
    np.testing.assert_allclose(res["mass_quantiles"][0, :, 1], np.median(mass, 0), rtol=1e-6)
    np.testing.assert_allclose(res["min_token_mass_quantiles"][0, :, 0], mn.min(0), rtol=1e-6)
    assert res["mass"][0] == pytest.approx(mass.mean(), rel=1e-6)
    assert res["min_token_mass"][0] == pytest.approx(mn.mean(), rel=1e-6)
    assert res["quantile_levels"].tolist() == [0.0, 0.5, 1.0]
    np.testing.assert_allclose(res["pattern"][0], q.mean(0), rtol=1e-6)  # [H, n_ctx]


def test_informative_positions_may_differ_per_input():
    # a 4-token sequence task: the informative positions of input i are {i % 3}; readout at 3
    n = 6
    inputs = np.tile(np.arange(4), (n, 1))
    mask = np.zeros((n, 4), dtype=bool)
    mask[np.arange(n), np.arange(n) % 3] = True
    data = task_data(inputs, np.zeros(n), mask, d_vocab=4, d_vocab_out=2, readout_pos=3)
    from groklens.config import RunConfig
    from groklens.models import build_model

    model = build_model(RunConfig(d_model=8, n_heads=1, d_head=4, d_mlp=8), data).eval()
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)

    def set_pattern(act, hook):
        out = act.clone()
        out[:, :, 3] = q.to(act.dtype)
        return out

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", set_pattern)]):
        res = attention_mass(model, data)
    expected = q[np.arange(n) % 3].numpy()
    assert res["mass"][0] == pytest.approx(expected.mean(), rel=1e-6)
    assert res["min_token_mass"][0] == pytest.approx(expected.mean(), rel=1e-6)  # one token each: mass = min


def test_a_model_without_attention_is_bad_input():
    _, data = modular_data(p=5)
    with pytest.raises(BadInput, match="attention mass needs attention layers"):
        attention_mass(NoAttention(6, 5), data)
