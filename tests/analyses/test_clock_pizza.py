"""Clock/Pizza measures: planted clock and pizza logit functions whose values are known by
construction, their notebook's code re-typed on a tiny transformer, and real runs (learned and
uniform attention) analyzed along their checkpoints."""

from __future__ import annotations

import copy
import math
import random

import numpy as np
import pytest
import torch
from torch import nn
from transformer_lens.hook_points import HookPoint

from groklens.analyses.clock_pizza import (
    ALGORITHM_RULE,
    algorithm_label,
    clock_pizza,
    distance_irrelevance,
    gradient_symmetricity,
    logit_patterns,
    operand_positions,
    sample_triples,
)
from groklens.analyses.runner import compute
from groklens.checkpoints.reader import Trajectory
from groklens.errors import BadInput
from groklens.models.hooked import HookedModel, ModelConfig
from tests.analyses.builders import all_hooks_clear, modular_data, tiny_transformer
from tests.helpers import train_tiny

P, K = 23, 3  # the planted circle's frequency w = 2 pi K / P


class Planted(HookedModel):
    """Logits of the planted algorithms from 2-d embeddings z_t = (cos wt, sin wt), as complex z_a, z_b:
      clock:  h = z_a z_b (a rotation product),  logit_c = Re(h e^{-iwc}) (1 + Re(h^2) / 2)
      pizza:  h = z_a + z_b,  logit_c = |Re(h e^{-iwc/2})| - |Im(h e^{-iwc/2})|   (their Q_pizza, cell 21)
    The clock's correct logit is 1 + cos(2w(a+b)) / 2 (no dependence on a-b), the pizza's
    2 |cos(w(a-b)/2)| (a function of a-b alone)."""

    def __init__(self, kind: str, p: int = P, k: int = K):
        super().__init__()
        self.cfg = ModelConfig(d_model=2, n_heads=0, d_head=0, n_layers=1, d_mlp=2, d_vocab=p + 1, d_vocab_out=p,
                               n_ctx=3)
        self.kind, self.w = kind, 2 * math.pi * k / p
        t = torch.arange(p + 1, dtype=torch.float64) * self.w  # the '=' token's row is never read
        self.W_E = nn.Parameter(torch.stack([t.cos(), t.sin()], 1))
        self.theta = self.w * torch.arange(p, dtype=torch.float64)
        self.hook_embed = HookPoint()
        self.setup()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [b, n] -> [b, n, p]
        e = self.hook_embed(self.W_E[tokens])
        (xa, ya), (xb, yb) = e[:, 0].unbind(-1), e[:, 1].unbind(-1)
        if self.kind == "clock":
            hx, hy = (xa * xb - ya * yb)[:, None], (xa * yb + ya * xb)[:, None]
            logits = (hx * self.theta.cos() + hy * self.theta.sin()) * (1 + (hx ** 2 - hy ** 2) / 2)
        else:
            hx, hy = (xa + xb)[:, None], (ya + yb)[:, None]
            c, s = (self.theta / 2).cos(), (self.theta / 2).sin()
            logits = (c * hx + s * hy).abs() - (-s * hx + c * hy).abs()
        return logits[:, None, :].expand(-1, tokens.shape[1], -1)


@pytest.fixture(scope="module")
def data():
    return modular_data(P)[1]


def test_planted_clock_is_distance_irrelevant_and_asymmetric(data):
    model = Planted("clock")
    di = distance_irrelevance(model, data)
    assert di["distance_irrelevance"] == pytest.approx(1.0, abs=1e-12)  # the correct logit is a function of a+b
    # any f(z_a z_b): the two gradients are grad_h conj(z_b) and grad_h conj(z_a), cosine cos(w(a-b))
    triples = np.array(sample_triples(P, 100, 42))
    expected = np.cos(model.w * (triples[:, 0] - triples[:, 1]))
    gs = gradient_symmetricity(model, data)
    np.testing.assert_allclose(gs["cosines"], expected, atol=1e-12)
    assert abs(gs["gradient_symmetricity"]) < 0.2 and all_hooks_clear(model)
    assert algorithm_label(gs["gradient_symmetricity"], di["distance_irrelevance"]) == "clock"


def test_planted_pizza_is_distance_dependent_and_symmetric(data):
    model = Planted("pizza")
    di = distance_irrelevance(model, data)
    assert di["distance_irrelevance"] == pytest.approx(0.0, abs=1e-12)  # the correct logit is a function of a-b
    a, b = data.inputs[:, 0].numpy(), data.inputs[:, 1].numpy()
    grid = di["correct_logits"][(a + b) % P, (a - b) % P]
    np.testing.assert_allclose(grid, 2 * np.abs(np.cos(model.w * (a - b) / 2)), atol=1e-12)
    gs = gradient_symmetricity(model, data)  # any f(z_a + z_b): equal gradients
    np.testing.assert_allclose(gs["cosines"], 1.0, atol=1e-12)
    assert clock_pizza(model, data) == {"gradient_symmetricity": pytest.approx(1.0), "distance_irrelevance":
                                        pytest.approx(0.0, abs=1e-12), "is_clock": 0, "is_pizza": 1}


def test_planted_logit_patterns(data):
    """The pizza's logits are their Q_pizza itself (FVE 1). The clock's are cos x (1 + cos 2s / 2), x = w(a+b-c),
    s = w(a+b): over c, cos x has mean 0 and is uncorrelated with cos 2s, so corr(logits, cos x) =
    (1/2) / sqrt(1/2 * 9/16) = 2 sqrt(2) / 3 and the FVE (2 corr - 1) is 4 sqrt(2) / 3 - 1."""
    pizza = logit_patterns(Planted("pizza"), data, n_circles=1)
    assert pizza["circle_frequency"].tolist() == [K] and pizza["q_pizza"] == pytest.approx(1.0, abs=1e-12)
    assert pizza["q_clock"] < 0.85
    clock = logit_patterns(Planted("clock"), data, n_circles=1)
    assert clock["circle_frequency"].tolist() == [K]
    assert clock["q_clock"] == pytest.approx(4 * math.sqrt(2) / 3 - 1, abs=1e-9)
    assert clock["q_pizza"] < clock["q_clock"]
    with pytest.raises(BadInput, match="2 circles need 4 principal components"):
        logit_patterns(Planted("clock"), data, n_circles=2)  # 2-d embeddings hold one circle


def test_pattern_fve_is_two_correlations_minus_one():
    from groklens.analyses.clock_pizza import pattern_fve

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=500), rng.normal(size=500)
    assert pattern_fve(x, y) == pytest.approx(2 * np.corrcoef(x, y)[0, 1] - 1, abs=1e-12)
    assert pattern_fve(3 * y + 1, y) == pytest.approx(1.0) and np.isnan(pattern_fve(np.ones(5), y[:5]))


def test_the_rule_labels_the_published_groups():
    assert "clock" in ALGORITHM_RULE and "pizza" in ALGORITHM_RULE
    # medians of result/1l_fixedwidth.csv, 1-layer runs: attention rate >= 0.9 and <= 0.1
    assert algorithm_label(0.483, 0.853) == "clock"
    assert algorithm_label(0.993, 0.362) == "pizza"
    assert algorithm_label(0.9, 0.6) == "neither"


# ------------------------------------------------------------- their notebook's code, re-typed
def _forward_h(model, x):
    """Their Transformer.forward_h: (the token embedding, kept with its gradient; the logits)."""
    kept = {}

    def keep(act, hook):
        act.retain_grad()
        kept["t"] = act

    with model.hooks(fwd_hooks=[("hook_embed", keep)]):
        out = model(x)
    return kept["t"], out


def _their_gradient_symmetricity(model, C, eq):
    """eval-main.ipynb, cell 12, re-typed (x gets our '=' token; their readout is the last position too)."""
    tt = 0
    xs = [(a, b, c) for a in range(C) for b in range(C) for c in range(C)]
    random.Random(42).shuffle(xs)
    xs = xs[:100]
    for abc in xs:
        a, b, c = abc
        x = torch.tensor([[a, b, eq]], device="cpu")
        t, o0 = _forward_h(model, x)
        model.zero_grad()
        o = o0[0, -1, :]
        o[c].backward(retain_graph=True)
        tg = t.grad[0].detach().cpu().numpy()
        dp = np.sum(tg[0] * tg[1]) / np.sqrt(np.sum(tg[0] ** 2)) / np.sqrt(np.sum(tg[1] ** 2))
        tt += dp
    return tt / len(xs)


def _their_distance_irrelevance(model, data, C):
    """eval-main.ipynb, cell 10, re-typed."""
    oo = [[0] * C for _ in range(C)]
    with torch.inference_mode():
        o = model(data.inputs)[:, -1, :]
        o0 = o[list(range(len(data.inputs))), data.labels]
        for p, q in zip(o0, data.inputs):
            A, B = int(q[0].item()), int(q[1].item())
            oo[(A + B) % C][(A - B) % C] = p.item()
    oo = np.array(oo)
    return np.mean(np.std(oo, axis=0)) / np.std(oo.flatten())


@pytest.mark.parametrize("attention", ["softmax", "uniform"])
def test_matches_their_notebook_on_a_tiny_transformer(attention):
    model, data = tiny_transformer(p=11, train_steps=40, attention=attention)
    eq = int(data.inputs[0, 2])
    theirs_gs = _their_gradient_symmetricity(copy.deepcopy(model), 11, eq)
    theirs_di = _their_distance_irrelevance(model, data, 11)
    ours = clock_pizza(model, data)
    assert ours["gradient_symmetricity"] == pytest.approx(theirs_gs, abs=1e-5)
    assert ours["distance_irrelevance"] == pytest.approx(theirs_di, abs=1e-5)
    assert all(p.grad is None for p in model.parameters()) and all_hooks_clear(model)
    if attention == "uniform":  # one layer, no norm, read at '=': the logits see E_a and E_b only as E_a + E_b
        assert ours["gradient_symmetricity"] == pytest.approx(1.0, abs=1e-6)


def _their_logit_fve(model, C, eq, n_circles):
    """eval-main.ipynb cells 8 and 21, re-typed: sklearn's PCA of the number tokens' rows of W_E, the step
    `delta` of cell 8 per circle's first component and w = 2 pi delta^-1 / C, the W_E rows replaced by
    the circle's inverse_transform, their triple loop for oa (Q_clock) and ob (Q_pizza), sklearn's
    explained_variance_score of the standardized arrays."""
    from sklearn.decomposition import PCA
    from sklearn.metrics import explained_variance_score

    inv = lambda t: pow(t, C - 2, C)  # noqa: E731 (C prime)
    out = []
    for uu in range(n_circles):
        m = copy.deepcopy(model)
        we = m.embed.W_E.detach()[:C].double().numpy()
        pca = PCA(n_components=2 * n_circles)
        we2 = pca.fit_transform(we)
        vs = we2[:, 2 * uu]
        tt = []
        for i in range(1, C):
            vv = [vs[t * i % C] for t in range(C)]
            tt.append((-abs(sum(vv[t] * complex(math.cos(2 * math.pi / C * t), math.sin(2 * math.pi / C * t))
                                for t in range(C))), i))
        tt.sort()
        wk = 2 * math.pi / C * inv(tt[0][1])
        keep = np.zeros_like(we2)
        keep[:, [2 * uu, 2 * uu + 1]] = we2[:, [2 * uu, 2 * uu + 1]]
        with torch.no_grad():
            m.embed.W_E[:C] = torch.tensor(pca.inverse_transform(keep), dtype=m.embed.W_E.dtype)
            x = torch.tensor([[a, b, eq] for a in range(C) for b in range(C)])
            ou = m(x)[:, -1, :C].double().numpy().reshape(C, C, C)
        oa, ob = np.zeros_like(ou), np.zeros_like(ou)
        for i in range(C):
            for j in range(C):
                for k in range(C):
                    oa[i][j][k] = math.cos(wk * (i + j - k))
                    s = (math.cos(wk * i) + math.cos(wk * j), math.sin(wk * i) + math.sin(wk * j))
                    co, si = math.cos(wk * k / 2), math.sin(wk * k / 2)
                    ob[i][j][k] = abs(co * s[0] + si * s[1]) - abs(-si * s[0] + co * s[1])
        npfy = lambda x: ((x - np.mean(x)) / np.std(x)).flatten()  # noqa: E731
        freq = min(inv(tt[0][1]), C - inv(tt[0][1]))
        out.append((freq, explained_variance_score(npfy(ou), npfy(oa)), explained_variance_score(npfy(ou), npfy(ob))))
    return out


@pytest.mark.parametrize("attention", ["softmax", "uniform"])
def test_logit_patterns_match_their_notebook_on_a_tiny_transformer(attention):
    model, data = tiny_transformer(p=13, train_steps=60, attention=attention)
    eq = int(data.inputs[0, 2])
    theirs = _their_logit_fve(model, 13, eq, n_circles=2)
    ours = logit_patterns(model, data, n_circles=2)
    assert ours["circle_frequency"].tolist() == [f for f, _, _ in theirs]
    np.testing.assert_allclose(ours["circle_q_clock"], [q for _, q, _ in theirs], atol=1e-5)
    np.testing.assert_allclose(ours["circle_q_pizza"], [q for _, _, q in theirs], atol=1e-5)
    assert ours["q_clock"] == pytest.approx(np.mean([q for _, q, _ in theirs]), abs=1e-5)
    assert all_hooks_clear(model) and all(p.grad is None for p in model.parameters())


# ------------------------------------------------------------- along real runs
@pytest.mark.parametrize("attention", ["softmax", "uniform"])
def test_along_a_real_run(tmp_path, attention):
    path = tmp_path / "run.h5"
    train_tiny(path, attention=attention, steps=200, checkpoint_every=50, lr=1e-2)
    res = compute(path, "clock_pizza")
    steps = [int(s) for s in Trajectory(path).steps]
    assert res.steps == steps
    gs, di = res["gradient_symmetricity"], res["distance_irrelevance"]
    assert np.all((gs >= -1) & (gs <= 1)) and np.all((di >= 0) & (di <= 1.5))
    assert np.all(res["is_clock"] + res["is_pizza"] <= 1)
    single = compute(path, "distance_irrelevance", steps=[steps[-1]])
    assert single["distance_irrelevance"][0] == pytest.approx(di[-1])
    assert single["correct_logits"].shape == (1, 11, 11)
    patterns = compute(path, "logit_patterns")
    assert patterns.steps == steps and patterns["circle_q_clock"].shape == (len(steps), 3)
    assert np.all(patterns["q_clock"] <= 1) and np.all(patterns["q_pizza"] <= 1)
    run = Trajectory(path)
    last = logit_patterns(run.model(steps[-1]), run.dataset())
    assert last["q_pizza"] == pytest.approx(patterns["q_pizza"][-1])


def test_the_operands_are_the_informative_positions():
    model, data = tiny_transformer(p=7, train_steps=5, op_token=True)  # [a, op, b, =]
    assert operand_positions(data) == (0, 2)
    res = clock_pizza(model, data)
    assert -1 <= res["gradient_symmetricity"] <= 1 and res["distance_irrelevance"] > 0


def test_refuses_what_it_cannot_read():
    model, data = tiny_transformer(p=6)
    with pytest.raises(BadInput, match="odd p"):
        distance_irrelevance(model, data)
    model, data = tiny_transformer(p=5)
    with pytest.raises(BadInput, match="n_samples"):
        gradient_symmetricity(model, data, n_samples=0)
    with pytest.raises(BadInput, match="n_circles"):
        logit_patterns(model, data, n_circles=0)
    model, data = tiny_transformer(p=5, nonzero_b=True)
    with pytest.raises(BadInput, match="every"):
        distance_irrelevance(model, data)
