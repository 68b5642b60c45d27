"""The scaling law's claims beyond the fit (analyses/scaling.py): the phase boundary along one
variable, checked against its closed form and an independent bootstrap; the weight norm through
the transition, against hand-computed curves, a real run's file read directly, and the exact
binomial interval from the beta quantiles; and the figure's phase map."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest

from groklens.analyses.scaling import (
    GrokRecord, falls_monotonically, figure, fit_scaling_law, monotone_rate, phase_boundary, weight_norm_transition)
from groklens.errors import BadInput

LEVELS = [0.1, 0.3, 1.0, 3.0]


def _runs(fractions, n=4):
    """n runs per level, the first round(f * n) grokked."""
    values, grokked = [], []
    for v, f in zip(LEVELS, fractions):
        k = round(f * n)
        values += [v] * n
        grokked += [True] * k + [False] * (n - k)
    return values, grokked


def test_boundary_is_the_log_interpolated_crossing_of_one_half():
    b = phase_boundary(*_runs([0.0, 0.25, 0.75, 1.0]))
    # only (0.3, 1) straddles 1/2, at the middle of its fractions: the geometric mean of the two levels
    assert b["estimate"] == pytest.approx(math.sqrt(0.3 * 1.0))
    assert b["between"] == [0.3, 1.0] and b["grokked_side"] == "above" and b["step"] == [0.25, 0.75]
    assert b["fraction"] == [0.0, 0.25, 0.75, 1.0] and b["n"] == [4] * 4
    # several straddling pairs: the one with the largest step; the runs grok below it
    b = phase_boundary(*_runs([1.0, 0.0, 0.25, 0.75]))  # (0.1, 0.3) steps 1, (1, 3) only 0.5
    assert b["estimate"] == pytest.approx(math.sqrt(0.1 * 0.3)) and b["grokked_side"] == "below"
    b = phase_boundary(*_runs([0.0, 0.25, 1.0, 1.0]))  # (0.3, 1) steps 0.75, more than (0.1, 0.3)
    t = (0.5 - 0.25) / 0.75
    assert b["estimate"] == pytest.approx(math.exp(math.log(0.3) + t * math.log(1 / 0.3)))


def test_a_step_without_spread_has_a_point_interval_and_no_crossing_says_why():
    b = phase_boundary(*_runs([0.0, 0.0, 1.0, 1.0]))
    assert b["ci95"] == [pytest.approx(b["estimate"])] * 2  # every resample is the sample itself
    none = phase_boundary(*_runs([0.75, 1.0, 1.0, 1.0]))
    assert none["estimate"] is None and "every level" in none["why"]
    with pytest.raises(BadInput):
        phase_boundary([0.0, 1.0], [True, False])


def test_bootstrap_interval_agrees_with_resampling_the_runs_independently():
    values, grokked = _runs([0.1, 0.4, 0.7, 0.9], n=10)
    ours = phase_boundary(values, grokked, n_boot=20_000, seed=1)
    # independently: resample each level's runs with replacement, recompute the crossing by hand
    rng = np.random.default_rng(7)
    x, g = np.array(values), np.array(grokked)
    levels = np.unique(x)
    boots = []
    for _ in range(20_000):
        f = np.array([rng.choice(g[x == v], size=(x == v).sum(), replace=True).mean() for v in levels])
        pairs = [(abs(f[i + 1] - f[i]), i) for i in range(3) if (f[i] - .5) * (f[i + 1] - .5) <= 0 and f[i] != f[i + 1]]
        if not pairs:
            boots.append(0.0 if np.all(f > .5) else math.inf)
            continue
        i = max(pairs, key=lambda p: (p[0], -p[1]))[1]
        t = (.5 - f[i]) / (f[i + 1] - f[i])
        boots.append(math.exp(math.log(levels[i]) + t * (math.log(levels[i + 1]) - math.log(levels[i]))))
    lo, hi = np.quantile(boots, [0.025, 0.975])
    assert ours["ci95"][0] == pytest.approx(lo, rel=0.1) and ours["ci95"][1] == pytest.approx(hi, rel=0.1)
    assert ours["ci95"][0] <= ours["estimate"] <= ours["ci95"][1]


def test_weight_norm_through_the_transition_against_hand_curves():
    steps = np.arange(0, 1001, 50)
    falling = 30.0 - 0.01 * steps
    t = weight_norm_transition(steps, falling, 100, 600)
    assert (t["evals"], t["first"], t["last"], t["max_rise"], t["falling"]) == (11, 29.0, 24.0, 0.0, 1.0)
    assert falls_monotonically(t)
    bumped = falling.copy()
    bumped[steps == 300] = bumped[steps == 250][0] * 1.005  # one rise of 0.5% between evaluations
    t = weight_norm_transition(steps, bumped, 100, 600)
    assert t["max_rise"] == pytest.approx(0.005) and t["falling"] == pytest.approx(9 / 10)
    assert not falls_monotonically(t) and falls_monotonically(t, tol=0.01)
    flat = weight_norm_transition(steps, np.full(len(steps), 5.0), 100, 600)
    assert not falls_monotonically(flat)  # never rises, never falls: not a fall
    assert weight_norm_transition(steps, falling, 600, 600) is None  # one evaluation: no window


def test_monotone_rate_has_the_exact_binomial_interval():
    from scipy import stats

    down = {"max_rise": 0.0, "first": 2.0, "last": 1.0, "falling": 1.0}
    up = {"max_rise": 0.1, "first": 2.0, "last": 1.0, "falling": 0.5}
    r = monotone_rate([down] * 7 + [up] * 3 + [None])
    assert (r["k"], r["n"], r["missing"]) == (7, 10, 1) and r["rate"] == pytest.approx(0.7)
    # Clopper-Pearson from the beta quantiles
    assert r["ci95"] == [pytest.approx(stats.beta.ppf(0.025, 7, 4)), pytest.approx(stats.beta.ppf(0.975, 8, 3))]
    assert r["median_falling"] == pytest.approx(1.0)


def test_a_real_runs_window_is_its_files_weight_norm(tmp_path):
    """A tiny MLP that groks in a few hundred steps: the experiment's run value is the window of
    the weight norm stored in the file (read here with h5py), memorization to grokking."""
    from groklens.config import config_from
    from groklens.experiments.scaling_law import _run_values
    from groklens.trainers.train import train

    cfg = config_from(None, overrides=dict(task="add", p=13, model="mlp", n_layers=2, d_model=32, d_mlp=64,
                                           mlp_bias=True, train_frac=0.7, lr=1e-2, weight_decay=2.0, steps=600,
                                           eval_every=10, checkpoint_every=300, stop_after_grok=1, grok_evals=1,
                                           device="cpu", seed=1))
    path = tmp_path / "r.h5"
    train(cfg, path, progress=False)
    wn = _run_values(path, None)["weight_norm"]
    with h5py.File(path, "r", locking=False) as f:
        steps, norm = f["metrics/step"][:], f["metrics/weight_norm"][:]
        train_acc, test_acc = f["metrics/train_acc"][:], f["metrics/test_acc"][:]
    memo, grok = steps[np.argmax(train_acc >= 0.95)], steps[np.argmax(test_acc >= 0.95)]
    assert test_acc.max() >= 0.95 and (wn["from_step"], wn["to_step"]) == (memo, grok)
    window = norm[(steps >= memo) & (steps <= grok)]
    assert wn["evals"] == len(window) and wn["first"] == window[0] and wn["last"] == window[-1]
    assert wn["max_rise"] == pytest.approx(max(0.0, float(np.max(np.diff(window) / window[:-1]))))


def test_figure_draws_the_phase_map_cells_and_the_boundary():
    rng = np.random.default_rng(0)
    recs = []
    for wd in LEVELS:
        for d in (0.4, 0.6):
            for lr in (1e-3, 3e-3, 1e-2):
                t = 50 * wd ** -0.6 * d ** -2 * lr ** -0.5 * math.exp(rng.normal(0, 0.1))
                grok = int(t) if wd >= 1.0 or lr == 1e-2 else None
                recs.append(GrokRecord(f"{wd}_{d}_{lr}", {"weight_decay": wd, "train_frac": d, "lr": lr}, grok, 20_000))
    variables = ["weight_decay", "train_frac", "lr"]
    from groklens.analyses.scaling import claims

    result = {**fit_scaling_law(recs, variables, censored=True), **claims(recs, variables)}
    fig = figure(recs, result, variables)
    phase = [ax for ax in fig.axes if ax.get_title().startswith("grokked within the cap")][0]
    labels = sorted(t.get_text() for t in phase.texts)
    # independently: per (weight decay, train_frac) cell, grokked / runs
    cell = lambda r: (r.values["weight_decay"], r.values["train_frac"])  # noqa: E731
    want = sorted(f"{sum(r.grok_step is not None for r in recs if cell(r) == c)}/3" for c in {cell(r) for r in recs})
    assert labels == want
    assert phase.get_xlabel() == "weight_decay" and phase.get_ylabel() == "train_frac"
    assert any(line.get_label().startswith("boundary") for line in phase.get_lines())
    panels = [ax.get_xlabel() for ax in fig.axes if ax.get_title().startswith("grokking step against")]
    assert panels == variables
