"""The cost estimate (experiments/cost.py) against the committed paper ledgers.

Like with like: each ledger entry's wall time is compared with the estimate of the code path,
thread layout and steps that run had, and only where those are known:

- bounded-sphere, paper: the seeds trained with the table path and torch.compile, one thread per
  run, two runs on the two cores (commits ef16a2f and be16efe; their entries' device ends in
  ", compiled", no `cpu_s`), each to its own last step, against the compiled step timed here on
  one thread (`reproduce --list` times the eager one: the compiled step measured 0.84-0.93x of
  it, docs/PERFORMANCE.md; the compiling is the untimed warm-up). Older seeds ran the explicit
  path (before issue 31) while the machine was loaded 5-9 deep, some interrupted and resumed
  (their wall time counts the pause): not comparable, left out. Later compiled runs (lr 1e-4
  LayerNorm and RMSNorm) recorded `cpu_s`, and some were resumed across sessions: their CPU time
  against the estimate, the two-sided 2x.
- bounded-sphere, paper split: every run, each recorded `cpu_s` (the process's CPU time; the
  table path, eager, one thread, one or two at a time; 15 runs, then 25 with the sphere arms'
  seeds 6-10), each to its own last step: the two-sided 2x,
  CPU time against CPU time, so the machine's load when they trained does not enter.
- progress-measures, paper: seeds 2 and 3, trained after the lean path and before the table path
  (recorded in 7ff32f1, 09:15 UTC on 2026-12-02; the table path came at 17:42), to step 20,000:
  the estimate times the step with the table off (`Transformer.embedding_table = False`: the
  lean path those runs took). Seed 1 was interrupted and resumed (19,257 s): left out. They
  predate `cpu_s`, and their wall time (184 ms a step) counts the load they ran beside: the
  estimate came to 0.50x of it here and 0.49x on CI's machine, so, as for llc-grokking, what
  holds is the bound (the estimate at most 2x the wall time).
- activation-norm and geomdr, paper: the runs trained with float32 subnormals flushed (device ends
  in ", subnormals flushed"; each recorded `cpu_s`): CPU time against the estimate, the two-sided 2x.
- llc-grokking, paper: its eight seeds were trained to their cap of 25,000 steps before the MLP's
  first layer came from its table (2026-12-07, a faster step: the bound below only gets looser),
  and their wall times
  (194-1,972 s, 8,977 s in all) are the machine's load, not the step: one thread of this MLP
  takes about 1 ms of CPU a step, and on this machine under load 5 a niced one-thread run measured
  15.8 ms of wall per step at 1.45 ms of CPU (two threads: 217 ms wall, 41 ms CPU, their OpenMP
  threads spinning). These entries predate `cpu_s`, so the CPU time to compare is not recorded;
  what holds for them is the bound: a one-thread run's CPU time is at most its wall time, so the
  estimate of every run is at most 2x its wall time (the two-sided 2x fails, at 0.02-0.05).

The figure compared is the sum over the compared runs of a ledger, so one run slowed by the
machine's load when it trained does not decide it; the tolerance is the issue's 2x. The estimate
is measured by process CPU time on one thread, which other processes' time slices do not count,
as the fastest of up to 10 steps (more than `--list` times: on a machine whose other processes
share the caches and memory, the CPU time of a step still grew 1.5-1.8x, measured at load 4-5
on this project's 2 cores, and the fastest step is the least disturbed one); it runs real
steps and compiles three models, hence `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEDGERS = ROOT / "docs" / "results"


def _entries(name: str) -> list[dict]:
    return json.loads((LEDGERS / f"{name}.paper.json").read_text())["runs"]


_RATES: dict[tuple, object] = {}


def _estimate(entries: list[dict], **measure_kw) -> float:
    """The CPU seconds of these runs, each to its last step, at the step cost timed here on one
    thread of the config it ran (compile=true where it was compiled)."""
    from groklens.config import RunConfig
    from groklens.experiments.cost import cost_key, measure_rates, run_seconds

    total = 0.0
    for e in entries:
        cfg = RunConfig.from_dict(e["config"])
        key = (cost_key(cfg), cfg.compile, tuple(sorted(measure_kw.items())))
        if key not in _RATES:
            _RATES[key] = measure_rates(cfg, steps=10, budget_s=2.0, **measure_kw)
        total += run_seconds(cfg, _RATES[key], e["last_step"])
    return total


def _ratio(entries: list[dict], **measure_kw) -> float:
    return _estimate(entries, **measure_kw) / sum(e["wall_s"] for e in entries)


def _cpu_ratio(entries: list[dict]) -> float:
    """The estimate against the runs' recorded CPU time (`cpu_s`): the machine's load does not enter."""
    return _estimate(entries) / sum(e["cpu_s"] for e in entries)


@pytest.mark.slow
def test_bounded_sphere_compiled_seeds():
    arms: dict[str, list[dict]] = {}
    for e in _entries("bounded-sphere"):
        if e["device"].endswith(", compiled") and "cpu_s" not in e:
            arms.setdefault(e["arm"], []).append(e)
    assert len(arms) == 6 and sum(map(len, arms.values())) == 35
    r = _ratio([e for runs in arms.values() for e in runs])
    assert 0.5 <= r <= 2.0, r


@pytest.mark.slow
def test_bounded_sphere_compiled_cpu_time():
    # Compiled runs that recorded cpu_s: some were paused and resumed across sessions (their wall
    # time counts the pause), so CPU time against CPU time.
    runs = [e for e in _entries("bounded-sphere")
            if e["device"].endswith(", compiled") and e.get("cpu_s")]
    assert len(runs) >= 4
    r = _cpu_ratio(runs)
    assert 0.5 <= r <= 2.0, r


@pytest.mark.slow
def test_bounded_sphere_paper_split_cpu_time():
    runs = [e for e in _entries("bounded-sphere") if "papersplit" in e["arm"]]
    assert len(runs) >= 15 and all(e.get("cpu_s") for e in runs)
    assert not any(e["config"].get("compile") for e in runs)
    r = _cpu_ratio(runs)
    assert 0.5 <= r <= 2.0, r


@pytest.mark.slow
def test_progress_measures_lean_path_seeds_bounded_by_wall():
    runs = [e for e in _entries("progress-measures") if e["seed"] in (2, 3)]
    assert _ratio(runs, table=False) <= 2.0


@pytest.mark.slow
def test_llc_grokking_estimate_bounded_by_each_runs_wall():
    runs = _entries("llc-grokking")
    assert {e["last_step"] for e in runs} == {25_000}
    ratios = [_estimate([e]) / e["wall_s"] for e in runs]
    assert all(r <= 2.0 for r in ratios), ratios


@pytest.mark.slow
def test_runs_with_subnormals_flushed_cpu_time():
    """Runs trained with float32 subnormals flushed (their device says so, 2026-12-07): the step
    no longer slows after memorization, so the estimate from the first steps holds over the whole
    run. Measured when added: activation-norm tf_base 1.05, lambda 0.01 0.86, geomdr MLP baselines
    0.86-0.91; CPU time against CPU time, the two-sided 2x, per experiment."""
    for name in ("activation-norm", "geomdr"):
        runs = [e for e in _entries(name) if e["device"].endswith("subnormals flushed") and e.get("cpu_s")]
        assert len(runs) >= 2, name
        r = _cpu_ratio(runs)
        assert 0.5 <= r <= 2.0, (name, r)
