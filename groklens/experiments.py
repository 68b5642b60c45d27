"""`groklens reproduce`: the published results of `../shared/REFERENCES.md`, one command each.

An experiment is a named plan of runs at three scales, and a reading of those runs:
    smoke  a tiny end-to-end check for the test suite (p 5-7, widths 8-32, tens of steps, one
           seed): it proves the pipeline, never the result;
    quick  fits a 2-core CPU (minutes to under an hour): smaller p and model than the paper,
           said in each experiment's `quick_note`, in `--list` and in docs/RESULTS.md;
    paper  the published configuration, meant for a GPU.

`reproduce(name, scale, out_dir, seeds)` does, in `out_dir`:
    1. train every run of the plan into `runs/` through `groklens.trainers.sweeps.run_sweep`
       (`groklens.trainers.loop.train`, or batched ensembles of runs that share an
       architecture): runs already complete are skipped, interrupted ones resumed exactly;
    2. analyze them through `groklens.analyses.runner.compute_many` (results in the sidecars);
    3. compare them (`groklens.analyses.compare.compare`, grouped by variant, the experiment's
       baseline first) into `comparison.txt` / `comparison.csv`;
    4. write the report figures and page (`groklens.analyses.report.build_report`) into `report/`;
    5. read the rows: each published number (value and source, from REFERENCES.md) beside ours
       and their ratio ours / published, and what differs in our setup; into `results.json`
       and, unless disabled, docs/RESULTS.md (a rerun of the same command replaces its rows).

Where the source states a claim without a number, the row's published value is None, the
claim is quoted, and `verdict` says whether ours agrees; ratios are then not defined.
Results that disagree with the paper are reported as they are. A grokking time that was not
reached is right-censored: the mean then counts the censoring step and is a lower bound
(shown `> N`), never dropped.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from groklens.errors import BadInput, GroklensError

SCALES = ("smoke", "quick", "paper")
DEFAULT_SEEDS = {"smoke": 1, "quick": 2, "paper": 10}
RESULTS_MD = Path(__file__).resolve().parents[1] / "docs" / "RESULTS.md"
RESULTS_BEGIN = "<!-- reproduce rows: written by `groklens reproduce`; a rerun of a command replaces its rows -->"
RESULTS_END = "<!-- end of reproduce rows -->"

YILDIRIM = "Yildirim 2026, arXiv 2603.05228 (REFERENCES.md table)"
ACTNORM = "Activation-norm penalty ('radial inflation', 2026; REFERENCES.md)"
GEOMDR = "GeomDR (2026; REFERENCES.md)"
STRUCT = "Structural (Bayesian) attention account (2026; REFERENCES.md)"
SCALING = "Grokking scaling law (2026; REFERENCES.md)"
GROKFAST = "Lee et al. 2024, Grokfast (REFERENCES.md)"
PRIETO = "Prieto et al. 2025, 'Grokking at the edge of numerical stability' (REFERENCES.md)"

# Step-time model of the cost estimates (`--list`): seconds per training step =
# STEP_OVERHEAD_S + FLOPs / CPU_FLOPS, evaluation forward passes included. Calibrated with
# benchmarks/train_throughput.py and tiny runs on the 2-core development machine while it was
# shared with other jobs (OMP_NUM_THREADS=1); estimates, not promises.
# Measured 2026-11-30 with two training processes on the 2 cores (load average ~3): the
# canonical p=113 step took 0.41 s (14.6 GFLOP by this model, which ignores that the trainer
# computes the last block at the readout position only), a p=23 d_model-64 step (0.24 GFLOP)
# ~25 ms in `reproduce bounded-sphere --scale quick`. With --workers W the wall time is about
# the estimate / W.
CPU_FLOPS = 3.0e10  # sustained float32 FLOP/s of one shared core
STEP_OVERHEAD_S = 1.5e-2  # per-step overhead (Python, autograd, optimizer, time slicing) of a small model


# ---------------------------------------------------------------------- data types
@dataclass(frozen=True)
class Published:
    value: float | None  # None: the source states the claim without a number
    text: str  # the claim or number as the source states it
    source: str


@dataclass
class Row:
    measure: str
    published: Published
    ours: float | None
    ours_text: str
    differs: str = ""
    verdict: str = ""  # for claims without a number: agrees | disagrees | undetermined (why)
    bound: str = ""  # "lower" / "upper": ours (hence the ratio) is a bound, from censored runs

    def ratio_text(self) -> str:
        r = self.ratio
        if r is None:
            return "n/a"
        return {"lower": ">= ", "upper": "<= "}.get(self.bound, "") + f"{r:.3g}"

    @property
    def ratio(self) -> float | None:
        p, o = self.published.value, self.ours
        if p is None or o is None or p == 0 or not math.isfinite(o):
            return None
        return o / p

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["ratio_text"] = self.ratio_text()
        return d


@dataclass
class Scale:
    base: dict[str, Any]  # config fields shared by every run of the experiment at this scale
    note: str  # what differs from the published setup at this scale
    extra: dict[str, Any] = field(default_factory=dict)  # experiment-specific knobs


@dataclass
class Plan:
    """The runs of one experiment at one scale: variant -> config overrides (on `base`)."""

    variants: dict[str, dict[str, Any]]
    baseline: str | None
    base: dict[str, Any]


@dataclass
class Context:
    """What an experiment's reading gets: its runs, their comparison, the scale."""

    name: str
    scale: str
    sc: Scale
    plan: Plan
    paths: dict[str, list[Path]]  # variant -> run files (one per seed)
    comparison: Any  # groklens.analyses.compare.Comparison
    out_dir: Path

    def group(self, variant: str):
        want = {p.resolve() for p in self.paths[variant]}
        for g in self.comparison.groups:
            if {r.path.resolve() for r in g.runs} == want:
                return g
        raise GroklensError(f"variant {variant} is missing from the comparison")  # pragma: no cover

    def grok(self, variant: str) -> tuple[float | None, str, bool]:
        """Mean grokking step over seeds (censored seeds count their last step), its text, censored?"""
        runs = self.group(variant).runs
        times = [r.grok_time() for r in runs]
        if any(t is None for t in times):
            return None, "no evaluation", True
        mean = sum(times) / len(times)
        cens = sum(r.grok_censored for r in runs)
        sd = (sum((t - mean) ** 2 for t in times) / (len(times) - 1)) ** 0.5 if len(times) > 1 else None
        text = (f"> {mean:.0f}" if cens == len(runs) else f"{mean:.0f}") + (f" ± {sd:.0f}" if sd is not None else "")
        text += f" (n={len(runs)}" + (f", {cens} censored, mean a lower bound)" if 0 < cens < len(runs) else ")")
        return mean, text, cens > 0

    def speedup(self, base: str, variant: str) -> tuple[float | None, str]:
        """Mean grokking step of `base` / that of `variant` (ratio of arithmetic means, as the
        published ratios derived from table means), with censoring bounds."""
        tb, _, cb = self.grok(base)
        tv, _, cv = self.grok(variant)
        if tb is None or tv is None or tv <= 0:
            return None, "n/a (no grokking time)"
        s = tb / tv
        if cb and cv:
            return None, f"undetermined (both censored; {tb:.0f} / {tv:.0f})"
        if cb:
            return s, f">= {s:.2f}x (baseline censored)"
        if cv:
            return s, f"<= {s:.2f}x ({variant} censored)"
        return s, f"{s:.2f}x"

    def measure(self, variant: str, key: str, phase: str) -> tuple[float | None, str]:
        """A stored analysis value (compare's MEASURES key) at a phase, mean over seeds."""
        row = next(r for g, r in zip(self.comparison.groups, self.comparison.rows()) if g is self.group(variant))
        cell = row["analyses"][key][phase]
        if cell["mean"] is None:
            return None, f"missing ({cell['missing']})"
        return cell["mean"], f"{cell['mean']:.4g}" + (f" ± {cell['std']:.2g}" if cell["n"] > 1 else "")


@dataclass
class Experiment:
    name: str
    summary: str
    scales: dict[str, Scale]
    plan: Callable[[Scale, str], Plan]
    read: Callable[[Context], list[Row]]
    analyses: Callable[[Scale, str], list[tuple[str, dict[str, Any], str]]]  # (name, params, where: end|phases|every)

    def seeds_default(self, scale: str) -> int:
        return DEFAULT_SEEDS[scale]


@dataclass
class Result:
    name: str
    scale: str
    seeds: int
    out_dir: Path
    rows: list[Row]
    wall_s: float
    command: str
    runs: list[Path]
    report: Path | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.name, "scale": self.scale, "seeds": self.seeds, "out_dir": str(self.out_dir),
                "command": self.command, "wall_s": self.wall_s, "rows": [r.to_dict() for r in self.rows],
                "runs": [str(p) for p in self.runs], "report": str(self.report) if self.report else None,
                "notes": self.notes}


# ---------------------------------------------------------------------- shared setups
_SMOKE = dict(task="add", p=7, train_frac=0.5, d_model=16, n_heads=2, d_head=8, d_mlp=32, steps=30, eval_every=10,
              checkpoint_every=10, device="cpu")
# the sphere paper's training setup (preset `sphere`): bidirectional, MLP biases, betas (0.9, 0.999), no warm-up
# and PyTorch's default init, as its code (init_scheme=torch)
_SPHERE_TRAIN = dict(causal=False, mlp_bias=True, betas=[0.9, 0.999], warmup_steps=0, init_scheme="torch")
_SPHERE_PAPER = dict(task="add", p=113, train_frac=0.3, d_model=128, n_heads=4, d_head=32, d_mlp=512,
                     eval_every=200, checkpoint_every=1000, device="auto", **_SPHERE_TRAIN)
# Quick scale: one small modular-addition transformer where a pre-LayerNorm model groks in ~2,000
# steps at lr 3e-3 (measured: docs/VARIANTS.md, config B), so baselines grok within a few minutes
# on a 2-core CPU. lr 3e-3 is 5x the sphere paper's 6e-4 (at 6e-4 the LayerNorm baseline needs
# ~10k steps here): absolute grokking times are not comparable, speed-ups and claims are.
_QUICK = dict(task="add", p=23, train_frac=0.5, d_model=64, n_heads=2, d_head=32, d_mlp=256, norm="ln", lr=3e-3,
              weight_decay=1.0, eval_every=50, checkpoint_every=250, device="cpu")
_QUICK_NOTE = ("p=23, 50% of pairs, 1 layer, d_model 64, 2 heads, d_mlp 256, pre-LayerNorm, lr 3e-3 (Nanda: p=113, "
               "30%, d_model 128, 4 heads, d_mlp 512, no norm, lr 1e-3)")
_SPHERE_QUICK = {**_QUICK, **_SPHERE_TRAIN}
_QUICK_SPHERE_NOTE = ("p=23, 50% of pairs, d_model 64, 2 heads, d_mlp 256 (the paper: p=113, 30%, d_model 128, "
                      "4 heads, d_mlp 512); lr 3e-3 compared with the paper's lr 6e-4 row (5x larger: at 6e-4 "
                      "these runs need ~10k steps); evaluation every 50 steps (paper: 200)")
ARCH: dict[str, dict[str, Any]] = {  # the architectures of the sphere paper's table (its baselines are post-norm)
    "ln": {"norm": "ln", "norm_placement": "post", "weight_decay": 1.0},
    "rms": {"norm": "rms", "norm_placement": "post", "weight_decay": 1.0},
    "sphere_wd1": {"norm": "sphere", "unembed": "bounded", "weight_decay": 1.0},
    "sphere_wd0": {"norm": "sphere", "unembed": "bounded", "weight_decay": 0.0},
    "sphere_fourier_wd0": {"norm": "sphere", "unembed": "bounded", "init": "fourier", "weight_decay": 0.0},
}
ARCH_LABEL = {"ln": "LayerNorm", "rms": "RMSNorm", "sphere_wd1": "bounded sphere, wd 1.0",
              "sphere_wd0": "bounded sphere, wd 0", "sphere_fourier_wd0": "bounded sphere + Fourier init, wd 0"}
# Yildirim 2026 table: (lr, arch) -> mean grok epoch
SPHERE_TABLE = {
    (1e-4, "ln"): 54_160, (1e-4, "rms"): 51_240, (6e-4, "ln"): 7_800, (6e-4, "rms"): 7_300,
    (1e-4, "sphere_wd1"): 2_400, (1e-4, "sphere_wd0"): 2_480, (1e-4, "sphere_fourier_wd0"): 2_100,
    (6e-4, "sphere_wd1"): 1_560, (6e-4, "sphere_wd0"): 820, (6e-4, "sphere_fourier_wd0"): 711,
}


def grok_row(ctx: Context, measure: str, published: Published, variant: str, differs: str) -> Row:
    """A grokking-time row: mean over seeds; a censored seed makes ours a lower bound."""
    ours, text, cens = ctx.grok(variant)
    return Row(measure, published, ours, text, differs, bound="lower" if cens and ours is not None else "")


def speedup_row(ctx: Context, measure: str, published: Published, base: str, variant: str, differs: str,
                verdict: bool = False) -> Row:
    ours, text = ctx.speedup(base, variant)
    bound = "lower" if text.startswith(">=") else "upper" if text.startswith("<=") else ""
    return Row(measure, published, ours, text, differs, _verdict_faster(ours, text) if verdict else "", bound)


def _lr_tag(lr: float) -> str:
    """6e-4 -> '6e-4', 1.5e-3 -> '1.5e-3' (run names)."""
    mant, exp = f"{lr:e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


# ---------------------------------------------------------------------- bounded-sphere
def _plan_sphere(sc: Scale, scale: str) -> Plan:
    variants = {f"{a}_lr{_lr_tag(lr)}": {**ARCH[a], "lr": lr} for lr in sc.extra["lrs"] for a in ARCH}
    return Plan(variants, f"ln_lr{_lr_tag(sc.extra['lrs'][0])}", sc.base)


def _read_sphere(ctx: Context) -> list[Row]:
    rows = []
    lrs = ctx.sc.extra["lrs"]
    for lr, pub_lr in zip(lrs, ctx.sc.extra.get("published_lrs", lrs)):  # quick: our lr != the paper's
        tag = _lr_tag(lr)
        at = f"lr {lr:g}" if lr == pub_lr else f"lr {lr:g} (published: lr {pub_lr:g})"
        for a in ARCH:
            pub = SPHERE_TABLE[(pub_lr, a)]
            rows.append(grok_row(ctx, f"grok epoch, {ARCH_LABEL[a]}, {at}",
                                 Published(pub, f"{pub:,} (mean of 10 seeds)", YILDIRIM), f"{a}_lr{tag}", ctx.sc.note))
        for a in ("sphere_wd1", "sphere_wd0", "sphere_fourier_wd0"):
            pub = SPHERE_TABLE[(pub_lr, "ln")] / SPHERE_TABLE[(pub_lr, a)]
            rows.append(speedup_row(ctx, f"speed-up of {ARCH_LABEL[a]} over LayerNorm, {at}",
                                    Published(pub, f"{pub:.2f}x (derived: ratio of the table's means)", YILDIRIM),
                                    f"ln_lr{tag}", f"{a}_lr{tag}", ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- uniform-attention
def _plan_uniform(sc: Scale, scale: str) -> Plan:
    variants = {}
    for a in ("ln", "rms", "sphere_wd1"):
        for att in ("softmax", "uniform"):
            variants[f"{a}_{att}"] = {**ARCH[a], "attention": att, "lr": sc.extra["lr"]}
    return Plan(variants, "ln_softmax", sc.base)


def _read_uniform(ctx: Context) -> list[Row]:
    rows = []
    claim = Published(None, "uniform attention removes most of the grokking delay (no number in REFERENCES.md)",
                      YILDIRIM)
    for a in ("ln", "rms", "sphere_wd1"):
        rows.append(speedup_row(ctx, f"speed-up of uniform over learned attention, {ARCH_LABEL[a]}", claim,
                                f"{a}_softmax", f"{a}_uniform", ctx.sc.note, verdict=True))
    for a in ("ln", "rms", "sphere_wd1"):
        rows.append(grok_row(ctx, f"grok epoch, {ARCH_LABEL[a]} + uniform attention",
                             Published(None, "no number in REFERENCES.md", YILDIRIM), f"{a}_uniform", ctx.sc.note))
    return rows


def _verdict_faster(s: float | None, text: str) -> str:
    """Does a speed-up (with its censoring bound in `text`) say 'faster' (> 1)?"""
    if s is None:
        return text if text.startswith("undetermined") else f"undetermined ({text})"
    if text.startswith(">="):  # a lower bound
        return "agrees" if s > 1 else "undetermined (baseline censored)"
    if text.startswith("<="):  # an upper bound
        return "disagrees" if s <= 1 else "undetermined (variant censored)"
    return "agrees" if s > 1 else "disagrees"


# ---------------------------------------------------------------------- s5-control
def _plan_s5(sc: Scale, scale: str) -> Plan:
    archs = ("ln", "rms", "sphere_wd1", "sphere_wd0")  # Fourier init needs residue tokens: not on S5
    return Plan({a: {**ARCH[a], "lr": sc.extra.get("lr", 1e-3)} for a in archs}, "ln", sc.base)


def _read_s5(ctx: Context) -> list[Row]:
    claim = Published(None, "the spherical constraint does not make S5 generalize faster (speed-up <= 1)", YILDIRIM)
    rows = []
    for a in ("sphere_wd1", "sphere_wd0"):
        ours, text = ctx.speedup("ln", a)
        if ours is None:
            verdict = text if text.startswith("undetermined") else f"undetermined ({text})"
        elif text.startswith(">="):
            verdict = "disagrees" if ours > 1.05 else "undetermined (baseline censored)"
        elif text.startswith("<="):
            verdict = "agrees" if ours <= 1.05 else "undetermined (sphere censored)"
        else:
            verdict = "agrees" if ours <= 1.05 else "disagrees"
        rows.append(Row(f"S5: speed-up of {ARCH_LABEL[a]} over LayerNorm", claim, ours, text, ctx.sc.note, verdict))
    for a in ("ln", "rms", "sphere_wd1", "sphere_wd0"):
        rows.append(grok_row(ctx, f"S5: grok epoch, {ARCH_LABEL[a]}", Published(None, "no number in REFERENCES.md", YILDIRIM),
                             a, ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- fourier-fve
def _plan_fve(sc: Scale, scale: str) -> Plan:
    return Plan({"standard": {**ARCH["ln"], "lr": sc.extra["lr"]},
                 "bounded": {**ARCH["sphere_wd1"], "lr": sc.extra["lr"]}}, "standard", sc.base)


def _read_fve(ctx: Context) -> list[Row]:
    rows = []
    diff = ctx.sc.note + "; LS FVE = mean over the top-5 frequencies' cos and sin directions (our reading, docs/ANALYSES.md)"
    for v, pub in (("bounded", 0.62), ("standard", 0.29)):
        ours, text = ctx.measure(v, "fve_ls", "end")
        _, gtext, cens = ctx.grok(v)
        text += f" (grokked at {gtext})" if not cens else f" (never grokked: {gtext})"
        rows.append(Row(f"Fourier FVE (least squares, 2c) at the end, {v} ({'bounded sphere wd 1' if v == 'bounded' else 'LayerNorm'})",
                        Published(pub, f"about {pub:.0%}", YILDIRIM), ours, text, diff))
    for v in ("bounded", "standard"):
        ours, text = ctx.measure(v, "fve_neuron", "end")
        rows.append(Row(f"Fourier FVE (neuron, Nanda 2b) at the end, {v}",
                        Published(None, "not reported (the paper reports the least-squares variant)", YILDIRIM),
                        ours, text, ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- activation-norm
def _plan_actnorm(sc: Scale, scale: str) -> Plan:
    lam = sc.extra["lambda"]
    mlp = {**sc.extra["mlp"]}
    return Plan({"tf_base": {}, "tf_actnorm": {"act_norm_lambda": lam},
                 "mlp_base": mlp, "mlp_actnorm": {**mlp, "act_norm_lambda": lam}}, "tf_base", sc.base)


def _read_actnorm(ctx: Context) -> list[Row]:
    rows = []
    lam = ctx.sc.extra["lambda"]
    diff = f"{ctx.sc.note}; lambda {lam:g} (our single untuned choice; the paper's value is not in REFERENCES.md)"
    for m, label in (("tf", "transformer"), ("mlp", "MLP")):
        rows.append(speedup_row(ctx, f"speed-up of the sqrt(d) penalty, {label}", Published(6.0, "up to 6x", ACTNORM),
                                f"{m}_base", f"{m}_actnorm", diff))
    for m, label in (("tf", "transformer"), ("mlp", "MLP")):
        for v in (f"{m}_base", f"{m}_actnorm"):
            rho, rtext = ctx.measure(v, "rho", "end")
            base = _rho_baseline(ctx, v)
            ratio = None if rho is None or base is None else rho / base
            verdict = "undetermined (missing)" if ratio is None else ("agrees" if ratio < 1 else "disagrees")
            rows.append(Row(f"radial gradient energy rho / (1/d) at the end, {label}, {'penalty' if 'actnorm' in v else 'baseline'}",
                            Published(None, "rho below the isotropic 1/d baseline (Proposition ii; no number)", ACTNORM),
                            ratio, f"{ratio:.3g} (rho {rtext})" if ratio is not None else rtext, diff,
                            verdict if "actnorm" in v else ""))
        r_base, _ = ctx.measure(f"{m}_base", "hessian_top", "end")
        r_act, _ = ctx.measure(f"{m}_actnorm", "hessian_top", "end")
        ratio = r_act / r_base if r_act is not None and r_base not in (None, 0) else None
        rows.append(Row(f"Hessian top eigenvalue at the end, penalty / baseline, {label}",
                        Published(None, "flatter minima (Proposition iii; no number)", ACTNORM), ratio,
                        f"{ratio:.3g}" if ratio is not None else "missing", diff,
                        "undetermined (missing)" if ratio is None else "agrees" if ratio < 1 else "disagrees"))
        rad, rtext = ctx.measure(f"{m}_actnorm", "radius", "end")
        rows.append(Row(f"activation radius ||h||/sqrt(d) at the end, {label}, penalty",
                        Published(1.0, "held softly on the sqrt(d) sphere (radius 1)", ACTNORM), rad, rtext, diff))
    return rows


def _rho_baseline(ctx: Context, variant: str) -> float | None:
    """1/d of the site compare reads rho at (stored beside rho by the radial analysis)."""
    g = ctx.group(variant)
    vals = []
    for r in g.runs:
        key = r.value_keys.get("rho")
        st = r.stored.get("radial")
        end = r.phase_steps.get("end")
        if key is None or st is None or end is None:
            return None
        rows = st.rows()
        if end not in rows:
            return None
        vals.append(float(rows[end][key.replace("rho@", "rho_baseline@")]))
    return sum(vals) / len(vals) if vals else None


# ---------------------------------------------------------------------- geomdr
def _plan_geomdr(sc: Scale, scale: str) -> Plan:
    variants: dict[str, dict[str, Any]] = {"base": {}}
    lam, steps = sc.extra["lambda"], sc.base["steps"]
    for t in sc.extra["targets"]:
        variants[f"geomdr_t{t:g}_always"] = {"geomdr_lambda": lam, "geomdr_target": float(t)}
        variants[f"geomdr_t{t:g}_early"] = {"geomdr_lambda": lam, "geomdr_target": float(t),
                                            "geomdr_end": max(1, steps // 4)}
    return Plan(variants, "base", sc.base)


def _read_geomdr(ctx: Context) -> list[Row]:
    rows = []
    lam = ctx.sc.extra["lambda"]
    diff = (f"{ctx.sc.note}; GeomDR is our definition (docs/VARIANTS.md), lambda {lam:g}, targets "
            f"{', '.join(f'{t:g}' for t in ctx.sc.extra['targets'])}, always on or for the first quarter")
    best = None
    for v in ctx.plan.variants:
        if v == "base":
            continue
        row = speedup_row(ctx, f"speed-up of GeomDR ({v}) over AdamW", Published(52.0, "up to 52x", GEOMDR), "base", v, diff)
        rows.append(row)
        if row.ours is not None and (best is None or row.ours > best.ours):
            best = row
    if best is not None:
        rows.insert(0, Row("best speed-up of GeomDR over AdamW", best.published, best.ours,
                           f"{best.ours_text} ({best.measure.split('(')[1].split(')')[0]})", diff, bound=best.bound))
    else:
        rows.insert(0, Row("best speed-up of GeomDR over AdamW", Published(52.0, "up to 52x", GEOMDR), None,
                           "n/a (no grokking time)", diff))
    mem, mtext = ctx.measure("base", "eff_rank", "memorization")
    grok, gtext = ctx.measure("base", "eff_rank", "grokking")
    ratio = grok / mem if grok is not None and mem not in (None, 0) else None
    rows.append(Row("baseline: effective rank (Roy-Vetterli, centred, last hidden layer) at grokking / at memorization",
                    Published(None, "effective dimensionality collapses before grokking (< 1; no number)", GEOMDR),
                    ratio, f"{ratio:.3g} ({gtext} / {mtext})" if ratio is not None else f"{gtext} / {mtext}", ctx.sc.note,
                    "undetermined (missing)" if ratio is None else "agrees" if ratio < 1 else "disagrees"))
    return rows


# ---------------------------------------------------------------------- structural-attention
def _plan_struct(sc: Scale, scale: str) -> Plan:
    wd0, beta_wd = sc.extra["wds"], sc.extra["beta_wd"]
    variants = {f"wd{wd:g}": {"weight_decay": wd} for wd in wd0}
    for beta in sc.extra["betas"]:  # beta 0 is the baseline: weight decay beta_wd, no intervention
        if beta > 0:
            variants[f"kl{beta:g}"] = {"weight_decay": beta_wd, "kl_attn_beta": beta}
    base = f"wd{beta_wd:g}" if beta_wd in wd0 else None
    if base is None:
        variants["kl0"] = {"weight_decay": beta_wd}
        base = "kl0"
    return Plan(variants, base, sc.base)


def _fit_exponent(ctx: Context, variants: list[str], var: str, delay: bool) -> tuple[float | None, str]:
    """OLS exponent of log T (or log of the delay T - memorization) on log `var`, over the runs of
    `variants` (analyses.scaling.fit_scaling_law; censored runs left out and counted)."""
    from groklens.analyses.scaling import GrokRecord, fit_scaling_law

    recs = []
    for v in variants:
        for r in ctx.group(v).runs:
            t = r.grokking
            if delay and t is not None:
                t = None if r.memorization is None else max(t - r.memorization, 1)
            recs.append(GrokRecord(r.name, {var: float(r.config[var])}, t, r.last_step))
    try:
        fit = fit_scaling_law(recs, [var])
    except BadInput as exc:
        return None, f"no fit: {exc}"
    e = fit["ols"]["exponents"][var]
    return e["estimate"], (f"{e['estimate']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}] "
                           f"(R^2 {fit['ols']['r2']:.2f}, {fit['n_grokked']} grokked, {fit['n_censored']} censored)")


def _read_struct(ctx: Context) -> list[Row]:
    x = ctx.sc.extra
    diff = f"{ctx.sc.note}; KL intervention is our definition (REFERENCES.md def. 3)"
    wd_vars = [f"wd{w:g}" for w in x["wds"]]
    beta_vars = [f"kl{b:g}" for b in x["betas"] if b > 0]
    rows = []
    e, text = _fit_exponent(ctx, wd_vars, "weight_decay", delay=False)
    rows.append(Row("exponent of grokking time in weight decay", Published(-1.0, "delay inversely proportional to weight decay", STRUCT),
                    e, text, diff + "; fitted on the grokking step"))
    e, text = _fit_exponent(ctx, beta_vars, "kl_attn_beta", delay=True)
    rows.append(Row("exponent of the delay (grok - memorization) in KL strength beta",
                    Published(-1.0, "delay shortened inversely with the KL strength", STRUCT), e, text, diff))
    base = ctx.plan.baseline
    mem, mtext = ctx.measure(base, "attn_mass", "memorization")
    grok, gtext = ctx.measure(base, "attn_mass", "grokking")
    ratio = grok / mem if grok is not None and mem not in (None, 0) else None
    rows.append(Row("attention mass on informative tokens (readout query), at grokking / at memorization, baseline",
                    Published(None, "attention must reach enough mass on every informative token; the memorizing MLP "
                              "starves it first (> 1; no number)", STRUCT), ratio,
                    f"{ratio:.3g} ({gtext} / {mtext})" if ratio is not None else f"{gtext} / {mtext}", diff,
                    "undetermined (missing)" if ratio is None else "agrees" if ratio > 1 else "disagrees"))
    for b in x["betas"]:
        if b > 0:
            rows.append(speedup_row(ctx, f"speed-up of the KL intervention beta {b:g}",
                                    Published(None, "shorter delay (no number)", STRUCT), base, f"kl{b:g}", diff,
                                    verdict=True))
    return rows


# ---------------------------------------------------------------------- scaling-law
SCALING_PUBLISHED = {"width": -0.27, "train_frac": -2.04, "lr": -0.50, "weight_decay": -0.64}


def _plan_scaling(sc: Scale, scale: str) -> Plan:
    import itertools

    ax = sc.extra["axes"]
    variants = {}
    for h, d, lr, wd in itertools.product(ax["d_mlp"], ax["train_frac"], ax["lr"], ax["weight_decay"]):
        variants[f"h{h}_d{d:g}_lr{_lr_tag(lr)}_wd{wd:g}"] = {"d_mlp": h, "train_frac": d, "lr": lr, "weight_decay": wd}
    return Plan(variants, None, sc.base)


def _read_scaling(ctx: Context) -> list[Row]:
    from groklens.analyses.scaling import DEFAULT_VARS, scaling_law

    diff = ctx.sc.note + "; D = train_frac (the paper's D is the training data size: the same exponent when p is fixed)"
    try:
        res = scaling_law(ctx.out_dir / "runs", list(DEFAULT_VARS), write=True)
        fit, err = res["ols"], None
    except BadInput as exc:
        res, fit, err = None, None, str(exc)
    names = {"width": "H (width)", "train_frac": "D (data)", "lr": "eta (learning rate)", "weight_decay": "lambda (weight decay)"}
    rows = []
    for v in DEFAULT_VARS:
        if fit is None:
            ours, text = None, f"no fit: {err}"
        else:
            e = fit["exponents"][v]
            ours, text = e["estimate"], f"{e['estimate']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}]"
        rows.append(Row(f"scaling exponent of {names[v]}", Published(SCALING_PUBLISHED[v], f"{SCALING_PUBLISHED[v]:+.2f}", SCALING),
                        ours, text, diff))
    r2 = None if fit is None else fit["r2"]
    extra = "" if res is None else f" ({res['n_grokked']} grokked, {res['n_censored']} censored runs left out)"
    rows.append(Row("R^2 of the power-law fit", Published(0.732, "0.732 (0.821 with interactions)", SCALING), r2,
                    (f"{r2:.3f}" + extra) if r2 is not None else f"no fit: {err}", diff))
    return rows


# ---------------------------------------------------------------------- nanogpt-addition
def _plan_nanogpt(sc: Scale, scale: str) -> Plan:
    return Plan({"base": {}, "actnorm": {"act_norm_lambda": sc.extra["lambda"]}}, "base", sc.base)


def _read_nanogpt(ctx: Context) -> list[Row]:
    diff = f"{ctx.sc.note}; lambda {ctx.sc.extra['lambda']:g} (our choice); grokking = exact-match test accuracy >= 0.95"
    rows = [speedup_row(ctx, "speed-up of the sqrt(d) penalty, nanoGPT on 3-digit addition",
                        Published(2.0, "halves the training steps (2x)", ACTNORM), "base", "actnorm", diff)]
    for v in ("base", "actnorm"):
        rows.append(grok_row(ctx, f"steps to 95% exact-match test accuracy, {v}",
                             Published(None, "no number in REFERENCES.md", ACTNORM), v, diff))
    return rows


# ---------------------------------------------------------------------- grokfast
def _plan_grokfast(sc: Scale, scale: str) -> Plan:
    return Plan({"base": {}, "grokfast": {"grokfast_alpha": 0.98, "grokfast_lambda": 2.0}}, "base", sc.base)


def _read_grokfast(ctx: Context) -> list[Row]:
    diff = (f"{ctx.sc.note}; our transformer and AdamW with wd 1 (Grokfast's own model and optimizer settings "
            "are not in REFERENCES.md)")
    rows = []
    for v, pub in (("base", 39_890), ("grokfast", 910)):
        rows.append(grok_row(ctx, f"iterations to 95% validation accuracy, {'baseline' if v == 'base' else 'Grokfast-EMA (alpha 0.98, lambda 2)'}",
                             Published(pub, f"{pub:,}", GROKFAST), v, diff))
    rows.append(speedup_row(ctx, "speed-up of Grokfast-EMA", Published(39_890 / 910, "43.8x (derived: 39,890 / 910)", GROKFAST),
                            "base", "grokfast", diff))
    return rows


# ---------------------------------------------------------------------- stablemax
def _plan_stablemax(sc: Scale, scale: str) -> Plan:
    return Plan({"ce_wd1": {"weight_decay": 1.0}, "ce_wd0": {"weight_decay": 0.0},
                 "stablemax_wd0": {"loss": "stablemax", "weight_decay": 0.0},
                 "perp_wd0": {"perp_grad": True, "weight_decay": 0.0},
                 "stablemax_perp_wd0": {"loss": "stablemax", "perp_grad": True, "weight_decay": 0.0}}, "ce_wd1", sc.base)


def _read_stablemax(ctx: Context) -> list[Row]:
    rows = []
    labels = {"ce_wd0": "softmax CE, wd 0", "stablemax_wd0": "StableMax, wd 0", "perp_wd0": "perpendicular gradient, wd 0",
              "stablemax_perp_wd0": "StableMax + perpendicular gradient, wd 0"}
    steps = ctx.sc.base["steps"]
    for v, label in labels.items():
        row = speedup_row(ctx, f"speed-up over softmax CE with wd 1: {label}",
                          Published(None, "softmax collapse stops grokking without weight decay; StableMax and "
                                    "the perpendicular gradient remove it (no number in REFERENCES.md)", PRIETO),
                          "ce_wd1", v, ctx.sc.note)
        runs = ctx.group(v).runs
        n_grokked = sum(not r.grok_censored for r in runs)
        should_grok = v != "ce_wd0"  # the claim: plain softmax CE without weight decay does not grok
        if 0 < n_grokked < len(runs):
            row.verdict = f"undetermined ({n_grokked} of {len(runs)} seeds grokked)"
        elif (n_grokked == len(runs)) == should_grok:
            row.verdict = "agrees" + ("" if should_grok else f" (no seed grokked within {steps} steps)")
        else:
            row.verdict = "disagrees" + (f" (no seed grokked within {steps} steps)" if should_grok else "")
        rows.append(row)
    for v in ("ce_wd1", *labels):
        rows.append(grok_row(ctx, f"grok step, {labels.get(v, 'softmax CE, wd 1 (baseline)')}",
                             Published(None, "no number in REFERENCES.md", PRIETO), v, ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- analyses per experiment
def _an_none(sc: Scale, scale: str):
    return []


def _an_fve(sc: Scale, scale: str):
    return [("fourier", {}, "end")]


def _an_actnorm(sc: Scale, scale: str):
    small = scale == "smoke"
    return [("radial", {}, "phases"),
            ("sharpness", {"top_k": 1, "trace_samples": 2 if small else 10, "maxiter": 50 if small else None}, "end")]


def _an_rank(sc: Scale, scale: str):
    return [("rank", {"weights": []}, "every")]


def _an_attention(sc: Scale, scale: str):
    return [("attention", {}, "every")]


# ---------------------------------------------------------------------- the registry
def _scale(base: dict, note: str, **extra) -> Scale:
    return Scale(base, note, extra)


_SMOKE_NOTE = "smoke: a tiny pipeline check, not a reproduction (p=7, d_model 16, 30 steps)"
_PAPER_SPHERE_NOTE = "the published setup (post-norm baselines, PyTorch's default init as the paper's code)"

EXPERIMENTS: dict[str, Experiment] = {}


def _register(e: Experiment) -> None:
    if e.name in EXPERIMENTS:  # pragma: no cover
        raise ValueError(f"duplicate experiment {e.name}")
    EXPERIMENTS[e.name] = e


_register(Experiment(
    "bounded-sphere",
    "LayerNorm vs RMSNorm vs bounded sphere (wd 1, wd 0) vs sphere + Fourier init, modular addition: grok epochs",
    {
        "smoke": _scale({**_SMOKE, **_SPHERE_TRAIN, "fourier_freqs": "1 2 3"}, _SMOKE_NOTE, lrs=[6e-4]),
        "quick": _scale({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 2, "fourier_freqs": "1 2 3 4 5"},
                        _QUICK_SPHERE_NOTE + "; Fourier init frequencies 1-5 (our choice for p=23); runs stop 2 "
                        "evaluations after grokking, censored at 6000 steps", lrs=[3e-3], published_lrs=[6e-4]),
        "paper": _scale({**_SPHERE_PAPER, "steps": 100_000, "stop_after_grok": 2}, _PAPER_SPHERE_NOTE, lrs=[6e-4]),
    },
    _plan_sphere, _read_sphere, _an_none))

_register(Experiment(
    "uniform-attention",
    "each norm (LayerNorm, RMSNorm, bounded sphere) with uniform attention against learned attention",
    {
        "smoke": _scale({**_SMOKE, **_SPHERE_TRAIN}, _SMOKE_NOTE, lr=6e-4),
        "quick": _scale({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 2},
                        _QUICK_SPHERE_NOTE + "; censored at 6000 steps", lr=3e-3),
        "paper": _scale({**_SPHERE_PAPER, "steps": 100_000, "stop_after_grok": 2}, _PAPER_SPHERE_NOTE, lr=6e-4),
    },
    _plan_uniform, _read_uniform, _an_none))

_register(Experiment(
    "s5-control",
    "the same variants on S5 composition (negative control): the sphere must not help",
    {
        "smoke": _scale({**_SMOKE, **_SPHERE_TRAIN, "task": "s5", "train_frac": 0.3, "steps": 10}, _SMOKE_NOTE + " (S5, 10 steps)"),
        "quick": _scale({**_SPHERE_QUICK, "task": "s5", "train_frac": 0.3, "batch_size": 512, "steps": 6000,
                         "stop_after_grok": 2, "eval_every": 100, "checkpoint_every": 500},
                        "S5 (14,400 pairs, 30%), d_model 64, 2 heads, d_mlp 256, lr 3e-3, mini-batches of 512 (the "
                        "paper: d_model 128, lr 1e-3, full batch, up to 100k epochs); censored at 6000 steps", lr=3e-3),
        "paper": _scale({**_SPHERE_PAPER, "task": "s5", "steps": 100_000, "stop_after_grok": 2}, _PAPER_SPHERE_NOTE),
    },
    _plan_s5, _read_s5, _an_none))

_register(Experiment(
    "fourier-fve",
    "least-squares and neuron Fourier FVE of bounded vs standard (LayerNorm) models at the end of training",
    {
        "smoke": _scale({**_SMOKE, **_SPHERE_TRAIN}, _SMOKE_NOTE, lr=6e-4),
        "quick": _scale({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 10},
                        _QUICK_SPHERE_NOTE + "; trained 10 evaluations past grokking (or 6000 steps)", lr=3e-3),
        "paper": _scale({**_SPHERE_PAPER, "steps": 100_000, "stop_after_grok": 25}, _PAPER_SPHERE_NOTE
                        + "; trained 25 evaluations past grokking (when the paper measured is not in REFERENCES.md)", lr=6e-4),
    },
    _plan_fve, _read_fve, _an_fve))

_register(Experiment(
    "activation-norm",
    "the sqrt(d) activation-norm penalty against the baseline, MLP and transformer: speed-up, radius and rho "
    "against 1/d, Hessian sharpness at the end",
    {
        "smoke": _scale({**_SMOKE}, _SMOKE_NOTE, **{"lambda": 1.0, "mlp": {"model": "mlp", "n_layers": 2, "mlp_bias": True}}),
        "quick": _scale({**_QUICK, "steps": 6000, "stop_after_grok": 2},
                        _QUICK_NOTE + "; MLP: 2 hidden layers of 256, embeddings 64 wide, lr 1e-2 (it grokked at step 1200 "
                        "with it, at 5800 with 3e-3: one seed); censored at 6000 steps",
                        **{"lambda": 1.0, "mlp": {"model": "mlp", "n_layers": 2, "mlp_bias": True, "norm": "none",
                                                  "lr": 1e-2}}),
        "paper": _scale(dict(task="add", steps=40_000, stop_after_grok=2, eval_every=100, checkpoint_every=1000),
                        "Nanda's canonical p=113 setup; the MLP is preset `mlp` (widths ours: the paper's are not in "
                        "REFERENCES.md)",
                        **{"lambda": 1.0, "mlp": {"model": "mlp", "n_layers": 2, "d_model": 128, "d_mlp": 256,
                                                  "mlp_bias": True}}),
    },
    _plan_actnorm, _read_actnorm, _an_actnorm))

_register(Experiment(
    "geomdr",
    "GeomDR effective-rank regularizer: targets and schedules against AdamW; effective-rank collapse before "
    "grokking in the baseline",
    {
        "smoke": _scale({**_SMOKE}, _SMOKE_NOTE, **{"lambda": 1.0, "targets": [4]}),
        "quick": _scale({**_QUICK, "steps": 6000, "stop_after_grok": 2},
                        _QUICK_NOTE + "; censored at 6000 steps", **{"lambda": 1.0, "targets": [4, 16]}),
        "paper": _scale(dict(task="add", steps=40_000, stop_after_grok=2, eval_every=100, checkpoint_every=500),
                        "Nanda's canonical p=113 setup (the GeomDR paper's model is not in REFERENCES.md)",
                        **{"lambda": 1.0, "targets": [4, 8, 16, 32]}),
    },
    _plan_geomdr, _read_geomdr, _an_rank))

# seq_add with 2 separate distractor tokens: with residue distractors (p=17, L=6; p=23, L=3) the
# quick baseline memorizes at step 50 and stays at chance for 6,000 steps (docs/RESULTS.md)
_SEQ_QUICK = dict(task="seq_add", p=23, seq_len=4, n_informative=2, informative_layout="first", distractor_vocab=2,
                  train_frac=0.5, d_model=64, n_heads=2, d_head=32, d_mlp=256, norm="ln", lr=3e-3, steps=6000,
                  eval_every=50, checkpoint_every=250, stop_after_grok=2, device="cpu")
_SEQ_PAPER = dict(_SEQ_QUICK, p=53, seq_len=8, informative_layout="spread", distractor_vocab=0)
_register(Experiment(
    "structural-attention",
    "informative-token task: grokking time against weight decay and against KL strength beta (the two inverse "
    "laws); attention mass on the informative tokens over training",
    {
        "smoke": _scale({**_SMOKE, "task": "seq_add", "p": 5, "seq_len": 4, "n_informative": 2,
                         "informative_layout": "spread"}, _SMOKE_NOTE + " (seq_add p=5, L=4)",
                        wds=[0.5, 1.0, 2.0], betas=[1.0], beta_wd=1.0),
        "quick": _scale(_SEQ_QUICK, "seq_add: p=23, L=4, the k=2 informative tokens first, then 2 positions of 2 "
                        "separate distractor tokens; 1 layer d_model 64, pre-LayerNorm, lr 3e-3; censored at 6000 steps "
                        "(the paper's tasks and sizes are not in REFERENCES.md)",
                        wds=[0.3, 1.0, 3.0], betas=[0.1, 0.3, 1.0], beta_wd=1.0),
        "paper": _scale({**_SEQ_PAPER, "d_model": 128, "n_heads": 4, "d_mlp": 512,
                         "steps": 50_000, "eval_every": 100, "checkpoint_every": 1000, "device": "auto"},
                        "seq_add p=53, L=8, k=2 (our sizes: the paper's are not in REFERENCES.md)",
                        wds=[0.1, 0.3, 1.0, 3.0], betas=[0.03, 0.1, 0.3, 1.0], beta_wd=0.3),
    },
    _plan_struct, _read_struct, _an_attention))

_register(Experiment(
    "scaling-law",
    "two-hidden-layer MLP grid over width, data, learning rate and weight decay; fitted power-law exponents",
    {
        "smoke": _scale({**_SMOKE, "model": "mlp", "n_layers": 2, "mlp_bias": True, "steps": 20}, _SMOKE_NOTE + " (MLP grid 2x2x2x1)",
                        axes={"d_mlp": [16, 32], "train_frac": [0.4, 0.6], "lr": [1e-3, 3e-3], "weight_decay": [1.0]}),
        "quick": _scale(dict(task="add", p=23, model="mlp", n_layers=2, d_model=64, mlp_bias=True, steps=6000,
                             eval_every=50, checkpoint_every=1000, stop_after_grok=1, device="cpu"),
                        "MLP grid of 16 (2 values per axis: width 128, 256; train_frac 0.5, 0.7; lr 5e-3, 1e-2; wd 1, 3), "
                        "p=23, embeddings 64 wide; censored at 6000 steps (the paper: 384 configurations)",
                        axes={"d_mlp": [128, 256], "train_frac": [0.5, 0.7], "lr": [5e-3, 1e-2], "weight_decay": [1.0, 3.0]}),
        "paper": _scale(dict(task="add", p=97, model="mlp", n_layers=2, d_model=128, mlp_bias=True, steps=100_000,
                             eval_every=100, checkpoint_every=5000, stop_after_grok=1, device="auto"),
                        "384 configurations (4 widths x 4 data x 4 lr x 6 wd), p=97 (the paper's p and grid values "
                        "are not in REFERENCES.md: ours)",
                        axes={"d_mlp": [64, 128, 256, 512], "train_frac": [0.3, 0.4, 0.5, 0.6],
                              "lr": [3e-4, 1e-3, 3e-3, 1e-2], "weight_decay": [0.1, 0.3, 0.5, 1.0, 2.0, 3.0]}),
    },
    _plan_scaling, _read_scaling, _an_none))

_register(Experiment(
    "nanogpt-addition",
    "3-digit addition with the ~10M-parameter causal transformer, with and without the activation-norm penalty",
    {
        "smoke": _scale({"task": "digits_add", "n_digits": 1, "norm": "ln",
                         "act_fn": "gelu", "causal": True, "mlp_bias": True, "n_layers": 1, "d_model": 16, "n_heads": 2,
                         "d_head": 8, "d_mlp": 32, "train_frac": 0.5, "lr": 3e-3, "batch_size": 0, "steps": 20,
                         "eval_every": 10, "checkpoint_every": 10, "warmup_steps": 5, "device": "cpu"},
                        _SMOKE_NOTE + " (1-digit addition, 1 layer)", **{"lambda": 0.1}),
        "quick": _scale({"preset": "nanogpt_tiny", "steps": 6000, "eval_every": 100, "checkpoint_every": 1000,
                         "stop_after_grok": 1, "device": "cpu"},
                        "preset nanogpt_tiny: 2-digit addition, 2 layers x 32 wide (the paper: 3 digits, ~10M "
                        "parameters); censored at 6000 steps", **{"lambda": 0.1}),
        "paper": _scale({"preset": "nanogpt_10m", "stop_after_grok": 1, "device": "auto"},
                        "preset nanogpt_10m (10.6M parameters; training setup ours: docs/VARIANTS.md)", **{"lambda": 0.1}),
    },
    _plan_nanogpt, _read_nanogpt, _an_none))

_register(Experiment(
    "grokfast",
    "Grokfast-EMA (alpha 0.98, lambda 2) against the baseline on x*y mod p, 50% train",
    {
        "smoke": _scale({**_SMOKE, "task": "mul"}, _SMOKE_NOTE + " (x*y mod 7)"),
        "quick": _scale({**_QUICK, "task": "mul", "steps": 6000, "stop_after_grok": 1},
                        "x*y mod 23 (the paper: mod 97), " + _QUICK_NOTE.split(", ", 2)[2] + "; censored at 6000 steps"),
        "paper": _scale(dict(task="mul", p=97, train_frac=0.5, steps=60_000, eval_every=10, checkpoint_every=2000,
                             stop_after_grok=1),
                        "x*y mod 97, 50% train; evaluation every 10 steps"),
    },
    _plan_grokfast, _read_grokfast, _an_none))

_register(Experiment(
    "stablemax",
    "StableMax and the perpendicular gradient (Prieto et al.) with and without weight decay on modular addition",
    {
        "smoke": _scale({**_SMOKE}, _SMOKE_NOTE),
        "quick": _scale({**_QUICK, "steps": 6000, "stop_after_grok": 1}, _QUICK_NOTE + "; censored at 6000 steps"),
        "paper": _scale(dict(task="add", steps=40_000, eval_every=100, checkpoint_every=2000, stop_after_grok=1),
                        "Nanda's canonical p=113 setup (Prieto et al.'s own setups are not in REFERENCES.md)"),
    },
    _plan_stablemax, _read_stablemax, _an_none))


# ---------------------------------------------------------------------- configs and cost
def run_configs(exp: Experiment, scale: str, seeds: int) -> list[tuple[str, str, Any]]:
    """(variant, run name, RunConfig) of every run of `exp` at `scale` with seeds 1..seeds."""
    from groklens.config import PRESETS, RunConfig

    sc = exp.scales[scale]
    plan = exp.plan(sc, scale)
    base = dict(sc.base)
    preset_name = base.pop("preset", None)
    start = dict(PRESETS[preset_name]) if preset_name else {}
    out = []
    for variant, over in plan.variants.items():
        for seed in range(1, seeds + 1):
            cfg = RunConfig.from_dict({**start, **base, **over, "seed": seed})
            out.append((variant, f"{variant}_s{seed}", cfg))
    return out


def _n_inputs(cfg) -> tuple[int, int]:
    """(all inputs, sequence length) of cfg's task, without building it."""
    t = cfg.task
    if t == "s5":
        return 120 * 120, 3
    if t == "digits_add":
        return 10 ** (2 * cfg.n_digits), 3 * cfg.n_digits + 2
    if t.startswith("seq_"):
        return min(cfg.p ** cfg.n_informative, 2_000_000), cfg.seq_len + 1
    n = cfg.p * (cfg.p - 1) if t == "div" else cfg.p * cfg.p
    return n, 3


def step_flops(cfg) -> tuple[float, float]:
    """(FLOPs of one training step, FLOPs of one evaluation) of cfg: 6 x (multiply-add weights
    per token) x tokens for training (forward + backward), 2 x for the evaluation forward pass."""
    n_all, ctx = _n_inputs(cfg)
    n_train = max(1, round(cfg.train_frac * n_all))
    batch = cfg.batch_size if cfg.batch_size and cfg.batch_size < n_train else n_train
    if cfg.model == "mlp":
        d_in = (ctx - 1) * cfg.d_model
        per = d_in * cfg.d_mlp + (cfg.n_layers - 1) * cfg.d_mlp ** 2 + cfg.d_mlp * cfg.p
        tokens_train, tokens_eval = batch, n_all
    else:
        h = cfg.n_heads * cfg.d_head
        vocab_out = 120 if cfg.task == "s5" else 10 if cfg.task == "digits_add" else cfg.p
        per = cfg.n_layers * (4 * cfg.d_model * h + 2 * cfg.d_model * cfg.d_mlp + 2 * ctx * h) + cfg.d_model * vocab_out
        tokens_train, tokens_eval = batch * ctx, n_all * ctx
    return 6.0 * per * tokens_train, 2.0 * per * tokens_eval


def estimate_seconds(cfgs: list[Any]) -> float:
    """CPU seconds of training `cfgs` (every run to its step limit: an upper bound when runs stop
    after grokking), from the step-time model above."""
    total = 0.0
    for cfg in cfgs:
        train_f, eval_f = step_flops(cfg)
        n_eval = cfg.steps // cfg.eval_every + 1
        total += cfg.steps * (STEP_OVERHEAD_S + train_f / CPU_FLOPS) + n_eval * (STEP_OVERHEAD_S + eval_f / CPU_FLOPS)
    return total


def _fmt_duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"


def listing() -> list[dict[str, Any]]:
    """Every experiment with its runs and estimated cost at each scale (default seeds)."""
    out = []
    for e in EXPERIMENTS.values():
        item = {"name": e.name, "summary": e.summary, "scales": {}}
        for scale in SCALES:
            n = DEFAULT_SEEDS[scale]
            cfgs = [c for _, _, c in run_configs(e, scale, n)]
            secs = estimate_seconds(cfgs)
            item["scales"][scale] = {"runs": len(cfgs), "seeds": n, "max_steps": max(c.steps for c in cfgs),
                                     "cpu_seconds_estimate": secs, "note": e.scales[scale].note}
        out.append(item)
    return out


def format_listing(items: list[dict[str, Any]]) -> str:
    lines = [("experiment             scale  runs  cost (estimate: CPU-core time on the shared development machine, "
              "training only, every run to its step limit; wall time ~ this / workers)")]
    for it in items:
        for scale in SCALES:
            s = it["scales"][scale]
            cost = _fmt_duration(s["cpu_seconds_estimate"])
            if scale == "paper":
                cost += " CPU-core time (meant for a GPU; not measured on one)"
            lines.append(f"{it['name'] if scale == 'smoke' else '':<22} {scale:<6} {s['runs']:>4}  {cost}")
        lines.append(f"{'':<22} {it['summary']}")
        lines.append(f"{'':<22} quick: {it['scales']['quick']['note']}")
    lines.append(f"Estimates: seconds/step = {STEP_OVERHEAD_S:.0e} s + FLOPs / {CPU_FLOPS:.0e} FLOP/s, calibrated on the "
                 "shared 2-core development machine (benchmarks/train_throughput.py); runs that stop after grokking "
                 "take less.")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the pipeline
def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise BadInput(f"unknown experiment {name!r} (known: {', '.join(EXPERIMENTS)}; `groklens reproduce --list`)")
    return EXPERIMENTS[name]


def command_text(name: str, scale: str, seeds: int) -> str:
    return f"groklens reproduce {name} --scale {scale} --seeds {seeds}"


def reproduce(name: str, scale: str = "quick", out_dir: str | Path | None = None, seeds: int | None = None, *,
              workers: int | None = None, results_md: str | Path | None = RESULTS_MD, progress: bool = True,
              echo: Callable[[str], None] = print) -> Result:
    """Train, analyze, compare, report and read one experiment; see the module docstring."""
    from groklens.trainers.sweeps import InlineExecutor, RunSpec, run_path, run_sweep

    t0 = time.perf_counter()
    exp = get_experiment(name)
    if scale not in SCALES:
        raise BadInput(f"--scale must be one of {', '.join(SCALES)}; got {scale!r}")
    seeds = exp.seeds_default(scale) if seeds is None else seeds
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise BadInput(f"--seeds must be a positive integer; got {seeds!r}")
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1; got {workers}")
    out = Path(out_dir if out_dir is not None else f"reproduce-{name}-{scale}")
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory")
    if not out.exists() and not out.parent.is_dir():
        raise BadInput(f"directory {out.parent} does not exist")
    sc = exp.scales[scale]
    plan = exp.plan(sc, scale)
    runs = run_configs(exp, scale, seeds)
    out.mkdir(exist_ok=True)
    runs_dir = out / "runs"
    specs = [RunSpec(run_name, cfg) for _, run_name, cfg in runs]
    paths: dict[str, list[Path]] = {}
    for variant, run_name, _ in runs:
        paths.setdefault(variant, []).append(run_path(runs_dir, run_name))
    all_paths = [p for ps in paths.values() for p in ps]
    cmd = command_text(name, scale, seeds)

    # 1. train (done runs skipped, interrupted ones resumed; ensembles where the configs allow)
    n_workers = workers or (1 if scale == "smoke" else max(1, min(len(specs), os.cpu_count() or 1)))
    echo(f"{cmd}: {len(specs)} runs ({len(plan.variants)} variants x {seeds} seed(s)) into {runs_dir}")
    executor = InlineExecutor() if n_workers == 1 else "local"
    rep = run_sweep(specs, runs_dir, executor=executor, workers=n_workers, ensemble=True, progress=progress)
    if rep.counts["failed"]:
        first = next(iter(rep.failed.items()))
        raise GroklensError(f"{rep.counts['failed']} run(s) of {name} failed, e.g. {first[0]}: {first[1]}")
    if rep.counts["running"]:
        raise GroklensError(f"{rep.counts['running']} run(s) in {runs_dir} are being written by another process; "
                            "wait for it or use another -o")
    t_train = time.perf_counter() - t0
    echo(f"trained in {t_train:.0f} s")

    # 2. analyze
    notes = _analyze(exp, sc, scale, all_paths, progress)
    t_an = time.perf_counter() - t0 - t_train

    # 3. compare
    from groklens.analyses.compare import compare
    from groklens.analyses.report import build_report

    baseline = paths[plan.baseline][0] if plan.baseline else None
    comp = compare(all_paths, baseline=baseline, group_by="variant")
    (out / "comparison.txt").write_text(comp.format_table() + "\n")
    (out / "comparison.csv").write_text(comp.to_csv())

    # 4. report figures
    t_rep = time.perf_counter()
    rep_result = build_report(all_paths, out / "report", comparison=comp)
    t_rep = time.perf_counter() - t_rep
    notes += [f"not in the report: {t} ({w})" for t, w in rep_result.missing
              if not w.startswith("no run has")]  # figures of analyses this experiment does not compute

    # 5. rows
    ctx = Context(name, scale, sc, plan, paths, comp, out)
    rows = exp.read(ctx)
    wall = time.perf_counter() - t0
    notes.append(f"time: training {t_train:.0f} s, analyses {t_an:.0f} s, report {t_rep:.0f} s, total {wall:.0f} s")
    # training time of earlier invocations in this directory (runs they finished are skipped now)
    earlier = _log_timing(out, cmd, t_train, wall)
    if earlier > 0:
        notes.append(f"time: {earlier:.0f} s more were spent training in earlier invocations of this command here")
    result = Result(name, scale, seeds, out, rows, wall + earlier, cmd, all_paths, rep_result.index, notes)
    (out / "results.json").write_text(json.dumps(result.to_json(), indent=1, default=_json_default))
    if results_md is not None and Path(results_md).parent.is_dir():
        update_results_md(results_md, result)
    elif results_md is not None:
        notes.append(f"rows not written: directory {Path(results_md).parent} does not exist")
    return result


def _log_timing(out: Path, cmd: str, train_s: float, wall_s: float) -> float:
    """Append this invocation's times to DIR/timings.json; return the training seconds of the
    earlier invocations of the same command there (the wall time reported counts them too)."""
    path = out / "timings.json"
    try:
        log = json.loads(path.read_text()) if path.exists() else []
    except ValueError:
        log = []
    earlier = sum(float(e.get("train_s", 0)) for e in log if e.get("command") == cmd)
    log.append({"command": cmd, "train_s": train_s, "wall_s": wall_s, "at": time.strftime("%Y-%m-%d %H:%M:%S")})
    path.write_text(json.dumps(log, indent=1))
    return earlier


def _analyze(exp: Experiment, sc: Scale, scale: str, paths: list[Path], progress: bool) -> list[str]:
    from groklens.analyses.compare import load_run
    from groklens.analyses.runner import compute_many, select_steps
    from groklens.checkpoints import Trajectory

    requests = exp.analyses(sc, scale)
    notes: list[str] = []
    if not requests:
        return notes
    for p in paths:
        traj = Trajectory(p)
        run = load_run(p)
        phases = sorted({s for s in run.phase_steps.values() if s is not None})
        end = [int(traj.steps[-1])]
        for name, params, where in requests:
            if where == "end":
                steps = end
            elif where == "phases":
                steps = phases
            else:  # "every": about 20 checkpoints along the run, plus the phases
                every = max(1, len(traj.steps) // 20)
                steps = sorted(set(select_steps(traj.steps, every=every)) | set(phases))
            skipped: list[str] = []
            compute_many(traj, [(name, params)], steps=steps, progress=progress, notes=skipped)
            notes += [f"{p.name}: {s}" for s in skipped]
    return notes


def _json_default(x):
    if isinstance(x, Path):
        return str(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


# ---------------------------------------------------------------------- docs/RESULTS.md
_HEAD = ("| command | scale | measure | published (source) | ours | ratio ours/published | verdict | what differs | "
         "wall time |")
_RULE = "|---|---|---|---|---|---|---|---|---|"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def result_lines(result: Result) -> list[str]:
    lines = []
    for r in result.rows:
        ratio = r.ratio_text()
        pub = f"{r.published.text} ({r.published.source})"
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"`{result.command}`", result.scale, r.measure, pub, r.ours_text, ratio, r.verdict or "—", r.differs,
            f"{_fmt_duration(result.wall_s)} (whole command)")) + " |")
    return lines


def update_results_md(path: str | Path, result: Result) -> Path:
    """Put `result`'s rows in the reproduce table of `path`, replacing earlier rows of the same
    command; create the file (or the table section) when missing."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Reproductions\n"
    if RESULTS_BEGIN not in text:
        text = text.rstrip("\n") + f"\n\n{RESULTS_BEGIN}\n{_HEAD}\n{_RULE}\n{RESULTS_END}\n"
    head, rest = text.split(RESULTS_BEGIN, 1)
    body, tail = rest.split(RESULTS_END, 1) if RESULTS_END in rest else (rest, "\n")
    key = f"| `{result.command}` |"
    kept = [ln for ln in body.strip("\n").splitlines() if ln.strip() and not ln.startswith(key)
            and ln not in (_HEAD, _RULE)]
    lines = [_HEAD, _RULE] + kept + result_lines(result)
    path.write_text(f"{head}{RESULTS_BEGIN}\n" + "\n".join(lines) + f"\n{RESULTS_END}{tail}")
    return path


def format_result(result: Result) -> str:
    lines = [f"{result.command}  ({result.scale}; {_fmt_duration(result.wall_s)}; runs and report in {result.out_dir})"]
    w = max(len(r.measure) for r in result.rows) if result.rows else 10
    w = min(w, 90)
    lines.append(f"{'measure':<{w}}  {'published':<28}  {'ours':<36}  {'ratio':<9}  verdict")
    for r in result.rows:
        pub = f"{r.published.value:g}" if r.published.value is not None else "(claim) " + r.published.text[:20]
        lines.append(f"{r.measure[:w]:<{w}}  {pub[:28]:<28}  {r.ours_text[:36]:<36}  {r.ratio_text():<9}  {r.verdict}")
    lines.append(f"setup: {result.rows[0].differs if result.rows else ''}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


__all__ = ["EXPERIMENTS", "SCALES", "Experiment", "Published", "Result", "Row", "estimate_seconds", "format_listing",
           "format_result", "get_experiment", "listing", "reproduce", "run_configs", "update_results_md"]
