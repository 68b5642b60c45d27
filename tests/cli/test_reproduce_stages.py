"""`reproduce` trains a study in stages (--arms) and groups its runs into batched ensembles where
that pays (layout.ensemble_rule): an arm's seeds or a grid's cell of learning rates and weight
decays on a GPU or a short CPU step; a compute-bound CPU step trains alone."""

from __future__ import annotations

import json

import pytest

from groklens import experiments as E
from groklens.config import RunConfig
from groklens.experiments.layout import ENSEMBLE_CPU_MAX_STEP_S, ensemble_rule
from groklens.sweeps import RunSpec
from groklens.sweeps.tasks import plan_tasks


@pytest.mark.slow
def test_arms_trains_only_the_matching_arms_and_the_rows_read_every_arm(tmp_path):
    out, led = tmp_path / "g", tmp_path / "led"
    quiet = dict(ledger_dir=led, progress=False, echo=lambda _m: None)
    first = E.reproduce("geomdr", "smoke", out, arms=["base"], **quiet)
    assert first.trained == 1
    assert any(n.startswith("not trained (outside --arms): 2 run(s) of 2 arm(s)") for n in first.notes)
    rows = {r.measure: r for r in first.rows}
    assert rows["speed-up of GeomDR (geomdr_t4_always) over AdamW"].ours_text.startswith("n/a (no runs)")
    second = E.reproduce("geomdr", "smoke", out, arms=["geomdr_*"], **quiet)
    assert second.trained == 2 and not any("outside --arms" in n for n in second.notes)
    entries = json.loads((led / "geomdr.smoke.json").read_text())["runs"]
    assert sorted(e["arm"] for e in entries) == ["base", "geomdr_t4_always", "geomdr_t4_early"]
    assert E.reproduce("geomdr", "smoke", out, **quiet).trained == 0  # every arm held


@pytest.mark.slow
def test_reproduce_trains_a_grid_as_ensembles_of_its_cells(tmp_path):
    """The smoke grid of the scaling law: 2 widths x 2 data x 2 learning rates; the runs of one
    (width, data) cell differ only in per-member fields and train as one ensemble."""
    res = E.reproduce("scaling-law", "smoke", tmp_path / "s", ledger_dir=tmp_path / "led", progress=False,
                      echo=lambda _m: None)
    assert res.trained == 8
    assert "trained 8 run(s) in 4 batched ensemble(s), 0 alone" in res.notes


def _cfg(**kw) -> RunConfig:
    return RunConfig.from_dict({"model": "mlp", "n_layers": 2, "p": 11, "steps": 50, "eval_every": 10,
                                "checkpoint_every": 10, "device": "cpu", **kw})


def test_the_ensemble_rule_keeps_compute_bound_cpu_steps_alone(tmp_path):
    runs = [RunSpec(f"h{h}_lr{lr}", _cfg(d_mlp=h, lr=lr)) for h in (16, 512) for lr in (1e-3, 3e-3, 1e-2)]
    step = {16: ENSEMBLE_CPU_MAX_STEP_S / 3, 512: ENSEMBLE_CPU_MAX_STEP_S * 3}
    rule = ensemble_rule(lambda cfg: step[cfg.d_mlp])
    tasks, alone = plan_tasks(runs, tmp_path, ensemble=rule, ensemble_size=64, workers=1, threads=1)
    ens = [t for t in tasks if t["ensemble"]]
    assert len(ens) == 1 and sorted(m["name"] for m in ens[0]["runs"]) == ["h16_lr0.001", "h16_lr0.003", "h16_lr0.01"]
    assert sorted(alone) == ["h512_lr0.001", "h512_lr0.003", "h512_lr0.01"]
    assert all("compute-bound" in why for why in alone.values())
    # not timed (the FLOP model), or on a GPU: every run may join
    assert ensemble_rule(lambda cfg: None)(_cfg(d_mlp=512)) is None
    assert ensemble_rule(lambda cfg: 1.0)(_cfg(d_mlp=512, device="cuda")) is None
    # a cluster's GPUs (reproduce --executor ... --gpus-per-run): a compute-bound CPU step here joins too
    assert ensemble_rule(lambda cfg: 1.0, gpu=True)(_cfg(d_mlp=512)) is None
    assert "compute-bound" in ensemble_rule(lambda cfg: 1.0)(_cfg(d_mlp=512))
