"""nanogpt-addition: the quick scale keeps its committed 2-digit runs and adds the 3-digit CPU
config; the paper scale is 3-digit at ~10M parameters; "halves" is read only where the baseline
shows a delay between memorization and generalization."""

from __future__ import annotations

from pathlib import Path

from groklens import experiments as E
from groklens.experiments.activation_norm import DELAY_RATIO
from groklens.experiments.ledger import Ledger, LedgerRun, config_hash, ledger_path
from groklens.experiments.pipeline import run_configs

NAME = "nanogpt-addition"


def test_the_quick_scale_keeps_its_committed_runs_and_adds_a_3_digit_model():
    exp = E.get_experiment(NAME)
    configs = {run: (variant, cfg) for variant, run, cfg in run_configs(exp, "quick", 3)}
    ledger = Ledger.load(ledger_path(E.LEDGER_DIR, NAME, "quick"), NAME, "quick")
    assert ledger.entries
    for e in ledger.entries:  # the committed 2-digit runs: same names, same hashes
        assert config_hash(configs[e["run"]][1].to_dict()) == e["config_hash"], e["run"]
    three = [cfg for variant, cfg in configs.values() if variant.startswith("d3_")]
    assert len(three) == 12 and {c.n_digits for c in three} == {3} and {c.act_norm_lambda for c in three} == {0.0, 0.1}
    assert all(c.causal and c.task == "digits_add" and c.digits_pairs == 10_000 for c in three)
    # 2,000 and 1,000 training pairs of the same sample: the second model differs only in train_frac
    fracs = {variant: cfg.train_frac for variant, cfg in configs.values() if variant.startswith("d3_")}
    assert fracs == {"d3_base": 0.2, "d3_actnorm": 0.2, "d3_1k_base": 0.1, "d3_1k_actnorm": 0.1}
    for seed in (1, 2, 3):
        a, b = configs[f"d3_base_s{seed}"][1].to_dict(), configs[f"d3_1k_base_s{seed}"][1].to_dict()
        assert {k for k in a if a[k] != b[k]} == {"train_frac"}


def test_the_paper_scale_is_3_digit_addition_at_about_10m_parameters():
    from groklens.tasks import TASKS
    from groklens.models import build_model

    cfgs = [cfg for _, _, cfg in run_configs(E.get_experiment(NAME), "paper", 1)]
    assert {c.n_digits for c in cfgs} == {3} and {c.digits_pairs for c in cfgs} == {0}
    small = cfgs[0].replace(digits_pairs=100)  # the same model on a small sample of the data
    model = build_model(small, TASKS.get(small.task).build(small))
    assert 10e6 < sum(p.numel() for p in model.parameters()) < 11e6


def _entry(arm: str, seed: int, mem: int, grok: int | None, cap: int = 6000) -> LedgerRun:
    return LedgerRun({"run": f"{arm}_s{seed}", "config": {}, "seed": seed, "last_step": grok + 50 if grok else cap,
                      "memorization_step": {"0.95": mem}, "grokking_step": {"0.95": grok},
                      "final": {"test_acc": 1.0 if grok else 0.5}, "measures": {}})


def _rows(base: list[tuple[int, int | None]], act: list[tuple[int, int | None]]) -> dict:
    exp = E.get_experiment(NAME)
    sc = exp.scales["quick"]
    arms = {"d3_base": [_entry("d3_base", i + 1, m, g) for i, (m, g) in enumerate(base)],
            "d3_actnorm": [_entry("d3_actnorm", i + 1, m, g) for i, (m, g) in enumerate(act)]}
    ctx = E.Context(NAME, "quick", sc, exp.plan(sc, "quick"), arms, Path("."))
    label = "nanoGPT on 3-digit addition (1.8M parameters, CPU)"  # the 2,000-pair model, not the 1,000-pair one
    return {r.measure.split(", nanoGPT on")[0]: r for r in exp.read(ctx) if r.measure.endswith(label)}


def test_halves_is_read_where_the_baseline_shows_a_delay():
    # memorized at 400, generalized at 1,500 (3.75x): a 2x faster penalty arm is "faster"
    rows = _rows([(400, 1500), (350, 1400), (450, 1700)], [(400, 750), (350, 700), (400, 800)])
    speed = rows["speed-up of the sqrt(d) penalty"]
    assert 1.9 < speed.ours < 2.2 and speed.verdict == "agrees" and speed.ratio is not None
    delay = rows["delay from memorization to generalization (steps to 95% test / train exact match), baseline"]
    assert delay.ours > DELAY_RATIO and "400->1,500" in delay.ours_text and "no delay" not in delay.ours_text


def test_without_a_delay_halves_cannot_be_tested_whatever_the_interval():
    # generalized with memorization (seed 2 within 2x): a 2x speed-up would have to speed up memorization
    rows = _rows([(400, 1500), (500, 600), (450, 1700)], [(100, 150), (100, 150), (120, 160)])
    speed = rows["speed-up of the sqrt(d) penalty"]
    assert speed.ours > 2 and speed.verdict.startswith("undetermined (cannot test 'halves': no delay to halve")
    assert "seed(s) 2," in speed.verdict
    delay = rows["delay from memorization to generalization (steps to 95% test / train exact match), baseline"]
    assert "500->600" in delay.ours_text and "no delay to halve" in delay.ours_text


def test_a_baseline_censored_after_memorizing_has_its_delay_as_a_lower_bound():
    rows = _rows([(400, None), (350, 1400), (450, 1700)], [(400, 750), (350, 700), (400, 800)])
    delay = rows["delay from memorization to generalization (steps to 95% test / train exact match), baseline"]
    assert delay.ours_text.startswith(">= ") and "400->>6,000" in delay.ours_text
    assert rows["speed-up of the sqrt(d) penalty"].bound == "lower"
