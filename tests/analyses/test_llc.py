"""The local learning coefficient (devinterp's SGLD) against cases with a known answer.

Linear regression with squared loss is exactly quadratic around its least-squares minimum w*:
L(w) = L(w*) + 1/2 (w - w*)^T H (w - w*), H = X^T X / n. Its LLC is rank(H) / 2: d/2 for a
full-rank (regular) model, less for a model with flat directions. Full-batch SGLD with step eps,
localization gamma and inverse temperature nb is then a Gaussian autoregression whose
stationary variance along an eigenvector of H (eigenvalue l, a = nb l + gamma) is
1 / (a (1 - eps a / 4)), so its expected estimate is sum_i nb l_i / (2 a_i (1 - eps a_i / 4)):
written out here independently of devinterp, and within a few percent of rank / 2.
"""

import json

import numpy as np
import pytest
import torch
from torch import nn

from groklens.analyses.llc import sgld_llc
from groklens.analyses.registry import get
from groklens.analyses.store import Sidecar
from groklens.checkpoints import Trajectory, sidecar_path
from tests.helpers import groklens, train_tiny

# 16 parameters each: the estimate's relative spread shrinks as sqrt(2 / rank)
N, NB, GAMMA, LR = 400, 20.0, 0.1, 5e-3
CHAINS, DRAWS, BURNIN = 8, 200, 50


def _problem(d_features: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, d_features, generator=g, dtype=torch.float64)
    y = x @ torch.randn(d_features, generator=g, dtype=torch.float64) + 0.5 * torch.randn(N, generator=g,
                                                                                          dtype=torch.float64)
    w_star = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1)
    return x, y, w_star


class Regular(nn.Module):
    """y = x . w: as many parameters as features, H = X^T X / n full rank."""

    def __init__(self, w_star):
        super().__init__()
        self.w = nn.Parameter(w_star.clone())

    def forward(self, x):
        return x @ self.w


class Redundant(nn.Module):
    """y = x . (u + v): twice the parameters of its features; u - v is a flat direction."""

    def __init__(self, w_star):
        super().__init__()
        self.u = nn.Parameter(w_star / 2)
        self.v = nn.Parameter(w_star / 2)

    def forward(self, x):
        return x @ (self.u + self.v)


def _hessian(model, x) -> np.ndarray:
    s = (x.T @ x / N).numpy()
    return s if isinstance(model, Regular) else np.block([[s, s], [s, s]])


def expected(h: np.ndarray, nb: float = NB, gamma: float = GAMMA, lr: float = LR) -> float:
    """This sampler's expected estimate for the quadratic loss with Hessian h (module docstring)."""
    lam = np.clip(np.linalg.eigvalsh(h), 0, None)
    a = nb * lam + gamma
    return float(np.sum(nb * lam / (2 * a * (1 - lr * a / 4))))


def _estimate(model, x, y, **kw):
    def row_loss(m, rows):
        return 0.5 * (m(x[rows]) - y[rows]) ** 2

    return sgld_llc(model, row_loss, N, lr=LR, localization=GAMMA, nbeta=NB, chains=CHAINS, draws=DRAWS,
                    burnin=BURNIN, minibatch=N, **kw)


@pytest.fixture(scope="module")
def estimates():
    out = {}
    x, y, w_star = _problem(16)
    out["regular"] = (Regular(w_star), x, 16 / 2)
    x, y2, w_star = _problem(8)
    out["redundant"] = (Redundant(w_star), x, 8 / 2)  # 16 parameters, rank 8
    res = {}
    for name, (model, xx, known) in out.items():
        yy = y if name == "regular" else y2
        r = _estimate(model.double(), xx, yy)
        res[name] = (r, known, expected(_hessian(model, xx)))
    return res


@pytest.mark.slow
@pytest.mark.parametrize("name", ["regular", "redundant"])
def test_llc_is_half_the_rank(estimates, name):
    r, known, expected = estimates[name]
    se = r["llc_std"] / np.sqrt(CHAINS)  # the chains' spread: the tolerance
    assert r["failed_chains"] == 0 and np.isfinite(r["llc_per_chain"]).all()
    assert 0 < se < 0.1 * known  # a tolerance that can fail
    assert abs(expected - known) < 0.06 * known  # this sampler's expectation is rank/2 up to its step's bias
    assert abs(r["llc_mean"] - expected) < 4 * se
    assert abs(r["llc_mean"] - known) < 4 * se + abs(expected - known)
    assert r["llc_per_chain"].shape == (CHAINS,)


@pytest.mark.slow
def test_degenerate_direction_lowers_the_llc(estimates):
    """Both models have 16 parameters; the redundant one's flat directions halve its LLC."""
    (reg, _, _), (red, _, _) = estimates["regular"], estimates["redundant"]
    se = np.hypot(reg["llc_std"], red["llc_std"]) / np.sqrt(CHAINS)
    assert reg["llc_mean"] - red["llc_mean"] > 4 * se


def test_burnin_zero_is_devinterps_compute_llc():
    """devinterp's compute_llc averages every step; ours the draws after burn-in: the same at 0."""
    x, y, w_star = _problem(2, seed=1)

    def row_loss(m, rows):
        return 0.5 * (m(x[rows]) - y[rows]) ** 2

    kw = dict(lr=LR, localization=GAMMA, nbeta=NB, chains=2, draws=40, minibatch=N)
    r0 = sgld_llc(Regular(w_star).double(), row_loss, N, burnin=0, **kw)
    assert r0["llc_devinterp"] == pytest.approx(r0["llc_mean"], rel=1e-6)  # its float32 reduction
    r5 = sgld_llc(Regular(w_star).double(), row_loss, N, burnin=5, **kw)
    assert r5["llc_devinterp"] != pytest.approx(r5["llc_mean"], rel=1e-3)


# ---------------------------------------------------------------------- `groklens analyze --metric llc`
CHEAP = ["--param", "llc.chains=2", "--param", "llc.draws=6", "--param", "llc.burnin=2", "--param", "llc.minibatch=8"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("llc") / "run.h5"
    train_tiny(path)
    return path


@pytest.fixture(scope="module")
def fresh_run(tmp_path_factory):
    """A run no test writes analyses of (bad input must leave it so)."""
    path = tmp_path_factory.mktemp("llc_bad") / "run.h5"
    train_tiny(path)
    return path


@pytest.mark.slow
def test_analyze_llc_stores_values_with_parameters(run):
    out = groklens("analyze", str(run), "--metric", "llc", "--checkpoints", "20,60", *CHEAP, "--json", "-q",
                   check=True)
    res = json.loads(out.stdout)["llc"]
    assert res["steps"] == [20, 60]
    for i in range(2):
        per_chain = res["llc_per_chain"][i]
        assert len(per_chain) == 2 and res["failed_chains"][i] == 0
        assert res["llc_mean"][i] == pytest.approx(np.mean(per_chain))
        assert res["llc_std"][i] == pytest.approx(np.std(per_chain, ddof=1))
        assert np.shape(res["trace"][i]) == (2, 8)  # burn-in + draws steps, fewer than TRACE_BINS
    n_train = len(Trajectory(run).dataset().train_idx)
    assert res["nbeta"] == [pytest.approx(n_train / np.log(n_train))] * 2
    (variant, attrs), = Sidecar(run).variants("llc")
    params = json.loads(attrs["params"])
    assert params["chains"] == 2 and params["draws"] == 6 and params["burnin"] == 2 and params["minibatch"] == 8
    assert params["lr"] == get("llc").defaults["lr"] and params["nbeta"] is None
    stored = Sidecar(run).read("llc", variant)
    assert stored.steps == [20, 60]
    np.testing.assert_allclose(np.array(stored.values["llc_mean"]), res["llc_mean"])
    again = json.loads(groklens("analyze", str(run), "--metric", "llc", "--checkpoints", "20,60", *CHEAP, "--json",
                                "-q", check=True).stdout)["llc"]
    assert again == res  # stored, not recomputed: the same seed gives the same numbers anyway


@pytest.mark.parametrize("param, message", [
    ("llc.lr=-0.001", "lr must be a positive"),
    ("llc.chains=0", "chains must be an integer >= 1"),
    ("llc.minibatch=100000", "larger than the evaluation set"),
])
def test_bad_hyperparameters_are_one_line_exit_2_and_nothing_written(fresh_run, param, message):
    proc = groklens("analyze", str(fresh_run), "--metric", "llc", "--param", param)
    assert proc.returncode == 2
    assert proc.stderr.startswith("groklens: error:") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not sidecar_path(fresh_run).exists()


@pytest.mark.parametrize("params, message", [
    ({"localization": -1.0}, "localization must be a non-negative"),
    ({"nbeta": 0}, "nbeta must be a positive"),
    ({"draws": 1}, "draws must be an integer >= 2"),
    ({"burnin": -1}, "burnin must be an integer >= 0"),
    ({"lr": float("nan")}, "lr must be a positive finite"),
    ({"chains": True}, "chains must be an integer"),
])
def test_check_refuses_bad_hyperparameters(params, message):
    from groklens.analyses.llc import check
    from groklens.errors import BadInput
    from tests.analyses.builders import tiny_transformer

    model, data = tiny_transformer(p=5)
    with pytest.raises(BadInput, match=message):
        check(model, data, params)


@pytest.mark.slow
def test_compare_reads_llc_at_the_end(tmp_path):
    from groklens.analyses import compute
    from groklens.analyses.compare import compare

    path = tmp_path / "run.h5"
    train_tiny(path)
    last = int(Trajectory(path).steps[-1])
    res = compute(path, "llc", steps=[last], chains=2, draws=6, burnin=2, minibatch=8)
    row, = compare([path]).rows()
    assert row["analyses"]["llc"]["end"]["mean"] == pytest.approx(float(res["llc_mean"][0]))


def test_global_generators_are_left_as_they_were():
    import random

    x, y, w_star = _problem(2, seed=2)
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    sgld_llc(Regular(w_star).double(), lambda m, rows: 0.5 * (m(x[rows]) - y[rows]) ** 2, N, lr=LR,
             localization=GAMMA, nbeta=NB, chains=1, draws=4, burnin=0, minibatch=N)
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1]) and got[2] == expected[2]
