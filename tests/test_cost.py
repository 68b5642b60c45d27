"""The cost model of `reproduce --list` (experiments/cost.py) without timing anything:
the expected stop, what shares a measurement, the rate cache and the FLOP-model fallback."""

from __future__ import annotations

import json

import pytest

from groklens.config import RunConfig
from groklens.experiments import cost
from groklens.experiments.cost import EXPECTED_MARGIN, RateCache, Rates, cost_key, expected_stop, rates_for
from tests.helpers import tiny_config


def test_expected_stop_prefers_the_ledger_then_the_expectation_then_the_cap():
    cfg = tiny_config(steps=10_000, eval_every=100, stop_after_grok=2)
    assert expected_stop(cfg, 1_000, [3_000, 4_000]) == (3_500, "ledger")  # their mean last step
    assert expected_stop(cfg, 1_000, []) == (EXPECTED_MARGIN * 1_000 + 200, "expected")  # + 2 evaluations
    assert expected_stop(cfg, None, []) == (10_000, "cap")
    assert expected_stop(cfg, 9_000, []) == (10_000, "expected")  # never past the cap
    assert expected_stop(cfg, 1_000, [50_000]) == (10_000, "ledger")
    # a run that does not stop after grokking trains to its cap whatever is expected
    assert expected_stop(cfg.replace(stop_after_grok=0), 1_000, []) == (10_000, "cap")
    # not before stop_min_steps; on the evaluation grid
    assert expected_stop(cfg.replace(stop_min_steps=6_000), 1_000, []) == (6_000, "expected")
    assert expected_stop(cfg, 1_234, [])[0] % 100 == 0


def test_scales_state_their_expected_grokking_step_per_variant():
    from groklens.experiments import EXPERIMENTS, SPHERE_TABLE

    sc = EXPERIMENTS.get("bounded-sphere").scales["paper"]
    assert sc.expected_grok("ln_lr6e-4") == SPHERE_TABLE[(6e-4, "ln")]
    assert sc.expected_grok("sphere_wd0_tlinit_lr6e-4") is None  # ours: not in the paper, the cap
    assert EXPERIMENTS.get("grokfast").scales["paper"].expected_grok("grokfast") == 910
    assert EXPERIMENTS.get("s5-control").scales["paper"].expected_grok("ln") is None


def test_runs_cost_to_their_expected_stop_with_the_cap_beside():
    from groklens.experiments.cost import cost_runs

    cfg = tiny_config(steps=10_000, eval_every=100, stop_after_grok=2)
    rates = {cost_key(cfg): Rates(0.01, 0.5, "measured")}
    (c,) = cost_runs([("base", cfg)], lambda v: 1_000, {}, rates)
    assert c.stop == 2_200 and c.stop_basis == "expected" and c.rate_basis == "measured"
    assert c.expected_s == pytest.approx(2_200 * 0.01 + 23 * 0.5)
    assert c.cap_s == pytest.approx(10_000 * 0.01 + 101 * 0.5)


def test_configs_that_differ_in_no_step_work_share_one_measurement():
    a = tiny_config()
    same = a.replace(seed=7, data_seed=3, lr=1e-2, weight_decay=0.0, steps=99, eval_every=3, stop_after_grok=5,
                     device="auto", init_scheme="torch")
    assert cost_key(a) == cost_key(same)
    assert cost_key(a) != cost_key(a.replace(d_model=32))
    assert cost_key(a) != cost_key(a.replace(batch_size=8))


class _Timer:
    def __init__(self):
        self.calls = 0

    def __call__(self, cfg):
        self.calls += 1
        return Rates(0.002, 0.01, "measured")


CTX = {"cpu": "test cpu", "cores": 2, "torch": "2.0", "code": "x"}


def test_the_cache_serves_a_second_listing_without_timing(tmp_path):
    path, timer = tmp_path / "c" / "costs.json", _Timer()
    cfgs = [tiny_config(seed=s) for s in (1, 2)] + [tiny_config(d_model=32)]
    first = rates_for(cfgs, cache=RateCache(path, CTX), timer=timer)
    assert timer.calls == 2 and path.exists()  # two distinct steps
    again = rates_for(cfgs, cache=RateCache(path, CTX), timer=timer)
    assert timer.calls == 2 and again == first
    # another torch (or machine, or trainer code): measured again, the first context's rates kept
    rates_for(cfgs, cache=RateCache(path, {**CTX, "torch": "2.1"}), timer=timer)
    assert timer.calls == 4
    rates_for(cfgs, cache=RateCache(path, CTX), timer=timer)
    assert timer.calls == 4


@pytest.mark.parametrize("text", ["{not json", "[]", json.dumps({"format": 99, "contexts": {}}),
                                  json.dumps({"format": 1, "contexts": {"k": {"rates": {"a": "b"}}}}), "\xff\xfe"])
def test_a_corrupt_cache_is_no_cache(tmp_path, text):
    path, timer = tmp_path / "costs.json", _Timer()
    path.write_text(text, errors="surrogateescape") if text.isascii() else path.write_bytes(b"\xff\xfe\x00")
    rates_for([tiny_config()], cache=RateCache(path, CTX), timer=timer)
    assert timer.calls == 1
    rates_for([tiny_config()], cache=RateCache(path, CTX), timer=timer)  # rewritten whole
    assert timer.calls == 1


def test_malformed_cached_rates_are_measured_again(tmp_path):
    path, timer = tmp_path / "costs.json", _Timer()
    cache = RateCache(path, CTX)
    rates_for([tiny_config()], cache=cache, timer=timer)
    data = json.loads(path.read_text())
    for entry in next(iter(data["contexts"].values()))["rates"].values():
        entry["step_s"] = -1
    path.write_text(json.dumps(data))
    rates_for([tiny_config()], cache=RateCache(path, CTX), timer=timer)
    assert timer.calls == 2


def test_an_unwritable_cache_is_skipped(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    timer = _Timer()
    out = rates_for([tiny_config()], cache=RateCache(blocker / "sub" / "costs.json", CTX), timer=timer)
    assert timer.calls == 1 and next(iter(out.values())).basis == "measured"


def test_the_cache_lives_under_the_users_cache_dir_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(cost.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cost.cache_path() == tmp_path / "xdg" / "groklens" / cost.CACHE_NAME
    monkeypatch.setenv(cost.CACHE_ENV, str(tmp_path / "mine"))
    assert cost.cache_path() == tmp_path / "mine" / cost.CACHE_NAME


def test_no_measure_and_gpu_runs_take_the_flop_model(tmp_path):
    timer = _Timer()
    cache = RateCache(tmp_path / "costs.json", CTX)
    (r,) = rates_for([tiny_config()], measure=False, cache=cache, timer=timer).values()
    assert r.basis == "flop model" and timer.calls == 0
    (r,) = rates_for([tiny_config(device="cuda")], cache=cache, timer=timer).values()
    assert r.basis == "flop model" and timer.calls == 0
    train_f, eval_f = cost.step_flops(RunConfig())
    assert cost.flop_rates(RunConfig()).step_s == pytest.approx(cost.STEP_OVERHEAD_S + train_f / cost.CPU_FLOPS)
    assert cost.flop_rates(RunConfig()).eval_s == pytest.approx(cost.STEP_OVERHEAD_S + eval_f / cost.CPU_FLOPS)


def test_the_context_names_machine_torch_and_code():
    ctx = cost.context()
    assert {"cpu", "cores", "torch", "code"} <= set(ctx) and ctx["code"].count("+") == 1


def test_measure_rates_times_a_real_step():
    r = cost.measure_rates(tiny_config())
    assert r.basis == "measured" and r.step_s > 0 and r.eval_s > 0


def test_reproduce_states_its_estimate_before_training():
    from types import SimpleNamespace

    from groklens.experiments import EXPERIMENTS
    from groklens.experiments.pipeline import estimate_text, run_configs

    exp = EXPERIMENTS.get("grokfast")
    todo = [SimpleNamespace(variant=v, cfg=c) for v, _, c in run_configs(exp, "paper", 1)]
    text = estimate_text(exp, "paper", todo, [], measure=False)
    assert text.startswith("cost estimate: ") and "3 run(s)" in text  # baseline, Grokfast-EMA, Grokfast-MA
    assert f"3 to {EXPECTED_MARGIN:g}x the expected grokking step" in text and "the FLOP model" in text
    ledger = [{"arm": "base", "last_step": 100}]
    assert "1 to the ledger runs of their arm" in estimate_text(exp, "paper", todo, ledger, measure=False)
