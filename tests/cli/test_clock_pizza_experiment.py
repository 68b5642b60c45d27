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
from groklens.experiments.ledger import config_hash
from groklens.experiments.pipeline import run_configs
from tests.helpers import train_tiny


def test_every_scale_is_a_valid_config_and_the_paper_scale_is_theirs():
    exp = E.EXPERIMENTS.get("clock-pizza")
    for name, sc in exp.scales.items():
        plan = exp.plan(sc, name)
        for arm, over in plan.variants.items():  # (the sphere arms' split takes the seed: the test below)
            if arm not in CP.SPHERE_ARMS:
                config_from(None, overrides={**sc.base, **over}).validate()
        rates = [config_from(None, overrides={**sc.base, **over}) for arm, over in plan.variants.items()
                 if arm not in CP.SPHERE_ARMS]
        rates = [0.0 if c.attention == "uniform" else c.attention_rate for c in rates]
        assert rates == sorted(rates) and rates[0] == 0 and rates[-1] == 1 and len(set(rates)) == len(rates)
    assert list(CP.rate_arms(exp.scales["paper"]).values()) == [0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1]
    paper = config_from(None, overrides=exp.scales["paper"].base)
    # code/save/config_p99zdpze5l.json and train-main.py
    assert (paper.p, paper.train_frac, paper.d_model, paper.n_heads, paper.d_mlp, paper.lr, paper.weight_decay,
            paper.steps, paper.warmup_steps, paper.batch_size, paper.norm) == (59, 0.8, 128, 4, 512, 1e-3, 2.0,
                                                                                20_000, 10, 0, "none")
    assert CP.VARIANTS["uniform"]["attention"] == "uniform" and CP.VARIANTS["learned"]["attention"] == "softmax"


def test_the_sphere_arms_are_bounded_spheres_own_runs():
    """The paper scale's sphere_* arms are bounded-sphere's paper-split arms, config for config, so one
    set of run files gives both experiments' rows."""
    ours = {n: c for _, n, c in run_configs(E.EXPERIMENTS.get("clock-pizza"), "paper", 2)}
    theirs = {n: c for _, n, c in run_configs(E.EXPERIMENTS.get("bounded-sphere"), "paper", 2)}
    shared = 0
    for arm, (arch, attention) in CP.SPHERE_ARMS.items():
        for seed in (1, 2):
            a = ours[f"{arm}_s{seed}"]
            assert (a.p, a.train_frac, a.data_seed, a.split_rule, a.lr) == (113, 0.3, seed, "python_shuffle", 6e-4)
            assert (a.attention, a.weight_decay) == (attention, 0.0 if arch == "sphere_wd0" else 1.0)
            assert a.norm == {"ln": "ln", "rms": "rms"}.get(arch, "sphere")
            if (b := theirs.get(f"{arch}_papersplit_lr6e-4_s{seed}")) and attention == "softmax":
                assert a == b and config_hash(a.to_dict()) == config_hash(b.to_dict())
                shared += 1
    assert shared == 6  # LayerNorm and both spheres, 2 seeds: bounded-sphere's own files
    # the uniform-attention arms differ from the learned ones by the attention alone
    for arch in ("ln", "sphere_wd1"):
        u = ours[f"sphere_{arch}_uniform_s1"].to_dict()
        assert {k for k, v in ours[f"sphere_{arch}_s1"].to_dict().items() if u[k] != v} == {"attention"}
    assert not any(arm in CP.SPHERE_ARMS for arm in E.EXPERIMENTS.get("clock-pizza").plan(
        E.EXPERIMENTS.get("clock-pizza").scales["quick"], "quick").variants)


@pytest.mark.parametrize("ln, sphere, verdict", [
    (["pizza", "pizza"], ["clock", "clock"], "agrees"),
    (["pizza", "neither"], ["clock", "clock"], "undetermined (seeds labelled neither: 1 LayerNorm, 0 sphere)"),
    (["pizza", "pizza"], ["pizza", "clock"], "disagrees"),
    (["clock", "pizza"], ["clock", "clock"], "disagrees"),
    (["neither"], ["neither", "neither"], "undetermined (seeds labelled neither: 1 LayerNorm, 2 sphere)"),
    ([], ["clock"], "undetermined (no LayerNorm runs)")])
def test_the_sphere_story_rows(ln, sphere, verdict):
    """The story's verdict with learned attention (LayerNorm against both spheres) and with uniform
    attention (LayerNorm against sphere wd 1), each from its own arms only."""
    arms = {"sphere_ln": _runs(ln), "sphere_sphere_wd1": _runs(sphere[:1]), "sphere_sphere_wd0": _runs(sphere[1:]),
            "sphere_ln_uniform": _runs(ln), "sphere_sphere_wd1_uniform": _runs(sphere)}
    rows = CP._sphere_rows(_ctx(None, scale="paper", arms=arms))
    n = len(CP.SPHERE_ARMS)
    assert len(rows) == n + 2 and [r.verdict for r in rows[:n]] == [""] * n
    assert rows[n].verdict == verdict and rows[n + 1].verdict == verdict
    assert "uniform attention" in rows[n + 1].measure and "uniform attention" not in rows[n].measure
    assert rows[0].ours_text.startswith("seed 1: " + ln[0]) if ln else rows[0].ours_text.startswith("—")
    assert rows[3].ours_text.startswith("—")  # RMSNorm: no runs given
    # the uniform row reads the uniform arms, not the learned ones
    arms["sphere_sphere_wd1_uniform"] = _runs(["pizza"])
    assert CP._sphere_rows(_ctx(None, scale="paper", arms=arms))[n + 1].verdict == (
        "disagrees" if ln else "undetermined (no LayerNorm runs)")


def test_run_values_are_the_last_checkpoints(tmp_path):
    path = tmp_path / "run.h5"
    train_tiny(path, attention="uniform", steps=60)
    vals = CP._run_values(path, None)
    assert vals["label"] == algorithm_label(vals["gradient_symmetricity"], vals["distance_irrelevance"])
    assert set(vals) == {"gradient_symmetricity", "distance_irrelevance", "label", "clock_from_step",
                         "pizza_from_step"}


def _runs(labels, censored=False):
    return [SimpleNamespace(seed=i + 1, grok_censored=censored, run_values={"label": lbl, "gradient_symmetricity": 0.5,
                                                                           "distance_irrelevance": 0.9})
            for i, lbl in enumerate(labels)]


def _ctx(labels, censored=False, scale="smoke", arms=None):
    sc = E.EXPERIMENTS.get("clock-pizza").scales[scale]
    arms = arms if arms is not None else {"learned": _runs(labels, censored)}
    return Context("clock-pizza", scale, sc, Plan(CP.VARIANTS, None, sc.base), arms, None)


@pytest.mark.parametrize("labels, censored, verdict", [
    (["clock", "clock"], False, "agrees"), (["pizza", "neither"], False, "disagrees"),
    (["clock", "pizza"], False, "undetermined (1 of 2 seeds)"),
    (["clock"], True, "undetermined (1 of 1 seeds did not grok)")])
def test_label_verdicts(labels, censored, verdict):
    assert CP._label_row(_ctx(labels, censored), "learned").verdict == verdict


def test_mean_rows_read_the_run_values():
    row = CP._mean_row(_ctx(["clock", "clock"]), "learned", "gradient_symmetricity", "gradient symmetricity")
    assert row.ours == pytest.approx(0.5) and row.published.value == 0.483


def test_their_rate_and_the_softmax_share_are_inverse():
    """share = c / (c + n (1 - c)): the rescaling that makes their all-ones mixture ours
    (tests/models/test_attention_rate.py checks it on the logits with n = 3)."""
    for c in (0.0, 0.3, 0.55, 0.65, 0.75, 1.0):
        assert CP.their_coeff(CP.softmax_share(c)) == pytest.approx(c)
    # their transition band in shares; the published boundary is its midpoint's share
    assert (CP.softmax_share(0.55),
            CP.softmax_share(0.75), CP.softmax_share(0.65)) == pytest.approx((0.3793, 0.6, 0.4815),
                                                                                                      abs=1e-4)


@pytest.mark.parametrize("labels, found", [
    ({0: "pizza", 0.25: "pizza", 0.5: "mixed", 0.75: "clock", 1: "clock"}, (0.25, 0.75)),
    ({0: "pizza", 0.5: "pizza", 1: "clock"}, (0.5, 1)),
    ({0: "pizza", 0.25: "clock", 0.5: "pizza", 1: "clock"}, "pizza at 0.5 above clock at 0.25: no single boundary"),
    ({0: "neither", 0.5: "clock", 1: "clock"}, "no pizza rate"),
    ({0: "pizza", 1: "neither"}, "no clock rate")])
def test_boundary_rule(labels, found):
    assert CP.boundary(labels) == found


def test_majority_is_strict():
    assert [CP.majority(x) for x in (["pizza", "pizza", "clock"], ["pizza", "clock"], [], ["clock"])] == \
        ["pizza", "mixed", "—", "clock"]


def test_boundary_row_reads_the_majorities_and_each_seed():
    arms = {"uniform": _runs(["pizza", "pizza", "pizza"]), "rate_0.25": _runs(["pizza", "pizza", "neither"]),
            "rate_0.5": _runs(["clock", "pizza", "neither"]), "rate_0.75": _runs(["clock", "clock", "clock"]),
            "learned": _runs(["clock", "clock", "clock"])}
    row = CP._boundary_row(_ctx(None, scale="quick", arms=arms))
    assert row.ours == pytest.approx(0.5) and row.verdict == "agrees"
    assert row.published.value == pytest.approx(0.481) and row.ratio == pytest.approx(0.5 / 0.481)
    assert "pizza up to 0.25, clock from 0.75" in row.ours_text and "0.5: mixed" in row.ours_text
    # seed 1 switches between 0.25 and 0.5, seed 2 between 0.5 and 0.75, seed 3 between 0 and 0.75
    assert "seed 1: 0.375; seed 2: 0.625; seed 3: 0.375" in row.ours_text
    del arms["rate_0.5"]
    assert CP._boundary_row(_ctx(None, scale="quick", arms=arms)).verdict == "undetermined (no runs at 1 of 5 rates)"
    arms["rate_0.5"] = _runs(["pizza", "pizza"])  # a majority of fewer than RATE_MIN_SEEDS
    assert CP._boundary_row(_ctx(None, scale="quick", arms=arms)).verdict == \
        "undetermined (fewer than 3 seeds at 1 of 5 rates)"
    arms["rate_0.5"] = _runs(["pizza", "pizza", "pizza"], censored=True)
    assert CP._boundary_row(_ctx(None, scale="quick", arms=arms)).verdict == "undetermined (3 run(s) did not grok)"
    flat = {a: _runs(["neither"] * 3) for a in CP.rate_arms(E.EXPERIMENTS.get("clock-pizza").scales["quick"])}
    row = CP._boundary_row(_ctx(None, scale="quick", arms=flat))
    assert row.ours is None and row.verdict == "disagrees" and "no pizza rate" in row.ours_text


@pytest.mark.parametrize("arm, rate, labels, verdict", [
    ("rate_0.25", 0.25, ["pizza"] * 3, "agrees"),  # their attn_coeff 0.4: pizza
    ("rate_0.5", 0.5, ["clock", "pizza", "pizza"], ""),  # 0.67: their transition band, no claim
    ("rate_0.75", 0.75, ["pizza"] * 3, "disagrees"),  # 0.86: clock
    ("rate_0.75", 0.75, ["pizza", "pizza"], "undetermined (2 seed(s); a rate is read from 3)")])
def test_rate_rows_against_their_table_at_the_same_share(arm, rate, labels, verdict):
    row = CP._rate_row(_ctx(None, scale="quick", arms={arm: _runs(labels)}), arm, rate)
    assert row.verdict == verdict and "seed 1" in row.ours_text and "gradient symmetricity 0.500" in row.ours_text


@pytest.mark.slow
def test_smoke_trains_the_rate_grid(tmp_path):
    import json

    from groklens.checkpoints import Trajectory

    res = E.reproduce("clock-pizza", "smoke", tmp_path / "cp", ledger_dir=tmp_path / "ledger", progress=False,
                      echo=lambda _m: None)
    rates = sorted(Trajectory(p).config.attention_rate for p in res.runs
                   if Trajectory(p).config.attention == "softmax")
    assert rates == [0.5, 1.0] and len(res.runs) == 3
    measures = [r.measure for r in res.rows]
    assert measures[-1].startswith("phase boundary") and any("attention rate 0.5" in m for m in measures)
    assert len(res.rows) == 6 + 1 + 1  # Model A and B's rows, the grid's rate, the boundary
    ledger = json.loads((tmp_path / "ledger" / "clock-pizza.smoke.json").read_text())
    assert {run["arm"] for run in ledger["runs"]} >= {"uniform", "rate_0.5", "learned"}
