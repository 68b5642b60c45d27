"""`groklens reproduce`: the published results of docs/RESULTS.md, one command each.

An experiment is a named plan of runs at three scales, and a reading of those runs:
    smoke  a tiny end-to-end check for the test suite (p 5-7, widths 8-32, tens of steps, one
           seed): it proves the pipeline, never the result;
    quick  fits a 2-core CPU (minutes to under an hour): smaller p and model than the paper,
           said in each experiment's note, in `--list` and in docs/RESULTS.md;
    paper  the published configuration (`--list` says whether it fits this CPU).

`reproduce(name, scale, out_dir, seeds, ledger_dir=..., results_md=...)`:
    1. looks every run of seeds 1..N up in the results ledger (`ledger.py`: LEDGER/NAME.SCALE.json,
       default OUT/ledger; the committed one is docs/results/) by arm, seed and config hash;
    2. trains, into OUT/runs through `groklens.trainers.sweeps.run_sweep`, only the runs that
       neither the ledger nor a finished file of the same config hash in OUT/runs holds
       (interrupted ones are resumed exactly);
    3. computes the analyses the experiment reads on the new runs and records each of them in the
       ledger (grokking steps at each threshold, censoring, final metrics, measures at the phases);
    4. compares the run files present in OUT/runs (`comparison.txt` / `.csv`, `report/`);
    5. reads the rows from the ledger: every recorded seed of each arm whose config hash is the
       current one (entries of another config are listed apart, never mixed in), each published
       number (value and source) beside ours and their ratio; into OUT/results.json and, with
       `results_md`, the reproduce table of that markdown file (a rerun replaces its rows).

Where the source states a claim without a number, the row's published value is None, the claim
is quoted, and `verdict` says whether ours agrees, by the rules of `verdicts.py`. Results that
disagree with the paper are reported as they are. A grokking time that was not reached is
right-censored: the mean then counts the censoring step and is a lower bound (shown `> N` or
`>= N`), never dropped. Speed-ups everywhere (rows, comparison.txt) are compare.speedup's: the
ratio of geometric means with the Welch interval on log times. Every value states its n.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from groklens.errors import BadInput, GroklensError
from groklens.registry import Registry
from groklens.experiments.verdicts import groks_verdict, mean_flag, ratio_verdict, speedup_verdict

SCALES = ("smoke", "quick", "paper")
SPEEDUP_DEFINITION = ("T_baseline / T_variant: ratio of the geometric means of the grokking steps over seeds, 95% CI "
                      "from Welch's t-interval on the mean log steps (groklens.analyses.compare.speedup)")
DEFAULT_SEEDS = {"smoke": 1, "quick": 2, "paper": 10}
REPO_DOCS = Path(__file__).resolve().parents[2] / "docs"  # a source checkout's docs/ (absent in a wheel)
RESULTS_MD = REPO_DOCS / "RESULTS.md"
LEDGER_DIR = REPO_DOCS / "results"
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
class Arm:
    runs: list[Any]  # ledger.LedgerRun, by seed


@dataclass
class Context:
    """What an experiment's reading gets: its runs from the ledger (every recorded seed of each
    variant whose config hash is the current one), the scale, the output directory."""

    name: str
    scale: str
    sc: Scale
    plan: Plan
    arms: dict[str, list[Any]]  # variant -> ledger.LedgerRun
    out_dir: Path

    def group(self, variant: str) -> Arm:
        return Arm(self.arms.get(variant, []))

    def grok(self, variant: str) -> tuple[float | None, str, bool]:
        """Mean grokking step over seeds (a censored seed counts its last step: the mean is then a
        lower bound), its text (mean ± std [min-max] (n)), censored?"""
        runs = self.group(variant).runs
        times = [r.grok_time() for r in runs]
        if not runs or any(t is None for t in times):
            return None, "no evaluation" if runs else "no runs", True
        n = len(times)
        mean = sum(times) / n
        cens = sum(r.grok_censored for r in runs)
        sd = (sum((t - mean) ** 2 for t in times) / (n - 1)) ** 0.5 if n > 1 else None
        if cens == n:
            return mean, f"> {min(times):,.0f} (n={n}, all censored)", True
        text = f"{mean:,.0f}" + (f" ± {sd:,.0f} [{min(times):,.0f}-{max(times):,.0f}]" if sd is not None else "")
        text = (">= " if cens else "") + text
        text += f" (n={n}" + (f", {cens} censored: a lower bound)" if cens else ")")
        return mean, text, cens > 0

    def speedup(self, base: str, variant: str) -> tuple[float | None, str, dict[str, Any]]:
        """T_base / T_variant: compare.speedup's definition (ratio of geometric means of the grokking
        steps, Welch t-interval on the log steps), the one `comparison.txt` uses too."""
        from groklens.analyses.compare import fmt_speedup, speedup

        rb, rv = self.group(base).runs, self.group(variant).runs
        if not rb or not rv:
            return None, "n/a (no runs)", {"value": None, "bound": None, "ci_note": "no runs"}
        sp = speedup(rb, rv)
        text = fmt_speedup(sp) + f" (n={len(rb)} / {len(rv)})"
        return sp["value"], text, sp

    def measure(self, variant: str, key: str, phase: str) -> tuple[float | None, str]:
        """A measure at a phase, mean over the seeds that have it; the text states n (flagged when
        fewer seeds than the variant has) or why none has it."""
        from groklens.analyses.compare import fmt_number

        runs = self.group(variant).runs
        vals = [r.value(key, phase) for r in runs]
        have = [v for v in vals if v is not None]
        if not have:
            return None, f"— ({self.missing_why(variant, phase)})"
        mean = sum(have) / len(have)
        sd = (sum((v - mean) ** 2 for v in have) / (len(have) - 1)) ** 0.5 if len(have) > 1 else None
        text = fmt_number(mean) + (f" ± {fmt_number(sd)}" if sd is not None else "")
        return mean, f"{text} {mean_flag(len(have), len(runs))}"

    def missing_why(self, variant: str, phase: str) -> str:
        runs = self.group(variant).runs
        notes = [r.phase_notes.get(phase) for r in runs if r.phase_notes.get(phase)]
        if not runs:
            return "no runs"
        return notes[0] if notes else "not stored"

    def phase_ratio(self, variant: str, key: str, num: str, den: str) -> tuple[float | None, str]:
        """Mean over seeds of measure(num phase) / measure(den phase), over the seeds with both."""
        from groklens.analyses.compare import fmt_number

        runs = self.group(variant).runs
        pairs = [(r.value(key, num), r.value(key, den)) for r in runs]
        ratios = [a / b for a, b in pairs if a is not None and b not in (None, 0)]
        if not ratios:
            return None, f"at {num}: {self.measure(variant, key, num)[1]}; at {den}: {self.measure(variant, key, den)[1]}"
        mean = sum(ratios) / len(ratios)
        _, tn = self.measure(variant, key, num)
        _, td = self.measure(variant, key, den)
        return mean, f"{fmt_number(mean)} {mean_flag(len(ratios), len(runs))} ({tn} / {td})"


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
    wall_s: float  # this command's wall time
    command: str
    runs: list[Path]  # the run files present in OUT/runs (the rows may also hold seeds of the ledger only)
    report: Path | None
    notes: list[str] = field(default_factory=list)
    ledger: Path | None = None
    run_wall: str = ""  # measured wall time per run, from the ledger
    trained: int = 0  # runs trained (or resumed) by this command

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.name, "scale": self.scale, "seeds": self.seeds, "out_dir": str(self.out_dir),
                "command": self.command, "wall_s": self.wall_s, "rows": [r.to_dict() for r in self.rows],
                "runs": [str(p) for p in self.runs], "report": str(self.report) if self.report else None,
                "ledger": str(self.ledger) if self.ledger else None, "run_wall": self.run_wall,
                "trained": self.trained, "speedup_method": SPEEDUP_DEFINITION, "notes": self.notes}


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
                      "these runs need ~10k steps); evaluation every 50 steps (paper: 200); post-norm "
                      "LayerNorm/RMSNorm baselines and PyTorch's init, as the paper's code")
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
    """A speed-up row (ratio of geometric means, Welch interval); `verdict`: the claim "faster"."""
    ours, text, sp = ctx.speedup(base, variant)
    return Row(measure, published, ours, text, differs, speedup_verdict(sp) if verdict else "", sp.get("bound") or "")


def _lr_tag(lr: float) -> str:
    """6e-4 -> '6e-4', 1.5e-3 -> '1.5e-3' (run names)."""
    mant, exp = f"{lr:e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


# ---------------------------------------------------------------------- bounded-sphere
# Our additions at paper scale (not in the paper's table): the bounded sphere wd 0 with
# TransformerLens' init, to show what the init scheme does to the grokking time.
SPHERE_OURS = {"sphere_wd0_tlinit": ({**ARCH["sphere_wd0"], "init_scheme": "tl"},
                                     "bounded sphere, wd 0, TransformerLens init (our addition)", "sphere_wd0")}


def _plan_sphere(sc: Scale, scale: str) -> Plan:
    variants = {f"{a}_lr{_lr_tag(lr)}": {**ARCH[a], "lr": lr} for lr in sc.extra["lrs"] for a in ARCH}
    for a in sc.extra.get("ours", ()):  # after the paper's arms: their run names never change
        variants.update({f"{a}_lr{_lr_tag(lr)}": {**SPHERE_OURS[a][0], "lr": lr} for lr in sc.extra["lrs"]})
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
                                    Published(pub, f"{pub:.2f}x (derived: ratio of the table's arithmetic means)",
                                              YILDIRIM),
                                    f"ln_lr{tag}", f"{a}_lr{tag}", ctx.sc.note + "; ours: ratio of geometric means"))
        for a in ctx.sc.extra.get("ours", ()):
            _, label, ref = SPHERE_OURS[a]
            none = Published(None, "not in the paper (our addition)", YILDIRIM)
            rows.append(grok_row(ctx, f"grok epoch, {label}, {at}", none, f"{a}_lr{tag}", ctx.sc.note))
            rows.append(speedup_row(ctx, f"speed-up of {ARCH_LABEL[ref]} (PyTorch init) over {label}, {at}", none,
                                    f"{a}_lr{tag}", f"{ref}_lr{tag}", ctx.sc.note))
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


# ---------------------------------------------------------------------- s5-control
def _plan_s5(sc: Scale, scale: str) -> Plan:
    archs = ("ln", "rms", "sphere_wd1", "sphere_wd0")  # Fourier init needs residue tokens: not on S5
    return Plan({a: {**ARCH[a], "lr": sc.extra.get("lr", 1e-3)} for a in archs}, "ln", sc.base)


def _read_s5(ctx: Context) -> list[Row]:
    claim = Published(None, "the spherical constraint does not make S5 generalize faster (speed-up <= 1)", YILDIRIM)
    rows = []
    for a in ("sphere_wd1", "sphere_wd0"):
        ours, text, sp = ctx.speedup("ln", a)
        verdict = speedup_verdict(sp, above=1.05, claim_faster=False)  # the claim: not faster (5% tolerance)
        rows.append(Row(f"S5: speed-up of {ARCH_LABEL[a]} over LayerNorm", claim, ours, text, ctx.sc.note, verdict,
                        sp.get("bound") or ""))
    for a in ("ln", "rms", "sphere_wd1", "sphere_wd0"):
        rows.append(grok_row(ctx, f"S5: grok epoch, {ARCH_LABEL[a]}", Published(None, "no number in REFERENCES.md", YILDIRIM),
                             a, ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- fourier-fve
def _fve_arms(sc: Scale) -> dict[str, str]:
    """bounded / standard -> variant name. At paper scale the arms are bounded-sphere's own runs
    (same names and configs: one set of runs gives both experiments' rows)."""
    if sc.extra.get("shared_with_sphere"):
        tag = _lr_tag(sc.extra["lr"])
        return {"bounded": f"sphere_wd1_lr{tag}", "standard": f"ln_lr{tag}"}
    return {"bounded": "bounded", "standard": "standard"}


def _plan_fve(sc: Scale, scale: str) -> Plan:
    arms = _fve_arms(sc)
    return Plan({arms["standard"]: {**ARCH["ln"], "lr": sc.extra["lr"]},
                 arms["bounded"]: {**ARCH["sphere_wd1"], "lr": sc.extra["lr"]}}, arms["standard"], sc.base)


def _read_fve(ctx: Context) -> list[Row]:
    rows = []
    diff = ctx.sc.note + "; LS FVE = mean over the top-5 frequencies' cos and sin directions (our reading, docs/ANALYSES.md)"
    arms = _fve_arms(ctx.sc)
    for v, pub in (("bounded", 0.62), ("standard", 0.29)):
        ours, text = ctx.measure(arms[v], "fve_ls", "end")
        _, gtext, cens = ctx.grok(arms[v])
        text += f" (grokked at {gtext})" if not cens else f" (never grokked: {gtext})"
        rows.append(Row(f"Fourier FVE (least squares, 2c) at the end, {v} ({'bounded sphere wd 1' if v == 'bounded' else 'post-norm LayerNorm'})",
                        Published(pub, f"about {pub:.0%}", YILDIRIM), ours, text, diff))
    for v in ("bounded", "standard"):
        ours, text = ctx.measure(arms[v], "fve_neuron", "end")
        rows.append(Row(f"Fourier FVE (neuron, Nanda 2b) at the end, {v}",
                        Published(None, "not reported (the paper reports the least-squares variant)", YILDIRIM),
                        ours, text, ctx.sc.note))
    return rows


# ---------------------------------------------------------------------- activation-norm
def _plan_actnorm(sc: Scale, scale: str) -> Plan:
    lam = sc.extra["lambda"]
    mlp = {**sc.extra["mlp"]}
    # Nanda's canonical no-norm transformer: the residual's scale reaches the logits (behind a
    # scale-invariant norm, rho and the Hessian would mostly measure the norm's eps)
    tf = {"norm": "none", **sc.extra.get("tf", {})}
    return Plan({"tf_base": tf, "tf_actnorm": {**tf, "act_norm_lambda": lam},
                 "mlp_base": mlp, "mlp_actnorm": {**mlp, "act_norm_lambda": lam}}, "tf_base", sc.base)


def _read_actnorm(ctx: Context) -> list[Row]:
    rows = []
    lam = ctx.sc.extra["lambda"]
    diff = f"{ctx.sc.note}; lambda {lam:g} (our single untuned choice; the paper's value is not in REFERENCES.md)"
    for m, label in (("tf", "transformer"), ("mlp", "MLP")):
        rows.append(speedup_row(ctx, f"speed-up of the sqrt(d) penalty, {label}", Published(6.0, "up to 6x", ACTNORM),
                                f"{m}_base", f"{m}_actnorm", diff))
    for m, label in (("tf", "no-norm transformer"), ("mlp", "MLP")):
        for v in (f"{m}_base", f"{m}_actnorm"):
            ratio, rtext = _rho_ratio(ctx, v)
            rows.append(Row(f"radial gradient energy rho / (1/d) at the end, {label}, {'penalty' if 'actnorm' in v else 'baseline'}",
                            Published(None, "rho below the isotropic 1/d baseline (Proposition ii; no number)", ACTNORM),
                            ratio, rtext, diff,
                            ratio_verdict(ratio, below=True, missing=rtext) if "actnorm" in v else ""))
        r_base, tb = ctx.measure(f"{m}_base", "hessian_top", "end")
        r_act, ta = ctx.measure(f"{m}_actnorm", "hessian_top", "end")
        ratio = r_act / r_base if r_act is not None and r_base not in (None, 0) else None
        text = f"{ratio:.3g} (penalty {ta} / baseline {tb})" if ratio is not None else f"penalty {ta} / baseline {tb}"
        rows.append(Row(f"Hessian top eigenvalue at the end, penalty / baseline, {label}",
                        Published(None, "flatter minima (Proposition iii; no number)", ACTNORM), ratio, text, diff,
                        ratio_verdict(ratio, below=True, missing=text)))
        rad, rtext = ctx.measure(f"{m}_actnorm", "radius", "end")
        rows.append(Row(f"activation radius ||h||/sqrt(d) at the end, {label}, penalty",
                        Published(1.0, "held softly on the sqrt(d) sphere (radius 1)", ACTNORM), rad, rtext, diff))
    return rows


def _rho_ratio(ctx: Context, variant: str) -> tuple[float | None, str]:
    """Mean over seeds of rho / its isotropic baseline 1/d (both stored by the radial analysis at
    the site compare reads), with n."""
    runs = ctx.group(variant).runs
    ratios = [r.value("rho", "end") / r.value("rho_baseline", "end") for r in runs
              if r.value("rho", "end") is not None and r.value("rho_baseline", "end")]
    _, rtext = ctx.measure(variant, "rho", "end")
    if not ratios:
        return None, f"rho {rtext}"
    mean = sum(ratios) / len(ratios)
    return mean, f"{mean:.3g} {mean_flag(len(ratios), len(runs))} (rho {rtext})"


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
    ratio, text = ctx.phase_ratio("base", "eff_rank", "grokking", "memorization")
    rows.append(Row("baseline: effective rank (Roy-Vetterli, centred, last hidden layer) at grokking / at memorization",
                    Published(None, "effective dimensionality collapses before grokking (< 1; no number)", GEOMDR),
                    ratio, text, ctx.sc.note, ratio_verdict(ratio, below=True, missing=text)))
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
    """Exponent of log T (or log of the delay T - memorization) on log `var` over the runs of
    `variants`: OLS on the runs that grokked and, when some are censored, the Tobit fit on all
    (analyses.scaling); ours is Tobit's estimate then, OLS's otherwise."""
    from groklens.analyses.scaling import GrokRecord

    recs = []
    for v in variants:
        for r in ctx.group(v).runs:
            t, last = r.grokking, r.last_step
            if delay and r.memorization is not None:
                t = None if t is None else max(t - r.memorization, 1)
                last = max(last - r.memorization, 1)
            elif delay:
                continue  # never memorized: no delay
            recs.append(GrokRecord(r.name, {var: float(r.config[var])}, t, last))
    return _fit_text(recs, [var])[var]


def _fit_text(recs: list[Any], variables: list[str]) -> dict[str, tuple[float | None, str]]:
    """var -> (estimate, 'OLS ... (n grokked); Tobit ... (n, k censored)')."""
    from groklens.analyses.scaling import fit_scaling_law

    try:
        fit = fit_scaling_law(recs, variables)
    except BadInput as exc:
        return {v: (None, f"no fit: {exc}") for v in variables}
    n_c = fit["n_censored"]
    tobit, terr = None, ""
    if n_c:
        try:
            tobit = fit_scaling_law(recs, variables, censored=True)["tobit"]
        except BadInput as exc:
            terr = str(exc)
    out = {}
    for v in variables:
        e = fit["ols"]["exponents"][v]
        text = (f"OLS {e['estimate']:.2f} [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}] (R^2 {fit['ols']['r2']:.2f}, "
                f"n={fit['n_grokked']} grokked" + (f", {n_c} censored left out)" if n_c else ")"))
        ours = e["estimate"]
        if tobit is not None:
            t = tobit["exponents"][v]
            text = (f"Tobit {t['estimate']:.2f} [{t['ci95'][0]:.2f}, {t['ci95'][1]:.2f}] (n={tobit['n']}, "
                    f"{tobit['n_censored']} censored); " + text)
            ours = t["estimate"]
        elif n_c:
            text += f"; Tobit n/a ({terr}): OLS on the grokked runs only is biased"
            ours = None
        out[v] = (ours, text)
    return out


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
    ratio, text = ctx.phase_ratio(base, "attn_mass", "grokking", "memorization")
    rows.append(Row("attention mass on informative tokens (readout query), at grokking / at memorization, baseline",
                    Published(None, "attention must reach enough mass on every informative token; the memorizing MLP "
                              "starves it first (> 1; no number)", STRUCT), ratio, text, diff,
                    ratio_verdict(ratio, below=False, missing=text)))
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
    from groklens.analyses.scaling import DEFAULT_VARS, GrokRecord, fit_scaling_law, variable_value

    diff = ctx.sc.note + "; D = train_frac (the paper's D is the training data size: the same exponent when p is fixed)"
    recs = [GrokRecord(r.name, {v: variable_value(v, r.config) for v in DEFAULT_VARS}, r.grokking, r.last_step)
            for v in ctx.plan.variants for r in ctx.group(v).runs]
    fits = _fit_text(recs, list(DEFAULT_VARS))
    names = {"width": "H (width)", "train_frac": "D (data)", "lr": "eta (learning rate)", "weight_decay": "lambda (weight decay)"}
    rows = []
    for v in DEFAULT_VARS:
        ours, text = fits[v]
        rows.append(Row(f"scaling exponent of {names[v]}", Published(SCALING_PUBLISHED[v], f"{SCALING_PUBLISHED[v]:+.2f}", SCALING),
                        ours, text, diff))
    try:
        fit = fit_scaling_law(recs, list(DEFAULT_VARS))
        r2, text = fit["ols"]["r2"], f"{fit['ols']['r2']:.3f} (OLS, n={fit['n_grokked']} grokked, {fit['n_censored']} censored left out)"
    except BadInput as exc:
        r2, text = None, f"no fit: {exc}"
    rows.append(Row("R^2 of the power-law fit", Published(0.732, "0.732 (0.821 with interactions)", SCALING), r2, text, diff))
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
    base_runs = ctx.group("ce_wd1").runs
    ref = None if not base_runs or any(r.grok_censored for r in base_runs) else \
        math.exp(sum(math.log(max(r.grokking, 1)) for r in base_runs) / len(base_runs))
    for v, label in labels.items():
        row = speedup_row(ctx, f"speed-up over softmax CE with wd 1: {label}",
                          Published(None, "softmax collapse stops grokking without weight decay; StableMax and "
                                    "the perpendicular gradient remove it (no number in REFERENCES.md)", PRIETO),
                          "ce_wd1", v, ctx.sc.note)
        # the claim: plain softmax CE without weight decay does not grok, the others do; no published
        # time, so a cap decides "never" only when it is FAR x our baseline's grokking time
        row.verdict = groks_verdict(ctx.group(v).runs, should_grok=v != "ce_wd0", reference=ref,
                                    reference_what="baseline's grokking step (softmax CE, wd 1; ours)")
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

EXPERIMENTS: Registry[Experiment] = Registry("experiment")


def _register(e: Experiment) -> None:
    EXPERIMENTS.register(e.name)(e)


_register(Experiment(
    "bounded-sphere",
    "LayerNorm vs RMSNorm vs bounded sphere (wd 1, wd 0) vs sphere + Fourier init, modular addition: grok epochs",
    {
        "smoke": _scale({**_SMOKE, **_SPHERE_TRAIN, "fourier_freqs": "1 2 3"}, _SMOKE_NOTE, lrs=[6e-4]),
        "quick": _scale({**_SPHERE_QUICK, "steps": 6000, "stop_after_grok": 2, "fourier_freqs": "1 2 3 4 5"},
                        _QUICK_SPHERE_NOTE + "; Fourier init frequencies 1-5 (our choice for p=23); runs stop 2 "
                        "evaluations after grokking, censored at 6000 steps", lrs=[3e-3], published_lrs=[6e-4]),
        "paper": _scale({**_SPHERE_PAPER, "steps": 100_000, "stop_after_grok": 2}, _PAPER_SPHERE_NOTE
                        + "; lr 6e-4 only (1e-4 does not fit a CPU); the data split is the same for every seed "
                        "(data_seed 598; the paper draws it from the seed)", lrs=[6e-4], ours=["sphere_wd0_tlinit"]),
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
        "paper": _scale({**_SPHERE_PAPER, "steps": 100_000, "stop_after_grok": 2}, _PAPER_SPHERE_NOTE
                        + "; the bounded-sphere experiment's own paper runs (ln, sphere_wd1 at lr 6e-4), read at their "
                        "end, 2 evaluations after grokking (when the paper measured is not in REFERENCES.md)",
                        lr=6e-4, shared_with_sphere=True),
    },
    _plan_fve, _read_fve, _an_fve))

_register(Experiment(
    "activation-norm",
    "the sqrt(d) activation-norm penalty against the baseline, MLP and transformer: speed-up, radius and rho "
    "against 1/d, Hessian sharpness at the end",
    {
        "smoke": _scale({**_SMOKE}, _SMOKE_NOTE, **{"lambda": 1.0, "mlp": {"model": "mlp", "n_layers": 2, "mlp_bias": True}}),
        "quick": _scale({**_QUICK, "steps": 6000, "stop_after_grok": 2},
                        _QUICK_NOTE.replace("pre-LayerNorm", "no norm (Nanda's architecture)")
                        + "; the transformer censored at 20,000 steps (without a norm it grokked after 12,700 steps or "
                        "not within 15,000 at lr 1e-3, not within 8,000 at lr 3e-3: docs/CLI.md); MLP: 2 hidden layers "
                        "of 256, embeddings 64 wide, lr 1e-2 (it grokked at step 1200 with it, at 5800 with 3e-3: one "
                        "seed), censored at 6000 steps",
                        **{"lambda": 1.0, "tf": {"steps": 20_000},
                           "mlp": {"model": "mlp", "n_layers": 2, "mlp_bias": True, "norm": "none", "lr": 1e-2}}),
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


@functools.lru_cache(maxsize=512)
def _task_shape(cfg_json: str) -> tuple[int, int, int]:
    """(all inputs, sequence length, output vocabulary) of a config's task, from the task registry
    (the task's own grid and vocabulary: no task sizes are hard-coded here)."""
    from groklens.config import RunConfig
    from groklens.trainers.tasks import TASKS

    cfg = RunConfig.from_dict(json.loads(cfg_json))
    task = TASKS.get(cfg.task)
    inputs, labels, *_ = task.grid(cfg)
    return int(len(labels)), int(inputs.shape[1]), int(task.vocab(cfg)[1])


def step_flops(cfg) -> tuple[float, float]:
    """(FLOPs of one training step, FLOPs of one evaluation) of cfg: 6 x (multiply-add weights
    per token) x tokens for training (forward + backward), 2 x for the evaluation forward pass."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("seed", "lr", "weight_decay", "steps")}
    n_all, ctx, vocab_out = _task_shape(json.dumps(data, sort_keys=True))
    n_train = max(1, round(cfg.train_frac * n_all))
    batch = cfg.batch_size if cfg.batch_size and cfg.batch_size < n_train else n_train
    if cfg.model == "mlp":
        d_in = (ctx - 1) * cfg.d_model
        per = d_in * cfg.d_mlp + (cfg.n_layers - 1) * cfg.d_mlp ** 2 + cfg.d_mlp * vocab_out
        tokens_train, tokens_eval = batch, n_all
    else:
        h = cfg.n_heads * cfg.d_head
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


FITS_RUN_S = 4 * 3600  # a scale fits this CPU when no run takes longer on one core ...
FITS_TOTAL_S = 72 * 3600  # ... and all its runs (default seeds) take at most this wall time on this CPU's cores


def _ledger_dirs(extra: str | Path | None = None) -> list[Path]:
    dirs = [LEDGER_DIR] if LEDGER_DIR.is_dir() else []
    return dirs + ([Path(extra)] if extra is not None else [])


def listing(ledger_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Every experiment with its runs, its estimated cost, the wall time per run measured where one
    ran (the ledgers: docs/results/ of a checkout, and `ledger_dir`), and whether it fits this CPU."""
    from groklens.experiments.ledger import measured_wall

    dirs = _ledger_dirs(ledger_dir)
    cores = os.cpu_count() or 1
    out = []
    for name in EXPERIMENTS:
        e = EXPERIMENTS.get(name)
        item = {"name": e.name, "summary": e.summary, "scales": {}}
        for scale in SCALES:
            n = DEFAULT_SEEDS[scale]
            cfgs = [c for _, _, c in run_configs(e, scale, n)]
            secs = estimate_seconds(cfgs)
            measured = measured_wall(dirs, e.name, scale)
            cpu_measured = measured is not None and all(d.startswith("cpu") for d in measured["devices"])
            per_run = measured["max_s"] if cpu_measured else max(estimate_seconds([c]) for c in cfgs)
            total = measured["mean_s"] * len(cfgs) if cpu_measured else secs
            item["scales"][scale] = {
                "runs": len(cfgs), "seeds": n, "max_steps": max(c.steps for c in cfgs),
                "cpu_seconds_estimate": secs, "measured": measured,
                "fits_cpu": per_run <= FITS_RUN_S and total / cores <= FITS_TOTAL_S,
                "fits_basis": "measured" if cpu_measured else "estimate", "note": e.scales[scale].note}
        out.append(item)
    return out


def format_listing(items: list[dict[str, Any]]) -> str:
    cores = os.cpu_count() or 1
    lines = [f"experiment             scale  runs  {f'fits this CPU ({cores} cores)?':<27}  {'measured per run (ledger)':<30}  "
             "estimate (CPU-core time, every run to its step limit)"]
    for it in items:
        for scale in SCALES:
            s = it["scales"][scale]
            m = s["measured"]
            meas = (f"{_fmt_duration(m['mean_s'])} mean, {_fmt_duration(m['max_s'])} max (n={m['n']}, "
                    f"{'/'.join(m['devices'])})") if m else "not run yet"
            fits = ("yes" if s["fits_cpu"] else "no") + f" ({s['fits_basis']})"
            lines.append(f"{it['name'] if scale == 'smoke' else '':<22} {scale:<6} {s['runs']:>4}  {fits:<27}  "
                         f"{meas:<30}  {_fmt_duration(s['cpu_seconds_estimate'])}")
        lines.append(f"{'':<22} {it['summary']}")
        lines.append(f"{'':<22} quick: {it['scales']['quick']['note']}")
    lines.append(f"Fits this CPU: no run over {FITS_RUN_S / 3600:g} h on one core and all runs (default seeds) within "
                 f"{FITS_TOTAL_S / 3600:g} h on the {cores} cores; from the ledger's measured wall times where runs "
                 "were recorded on a CPU, else from the estimate (an upper bound for runs that stop after grokking).")
    lines.append(f"Estimates: seconds/step = {STEP_OVERHEAD_S:.0e} s + FLOPs / {CPU_FLOPS:.0e} FLOP/s, calibrated on the "
                 "shared 2-core development machine (benchmarks/train_throughput.py).")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the pipeline
def get_experiment(name: str) -> Experiment:
    return EXPERIMENTS.get(name)


def command_text(name: str, scale: str, seeds: int) -> str:
    return f"groklens reproduce {name} --scale {scale} --seeds {seeds}"


@dataclass
class PlannedRun:
    variant: str
    name: str
    cfg: Any
    seed: int
    chash: str
    path: Path


def _check_args(exp: Experiment, name: str, scale: str, seeds: Any, workers: int | None, out_dir,
                results_md) -> tuple[int, Path]:
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
    if results_md is not None and not Path(results_md).parent.is_dir():
        raise BadInput(f"--results-md {results_md}: directory {Path(results_md).parent} does not exist")
    return seeds, out


def _plan_runs(exp: Experiment, scale: str, seeds: int, runs_dir: Path, led) -> tuple[list[PlannedRun], list[PlannedRun],
                                                                                       list[PlannedRun]]:
    """(runs the ledger holds, finished files to record, runs to train) of seeds 1..seeds."""
    from groklens.checkpoints import Trajectory
    from groklens.experiments.ledger import config_hash
    from groklens.trainers.sweeps import run_path, run_state

    held, ready, todo = [], [], []
    for variant, run_name, cfg in run_configs(exp, scale, seeds):
        pr = PlannedRun(variant, run_name, cfg, cfg.seed, config_hash(cfg.to_dict()), run_path(runs_dir, run_name))
        if led.find(variant, pr.seed, pr.chash) is not None:
            held.append(pr)
        elif runs_dir.is_dir() and run_state(runs_dir, run_name)[0] == "done" and \
                config_hash(Trajectory(pr.path).config_dict) == pr.chash:
            ready.append(pr)  # finished here (or by an earlier version with the same hash): record it
        else:
            todo.append(pr)
    return held, ready, todo


def _train(todo: list[PlannedRun], runs_dir: Path, name: str, workers: int, progress: bool) -> None:
    from groklens.trainers.sweeps import InlineExecutor, RunSpec, run_sweep

    if not todo:
        return
    specs = [RunSpec(r.name, r.cfg) for r in todo]
    executor = InlineExecutor() if workers == 1 else "local"
    rep = run_sweep(specs, runs_dir, executor=executor, workers=workers, ensemble=True, progress=progress)
    if rep.counts["failed"]:
        first = next(iter(rep.failed.items()))
        raise GroklensError(f"{rep.counts['failed']} run(s) of {name} failed, e.g. {first[0]}: {first[1]}")
    if rep.counts["running"]:
        raise GroklensError(f"{rep.counts['running']} run(s) in {runs_dir} are being written by another process; "
                            "wait for it or use another -o")


def _measure_keys(exp: Experiment, sc: Scale, scale: str) -> list[str]:
    from groklens.analyses.compare import MEASURES

    names = {n for n, _, _ in exp.analyses(sc, scale)}
    return [m.key for m in MEASURES if m.analysis in names]


def reproduce(name: str, scale: str = "quick", out_dir: str | Path | None = None, seeds: int | None = None, *,
              workers: int | None = None, results_md: str | Path | None = None, ledger_dir: str | Path | None = None,
              progress: bool = True, echo: Callable[[str], None] = print) -> Result:
    """Train the runs the ledger lacks, record them, and read every recorded seed; see the module
    docstring. `ledger_dir`: where NAME.SCALE.json is kept (default OUT/ledger); `results_md`: a
    markdown file whose reproduce table gets the rows (none by default)."""
    from groklens.experiments.ledger import Ledger, LedgerRun, arm_hash, ledger_path, summarize_run

    t0 = time.perf_counter()
    exp = get_experiment(name)
    seeds, out = _check_args(exp, name, scale, seeds, workers, out_dir, results_md)
    ldir = Path(ledger_dir) if ledger_dir is not None else out / "ledger"
    if ldir.exists() and not ldir.is_dir():
        raise BadInput(f"--ledger {ldir} is not a directory")
    if not ldir.exists() and not ldir.parent.is_dir() and ledger_dir is not None:
        raise BadInput(f"--ledger {ldir}: directory {ldir.parent} does not exist")
    led = Ledger.load(ledger_path(ldir, name, scale), name, scale)
    sc = exp.scales[scale]
    plan = exp.plan(sc, scale)
    out.mkdir(exist_ok=True)
    runs_dir = out / "runs"
    held, ready, todo = _plan_runs(exp, scale, seeds, runs_dir, led)
    cmd = command_text(name, scale, seeds)
    n_workers = workers or (1 if scale == "smoke" else max(1, min(len(todo) or 1, os.cpu_count() or 1)))
    echo(f"{cmd}: {len(held) + len(ready) + len(todo)} runs ({len(plan.variants)} variants x {seeds} seed(s)); "
         f"{len(held)} in the ledger {led.path}, {len(ready)} finished in {runs_dir}, {len(todo)} to train")

    # 1. train what neither the ledger nor OUT/runs holds (interrupted runs resumed)
    _train(todo, runs_dir, name, n_workers, progress)
    t_train = time.perf_counter() - t0

    # 2. analyze the new runs and record them in the ledger
    new = ready + todo
    notes = _analyze(exp, sc, scale, [r.path for r in new], progress)
    keys = _measure_keys(exp, sc, scale)
    for r in new:
        led.add(summarize_run(r.path, name, r.variant, r.seed, keys))
    if new:
        led.save()
    t_an = time.perf_counter() - t0 - t_train

    # 3. compare and report the files present here (the ledger may hold more seeds than OUT/runs)
    present = {r.variant: [] for r in held + new}
    for r in held + new:
        if r.path.exists():
            present[r.variant].append(r.path)
    all_paths = [p for ps in present.values() for p in ps]
    report = _compare_and_report(out, all_paths, present.get(plan.baseline or "", []), notes)

    # 4. rows from the ledger: every recorded seed of each variant with the current config
    arms, apart = {}, []
    for variant, cfg in {r.variant: r.cfg for r in held + new}.items():
        ah = arm_hash(cfg.to_dict())
        arms[variant] = [LedgerRun(e) for e in led.current(variant, ah)]
        apart += _apart_note(led, variant, ah, cfg.to_dict())
    ctx = Context(name, scale, sc, plan, arms, out)
    rows = exp.read(ctx)
    wall = time.perf_counter() - t0
    notes += apart
    notes.append(f"time: training {t_train:.0f} s, analyses {t_an:.0f} s, total {wall:.0f} s; "
                 f"{len(todo)} run(s) trained, {len(new)} recorded in {led.path}")
    result = Result(name, scale, seeds, out, rows, wall, cmd, all_paths, report, notes, led.path,
                    _run_wall(arms), len(todo))
    (out / "results.json").write_text(json.dumps(result.to_json(), indent=1, default=_json_default))
    if results_md is not None:
        update_results_md(results_md, result)
    return result


def _compare_and_report(out: Path, paths: list[Path], baseline: list[Path], notes: list[str]) -> Path | None:
    from groklens.analyses.compare import compare
    from groklens.analyses.report import build_report

    if not paths:
        notes.append(f"no run files in {out / 'runs'}: every run came from the ledger; no comparison.txt or report")
        return None
    comp = compare(paths, baseline=baseline[0] if baseline else None, group_by="variant")
    (out / "comparison.txt").write_text(comp.format_table() + "\n")
    (out / "comparison.csv").write_text(comp.to_csv())
    rep = build_report(paths, out / "report", comparison=comp)
    notes += [f"not in the report: {t} ({w})" for t, w in rep.missing if not w.startswith("no run has")]
    return rep.index


def _apart_note(led, variant: str, ah: str, cfg: dict[str, Any]) -> list[str]:
    from groklens.experiments.ledger import config_diff

    other = led.apart(variant, ah)
    if not other:
        return []
    fields = sorted({f for e in other for f in config_diff(e["config"], cfg)})
    return [f"{variant}: {len(other)} ledger entr{'y' if len(other) == 1 else 'ies'} (seeds "
            f"{', '.join(str(e['seed']) for e in other)}) recorded with another config (differs in "
            f"{', '.join(fields) or 'hashed fields'}): not in these rows"]


def _run_wall(arms: dict[str, list[Any]]) -> str:
    walls = [r.wall_s for runs in arms.values() for r in runs if isinstance(r.wall_s, (int, float))]
    devices = sorted({str(r.entry.get("device", "?")).split(" (")[0] for runs in arms.values() for r in runs})
    if not walls:
        return ""
    return (f"{_fmt_duration(sum(walls) / len(walls))} per run (mean of {len(walls)}, max "
            f"{_fmt_duration(max(walls))}; {'/'.join(devices)})")


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
            result.run_wall or f"{_fmt_duration(result.wall_s)} (whole command)")) + " |")
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
    if result.run_wall:
        lines.append(f"wall time: {result.run_wall} (measured, from the ledger {result.ledger})")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


__all__ = ["EXPERIMENTS", "SCALES", "Experiment", "Published", "Result", "Row", "estimate_seconds", "format_listing",
           "format_result", "get_experiment", "listing", "reproduce", "run_configs", "update_results_md"]
