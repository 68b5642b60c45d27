"""Registration where the code lives: the @analysis decorator, the one rule for the default sets,
the measures each analysis declares, the figure families, the phase thresholds."""

from __future__ import annotations

import pytest

from groklens.analyses import registry as R
from groklens.analyses.measures import ANALYSES_USED, MEASURES
from groklens.analyses.report_figures import FIGURE_NAMES, MISSING_NAMES


def test_one_rule_gives_each_command_its_default_set():
    # analyze (and the demo's every-checkpoint set): the default tier
    assert R.default_names() == ["attention", "fourier", "grokking", "norms", "radial", "rank"]
    # report --analyze: the default tier among what the comparison shows
    assert R.default_names(ANALYSES_USED) == ["attention", "fourier", "radial", "rank"]
    # compare --analyze: the extended tier among what the comparison shows (sharpness too)
    assert R.default_names(ANALYSES_USED, tier="extended") == ["attention", "fourier", "radial", "rank", "sharpness"]
    # named only: never in any default set
    everything = set(R.default_names(tier="named"))
    assert everything == set(R.names())
    assert everything - set(R.default_names(tier="extended")) == {
        "freq_ablation", "induced_reg", "llc", "probe", "gradient_symmetricity", "distance_irrelevance", "clock_pizza",
        "hessian_density", "attention_gradient"}
    with pytest.raises(ValueError):
        R.default_names(tier="sometimes")


def test_the_measures_are_declared_by_their_analyses_in_column_order():
    assert [m.key for m in MEASURES] == ["fve_neuron", "fve_ls", "fve_ls_top5", "n_key_freqs", "attn_mass",
                                         "attn_min_mass", "attn_qk_grad", "attn_qk_share", "attn_struct_pull",
                                         "hessian_top", "hessian_trace", "eff_rank", "radius", "rho", "rho_baseline",
                                         "induced_anisotropy", "induced_data_dependence", "llc"]
    assert ANALYSES_USED == ("fourier", "attention", "attention_gradient", "sharpness", "rank", "radial", "induced_reg",
                             "llc")
    for m in MEASURES:
        assert m in R.get(m.analysis).measures
    assert [a.name for a in R.in_order()][:4] == ["fourier", "attention", "attention_gradient", "sharpness"]


def test_the_decorator_reads_the_parameters_from_the_signature_and_refuses_a_duplicate():
    a = R.get("grokking")
    assert a.defaults == {"thresholds": [0.95, 0.99], "grok_evals": 0} and a.kind == "run"
    assert R.get("llc").batch_func is not None and R.get("llc").batch_func.__name__ == "llc_many"
    with pytest.raises(ValueError, match="duplicate analysis name 'norms'"):
        R.analysis("norms", "again")(lambda model, data: {})
    with pytest.raises(ValueError, match="tier"):
        R.analysis("never", "bad tier", tier="often")


def test_the_figures_are_registered_by_their_families_in_page_order():
    assert FIGURE_NAMES == ("curves", "grokking_times", "fourier_fve", "fourier_spectrum", "neuron_clusters",
                            "fve_top5", "progress_measures", "attention", "attention_patterns", "hessian", "llc",
                            "effective_rank", "radial", "clock_pizza",
                            "hessian_density", "parameter_pca")
    assert MISSING_NAMES["Attention at the readout position"] == ("attention", "attention_patterns")
    assert {n for names in MISSING_NAMES.values() for n in names} == set(FIGURE_NAMES[2:])


def test_the_phase_thresholds_are_one_constant():
    from groklens.config import GROK_THRESHOLD, PHASE_THRESHOLDS, RunConfig
    from groklens.experiments import ledger
    from groklens.trainers import engine

    assert (GROK_THRESHOLD, PHASE_THRESHOLDS) == (0.95, (0.95, 0.99))
    assert RunConfig().grok_threshold == GROK_THRESHOLD and engine.PHASE_THRESHOLDS is PHASE_THRESHOLDS
    assert ledger.GROK_THRESHOLD == GROK_THRESHOLD and ledger.THRESHOLDS[-2:] == PHASE_THRESHOLDS
