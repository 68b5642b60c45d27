"""reproduce clock-pizza: its scales are valid configs (the paper scale their setup), a run's values
are the analysis' at the last checkpoint, and the label rows' verdicts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from groklens import experiments as E
from groklens.analyses.clock_pizza import algorithm_label
from groklens.config import config_from
from groklens.experiments import clock_pizza as CP
from groklens.experiments.core import Context, Plan
from tests.helpers import train_tiny


def test_every_scale_is_a_valid_config_and_the_paper_scale_is_theirs():
    exp = E.EXPERIMENTS.get("clock-pizza")
    for sc in exp.scales.values():
        for over in CP.VARIANTS.values():
            config_from(None, overrides={**sc.base, **over}).validate()
    paper = config_from(None, overrides=exp.scales["paper"].base)
    # code/save/config_p99zdpze5l.json and train-main.py
    assert (paper.p, paper.train_frac, paper.d_model, paper.n_heads, paper.d_mlp, paper.lr, paper.weight_decay,
            paper.steps, paper.warmup_steps, paper.batch_size, paper.norm) == (59, 0.8, 128, 4, 512, 1e-3, 2.0,
                                                                                20_000, 10, 0, "none")
    assert CP.VARIANTS["uniform"]["attention"] == "uniform" and CP.VARIANTS["learned"]["attention"] == "softmax"


def test_run_values_are_the_last_checkpoints(tmp_path):
    path = tmp_path / "run.h5"
    train_tiny(path, attention="uniform", steps=60)
    vals = CP._run_values(path, None)
    assert vals["label"] == algorithm_label(vals["gradient_symmetricity"], vals["distance_irrelevance"])
    assert set(vals) == {"gradient_symmetricity", "distance_irrelevance", "label", "clock_from_step",
                         "pizza_from_step"}


def _ctx(labels, censored=False):
    runs = [SimpleNamespace(seed=i + 1, grok_censored=censored, run_values={"label": lbl, "gradient_symmetricity": 0.5,
                                                                           "distance_irrelevance": 0.9})
            for i, lbl in enumerate(labels)]
    sc = E.EXPERIMENTS.get("clock-pizza").scales["smoke"]
    return Context("clock-pizza", "smoke", sc, Plan(CP.VARIANTS, None, sc.base), {"learned": runs}, None)


@pytest.mark.parametrize("labels, censored, verdict", [
    (["clock", "clock"], False, "agrees"), (["pizza", "neither"], False, "disagrees"),
    (["clock", "pizza"], False, "undetermined (1 of 2 seeds)"),
    (["clock"], True, "undetermined (1 of 1 seeds did not grok)")])
def test_label_verdicts(labels, censored, verdict):
    assert CP._label_row(_ctx(labels, censored), "learned").verdict == verdict


def test_mean_rows_read_the_run_values():
    row = CP._mean_row(_ctx(["clock", "clock"]), "learned", "gradient_symmetricity", "gradient symmetricity")
    assert row.ours == pytest.approx(0.5) and row.published.value == 0.483
