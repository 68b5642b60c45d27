import numpy as np
import pytest
import torch

from groklens.errors import BadInput
from groklens.probes.capture import capture
from groklens.probes.linear import linear_probe, probe_split, probe_targets
from tests.analyses.builders import tiny_transformer


def test_operand_is_decodable_where_it_is_embedded_and_not_elsewhere():
    # hook_embed at position 0 is W_E[a]: the p+1 = 12 rows of a 16-wide W_E are linearly
    # independent, so a is linearly decodable exactly, and b (absent there) is at chance
    model, data = tiny_transformer(p=11)
    a = linear_probe(model, data, "hook_embed", "a", position=0)
    b = linear_probe(model, data, "hook_embed", "b", position=0)
    assert a["accuracy"] == 1.0 and a["train_accuracy"] == 1.0
    assert b["accuracy"] < 0.25  # chance is 1/11; it cannot beat always guessing one class by much
    assert a["n_train"] + a["n_test"] == 121


def test_fourier_r2_matches_ordinary_least_squares_computed_independently():
    model, data = tiny_transformer(p=11, train_steps=30)
    freqs = [1, 5]  # 5 = p // 2
    res = linear_probe(model, data, "blocks.0.hook_resid_post", "fourier", frequencies=freqs, alpha=1e-10, seed=3)
    # independent: OLS with intercept on the same held-out split, R^2 per target around the test mean
    X = capture(model, data.inputs,
                ["blocks.0.hook_resid_post"], position=2)["blocks.0.hook_resid_post"].double().numpy()
    c = data.labels.numpy()
    Y = np.stack([f(2 * np.pi * k * c / 11) for k in freqs for f in (np.cos, np.sin)], axis=1)
    tr, te = probe_split(data, "random", 0.5, 3)
    A = np.hstack([X, np.ones((len(X), 1))])
    beta = np.linalg.lstsq(A[tr], Y[tr], rcond=None)[0]
    pred = A[te] @ beta
    r2 = 1 - ((Y[te] - pred) ** 2).sum(0) / ((Y[te] - Y[te].mean(0)) ** 2).sum(0)
    np.testing.assert_allclose(res["r2_per_target"], r2, rtol=1e-6, atol=1e-8)
    assert res["r2"] == pytest.approx(r2.mean(), rel=1e-6, abs=1e-8)


def test_targets_and_their_errors():
    _, data = tiny_transformer(p=7)
    assert np.array_equal(probe_targets(data, "answer"), data.labels.numpy())
    y = probe_targets(data, "fourier", [3])
    np.testing.assert_allclose(y[:, 0], np.cos(2 * np.pi * 3 * data.labels.numpy() / 7))
    with pytest.raises(BadInput, match="unknown probe target"):
        probe_targets(data, "c")
    with pytest.raises(BadInput, match="frequencies must be integers in 1..3"):
        probe_targets(data, "fourier", [4])
    tr, te = probe_split(data, "run", 0.5, 0)
    assert torch.equal(torch.as_tensor(tr), data.train_idx) and torch.equal(torch.as_tensor(te), data.test_idx)
