"""The structural-attention reading on planted ledger entries: laws, curves, widths and the ticket
built to a known answer, so each row's number and verdict can be checked against it."""

from pathlib import Path

import numpy as np
import pytest

import groklens.experiments as E
from groklens.experiments.ledger import LedgerRun
from groklens.experiments.verdicts import exponent_verdict

EXP = E.get_experiment("structural-attention")
SEEDS = (1, 2, 3, 4, 5)


def _entry(variant, seed, cfg, mem, grok, last, curves=None):
    return {"run": f"{variant}_s{seed}", "arm": variant, "seed": seed, "config": cfg,
            "memorization_step": {"0.95": mem}, "grokking_step": {"0.95": grok}, "last_step": last,
            "final": {"test_acc": 1.0 if grok else 0.1},
            "collapse": {"crossed": grok, "fell_below": None, "final_test_acc": 1.0, "collapsed": False},
            "curves": curves or {}}


def _curves(mem, grok, seed):
    """Planted baseline curves: the least-attended token's mass 0.05 until 75% of the delay (the
    first checkpoint past it is at 80%), then 0.45; the QK share 0.3 at init, 0.03 from
    memorization on; the pull 0.2 -> 0.01."""
    steps = [0, mem // 2, mem] + [mem + (grok - mem) * k // 10 for k in range(1, 11)]
    rise = mem + 0.75 * (grok - mem)  # the first stored checkpoint past it: 80% of the delay
    jitter = 1 + 0.01 * seed
    return {
        "attn_min_mass": {"steps": steps, "values": [0.05 if s < rise else 0.45 for s in steps]},
        "attn_mass": {"steps": steps, "values": [0.2 if s < rise else 0.9 for s in steps]},
        "attn_qk_share": {"steps": steps, "values": [0.3 * jitter if s == 0 else 0.03 * jitter for s in steps]},
        "attn_qk_grad": {"steps": steps, "values": [1.0 * jitter if s == 0 else 1e-4 * jitter for s in steps]},
        "attn_struct_pull": {"steps": steps, "values": [0.2 * jitter if s == 0 else 0.01 for s in steps]},
    }


def _context(kl_time, width_time, ticket_time):
    sc = EXP.scales["paper"]
    plan = EXP.plan(sc, "paper")
    rng = np.random.default_rng(0)
    arms = {}
    for variant, over in plan.variants.items():
        cfg = {**sc.base, "kl_attn_beta": 0.0, "attn_mask": "", **over}
        runs = []
        for seed in SEEDS:
            noise = float(np.exp(rng.normal(0, 0.05)))
            mem = 200
            if variant.startswith("wd"):
                grok = mem + int(8000 / cfg["weight_decay"] * noise)  # the delay exactly ~ 1 / wd
            elif variant.startswith("kl"):
                grok = int(kl_time(cfg["kl_attn_beta"]) * noise)
            elif variant.startswith("mlp"):
                grok = int(width_time(cfg["d_mlp"]) * noise)
            else:
                grok, cfg = int(ticket_time * noise), {**cfg, "attn_mask": "0 7"}
            censored = grok > sc.base["steps"]
            e = _entry(variant, seed, cfg, mem, None if censored else grok,
                       sc.base["steps"] if censored else grok + 200,
                       _curves(mem, grok, seed) if variant == plan.baseline else None)
            runs.append(LedgerRun(e))
        arms[variant] = runs
    return E.Context("structural-attention", "paper", sc, plan, arms, Path("."))


_DEFAULTS = dict(kl_time=lambda b: 1000 + 300 / b, width_time=lambda d: 8200 if d == 512 else 4000 if d == 128 else
                 20_000, ticket_time=3000)


def _rows(**kw):
    return {r.measure: r for r in EXP.read(_context(**{**_DEFAULTS, **kw}))}


def _row(rows, start):
    return next(r for m, r in rows.items() if m.startswith(start))


def test_the_paper_plan_has_every_arm_at_five_levels_spanning_a_decade():
    sc = EXP.scales["paper"]
    plan = EXP.plan(sc, "paper")
    wds, betas = sc.extra["wds"], sc.extra["betas"]
    assert len(wds) >= 5 and max(wds) / min(wds) >= 10 and len(betas) >= 5 and max(betas) / min(betas) >= 10
    assert EXP.seeds_default("paper") >= 5
    assert plan.baseline == "wd1" and plan.variants["ticket"]["attn_mask_from"] == "wd1_s{seed}"
    assert {f"mlp{d}" for d in sc.extra["d_mlps"] if d != sc.base["d_mlp"]} <= set(plan.variants)


def test_a_planted_inverse_wd_law_agrees_and_a_flat_kl_law_disagrees():
    rows = _rows(kl_time=lambda b: 3000)  # grokking time independent of beta
    wd = _row(rows, "exponent of the delay (grokking - memorization) in weight decay")
    assert wd.ours == pytest.approx(-1.0, abs=0.05) and wd.verdict == "agrees"
    kl = _row(rows, "exponent of the grokking step in KL strength")
    assert abs(kl.ours) < 0.05 and kl.verdict.startswith("disagrees")


def test_censored_runs_enter_the_law_through_tobit():
    rows = _rows(kl_time=lambda b: 200 + 3000 / b)  # beta 0.01 and 0.03 run past the cap
    kl = _row(rows, "exponent of the grokking step in KL strength")
    assert kl.ours_text.startswith("Tobit ") and "censored" in kl.ours_text


def test_planted_curves_give_the_mass_gradient_and_rise_rows():
    rows = _rows()
    mn = _row(rows, "attention mass of the readout query on the least-attended")
    assert mn.ours == pytest.approx(9.0) and mn.verdict == "agrees"  # 0.45 / 0.05
    rise = _row(rows, "fraction of the delay elapsed")
    assert rise.ours == pytest.approx(0.8, abs=0.01) and rise.verdict == "agrees"
    share = _row(rows, "W_Q, W_K share of the whole gradient norm at memorization")
    assert share.ours == pytest.approx(0.1) and share.verdict == "agrees"
    pull = _row(rows, "pull of the loss toward the informative tokens")
    assert pull.ours == pytest.approx(0.01 - 0.2 * np.mean([1 + 0.01 * s for s in SEEDS]))
    assert pull.verdict == "agrees"


def test_a_middle_width_that_is_fastest_is_a_goldilocks_window_and_an_end_is_not():
    rows = _rows()
    win = _row(rows, "Goldilocks window of MLP width")
    assert "fastest d_mlp 128" in win.measure and win.verdict == "agrees"
    rows = _rows(width_time=lambda d: 1000 * (1 + d / 32))  # the narrowest is fastest
    win = _row(rows, "Goldilocks window of MLP width")
    assert "fastest d_mlp 32" in win.measure and win.verdict.startswith("undetermined")
    # the widest arm not trained yet: the window is open on that side, and the verdict names the pair
    ctx = _context(**{**_DEFAULTS, "width_time": lambda d: 4000 if d == 2048 else 20_000})
    ctx.arms[f"mlp{max(EXP.scales['paper'].extra['d_mlps'])}"] = []
    win = _row({r.measure: r for r in EXP.read(ctx)}, "Goldilocks window of MLP width")
    widest = max(EXP.scales["paper"].extra["d_mlps"])
    assert "fastest d_mlp 2048" in win.measure
    assert win.verdict == f"undetermined (d_mlp {widest} / 2048: undetermined (no runs))"


def test_the_kl_ticket_against_the_mask_ticket():
    rows = _rows(ticket_time=3000, kl_time=lambda b: 1000)
    vs = _row(rows, "speed-up of the KL intervention (Bayesian ticket")
    assert vs.ours == pytest.approx(3.0, rel=0.1) and vs.verdict == "agrees"
    assert "s1: 0 7" in vs.differs
    rows = _rows(ticket_time=500, kl_time=lambda b: 3000)
    assert _row(rows, "speed-up of the KL intervention (Bayesian ticket").verdict == "disagrees"



def test_a_ticket_whose_donor_never_grokked_is_left_out_on_both_sides():
    ctx = _context(**_DEFAULTS)
    base = ctx.plan.baseline
    ctx.arms[base][2].grokking = None  # seed 3's baseline (the donor) never grokked
    rows = {r.measure: r for r in EXP.read(ctx)}
    row = _row(rows, "speed-up of the attention-mask ticket over the baseline")
    keep = [0, 1, 3, 4]  # seeds 1, 2, 4, 5 on both sides
    t_base = np.exp(np.mean([np.log(ctx.arms[base][i].grok_time()) for i in keep]))
    t_ticket = np.exp(np.mean([np.log(ctx.arms["ticket"][i].grok_time()) for i in keep]))
    assert row.ours == pytest.approx(t_base / t_ticket) and "(n=4 / 4)" in row.ours_text
    assert "left out of these rows: the ticket's seed(s) 3" in row.differs
    assert "s3: 0 7 (donor never grokked: its last checkpoint)" in row.differs
    vs = _row(rows, "speed-up of the KL intervention (Bayesian ticket")
    assert "(n=4 / 5)" in vs.ours_text  # the KL arm keeps all its seeds
    ctx.arms["ticket"] = ctx.arms["ticket"][1:]  # no ticket of seed 1 yet: nor its baseline seed
    row = _row({r.measure: r for r in EXP.read(ctx)}, "speed-up of the attention-mask ticket over the baseline")
    assert "(n=3 / 3)" in row.ours_text

def test_exponent_verdict_rule():
    assert exponent_verdict([-1.3, -0.8], -1.0) == "agrees"
    assert exponent_verdict([-0.6, -0.2], -1.0).startswith("disagrees")
    assert exponent_verdict([-1.5, 0.2], -1.0).startswith("undetermined")
    assert exponent_verdict(None, -1.0, no_ci="no fit").startswith("undetermined")
