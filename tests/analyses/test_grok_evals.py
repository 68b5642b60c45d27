"""One definition of grokked: the first of grok_evals consecutive evaluations with test accuracy
>= threshold, used by the stop rule, info, compare and the ledger; the first crossing is kept
apart (issue 43)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from groklens.analyses.compare import compare
from groklens.analyses.grokking import collapse, collapse_text, grokked_at, grokking_times
from groklens.checkpoints import Trajectory
from groklens.config import first_sustained
from groklens.trainers.engine import Member, _count_stop_event, restore_counters
from tests.helpers import groklens, tiny_config, train_tiny

# a crossing at step 20 that a loss spike undoes, then three evaluations in a row from step 50
STEPS = np.arange(0, 100, 10)
SPIKED = np.array([0.0, 0.2, 0.96, 0.5, 0.6, 0.96, 0.97, 0.98, 0.99, 0.99])


def test_a_crossing_that_falls_back_is_not_grokking():
    metrics = {"step": STEPS, "test_acc": SPIKED, "train_acc": np.ones(10)}
    t = grokking_times(metrics, (0.95,), evals=3)
    assert t["grokking_step"]["0.95"] == 50 and t["first_crossing"]["0.95"] == 20
    assert grokking_times(metrics, (0.95,), evals=1)["grokking_step"]["0.95"] == 20  # the legacy reading
    assert grokked_at(STEPS, SPIKED, 0.95, 5) == 50
    assert grokked_at(STEPS, SPIKED, 0.95, 6) is None  # never 6 in a row: censored
    assert first_sustained([True, False, True, True], 2) == 2 and first_sustained([], 1) is None


@pytest.mark.parametrize("tail, collapsed_at", [
    # grokked at 50 (3 in a row), then the run's last evaluations:
    ([0.99, 0.99], {1: False, 3: False}),  # stayed
    ([0.99, 0.6], {1: True, 3: False}),  # ends inside a 1-evaluation dip: collapsed only at grok_evals 1
    ([0.6, 0.99], {1: False, 3: False}),  # dipped and recovered
    ([0.6, 0.5, 0.4], {1: True, 3: True}),  # 3 below at the end: collapsed either way
    ([0.6, 0.5, 0.99, 0.6, 0.5], {1: True, 3: False}),  # the last 3 are not all below
])
def test_a_collapse_must_last_as_long_as_grokking_did(tail, collapsed_at):
    acc = np.array([*SPIKED[:8], *tail])
    steps = np.arange(0, 10 * len(acc), 10)
    for evals, want in collapsed_at.items():
        c = collapse({"step": steps, "test_acc": acc}, 0.95, evals=evals)
        assert c["collapsed"] is want, (tail, evals)
        assert c["crossed"] == 20 and c["final_test_acc"] == acc[-1]
        assert c["grokked"] == grokked_at(steps, acc, 0.95, evals) and c["ended_below"] == bool(acc[-1] < 0.95)
        text = collapse_text(c)
        assert ("collapsed" in text) is want
        assert ("ends inside a dip" in text) == bool(not want and acc[-1] < 0.95)
    # a first crossing that falls back for good is not a collapse at grok_evals 3: it never grokked
    never = collapse({"step": STEPS[:5], "test_acc": SPIKED[:5]}, 0.95, evals=3)
    assert never["crossed"] == 20 and never["grokked"] is None and not never["collapsed"]
    assert "never held it long enough to grok" in collapse_text(never)
    assert collapse({"step": STEPS[:5], "test_acc": SPIKED[:5]}, 0.95)["collapsed"]  # the legacy reading


def test_the_stop_counter_fed_row_by_row_equals_the_one_restored_from_rows():
    """A resume rebuilds the stop rule's counters from the stored rows; at every prefix of the
    spiked series they equal those of the loop that saw the rows one by one."""
    cfg = tiny_config(grok_threshold=0.95, grok_evals=3)
    live = Member(cfg, None, None)
    for n in range(1, len(SPIKED) + 1):
        _count_stop_event(live, bool(SPIKED[n - 1] >= 0.95))
        restored = Member(cfg, None, None)
        restore_counters(restored, {"step": STEPS[:n], "test_acc": SPIKED[:n], "train_acc": np.ones(n)})
        assert (restored.evals_after_grok, restored.event_streak) == (live.evals_after_grok, live.event_streak)
    assert live.evals_after_grok == 4  # grokked at index 5 (step 50), 4 evaluations before the last


def test_a_real_run_that_crosses_at_chance_and_falls_back(tmp_path):
    """Test accuracy 0.098 at step 0 crosses 0.05, falls below, and stays above from step 110 on
    (measured on CPU): info, train's line, compare and the stop rule all say step 110, and name
    the first crossing apart."""
    path = tmp_path / "g.h5"
    cfg = dict(steps=2000, eval_every=10, checkpoint_every=1000, grok_threshold=0.05, stop_after_grok=2)
    train_tiny(path, **cfg)
    run = Trajectory(path)
    acc, steps = run.metrics["test_acc"], run.metrics["step"]
    above = acc >= 0.05
    want = int(steps[next(i for i in range(len(above) - 2) if above[i] and above[i + 1] and above[i + 2])])
    first = int(steps[np.argmax(above)])
    assert first < want  # the run does fall back after its first crossing
    assert want in [int(s) for s in run.steps]  # the crossing that started grokking has its checkpoint
    assert int(steps[-1]) == want + 2 * 10  # stopped 2 evaluations after grokking
    info = json.loads(groklens("info", str(path), "--json", check=True).stdout)
    assert info["grokking_step"]["0.05"] == want and info["first_crossing"]["0.05"] == first
    assert info["grok_evals"] == 3
    text = groklens("info", str(path), check=True).stdout
    assert f"grokked step {want} (first crossing at step {first})" in text
    assert "the first of 3 consecutive evaluations" in text
    comp = compare([path], threshold=0.05)
    row = comp.rows()[0]
    assert row["grokking_step"]["values"] == [want] and row["grokking_step"]["first_crossing"] == [first]
    assert any(f"first crossed 0.05 at step {first}" in n for n in comp.notes)
    # the same file read at the legacy N=1 (a file from before grok_evals) groks at its first crossing
    legacy = tiny_config(**cfg, grok_evals=1)
    train_tiny(tmp_path / "legacy.h5", **legacy.to_dict())
    assert compare([tmp_path / "legacy.h5"], threshold=0.05).rows()[0]["grokking_step"]["values"] == [first]
