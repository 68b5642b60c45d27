"""scaling-law on a variable with few levels: a warning under 3, and with one variable a second
panel that plots the grokking step against it (not a phase diagram with a meaningless y axis)."""

from __future__ import annotations

import numpy as np

from groklens.analyses.scaling import GrokRecord, figure, fit_scaling_law, format_result


def _records(levels, seeds=3):
    rng = np.random.default_rng(0)
    out = []
    for v in levels:
        for s in range(seeds):
            out.append(GrokRecord(f"wd{v}_s{s}", {"weight_decay": v},
                                  float(1000 * v ** -0.6 * np.exp(rng.normal(0, 0.1))),
                                  5000))
    out.append(GrokRecord("cens", {"weight_decay": levels[0]}, None, 5000))
    return out


def test_two_levels_warn_and_three_do_not():
    two = fit_scaling_law(_records([0.3, 1.0]), ["weight_decay"])
    assert len(two["warnings"]) == 1 and "weight_decay has only 2 levels (0.3, 1)" in two["warnings"][0]
    lines = format_result({**two, "threshold": 0.95})
    assert any(line.startswith("warning  weight_decay has only 2 levels") for line in lines)
    assert fit_scaling_law(_records([0.3, 1.0, 3.0]), ["weight_decay"])["warnings"] == []


def test_one_variable_draws_the_grokking_step_against_it():
    records = _records([0.3, 1.0])
    result = fit_scaling_law(records, ["weight_decay"])
    fig = figure(records, result, ["weight_decay"], None)
    panel = fig.axes[1]
    assert panel.get_ylabel() == "grokking step" and panel.get_xlabel() == "weight_decay"
    assert panel.get_yscale() == "log" and panel.get_xscale() == "log"
    points = np.concatenate([c.get_offsets() for c in panel.collections])
    # independently: every run at (its weight decay, its grokking step, or its last step when censored)
    want = sorted((r.values["weight_decay"], r.grok_step if r.grok_step is not None else r.last_step) for r in records)
    assert sorted(map(tuple, points.tolist())) == sorted(map(lambda t: tuple(map(float, t)), want))
