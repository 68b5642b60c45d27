import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.analyses.radial import radial, radial_energy
from tests.analyses.builders import NoAttention, all_hooks_clear, modular_data, tiny_transformer


@pytest.mark.parametrize("d", [4, 16])
def test_isotropic_gradients_give_one_over_d_in_expectation(d):
    rng = np.random.default_rng(d)
    n = 100_000
    h = rng.standard_normal((n, d)) * rng.uniform(0.1, 10, (n, 1))
    g = rng.standard_normal((n, d))
    rho, ok = radial_energy(h, g)
    assert ok.all()
    # rho_i ~ Beta(1/2, (d-1)/2): mean 1/d, variance 2(d-1) / (d^2 (d+2))
    se = np.sqrt(2 * (d - 1) / (d**2 * (d + 2)) / n)
    assert abs(rho.mean() - 1 / d) < 5 * se


def test_purely_radial_gradients_give_exactly_one():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((50, 7))
    g = rng.standard_normal((50, 1)) * h
    rho, ok = radial_energy(h, g)
    np.testing.assert_allclose(rho, 1.0, rtol=1e-14)
    rho, ok = radial_energy(np.zeros((2, 3)), np.ones((2, 3)))
    assert not ok.any() and np.isnan(rho).all()


def test_a_loss_that_sees_only_norms_has_rho_one_end_to_end():
    _, data = modular_data(p=5)
    model = NoAttention(6, 5, radial_only=True)
    res = radial(model, data, sites=["hook_h"])
    assert res["rho@hook_h"] == pytest.approx(1.0, rel=1e-12)
    assert res["rho_baseline@hook_h"] == pytest.approx(1 / 6)
    assert all_hooks_clear(model)


def test_rho_and_radius_match_gradients_taken_by_an_independent_route():
    model, data = tiny_transformer(p=7, train_steps=10)
    site = "blocks.0.hook_resid_mid"
    res = radial(model, data, sites=[site], batch_size=9)
    # independent: add a zero perturbation at the site and differentiate the summed float64 loss by it
    m = model.double()
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
    delta = torch.zeros(len(x), 3, 16, dtype=torch.float64, requires_grad=True)
    store = {}

    def add(act, hook):
        store["h"] = act.detach().clone()
        return act + delta

    with m.hooks(fwd_hooks=[(site, add)]):
        loss = F.cross_entropy(m(x)[:, 2], y, reduction="sum")
    (g,) = torch.autograd.grad(loss, delta)
    model.float()
    h, g = store["h"].reshape(-1, 16).numpy(), g.reshape(-1, 16).numpy()
    hn = np.linalg.norm(h, axis=1)
    # one layer: resid_mid at positions 0 and 1 never reaches the readout, so its gradient is 0
    live = (g * g).sum(1) > 0
    assert live.sum() == len(x)
    rho = ((g[live] * h[live]).sum(1) / hn[live]) ** 2 / (g[live] * g[live]).sum(1)
    assert res[f"rho@{site}"] == pytest.approx(rho.mean(), rel=1e-9)
    assert res[f"radius_mean@{site}"] == pytest.approx((hn / 4.0).mean(), rel=1e-9)
    assert res[f"rho_excluded@{site}"] == 2 * len(x)
