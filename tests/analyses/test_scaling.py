"""The scaling-law fit: exponents recovered from synthetic grokking times, noise and censoring."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from groklens.analyses.scaling import (
    GrokRecord,
    collect_runs,
    fit_scaling_law,
    ols_fit,
    scaling_law,
    tobit_fit,
    variable_value,
)
from groklens.checkpoints import TrajectoryWriter
from groklens.checkpoints.writer import config_json
from groklens.trainers.engine import METRIC_NAMES

from groklens.errors import BadInput
from groklens.tasks import TASKS
from tests.helpers import groklens, tiny_config

TRUE = {"width": -0.27, "train_frac": -2.04, "lr": -0.50, "weight_decay": -0.64}  # the published law
GRID = {"width": [32, 64, 128, 256], "train_frac": [0.2, 0.3, 0.5, 0.7], "lr": [3e-4, 1e-3, 3e-3],
        "weight_decay": [0.1, 0.3, 1.0, 3.0]}


def synthetic(seed=0, noise=0.3, last=5000, c=30.0, seeds=2):
    """Grokking times T = c prod v^a exp(noise N(0,1)); T > last is right-censored at last."""
    rng = np.random.default_rng(seed)
    records = []
    for i, (values, _) in enumerate(itertools.product(itertools.product(*GRID.values()), range(seeds))):
        point = dict(zip(GRID, values))
        log_t = math.log(c) + sum(TRUE[k] * math.log(v) for k, v in point.items()) + rng.normal(0, noise)
        t = math.exp(log_t)
        records.append(GrokRecord(f"r{i}", point, t if t <= last else None, last))
    return records


def test_tobit_recovers_the_exponents_despite_censoring():
    records = synthetic()
    n_cens = sum(r.censored for r in records)
    assert 0.2 < n_cens / len(records) < 0.5  # a real share of runs never groks
    result = fit_scaling_law(records, list(TRUE), censored=True)
    assert result["n_censored"] == n_cens and result["censored"] == "tobit"
    tobit = result["tobit"]
    assert tobit["converged"]
    for var, a in TRUE.items():
        e = tobit["exponents"][var]
        assert abs(e["estimate"] - a) < 0.1, (var, e)
        assert e["ci95"][0] < a < e["ci95"][1], (var, e)
    assert abs(tobit["sigma"] - 0.3) < 0.05
    # leaving the censored runs out biases the exponents toward zero: the reason for --censored
    ols = result["ols"]
    assert ols["n"] == len(records) - n_cens
    assert abs(ols["exponents"]["train_frac"]["estimate"]) < abs(tobit["exponents"]["train_frac"]["estimate"])


def test_ols_without_censoring_recovers_exponents_and_r2():
    records = synthetic(last=1e12, noise=0.2)
    result = fit_scaling_law(records, list(TRUE))
    assert result["n_censored"] == 0 and result["censored"] == "excluded"
    for var, a in TRUE.items():
        e = result["ols"]["exponents"][var]
        assert e["ci95"][0] < a < e["ci95"][1]
    # R^2 from the variance budget: var(signal) / (var(signal) + noise^2)
    logx = np.log([[r.values[v] for v in TRUE] for r in records])
    signal = logx @ np.array(list(TRUE.values()))
    expected = signal.var() / (signal.var() + 0.2**2)
    assert abs(result["ols"]["r2"] - expected) < 0.03
    assert result["ols"]["r2_interactions"] >= result["ols"]["r2"] - 1e-12


def test_ols_matches_the_normal_equations():
    """Against an independent computation: numpy normal equations and the t quantile."""
    from scipy import stats

    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 3))
    y = 1.5 + X @ [0.5, -1.0, 2.0] + rng.normal(0, 0.5, 40)
    fit = ols_fit(X, y, ["a", "b", "c"])
    A = np.hstack([np.ones((40, 1)), X])
    beta = np.linalg.solve(A.T @ A, A.T @ y)
    resid = y - A @ beta
    s2 = resid @ resid / (40 - 4)
    se = np.sqrt(np.diag(s2 * np.linalg.inv(A.T @ A)))
    t = stats.t.ppf(0.975, 36)
    for i, name in enumerate("abc"):
        e = fit["exponents"][name]
        assert e["estimate"] == pytest.approx(beta[i + 1], rel=1e-10)
        assert e["se"] == pytest.approx(se[i + 1], rel=1e-10)
        assert e["ci95"] == pytest.approx([beta[i + 1] - t * se[i + 1], beta[i + 1] + t * se[i + 1]], rel=1e-10)
    assert fit["r2"] == pytest.approx(1 - resid @ resid / ((y - y.mean()) ** 2).sum(), rel=1e-10)


def test_tobit_without_censoring_is_the_gaussian_mle():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(60, 2))
    y = 0.3 + X @ [1.0, -0.5] + rng.normal(0, 0.4, 60)
    fit = tobit_fit(X, y, np.zeros(60, bool), ["a", "b"])
    A = np.hstack([np.ones((60, 1)), X])
    beta = np.linalg.lstsq(A, y, rcond=None)[0]
    sigma_mle = math.sqrt(((y - A @ beta) ** 2).mean())  # the MLE divides by n
    assert [fit["exponents"][k]["estimate"] for k in "ab"] == pytest.approx(beta[1:], abs=1e-6)
    assert fit["sigma"] == pytest.approx(sigma_mle, rel=1e-5)
    # its standard errors: sigma^2 (A'A)^-1 at the MLE
    se = np.sqrt(np.diag(sigma_mle**2 * np.linalg.inv(A.T @ A)))
    assert [fit["exponents"][k]["se"] for k in "ab"] == pytest.approx(se[1:], rel=1e-3)


def test_tobit_with_censoring_matches_an_independent_mle():
    """Against an independent computation: the censored likelihood written with the normal pdf and
    1 - cdf, maximised by Nelder-Mead over (b, sigma) without gradients, and its standard errors
    from a value-only finite-difference Hessian in (b, log sigma)."""
    from scipy import optimize, stats

    rng = np.random.default_rng(7)
    X = rng.normal(size=(80, 2))
    y = 0.2 + X @ [1.0, -0.6] + rng.normal(0, 0.5, 80)
    cens = y > 0.6
    y = np.where(cens, 0.6, y)
    assert 15 < cens.sum() < 40
    fit = tobit_fit(X, y, cens, ["a", "b"])
    A = np.hstack([np.ones((80, 1)), X])

    def nll(t):
        b, s = t[:3], t[3]
        if s <= 0:
            return np.inf
        mu = A @ b
        return -(np.log(stats.norm.pdf(y[~cens], mu[~cens], s)).sum()
                 + np.log(1 - stats.norm.cdf(0.6, mu[cens], s)).sum())

    ref = optimize.minimize(nll, [0, 0, 0, 1], method="Nelder-Mead",
                            options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 40_000, "maxfev": 40_000})
    ours = [fit["intercept"]["estimate"]] + [fit["exponents"][k]["estimate"] for k in "ab"]
    assert ours == pytest.approx(ref.x[:3], abs=1e-6)
    assert fit["sigma"] == pytest.approx(ref.x[3], abs=1e-6)
    assert fit["log_likelihood"] == pytest.approx(-ref.fun, abs=1e-8)

    def f(u):
        return nll(np.r_[u[:3], math.exp(u[3])])

    u, h, eye = np.r_[ref.x[:3], math.log(ref.x[3])], 1e-4, np.eye(4)
    H = np.array([[(f(u + h * (eye[i] + eye[j])) - f(u + h * (eye[i] - eye[j])) - f(u - h * (eye[i] - eye[j]))
                    + f(u - h * (eye[i] + eye[j]))) / (4 * h * h) for j in range(4)] for i in range(4)])
    se = np.sqrt(np.diag(np.linalg.inv(H)))
    assert [fit["intercept"]["se"]] + [fit["exponents"][k]["se"] for k in "ab"] == pytest.approx(se[:3], rel=1e-3)


def test_interactions_raise_r2_when_the_truth_has_them():
    rng = np.random.default_rng(5)
    records = []
    for i, (h, lr) in enumerate(itertools.product([16, 32, 64, 128, 256], [1e-4, 3e-4, 1e-3, 3e-3, 1e-2])):
        for s in range(3):
            lh, ll = math.log(h), math.log(lr)
            log_t = 2 - 0.3 * lh - 0.5 * ll + 0.4 * (lh - 4) * (ll + 6) + rng.normal(0, 0.1)
            records.append(GrokRecord(f"{i}-{s}", {"width": h, "lr": lr}, math.exp(log_t), 1e12))
    result = fit_scaling_law(records, ["width", "lr"], interactions=True)
    assert result["ols"]["r2_interactions"] > result["ols"]["r2"] + 0.1
    assert result["interactions"]["exponents"]["width*lr"]["estimate"] == pytest.approx(0.4, abs=0.03)


def test_bad_fits_are_bad_input():
    records = synthetic()
    with pytest.raises(BadInput, match="takes one value"):
        fit_scaling_law([r for r in records if r.values["lr"] == 1e-3], list(TRUE))
    with pytest.raises(BadInput, match="repeated"):
        fit_scaling_law(records, ["lr", "lr"])
    with pytest.raises(BadInput, match="nothing to fit"):
        fit_scaling_law([GrokRecord(r.name, r.values, None, 100) for r in records], list(TRUE))
    zero = [GrokRecord(r.name, {**r.values, "weight_decay": 0.0 if i % 2 else r.values["weight_decay"]},
                       r.grok_step, r.last_step) for i, r in enumerate(records)]
    result = fit_scaling_law(zero, list(TRUE))
    assert len(result["excluded"]["nonpositive_value"]) == len(records) // 2


def test_width_is_the_hidden_width_of_each_model():
    cfg = tiny_config(d_mlp=48).to_dict()
    assert variable_value("width", cfg) == 48.0
    assert variable_value("lr", cfg) == cfg["lr"]
    with pytest.raises(BadInput, match="not numeric"):
        variable_value("norm", cfg)
    with pytest.raises(BadInput, match="unknown scaling variable"):
        variable_value("depthh", cfg)


# ---------------------------------------------------------------------- from a sweep directory
def write_run(path, cfg, grok_step, last=2000, every=100, status="completed"):
    """A trajectory file whose test accuracy crosses 0.95 at grok_step (None: never), of a run
    configured for `last` steps (readers refuse steps past the config's)."""
    cfg = cfg.replace(steps=last)
    params = {"w": np.zeros(2, np.float32)}
    data = TASKS.get(cfg.task).build(cfg)  # the config's own dataset: files are checked against it on open
    writer = TrajectoryWriter.create(
        path, config_json=config_json(cfg),
        data={"inputs": data.inputs.numpy(), "labels": data.labels.numpy(), "train_idx": data.train_idx.numpy(),
              "test_idx": data.test_idx.numpy(), "informative_mask": data.informative_mask.numpy()},
        data_attrs={"readout_pos": data.readout_pos, "d_vocab": data.d_vocab, "d_vocab_out": data.d_vocab_out},
        params=params, state={"s": np.zeros(1, np.float32)}, metric_names=METRIC_NAMES)
    for step in range(0, last + 1, every):
        acc = 1.0 if grok_step is not None and step >= grok_step else 0.1
        writer.write_eval({"step": step, "train_acc": 1.0, "test_acc": acc, "train_loss": 0.0, "test_loss": 1.0})
    writer.write_checkpoint(last, params, {"s": np.zeros(1, np.float32)})
    writer.close(status)


@pytest.mark.slow
def test_scaling_law_command_on_a_directory(tmp_path, capsys):
    rng = np.random.default_rng(7)
    expected_censored = 0
    for i, (d_mlp, frac, lr, wd) in enumerate(itertools.product([16, 32, 64], [0.3, 0.5, 0.7], [1e-3, 3e-3],
                                                                  [0.3, 1.0, 3.0])):
        cfg = tiny_config(d_mlp=d_mlp, train_frac=frac, lr=lr, weight_decay=wd)
        t = 40 * d_mlp**-0.3 * frac**-2 * lr**-0.5 * wd**-0.6 * math.exp(rng.normal(0, 0.1))
        step = int(math.ceil(t / 100) * 100)
        grok = step if step <= 2000 else None
        # grokked needs 3 evaluations (grok_evals) at or above 0.95 by the last, step 2000
        expected_censored += step > 2000 - 2 * 100
        write_run(tmp_path / f"run{i}.h5", cfg, grok)
    write_run(tmp_path / "unfinished.h5", tiny_config(), 500, status="running")
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    proc = groklens("scaling-law", str(tmp_path), "--censored", "--json", check=True)
    result = json.loads(proc.stdout)
    assert result["n_runs"] == 54 and result["n_censored"] == expected_censored > 0
    assert result["skipped"] == {"unfinished": ["unfinished"], "unreadable": ["junk"]}
    exps = result["tobit"]["exponents"]
    assert exps["width"]["estimate"] == pytest.approx(-0.3, abs=0.15)
    assert exps["train_frac"]["estimate"] == pytest.approx(-2.0, abs=0.3)
    assert exps["weight_decay"]["estimate"] == pytest.approx(-0.6, abs=0.15)
    assert json.loads((tmp_path / "scaling-law.json").read_text())["n_runs"] == 54
    assert (tmp_path / "scaling-law.png").stat().st_size > 10_000
    text = groklens("scaling-law", str(tmp_path), "--vars", "width,lr", "--interactions", check=True).stdout
    assert "R^2" in text and "width*lr" in text and "excluded from the fit" in text
    # bad input: exit 2 and one line, through the CLI's entry point (in-process, to save start-ups)
    from groklens.cli import main

    for args, message in [((str(tmp_path / "nope"),), "no such directory"),
                          ((str(tmp_path), "--vars", "width,nope"), "unknown scaling variable"),
                          ((str(tmp_path), "--vars", "width,p"), "takes one value"),
                          ((str(tmp_path), "--phase", "lr"), "--phase")]:
        with pytest.raises(SystemExit) as exit_info:
            main(["scaling-law", *args])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and err.count("\n") == 1, err


def test_collect_runs_needs_trajectories(tmp_path):
    with pytest.raises(BadInput, match="no trajectory files"):
        collect_runs(tmp_path, ["lr"])
    write_run(tmp_path / "a.h5", tiny_config(), 300)
    collected = collect_runs(tmp_path, ["lr", "width"], threshold=0.95)
    assert collected.records[0].grok_step == 300 and collected.records[0].values["width"] == 32
    with pytest.raises(BadInput, match="threshold"):
        collect_runs(tmp_path, ["lr"], threshold=1.5)
    with pytest.raises(BadInput):
        scaling_law(tmp_path, ["lr"])  # one run: lr takes one value
