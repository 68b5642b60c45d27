"""Registration where the code lives: the @analysis decorator, the one rule for the default sets,
the measures each analysis declares, the figure families, the phase thresholds."""

from __future__ import annotations

import pytest

from groklens.analyses import registry as R
from groklens.analyses.measures import ANALYSES_USED, MEASURES
from groklens.analyses.report_figures import FIGURE_NAMES, MISSING_NAMES


def test_one_rule_gives_each_command_its_default_set():
    """Each default set is every analysis at that tier or a cheaper one (TIERS), computed here from
    each analysis's declared tier; `among` keeps only what the caller can use."""
    tier_of = {name: R.TIERS.index(R.get(name).tier) for name in R.names()}
    for upto, tier in enumerate(R.TIERS):
        assert R.default_names(tier=tier) == sorted(n for n, t in tier_of.items() if t <= upto)
        assert R.default_names(ANALYSES_USED, tier=tier) == sorted(
            n for n, t in tier_of.items() if t <= upto and n in ANALYSES_USED)
    assert set(R.default_names(tier="named")) == set(R.names())  # named: every analysis
    # the commands' sets are not empty, and the cheap first look is among them
    assert "fourier" in R.default_names() and "sharpness" in set(R.default_names(tier="extended")) - set(
        R.default_names())
    with pytest.raises(ValueError):
        R.default_names(tier="sometimes")


def test_the_measures_are_declared_by_their_analyses_in_column_order():
    """The comparison's columns are the measures each analysis declares, in the analyses' declared
    order (then module, then registration), and ANALYSES_USED the analyses that have columns."""
    ordered = R.in_order()
    assert [(a.order, a.func.__module__) for a in ordered] == sorted((a.order, a.func.__module__) for a in ordered)
    assert MEASURES == tuple(m for a in ordered for m in a.measures)
    assert ANALYSES_USED == tuple(a.name for a in ordered if a.measures)
    assert len({m.key for m in MEASURES}) == len(MEASURES)  # one column per key
    for m in MEASURES:
        assert m in R.get(m.analysis).measures


def test_every_builtin_analysis_module_is_found_by_its_decorator_and_registers():
    """The one rule for groklens' own analyses: the modules with a top-level @analysis(...) are
    imported, and every analysis of groklens.analyses comes from one of them."""
    found = set(R.BUILTIN_MODULES)
    registered = {a.func.__module__.rpartition(".")[2] for a in R.in_order()
                  if a.func.__module__.startswith("groklens.analyses.")}
    assert found == registered and {"fourier", "attention"} <= found


def test_the_decorator_reads_the_parameters_from_the_signature_and_refuses_a_duplicate():
    a = R.get("grokking")
    assert a.defaults == {"thresholds": [0.95, 0.99], "grok_evals": 0} and a.kind == "run"
    assert R.get("llc").batch_func is not None and R.get("llc").batch_func.__name__ == "llc_many"
    with pytest.raises(ValueError, match="duplicate analysis name 'norms'"):
        R.analysis("norms", "again")(lambda model, data: {})
    with pytest.raises(ValueError, match="tier"):
        R.analysis("never", "bad tier", tier="often")


def test_the_figures_are_registered_by_their_families_in_page_order():
    """Each figure name once; each section a report may miss names only registered figures, and
    every figure but the two always drawn (the curves, the grokking times) belongs to one."""
    assert len(set(FIGURE_NAMES)) == len(FIGURE_NAMES)
    assert FIGURE_NAMES[:2] == ("curves", "grokking_times")
    assert MISSING_NAMES["Attention at the readout position"] == ("attention", "attention_patterns")
    assert {n for names in MISSING_NAMES.values() for n in names} == set(FIGURE_NAMES[2:])


def test_the_phase_thresholds_are_one_constant():
    from groklens.config import GROK_THRESHOLD, PHASE_THRESHOLDS, RunConfig
    from groklens.experiments import ledger
    from groklens.trainers import engine

    assert (GROK_THRESHOLD, PHASE_THRESHOLDS) == (0.95, (0.95, 0.99))
    assert RunConfig().grok_threshold == GROK_THRESHOLD and engine.PHASE_THRESHOLDS is PHASE_THRESHOLDS
    assert ledger.GROK_THRESHOLD == GROK_THRESHOLD and ledger.THRESHOLDS[-2:] == PHASE_THRESHOLDS
