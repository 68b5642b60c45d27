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


def test_sites_feeding_a_scale_invariant_norm_are_flagged_eps_dependent():
    """Pre-LN: the last block's resid_post reaches the logits only through ln_final, so its
    scale is free; an earlier block's also feeds the next residual sum. No norm: nothing."""
    from groklens.analyses.radial import norm_fed_sites

    model, data = tiny_transformer(p=7, train_steps=5, norm="ln", n_layers=2)
    with pytest.warns(UserWarning, match=r"blocks\.1\.hook_resid_post feeds ln_final \(read only through"):
        res = radial(model, data)
    assert res["eps_dependent@blocks.1.hook_resid_post"] == 1
    assert res["eps_dependent@blocks.0.hook_resid_post"] == 0
    assert norm_fed_sites(model, data, ["blocks.1.hook_resid_pre", "blocks.0.hook_resid_mid"]) == {}
    # independently: scaling that site's activation leaves the logits unchanged up to eps
    from groklens.probes.interventions import scoped_hooks

    x = data.inputs[:20]
    with torch.no_grad(), scoped_hooks(model, fwd_hooks=[("blocks.1.hook_resid_post", lambda a, hook: 50 * a)]):
        scaled = model(x)
    torch.testing.assert_close(scaled, model(x), rtol=1e-3, atol=1e-3)
    plain, data = tiny_transformer(p=7, train_steps=5)
    assert radial(plain, data)["eps_dependent@blocks.0.hook_resid_post"] == 0
    assert all_hooks_clear(model) and all_hooks_clear(plain)


def test_sharpness_flags_models_with_a_scale_invariant_norm():
    from groklens.analyses.sharpness import sharpness

    tiny = dict(d_model=4, n_heads=1, d_head=2, d_mlp=8)
    model, data = tiny_transformer(p=5, train_steps=5, norm="ln", **tiny)
    with pytest.warns(UserWarning, match="sharpness: the input of ln_final"):
        assert sharpness(model, data, top_k=1, trace_samples=2)["eps_dependent"] == 1
    plain, data = tiny_transformer(p=5, train_steps=5, **tiny)
    assert sharpness(plain, data, top_k=1, trace_samples=2)["eps_dependent"] == 0
