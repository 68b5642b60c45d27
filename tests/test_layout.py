"""`reproduce`'s training layout (experiments/layout.py): one run per core or one run on
all cores, chosen from step times. The choice is checked on given step times against makespans
worked out by hand; the measurement only for what it returns, never for how long it took."""

from __future__ import annotations

import pytest
import torch

from groklens.experiments.layout import Layout, candidates, choose_layout, measure_step_seconds, plan_layout
from tests.helpers import tiny_config


def test_candidates_are_divisions_of_the_cores():
    assert candidates(1, 2) == [(1, 1), (1, 2)]
    assert candidates(5, 2) == [(1, 1), (1, 2), (2, 1)]
    assert candidates(3, 8) == [(1, 1), (1, 8), (2, 1), (2, 4), (3, 1), (3, 2)]


@pytest.mark.parametrize("n_runs, t2, expected", [
    (1, 0.6, (1, 2)),  # one run: 0.6 on both cores beats 1.0 on one
    (1, 1.2, (1, 1)),  # threads that slow the step down (a loaded machine): one thread
    (2, 0.6, (2, 1)),  # per core ceil(2/2) x 1.0 = 1.0 < all cores 2 x 0.6 = 1.2
    (3, 0.6, (1, 2)),  # per core ceil(3/2) x 1.0 = 2.0 > all cores 3 x 0.6 = 1.8
    (3, 0.7, (2, 1)),  # per core 2.0 < all cores 3 x 0.7 = 2.1
    (2, 0.5, (2, 1)),  # a tie (1.0 either way): more workers
    (1, 1.0, (1, 1)),  # a tie of one run: fewer threads
])
def test_the_shorter_makespan_wins(n_runs, t2, expected):
    layout = choose_layout(n_runs, 2, {1: 1.0, 2: t2})
    assert (layout.workers, layout.threads) == expected
    assert f"{n_runs} run(s) on 2 core(s)" in layout.why


def test_four_cores_can_split_in_between():
    # 2 runs on 4 cores: per core 1 x 1.0; all cores 2 x 0.45 = 0.9; two workers of 2 threads 1 x 0.6
    layout = choose_layout(2, 4, {1: 1.0, 2: 0.6, 4: 0.45})
    assert (layout.workers, layout.threads) == (2, 2)
    assert "2 runs at a time" in layout.why


def test_bad_counts_are_refused():
    with pytest.raises(ValueError):
        choose_layout(0, 2, {1: 1.0})


def test_plan_measures_the_costliest_config_on_each_thread_count():
    small, big = tiny_config(), tiny_config(d_model=64, d_mlp=256, d_head=32)
    seen = []

    def fake(cfg, threads):
        seen.append((cfg.d_model, threads))
        return {1: 1.0, 2: 0.4}[threads]

    layout = plan_layout([small, big, small], cores=2, measure=fake)
    assert sorted(seen) == [(64, 1), (64, 2)]
    assert layout == choose_layout(3, 2, {1: 1.0, 2: 0.4})  # 3 x 0.4 = 1.2 < ceil(3/2) x 1.0 = 2.0
    assert (layout.workers, layout.threads) == (1, 2)


def test_one_core_measures_nothing():
    def fail(cfg, threads):
        raise AssertionError("measured")

    assert plan_layout([tiny_config()] * 3, cores=1, measure=fail) == Layout(
        1, 1, "one run per core (1 worker(s) x 1 thread)")
    assert plan_layout([], cores=4, measure=fail).why == "nothing to train"


def test_the_measurement_is_a_real_step_and_restores_the_threads():
    before = torch.get_num_threads()
    seconds = measure_step_seconds(tiny_config(), threads=1, steps=2)
    assert seconds > 0
    assert torch.get_num_threads() == before
