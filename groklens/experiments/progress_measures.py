"""Nanda et al. 2023's progress measures at his own scale (`reproduce progress-measures`).

His canonical run (docs/REFERENCES.md): modular addition p=113, 30% of the pairs, a 1-layer
transformer (d_model 128, 4 heads, d_mlp 512, ReLU, no LayerNorm, no biases), AdamW lr 1e-3,
weight decay 1, betas (0.9, 0.98), 10-step warm-up, full batch, float64 loss. groklens' default
preset is that model, so the paper scale changes only the schedule: a checkpoint every 100
steps (his code saves every 100 epochs) and a stop 2 evaluations after the test loss first
falls to 0.01, not before step 20,000 (his cleanup ends at ~14.5k), censored at 40,000 (his
run length).
"""

from __future__ import annotations

from groklens.experiments.core import Experiment, Plan, Scale, _SMOKE, _SMOKE_NOTE, _register, _scale

NANDA = "Nanda et al. 2023, progress measures for grokking (REFERENCES.md)"
STOP_LOSS = 0.01  # the schedule trains 2 evaluations past test loss <= this (the end of cleanup)

_SCHEDULE = dict(eval_every=100, checkpoint_every=100, stop_after_grok=2, stop_test_loss=STOP_LOSS)
SCALES = {
    "smoke": _scale({**_SMOKE, "steps": 60, "stop_test_loss": 0.0}, _SMOKE_NOTE),
    # Nanda's model and optimizer on p=59 (1,044 of 3,481 pairs): the same phases, ~4x cheaper a step
    "quick": _scale(dict(task="add", p=59, steps=15_000, stop_min_steps=6_000, device="cpu", **_SCHEDULE),
                    "p=59 (Nanda: p=113), his model and optimizer otherwise; trained 2 evaluations past test loss "
                    "<= 0.01, not before step 6,000, censored at 15,000"),
    "paper": _scale(dict(task="add", steps=40_000, stop_min_steps=20_000, device="auto", **_SCHEDULE),
                    "his setup (the default preset); seeds 1..N with his data split (data_seed 598); trained 2 "
                    "evaluations past test loss <= 0.01, not before step 20,000, censored at 40,000"),
}


def _plan(sc: Scale, scale: str) -> Plan:
    return Plan({"nanda": {}}, None, sc.base)


def _read(ctx):  # rows: filled in with the analyses (progress_measures reading below)
    return []


def _analyses(sc: Scale, scale: str):
    return []


_register(Experiment(
    "progress-measures",
    "Nanda et al.'s canonical run: memorization, circuit formation and cleanup from restricted/excluded loss, "
    "key frequencies and the weight norm",
    SCALES, _plan, _read, _analyses, seeds={"smoke": 1, "quick": 3, "paper": 3}))
