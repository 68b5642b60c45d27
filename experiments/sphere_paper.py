"""The sphere paper's experiments (Yildirim 2026): bounded-sphere, uniform-attention, s5-control, fourier-fve.

Sources (docs/REFERENCES.md): the paper's table as corrected by its v2 errata (the official
repository's readme), and its official notebooks (AlperYildirim1/geometric-grokking, read at
commit 9fe40bd), whose settings the paper scales follow where the paper is silent:
  Final_Modular_No_Decay / _Norm_Baselines  p=113, 30% split from the seed, d_model 128, 4 heads,
      d_mlp 512, AdamW lr 6e-4 (or 1e-4) betas (0.9, 0.999), full batch, logged every 200 epochs,
      grok = first logged test accuracy > 0.95; bounded sphere (tau 10) at wd 1 or 0 (5,000 epochs),
      post-norm LayerNorm / RMSNorm at wd 1 (15,000 epochs). bounded-sphere's paper scale; its
      runs are also read beside the official code's own (sphere_official.py, the peer ledger).
  S5_Final  S5 composition, lr 1e-3, full batch, 100,000 epochs, grok = first test accuracy >=
      0.99; LayerNorm, RMSNorm (wd 1), the sphere with a plain unembedding (wd 1), the bounded
      sphere (wd 0). s5-control's paper scale, with its stop rule as the only difference.
  Final_No_attention_all_models  uniform attention at lr 1e-4, betas (0.9, 0.98), 20,000 epochs,
      peak test accuracy; no norm, LayerNorm, plain-unembedding sphere (wd 1), bounded sphere (wd 0).
      uniform-attention follows the paper's table instead (LayerNorm, RMSNorm, bounded sphere wd 1,
      + Fourier init wd 1) at bounded-sphere's lr 6e-4, sharing its learned-attention runs.
  Fourier_Analysis_Last  the FVE reading at the first logged test accuracy >= 0.99, seed 42 (fourier-fve;
      benchmarks/peer/sphere_fve_official.py runs it on groklens' and their models).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from groklens.experiments.core import (
    FROM_SEED, Context, Experiment, Plan, Published, QUICK, Row, SMOKE, SMOKE_NOTE, Scale, grok_row, lr_tag,
    no_analyses, register, speedup_row)
from groklens.experiments.peer import OfficialRun
from groklens.experiments.sphere_official import PEER, PEER_LEDGER, groklens_split_sha256, load_official
from groklens.experiments.verdicts import fmt_ci, interval_verdict, speedup_verdict, undetermined, welch_log_ratio

YILDIRIM = "Yildirim 2026, arXiv 2603.05228 (REFERENCES.md table)"

# the sphere paper's training setup (preset `sphere`): bidirectional, MLP biases, betas (0.9, 0.999), no warm-up
# and PyTorch's default init, as its code (init_scheme=torch)
_SPHERE_TRAIN = dict(causal=False, mlp_bias=True, betas=[0.9, 0.999], warmup_steps=0, init_scheme="torch")
_SPHERE_PAPER = dict(task="add", p=113, train_frac=0.3, d_model=128, n_heads=4, d_head=32, d_mlp=512,
                     eval_every=200, checkpoint_every=1000, device="auto", **_SPHERE_TRAIN)
# the paper scale of bounded-sphere, uniform-attention and fourier-fve (clock-pizza reads its arms too)
SPHERE_PAPER_BASE = {**_SPHERE_PAPER, "steps": 100_000, "stop_after_grok": 2}
_SPHERE_QUICK = {**QUICK, **_SPHERE_TRAIN}
_QUICK_SPHERE_NOTE = ("p=23, 50% of pairs, d_model 64, 2 heads, d_mlp 256 (the paper: p=113, 30%, d_model 128, "
                      "4 heads, d_mlp 512); lr 3e-3 compared with the paper's lr 6e-4 row (5x larger: at 6e-4 "
                      "these runs need ~10k steps); evaluation every 50 steps (paper: 200); post-norm "
                      "LayerNorm/RMSNorm baselines and PyTorch's init, as the paper's code")
ARCH: dict[str, dict[str, Any]] = {  # the architectures of the sphere paper's table (its baselines are post-norm)
    "ln": {"norm": "ln", "norm_placement": "post", "weight_decay": 1.0},
    "rms": {"norm": "rms", "norm_placement": "post", "weight_decay": 1.0},
    "sphere_wd1": {"norm": "sphere", "unembed": "bounded", "weight_decay": 1.0},
    "sphere_wd0": {"norm": "sphere", "unembed": "bounded", "weight_decay": 0.0},
    "sphere_fourier_wd0": {"norm": "sphere", "unembed": "bounded", "init": "fourier", "weight_decay": 0.0},
}
# the table's (v2 errata) arm bounded-sphere does not train; uniform-attention's paper scale has it
ARCH_FOURIER_WD1 = {"norm": "sphere", "unembed": "bounded", "init": "fourier", "weight_decay": 1.0}
ARCH_LABEL = {"ln": "LayerNorm", "rms": "RMSNorm", "sphere_wd1": "bounded sphere, wd 1.0",
              "sphere_wd0": "bounded sphere, wd 0", "sphere_fourier_wd0": "bounded sphere + Fourier init, wd 0",
              "sphere_fourier_wd1": "bounded sphere + Fourier init, wd 1.0"}
# Yildirim 2026 table: (lr, arch) -> mean grok epoch
SPHERE_TABLE = {
    (1e-4, "ln"): 54_160, (1e-4, "rms"): 51_240, (6e-4, "ln"): 7_800, (6e-4, "rms"): 7_300,
    (1e-4, "sphere_wd1"): 2_400, (1e-4, "sphere_wd0"): 2_480, (1e-4, "sphere_fourier_wd0"): 2_100,
    (6e-4, "sphere_wd1"): 1_560, (6e-4, "sphere_wd0"): 820, (6e-4, "sphere_fourier_wd0"): 711,
    (1e-4, "sphere_fourier_wd1"): 2_120, (6e-4, "sphere_fourier_wd1"): 800,
}
def _published_grok(lrs: list[float]) -> dict[str, int]:
    """Scale.expect_grok of the paper's arms at these learning rates: its table's mean grok epochs."""
    return {f"{a}_lr{lr_tag(lr)}": SPHERE_TABLE[(lr, a)] for lr in lrs for a in ARCH}


_PAPER_SPHERE_NOTE = "the published setup (post-norm baselines, PyTorch's default init as the paper's code)"


# ---------------------------------------------------------------------- bounded-sphere
# Our additions at paper scale (not in the paper's table): the bounded sphere wd 0 with
# TransformerLens' init, to show what the init scheme does to the grokking time.
# And (issue 45) the paper's three headline arms on the paper's own split of each seed (its
# make_dataset: split_rule python_shuffle from the run's seed), beside the official code's runs
# (benchmarks/peer/sphere_official.py), to tell the split's share of the seeds' spread.
PAPER_SPLIT = {"split_rule": "python_shuffle", "data_seed": FROM_SEED}
SPHERE_OURS = {"sphere_wd0_tlinit": ({**ARCH["sphere_wd0"], "init_scheme": "tl"},
                                     "bounded sphere, wd 0, TransformerLens init (our addition)", "sphere_wd0"),
               **{f"{a}_papersplit": ({**ARCH[a], **PAPER_SPLIT}, f"{ARCH_LABEL[a]}, the paper's split of each seed",
                                      a) for a in ("ln", "sphere_wd1", "sphere_wd0")}}


def _ours_lrs(sc: Scale) -> list[float]:
    """The learning rates our additions (SPHERE_OURS) run at: every rate of the scale unless it says."""
    return sc.extra.get("ours_lrs", sc.extra["lrs"])


def _plan_sphere(sc: Scale, scale: str) -> Plan:
    variants = {f"{a}_lr{lr_tag(lr)}": {**ARCH[a], "lr": lr} for lr in sc.extra["lrs"] for a in ARCH}
    for a in sc.extra.get("ours", ()):  # after the paper's arms: their run names never change
        variants.update({f"{a}_lr{lr_tag(lr)}": {**SPHERE_OURS[a][0], "lr": lr} for lr in _ours_lrs(sc)})
    return Plan(variants, f"ln_lr{lr_tag(sc.extra['lrs'][0])}", sc.base)


def _read_sphere(ctx: Context) -> list[Row]:
    rows = []
    lrs = ctx.sc.extra["lrs"]
    for lr, pub_lr in zip(lrs, ctx.sc.extra.get("published_lrs", lrs)):  # quick: our lr != the paper's
        tag = lr_tag(lr)
        at = f"lr {lr:g}" if lr == pub_lr else f"lr {lr:g} (published: lr {pub_lr:g})"
        for a in ARCH:
            pub = SPHERE_TABLE[(pub_lr, a)]
            rows.append(grok_row(ctx, f"grok epoch, {ARCH_LABEL[a]}, {at}",
                                 Published(pub, f"{pub:,} (mean of 10 seeds)", YILDIRIM), f"{a}_lr{tag}", ctx.sc.note))
        for a in ("sphere_wd1", "sphere_wd0", "sphere_fourier_wd0"):
            pub = SPHERE_TABLE[(pub_lr, "ln")] / SPHERE_TABLE[(pub_lr, a)]
            rows.append(speedup_row(ctx, f"speed-up of {ARCH_LABEL[a]} over LayerNorm, {at}",
                                    Published(pub, f"{pub:.2f}x (derived: ratio of the table's arithmetic means)",
                                              YILDIRIM),
                                    f"ln_lr{tag}", f"{a}_lr{tag}", ctx.sc.note + "; ours: ratio of geometric means"))
        ours = ctx.sc.extra.get("ours", ()) if lr in _ours_lrs(ctx.sc) else ()
        if any(a.endswith("_papersplit") for a in ours):
            rows += _papersplit_rows(ctx, tag, at, pub_lr)
            rows += _official_rows(ctx, lr, at, pub_lr)
        for a in (a for a in ours if not a.endswith("_papersplit")):
            _, label, ref = SPHERE_OURS[a]
            none = Published(None, "not in the paper (our addition)", YILDIRIM)
            rows.append(grok_row(ctx, f"grok epoch, {label}, {at}", none, f"{a}_lr{tag}", ctx.sc.note))
            rows.append(speedup_row(ctx, f"speed-up of {ARCH_LABEL[ref]} (PyTorch init) over {label}, {at}", none,
                                    f"{a}_lr{tag}", f"{ref}_lr{tag}", ctx.sc.note))
    return rows


def _papersplit_rows(ctx: Context, tag: str, at: str, pub_lr: float) -> list[Row]:
    """The headline arms on the paper's split of each seed: grok epochs and speed-ups against the
    table, and the weight-decay order (sphere wd 0 over wd 1) on both splits."""
    note = ctx.sc.note + "; the paper's split: make_dataset's random.Random(seed) shuffle (split_rule python_shuffle)"
    rows = []
    for a in ("ln", "sphere_wd1", "sphere_wd0"):
        pub = SPHERE_TABLE[(pub_lr, a)]
        rows.append(grok_row(ctx, f"grok epoch, {ARCH_LABEL[a]}, the paper's split of each seed, {at}",
                             Published(pub, f"{pub:,} (mean of 10 seeds)", YILDIRIM), f"{a}_papersplit_lr{tag}", note))
    for a in ("sphere_wd1", "sphere_wd0"):
        pub = SPHERE_TABLE[(pub_lr, "ln")] / SPHERE_TABLE[(pub_lr, a)]
        rows.append(speedup_row(ctx,
                                f"speed-up of {ARCH_LABEL[a]} over LayerNorm, the paper's split of each seed, {at}",
                                Published(pub,
                                          f"{pub:.2f}x (derived: ratio of the table's arithmetic means)", YILDIRIM),
                                f"ln_papersplit_lr{tag}", f"{a}_papersplit_lr{tag}", note, verdict=True))
    pub = SPHERE_TABLE[(pub_lr, "sphere_wd1")] / SPHERE_TABLE[(pub_lr, "sphere_wd0")]
    for suffix, split in (("", "data_seed 598 for every seed"), ("_papersplit", "the paper's split of each seed")):
        rows.append(speedup_row(ctx,
                                f"speed-up of the bounded sphere wd 0 over wd 1 (the weight-decay order), {split}, "
                                f"{at}", Published(pub, f"{pub:.2f}x (derived: the table's wd 1 / wd 0)", YILDIRIM),
                                f"sphere_wd1{suffix}_lr{tag}", f"sphere_wd0{suffix}_lr{tag}",
                                note if suffix else ctx.sc.note, verdict=True))
    return rows


OFFICIAL_ARMS = ("ln", "sphere_wd1", "sphere_wd0")
OFFICIAL_NOTE = ("the official code (AlperYildirim1/geometric-grokking at {commit}, {notebooks}) run by "
                 "benchmarks/peer/sphere_official.py on this machine for {epochs} epochs (their device line set to the "
                 "CPU), recorded from its JSONs by benchmarks/peer/record_sphere_official.py in "
                 "docs/results/peer/sphere-official.json; their grok epoch e (the first logged epoch with test "
                 "accuracy > 0.95, logged every 200 epochs after that epoch's step) is shown as groklens' step e+1; a "
                 "collapse is read over their log up to where groklens' stop rule for the arm would have ended it "
                 "(at the first evaluation at the threshold {stop} or more after grokking: through a dip until "
                 "back, as a groklens run trains), the window a groklens run of the arm observes")


def _official_rows(ctx: Context, lr: float, at: str, pub_lr: float) -> list[Row]:
    """The official code's runs (sphere_official.PEER_LEDGER, at this lr and p) per arm, beside the
    table and groklens' *_papersplit runs of the same seeds (and whether each seed's split is
    theirs), the headline speed-ups over LayerNorm and the weight-decay order from the official runs."""
    tag = lr_tag(lr)
    entries = [e for e in load_official(PEER_LEDGER, ARCH) if e["lr"] == lr and e["p"] == ctx.sc.base["p"]]
    arms: dict[str, list[Any]] = {}
    # groklens' stop rule as it stands (stop_at_event: through a dip until back at the threshold) at
    # the stop_after_grok of the groklens arms beside them (the scale's: no arm sets its own)
    stop = (ctx.plan.base["stop_after_grok"], True)
    for a in OFFICIAL_ARMS:
        runs = sorted((OfficialRun(e, PEER, stop) for e in entries if e["arm"] == a), key=lambda r: r.seed)
        seeds = {r.seed for r in runs}
        arms[f"official:{a}"] = runs
        arms[f"same_seeds:{a}"] = [r for r in ctx.group(f"{a}_papersplit_lr{tag}").runs if r.seed in seeds]
    octx = dataclasses.replace(ctx, arms={**ctx.arms, **arms})
    note = ctx.sc.note + "; " + OFFICIAL_NOTE.format(
        commit=", ".join(sorted({e["repo_commit"][:10] for e in entries})) or "—",
        notebooks=", ".join(sorted({e["notebook"] for e in entries})) or "—",
        epochs=", ".join(f"{x:,}" for x in sorted({e["epochs"] for e in entries})) or "—",
        stop=stop[0])
    late = [r.name for a in OFFICIAL_ARMS for r in arms[f"official:{a}"] if r.collapse_whole_log["collapsed"]
            and not r.collapsed]
    if late:
        note += (f"; read to the end of their log, {len(late)} run(s) end below 0.95 after that window ("
                 f"{', '.join(late)}), which the collapse rule would read as never grokked")
    rows = []
    for a in OFFICIAL_ARMS:
        pub = SPHERE_TABLE[(pub_lr, a)]
        row = grok_row(octx, f"grok step, the official code, {ARCH_LABEL[a]}, the paper's split of each seed, {at}",
                       Published(pub, f"{pub:,} (mean of 10 seeds)", YILDIRIM), f"official:{a}", note)
        if arms[f"official:{a}"]:
            row.ours_text += "; " + _beside_groklens(octx, a, tag)
        else:
            row.ours_text = "no official-code run recorded"
        rows.append(row)
    for a in ("sphere_wd1", "sphere_wd0"):  # the headline, as their code trains it
        pub = SPHERE_TABLE[(pub_lr, "ln")] / SPHERE_TABLE[(pub_lr, a)]
        derived = Published(pub, f"{pub:.2f}x (derived: ratio of the table's arithmetic means)", YILDIRIM)
        rows.append(speedup_row(octx, f"speed-up of {ARCH_LABEL[a]} over LayerNorm, the official code, the paper's "
                                f"split of each seed, {at}", derived, "official:ln", f"official:{a}", note,
                                verdict=True))
    pub = SPHERE_TABLE[(pub_lr, "sphere_wd1")] / SPHERE_TABLE[(pub_lr, "sphere_wd0")]
    rows.append(speedup_row(octx,
                            f"speed-up of the bounded sphere wd 0 over wd 1 (the weight-decay order), the official "
                            f"code, the paper's split of each seed, {at}",
                            Published(pub, f"{pub:.2f}x (derived: the table's wd 1 / wd 0)", YILDIRIM),
                            "official:sphere_wd1", "official:sphere_wd0", note, verdict=True))
    return rows


def _beside_groklens(octx: Context, arm: str, tag: str) -> str:
    """groklens' runs of the official runs' seeds (the *_papersplit arm), seed by seed, and on how
    many seeds the official code's training pairs are groklens' python_shuffle split."""
    official = octx.group(f"official:{arm}").runs
    ours = {r.seed: r for r in octx.group(f"same_seeds:{arm}").runs}
    _, text, _ = octx.grok(f"same_seeds:{arm}")
    per_seed = ", ".join(f"s{r.seed} {_step_text(r)} / {_step_text(ours[r.seed]) if r.seed in ours else '—'}"
                         for r in official)
    differ = [r.seed for r in official if r.split_sha256 != groklens_split_sha256(r.entry["p"],
                                                                                  r.entry["frac_train"], r.seed)]
    split = (f"their training pairs are groklens' python_shuffle split on {len(official) - len(differ)} of "
             f"{len(official)} seeds" + (f" (not on seed {', '.join(map(str, differ))})" if differ else ""))
    return (f"groklens ({arm}_papersplit_lr{tag}) on the same seeds: {text}; per seed, official / groklens: "
            f"{per_seed}; {split}")


def _step_text(run: Any) -> str:
    return f"{run.grokking:,}" if run.grokking is not None else f"> {run.last_step:,}"


# ---------------------------------------------------------------------- uniform-attention
# The paper's table arms; the paper scale adds the bounded sphere + Fourier init at wd 1 (issue 45).
UNIFORM_ARCH = {**{a: ARCH[a] for a in ("ln", "rms", "sphere_wd1")}, "sphere_fourier_wd1": ARCH_FOURIER_WD1}


def _uniform_arms(sc: Scale) -> list[str]:
    return ["ln", "rms", "sphere_wd1"] + (["sphere_fourier_wd1"] if sc.extra.get("fourier_wd1") else [])


def _plan_uniform(sc: Scale, scale: str) -> Plan:
    variants = {}
    for a in _uniform_arms(sc):
        for att in ("softmax", "uniform"):
            variants[f"{a}_{att}"] = {**UNIFORM_ARCH[a], "attention": att, "lr": sc.extra["lr"]}
    return Plan(variants, "ln_softmax", sc.base)


def _read_uniform(ctx: Context) -> list[Row]:
    rows = []
    arms = _uniform_arms(ctx.sc)
    claim = Published(None, "uniform attention removes most of the grokking delay (no number in REFERENCES.md)",
                      YILDIRIM)
    for a in arms:
        rows.append(speedup_row(ctx, f"speed-up of uniform over learned attention, {ARCH_LABEL[a]}", claim,
                                f"{a}_softmax", f"{a}_uniform", ctx.sc.note, verdict=True))
    for a in arms:
        rows.append(grok_row(ctx, f"grok epoch, {ARCH_LABEL[a]} + uniform attention",
                             Published(None, "no number in REFERENCES.md", YILDIRIM), f"{a}_uniform", ctx.sc.note))
    if "sphere_fourier_wd1" in arms:  # its learned-attention arm is not in bounded-sphere: the table's row here
        pub = SPHERE_TABLE[(ctx.sc.extra["lr"], "sphere_fourier_wd1")]
        rows.append(grok_row(ctx, f"grok epoch, {ARCH_LABEL['sphere_fourier_wd1']}, learned attention, "
                             f"lr {ctx.sc.extra['lr']:g}", Published(pub, f"{pub:,} (mean of 10 seeds)", YILDIRIM),
                             "sphere_fourier_wd1_softmax", ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- s5-control
S5_ARMS = ("ln", "rms", "sphere_wd1", "sphere_wd0")  # Fourier init needs residue tokens: not on S5
# The official notebook's models (S5_Final.ipynb): its "Spherical Model (WD=1.0)" (spherical_wd) has a
# plain unembedding; only the wd-0 model (spherical_nowd) has the bounded one.
S5_NOTEBOOK_ARCH = {**ARCH, "sphere_wd1": {"norm": "sphere", "weight_decay": 1.0}}
S5_NOTEBOOK_LABEL = {**ARCH_LABEL, "sphere_wd1": "sphere (plain unembedding, the notebook's spherical_wd), wd 1.0"}


def _plan_s5(sc: Scale, scale: str) -> Plan:
    archs = S5_NOTEBOOK_ARCH if sc.extra.get("notebook_arms") else ARCH
    return Plan({a: {**archs[a], "lr": sc.extra.get("lr", 1e-3)} for a in S5_ARMS}, "ln", sc.base)


def _read_s5(ctx: Context) -> list[Row]:
    from groklens.experiments.ledger import LedgerRun

    claim = Published(None, "the spherical constraint does not make S5 generalize faster (speed-up <= 1)", YILDIRIM)
    labels = S5_NOTEBOOK_LABEL if ctx.sc.extra.get("notebook_arms") else ARCH_LABEL
    at = ""
    if "grok_at" in ctx.sc.extra:  # the notebook's rule: grokked at the first test accuracy >= 0.99
        thr = ctx.sc.extra["grok_at"]
        ctx = dataclasses.replace(ctx,
                                  arms={v: [LedgerRun(r.entry, thr) for r in runs] for v, runs in ctx.arms.items()})
        at = f" (first evaluation with test accuracy >= {thr:g})"
    rows = []
    for a in ("sphere_wd1", "sphere_wd0"):
        ours, text, sp = ctx.speedup("ln", a)
        # the claim: not faster (5% tolerance); collapsed runs cannot say "learns and generalizes"
        verdict = speedup_verdict(sp, above=1.05, claim_faster=False, collapsed=sp.get("collapsed", 0))
        rows.append(Row(f"S5: speed-up of {labels[a]} over LayerNorm{at}", claim, ours, text, ctx.sc.note, verdict,
                        sp.get("bound") or ""))
    for a in S5_ARMS:
        rows.append(grok_row(ctx, f"S5: grok epoch, {labels[a]}{at}",
                             Published(None, "no number in REFERENCES.md", YILDIRIM),
                             a, ctx.sc.note))
    return rows


_S5_NOTEBOOK_NOTE = (
    "S5 as the official notebook S5_Final.ipynb runs it: the 120 permutations (vocabulary 121), 30% of the 14,400 "
    "pairs drawn from each seed (make_s5_dataset's random.Random(seed) shuffle: split_rule python_shuffle, data_seed "
    "= the seed), d_model 128, 4 heads, d_mlp 512, post-norm LayerNorm / RMSNorm (eps 1e-8), PyTorch's init, AdamW lr "
    "1e-3, betas (0.9, 0.999), weight decay 1 (0 for the bounded sphere), full batch, evaluation every 200 epochs, "
    "grokked at the first evaluation with test accuracy >= 0.99 (the notebook's rule, which these rows read), capped "
    "at 100,000 steps (the notebook's MAX_EPOCHS; no published S5 grokking time is in REFERENCES.md, so the cap is "
    "10x a baseline's only if LayerNorm groks by step 10,000); its sphere wd 1 model has a plain unembedding, as here. "
    "What differs: runs stop 2 evaluations after test accuracy 0.99 (the notebook trains every one of its 100,000 "
    "epochs); our step s is their epoch s-1; groklens' code and RNG streams, not theirs")


# ---------------------------------------------------------------------- fourier-fve
# The notebook's three models (Fourier_Analysis_Last.ipynb; docs/REFERENCES.md): LayerNorm, the
# sphere with wd 1 and the fully bounded sphere with wd 0. Ours: post-norm LayerNorm, the
# bounded-sphere table's wd-1 arm (bounded unembedding; the notebook's wd-1 model has a plain
# one) and its wd-0 arm (the notebook's spherical_nowd).
FVE_ARMS = {"fully_bounded": ("sphere_wd0", "bounded sphere, wd 0 (the notebook's fully bounded model)", 0.62),
            "bounded": ("sphere_wd1", "bounded sphere, wd 1", 0.62),
            "standard": ("ln", "post-norm LayerNorm", 0.29)}
FVE_PHASE = "generalized"  # ledger.GENERALIZED_PHASE: the first evaluation with test accuracy >= 0.99
FVE_READING = ("the paper's reading (our reading of its notebook): least-squares FVE of the cos and sin directions of "
               "the top 5 frequencies of W_L by Fourier norm, the mean of those 10 values")


def _fve_arms(sc: Scale) -> dict[str, str]:
    """fully_bounded / bounded / standard -> variant name. At paper scale the arms are
    bounded-sphere's own runs (same names and configs: one set of runs gives both experiments' rows)."""
    if sc.extra.get("shared_with_sphere"):
        tag = lr_tag(sc.extra["lr"])
        return {k: f"{a}_lr{tag}" for k, (a, _, _) in FVE_ARMS.items()}
    return {k: k for k in FVE_ARMS}


def _plan_fve(sc: Scale, scale: str) -> Plan:
    arms = _fve_arms(sc)
    return Plan({arms[k]: {**ARCH[a], "lr": sc.extra["lr"]} for k, (a, _, _) in FVE_ARMS.items()}, arms["standard"],
                sc.base)


def _read_fve(ctx: Context) -> list[Row]:
    rows = []
    arms = _fve_arms(ctx.sc)
    at = "at the first evaluation with test accuracy >= 0.99"
    for k, (_, label, pub) in FVE_ARMS.items():
        ours, text = ctx.measure(arms[k], "fve_ls_top5", FVE_PHASE)
        rows.append(Row(f"Fourier FVE, the paper's reading (least squares, top-5 frequencies of W_L), {at}, {label}",
                        Published(pub, f"about {pub:.0%} ({'bounded' if k != 'standard' else 'standard'} models)",
                                  YILDIRIM), ours, text, f"{ctx.sc.note}; {FVE_READING}"))
    rows.append(_fve_higher_row(ctx, arms["fully_bounded"], arms["standard"], at))
    if ctx.sc.extra.get("shared_with_sphere"):
        rows += _official_fve_rows(ctx.sc.extra["lr"], ctx.sc.note)
    for k, (_, label, _) in FVE_ARMS.items():
        ours, text = ctx.measure(arms[k], "fve_ls", FVE_PHASE)
        _, ntext = ctx.measure(arms[k], "n_key_freqs", FVE_PHASE)
        rows.append(Row(f"Fourier FVE (least squares, mean over Nanda's key set), {at}, {label}",
                        Published(None, "not reported (the paper reads the top 5 of W_L)", YILDIRIM), ours,
                        f"{text}; key set size {ntext}", ctx.sc.note))
        ours, text = ctx.measure(arms[k], "fve_neuron", FVE_PHASE)
        rows.append(Row(f"Fourier FVE (neuron, Nanda 2b), {at}, {label}",
                        Published(None, "not reported (the paper reports the least-squares variant)", YILDIRIM),
                        ours, text, ctx.sc.note))
    return rows


OFFICIAL_FVE_LABELS = {"spherical_nowd": ("the fully bounded sphere, wd 0 (their spherical_nowd)", 0.62),
                       "spherical_wd": ("the sphere with a plain unembedding, wd 1 (their spherical_wd)", 0.62),
                       "layernorm": ("LayerNorm (their layernorm)", 0.29)}


def _official_fve_rows(lr: float, note: str) -> list[Row]:
    """The paper's FVE where both the model and the reading are their code's: Fourier_Analysis_Last
    trains each model at a seed and reads it at its own checkpoint (the peer readings of
    sphere_official.load_official_fve), over the seeds run, beside groklens' reading of the same weights."""
    from groklens.experiments.sphere_official import load_official_fve

    readings = [e for e in load_official_fve() if e["lr"] == lr]
    rows = []
    for model, (label, pub) in OFFICIAL_FVE_LABELS.items():
        runs = sorted((e for e in readings if e["model_type"] == model), key=lambda e: e["seed"])
        if not runs:
            continue
        v = [e["fve"] for e in runs]
        spread = f" ± {statistics.stdev(v):.3f}" if len(v) > 1 else ""
        gap = max(abs(e["fve"] - e["groklens_fve"]) for e in runs)
        text = (f"{statistics.mean(v):.3f}{spread} [{min(v):.3f}-{max(v):.3f}] (n={len(v)}); per seed: "
                + ", ".join(f"s{e['seed']} {e['fve']:.3f}" for e in runs)
                + f"; groklens' fve_ls_top5 of the same weights within {gap:.1e} (their printout has 2 decimals of %)")
        rows.append(Row(f"Fourier FVE, the official code's model and reading (Fourier_Analysis_Last trains it and "
                        f"reads it at its checkpoint, the first logged test accuracy >= 0.99), {label}",
                        Published(pub, f"about {pub:.0%} ({'standard' if model == 'layernorm' else 'bounded'} "
                                  "models)", YILDIRIM), statistics.mean(v), text,
                        f"{note}; their notebook's own training (its split from the seed, lr {lr:g}) and diagnostics, "
                        "run by benchmarks/peer/sphere_fve_official.py --train on this CPU; the paper's reading: the "
                        "mean of their ten printed U/V values (docs/results/peer/sphere-fve/)"))
    return rows


def _fve_higher_row(ctx: Context, bounded: str, standard: str, at: str) -> Row:
    """The claim "FVE is higher for bounded models": the ratio of geometric means (fully bounded /
    LayerNorm) of the paper's reading over the seeds that reached 0.99, with Welch's interval."""
    vb = [v for r in ctx.group(bounded).runs if (v := r.value("fve_ls_top5", FVE_PHASE)) is not None]
    vs = [v for r in ctx.group(standard).runs if (v := r.value("fve_ls_top5", FVE_PHASE)) is not None]
    ratio, ci = welch_log_ratio(vb, vs)
    ci_text = f" {fmt_ci(ci)}" if ci is not None else ""
    text = (f"{ratio:.3g}{ci_text} (n={len(vb)} / {len(vs)})" if ratio is not None
            else f"n/a (seeds with a value: {len(vb)} / {len(vs)})")
    verdict = interval_verdict(ci, 1.0, claim_above=True, no_ci=f"n={len(vb)} / {len(vs)}") if ratio is not None \
        else undetermined(f"missing: {len(vb)} / {len(vs)} seeds with a value")
    return Row(f"Fourier FVE (the paper's reading), fully bounded sphere / LayerNorm, {at}",
               Published(None, "FVE is higher for bounded models (62% against 29%)", YILDIRIM), ratio, text,
               f"{ctx.sc.note}; ratio of geometric means over seeds, Welch interval on the logs", verdict)


def _an_fve_phases(sc: Scale, scale: str):
    return [("fourier", {}, "phases+phases@0.99")]


register(Experiment(
    "bounded-sphere",
    "LayerNorm vs RMSNorm vs bounded sphere (wd 1, wd 0) vs sphere + Fourier init, modular addition: grok epochs",
    {
        "smoke": Scale.of({**SMOKE, **_SPHERE_TRAIN, "fourier_freqs": "1 2 3"}, SMOKE_NOTE, lrs=[6e-4]),
        "quick": Scale.of({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 2, "fourier_freqs": "1 2 3 4 5"},
                        _QUICK_SPHERE_NOTE + "; Fourier init frequencies 1-5 (our choice for p=23); runs stop 2 "
                        "evaluations after grokking, censored at 6000 steps", lrs=[3e-3], published_lrs=[6e-4]),
        # lr 1e-4 after 6e-4: the 6e-4 arms keep their names and configs; our additions stay at 6e-4
        "paper": Scale.of(SPHERE_PAPER_BASE, _PAPER_SPHERE_NOTE
                        + "; the table's two rates, lr 6e-4 and 1e-4 (our additions at 6e-4 only), capped at 100,000 "
                        "steps (the table's slowest seed: 74,600); the data split is the same for every seed "
                        "(data_seed 598; the paper draws it from the seed, which the *_papersplit arms do)",
                        lrs=[6e-4, 1e-4], ours_lrs=[6e-4],
                        ours=["sphere_wd0_tlinit", "ln_papersplit", "sphere_wd1_papersplit", "sphere_wd0_papersplit"],
                        expect_grok={**_published_grok([6e-4, 1e-4]),
                                     **{f"{a}_papersplit_lr6e-4": SPHERE_TABLE[(6e-4, a)]
                                                                         for a in ("ln", "sphere_wd1", "sphere_wd0")}}),
    },
    _plan_sphere, _read_sphere, no_analyses))

register(Experiment(
    "uniform-attention",
    "each norm (LayerNorm, RMSNorm, bounded sphere) with uniform attention against learned attention",
    {
        "smoke": Scale.of({**SMOKE, **_SPHERE_TRAIN}, SMOKE_NOTE, lr=6e-4),
        "quick": Scale.of({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 2},
                        _QUICK_SPHERE_NOTE + "; censored at 6000 steps", lr=3e-3),
        "paper": Scale.of(SPHERE_PAPER_BASE, _PAPER_SPHERE_NOTE
                        + "; lr 6e-4 as bounded-sphere (its learned-attention runs are these arms' softmax runs); the "
                        "arms are the paper's uniform-attention table's (LayerNorm, RMSNorm, bounded sphere wd 1, and "
                        "bounded sphere + Fourier init wd 1, the frequencies 14 35 41 42 52 of the official code's "
                        "inject_fourier_bias); its notebook (Final_No_attention_all_models) differs: lr 1e-4, betas "
                        "(0.9, 0.98), 20,000 epochs logged every 1,000, the peak test accuracy read, and arms no norm, "
                        "LayerNorm, sphere wd 1 with a plain unembedding and the bounded sphere wd 0",
                        lr=6e-4, fourier_wd1=True,
                        # the table's learned-attention time (v2 errata) costs both arms of the new pair
                        expect_grok={f"sphere_fourier_wd1_{att}": SPHERE_TABLE[(6e-4, "sphere_fourier_wd1")]
                                     for att in ("softmax", "uniform")}),
    },
    _plan_uniform, _read_uniform, no_analyses))

register(Experiment(
    "s5-control",
    "the same variants on S5 composition (negative control): the sphere must not help",
    {
        "smoke": Scale.of({**SMOKE, **_SPHERE_TRAIN, "task": "s5", "train_frac": 0.3, "steps": 10},
                          SMOKE_NOTE + " (S5, 10 steps)"),
        "quick": Scale.of({**_SPHERE_QUICK, "task": "s5", "train_frac": 0.3, "batch_size": 512, "steps": 6000,
                         "stop_after_grok": 2, "eval_every": 100, "checkpoint_every": 500},
                        "S5 (14,400 pairs, 30%), d_model 64, 2 heads, d_mlp 256, lr 3e-3, mini-batches of 512 (the "
                        "paper: d_model 128, lr 1e-3, full batch, up to 100k epochs); censored at 6000 steps", lr=3e-3),
        "paper": Scale.of({**_SPHERE_PAPER, "task": "s5", "steps": 100_000, "stop_after_grok": 2,
                           "grok_threshold": 0.99,
                           "split_rule": "python_shuffle", "data_seed": FROM_SEED}, _S5_NOTEBOOK_NOTE,
                          lr=1e-3, notebook_arms=True, grok_at=0.99),
    },
    _plan_s5, _read_s5, no_analyses))

register(Experiment(
    "fourier-fve",
    "the sphere paper's Fourier FVE (top-5 frequencies of W_L, at the first evaluation with test accuracy >= 0.99) of "
    "the fully bounded sphere (wd 0), the bounded sphere (wd 1) and post-norm LayerNorm",
    {
        "smoke": Scale.of({**SMOKE, **_SPHERE_TRAIN}, SMOKE_NOTE, lr=6e-4),
        "quick": Scale.of({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 10},
                        _QUICK_SPHERE_NOTE + "; trained 10 evaluations past grokking (or 6000 steps)", lr=3e-3),
        "paper": Scale.of(SPHERE_PAPER_BASE, _PAPER_SPHERE_NOTE
                        + "; the bounded-sphere experiment's own paper runs (ln, sphere_wd1, sphere_wd0 at lr 6e-4), "
                        "read at the first evaluation with test accuracy >= 0.99 (the notebook's checkpoint)",
                        lr=6e-4, shared_with_sphere=True),
    },
    _plan_fve, _read_fve, _an_fve_phases))
