"""What every experiment shares: the scales, the data types (Row, Context, Experiment, Result),
the shared setups and the experiments registry (groklens.registry).

The public API of an experiment module: everything here without a leading underscore; a
paper's own data (its architectures, its table, its notes) lives in that paper's module."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from groklens.errors import BadInput
from groklens.registry import Registry
from groklens.experiments.verdicts import mean_flag, speedup_verdict

SCALES = ("smoke", "quick", "paper")
SPEEDUP_DEFINITION = ("T_baseline / T_variant: ratio of the geometric means of the grokking steps over seeds, 95% CI "
                      "from Welch's t-interval on the mean log steps (groklens.analyses.compare.speedup)")
DEFAULT_SEEDS = {"smoke": 1, "quick": 2, "paper": 10}
REPO_DOCS = Path(__file__).resolve().parents[1] / "docs"  # a source checkout's docs/ (absent in a wheel)
RESULTS_MD = REPO_DOCS / "RESULTS.md"
LEDGER_DIR = REPO_DOCS / "results"
RESULTS_BEGIN = "<!-- reproduce rows: written by `groklens reproduce`; a rerun of a command replaces its rows -->"
RESULTS_END = "<!-- end of reproduce rows -->"

# ---------------------------------------------------------------------- data types
@dataclass(frozen=True)
class Published:
    """A published number (or a claim without one) and where it is published."""

    value: float | None  # None: the source states the claim without a number
    text: str  # the claim or number as the source states it
    source: str


@dataclass
class Row:
    """One row of an experiment's result: a published value beside ours, their ratio or a verdict."""

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
    """An experiment at one scale (smoke, quick, paper): the shared config, what differs from the
    published setup, and the experiment's own knobs."""

    base: dict[str, Any]  # config fields shared by every run of the experiment at this scale
    note: str  # what differs from the published setup at this scale
    extra: dict[str, Any] = field(default_factory=dict)  # experiment-specific knobs
    # the step a run is expected to reach its stop event at (grokking, or the stop_test_loss
    # event), published or a baseline's: one for every variant, or variant -> step (a variant
    # missing: unknown). What `reproduce --list` costs a run to where the ledger has no runs
    # (experiments/cost.py); None: unknown, the run is costed to its step cap
    expect_grok: int | dict[str, int] | None = None

    @classmethod
    def of(cls, base: dict[str, Any], note: str, expect_grok: int | dict[str, int] | None = None,
           **extra: Any) -> "Scale":
        """Scale(base, note, extra, expect_grok) with the knobs as keywords."""
        return cls(base, note, extra, expect_grok)

    def expected_grok(self, variant: str) -> int | None:
        """The expected stop-event step of `variant`'s runs (None: unknown)."""
        if isinstance(self.expect_grok, dict):
            return self.expect_grok.get(variant)
        return self.expect_grok


@dataclass
class Plan:
    """The runs of one experiment at one scale: variant -> config overrides (on `base`)."""

    variants: dict[str, dict[str, Any]]
    baseline: str | None
    base: dict[str, Any]


@dataclass
class Arm:
    """The runs of one variant (arm) of an experiment."""

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
        lower bound), its text (mean ± std [min-max] (n); the final test accuracy; collapsed
        runs named), censored?"""
        runs = self.group(variant).runs
        times = [r.grok_time() for r in runs]
        if not runs or any(t is None for t in times):
            return None, "no evaluation" if runs else "no runs", True
        n = len(times)
        mean = sum(times) / n
        cens = sum(r.grok_censored for r in runs)
        sd = (sum((t - mean) ** 2 for t in times) / (n - 1)) ** 0.5 if n > 1 else None
        if cens == n:
            return mean, f"> {min(times):,.0f} (n={n}, all censored){self.final_text(variant)}", True
        text = f"{mean:,.0f}" + (f" ± {sd:,.0f} [{min(times):,.0f}-{max(times):,.0f}]" if sd is not None else "")
        text = (">= " if cens else "") + text
        text += f" (n={n}" + (f", {cens} censored: a lower bound)" if cens else ")")
        return mean, text + self.final_text(variant), cens > 0

    def final_text(self, variant: str) -> str:
        """'; final test acc 0.99 [0.98-1.00]' and, for runs that crossed and then fell back,
        'seed 2 crossed at N, collapsed at M, final test acc x'."""
        from groklens.analyses.grokking import collapse_text

        runs = self.group(variant).runs
        accs = [r.final_test_acc for r in runs if r.final_test_acc is not None]
        text = ""
        if accs:
            mean = sum(accs) / len(accs)
            text = f"; final test acc {mean:.3f}" + (f" [{min(accs):.3f}-{max(accs):.3f}]" if len(accs) > 1 else "")
        bad = [f"seed {r.seed} {collapse_text(r.collapse)}" for r in runs if collapse_text(r.collapse)]
        return text + ("; " + "; ".join(bad) if bad else "")

    def collapsed(self, *variants: str) -> int:
        return sum(r.collapsed for v in variants for r in self.group(v).runs)

    def speedup(self, base: str, variant: str) -> tuple[float | None, str, dict[str, Any]]:
        """T_base / T_variant: compare.speedup's definition (ratio of geometric means of the grokking
        steps, Welch t-interval on the log steps), the one `comparison.txt` uses too."""
        from groklens.analyses.compare import fmt_speedup, speedup
        from groklens.analyses.speedup import collapsed_as_censored

        rb, rv = self.group(base).runs, self.group(variant).runs
        if not rb or not rv:
            return None, "n/a (no runs)", {"value": None, "bound": None, "ci_note": "no runs"}
        sp = speedup(rb, rv)
        text = fmt_speedup(sp) + f" (n={len(rb)} / {len(rv)})"
        sp["collapsed"] = self.collapsed(base, variant)
        if sp["collapsed"]:  # the second reading of those runs, which the verdict also needs
            sp["if_censored"] = speedup(collapsed_as_censored(rb), collapsed_as_censored(rv))
            text += (f"; {sp['collapsed']} run(s) crossed and then collapsed (read as censored at their last step: "
                     f"{fmt_speedup(sp['if_censored'])})")
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

    def phase_ratio(self, variant: str, key: str, num: str, den: str) -> tuple[float | None, str, list | None, int]:
        """Mean over seeds of measure(num phase) / measure(den phase), over the seeds with both, its
        paired 95% t-interval (None for fewer than 2 seeds), and n; the text shows the two phases'
        means over those same seeds."""
        from groklens.analyses.compare import fmt_number
        from groklens.experiments.verdicts import fmt_ci, paired_interval

        runs = self.group(variant).runs
        pairs = [(r.value(key, num), r.value(key, den)) for r in runs]
        pairs = [(a, b) for a, b in pairs if a is not None and b not in (None, 0)]
        if not pairs:
            why = f"at {num}: {self.measure(variant, key, num)[1]}; at {den}: {self.measure(variant, key, den)[1]}"
            return None, why, None, 0
        mean, ci = paired_interval([a / b for a, b in pairs])
        n = len(pairs)
        mn, md = sum(a for a, _ in pairs) / n, sum(b for _, b in pairs) / n
        ci_text = f" {fmt_ci(ci)}" if ci is not None else ""
        return mean, (f"{fmt_number(mean)}{ci_text} {mean_flag(n, len(runs))} (paired means: {fmt_number(mn)} at "
                      f"{num} / {fmt_number(md)} at {den})"), ci, n


@dataclass
class Experiment:
    """A published experiment: its scales, the runs it plans at a scale, the analyses it computes
    on them and how it reads them into rows (register it with `register`)."""

    name: str
    summary: str
    scales: dict[str, Scale]
    plan: Callable[[Scale, str], Plan]
    read: Callable[[Context], list[Row]]
    # (name, params, where): where is end | phases | every (about 20 along, and the phases), or
    # a checkpoint choice of analyses/runner.choose_checkpoints ('every:2+phases')
    analyses: Callable[[Scale, str], list[tuple[str, dict[str, Any], str]]]
    seeds: dict[str, int] | None = None  # seeds by scale when not DEFAULT_SEEDS
    published: bool = True  # False: no published numbers to reproduce (the demo)
    # (run file, scale) -> JSON values read from the whole run (curves, not phase values), computed
    # when the run is recorded and kept in its ledger entry (LedgerRun.run_values)
    run_values: Callable[[Path, Scale], dict[str, Any]] | None = None
    own_out: str | None = None  # the directory a command of its own writes to by default (`groklens demo`)
    # figures drawn from the ledger's runs (the rows' context) into its out_dir; returns their paths
    figures: Callable[[Context], list[Path]] | None = None

    def seeds_default(self, scale: str) -> int:
        return (self.seeds or DEFAULT_SEEDS)[scale]

    def default_outs(self, scale: str) -> list[Path]:
        """The output directories its commands write to when given no --out, relative to the
        working directory: `reproduce`'s, and its own command's."""
        return [default_out(self.name, scale)] + ([Path(self.own_out)] if self.own_out else [])


def default_out(name: str, scale: str) -> Path:
    """`reproduce NAME --scale SCALE`'s output directory when given no --out."""
    return Path(f"reproduce-{name}-{scale}")


@dataclass
class Result:
    """What `reproduce` returns: the rows of one experiment at one scale and where its files are."""

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
    run_lines: list[str] = field(default_factory=list)  # the per-run table of docs/RESULTS.md (pipeline.run_table)

    def to_json(self) -> dict[str, Any]:
        return {"experiment": self.name, "scale": self.scale, "seeds": self.seeds, "out_dir": str(self.out_dir),
                "command": self.command, "wall_s": self.wall_s, "rows": [r.to_dict() for r in self.rows],
                "runs": [str(p) for p in self.runs], "report": str(self.report) if self.report else None,
                "ledger": str(self.ledger) if self.ledger else None, "run_wall": self.run_wall,
                "trained": self.trained, "speedup_method": SPEEDUP_DEFINITION, "notes": self.notes}


# ---------------------------------------------------------------------- shared setups
# The smoke scale of every experiment: a tiny pipeline check for the test suite (SMOKE_NOTE).
SMOKE = dict(task="add", p=7, train_frac=0.5, d_model=16, n_heads=2, d_head=8, d_mlp=32, steps=30, eval_every=10,
             checkpoint_every=10, device="cpu")
SMOKE_NOTE = "smoke: a tiny pipeline check, not a reproduction (p=7, d_model 16, 30 steps)"
# Quick scale: one small modular-addition transformer where a pre-LayerNorm model groks in ~2,000
# steps at lr 3e-3 (measured: docs/VARIANTS.md, config B), so baselines grok within a few minutes
# on a 2-core CPU. lr 3e-3 is 5x the sphere paper's 6e-4 (at 6e-4 the LayerNorm baseline needs
# ~10k steps here): absolute grokking times are not comparable, speed-ups and claims are.
QUICK = dict(task="add", p=23, train_frac=0.5, d_model=64, n_heads=2, d_head=32, d_mlp=256, norm="ln", lr=3e-3,
             weight_decay=1.0, eval_every=50, checkpoint_every=250, device="cpu")
# The experiments read grokking as their committed ledger entries were recorded, at the first
# crossing (grok_evals 1, its legacy value, so their config hashes stay those entries'); a scale
# that sets grok_evals reads it its way, and its entries, hashed anew, are trained afresh.
# the rules the experiments' ledgers were recorded under (grokked at the first crossing; the stop
# rule counting evaluations, not waiting for the event to hold again): their config hashes and runs stay
EXPERIMENT_DEFAULTS = {"grok_evals": 1, "stop_at_event": False}
QUICK_GROK = 2_000  # its baseline's grokking step (above): the cost model's expectation where a ledger has none
# Nanda et al. 2023's canonical p=113 model (the default preset): test loss 0.86 at ~13.8k steps
# (REFERENCES.md), the expected grokking step of experiments that train it
# a variant's field set to this takes each run's seed (pipeline.run_configs): data_seed FROM_SEED
# draws every seed's own split, as papers that seed the split with the run do
FROM_SEED = "from_seed"
CANONICAL_GROK = 13_800
QUICK_NOTE = ("p=23, 50% of pairs, 1 layer, d_model 64, 2 heads, d_mlp 256, pre-LayerNorm, lr 3e-3 (Nanda: p=113, "
              "30%, d_model 128, 4 heads, d_mlp 512, no norm, lr 1e-3)")


def grok_row(ctx: Context, measure: str, published: Published, variant: str, differs: str) -> Row:
    """A grokking-time row: mean over seeds; a censored seed makes ours a lower bound."""
    ours, text, cens = ctx.grok(variant)
    return Row(measure, published, ours, text, differs, bound="lower" if cens and ours is not None else "")


def speedup_row(ctx: Context, measure: str, published: Published, base: str, variant: str, differs: str,
                verdict: bool = False) -> Row:
    """A speed-up row (ratio of geometric means, Welch interval); `verdict`: the claim "faster"."""
    ours, text, sp = ctx.speedup(base, variant)
    return Row(measure, published, ours, text, differs,
               speedup_verdict(sp, collapsed=sp.get("collapsed", 0)) if verdict else "", sp.get("bound") or "")


def lr_tag(lr: float) -> str:
    """6e-4 -> '6e-4', 1.5e-3 -> '1.5e-3' (run names)."""
    mant, exp = f"{lr:e}".split("e")
    return f"{mant.rstrip('0').rstrip('.')}e{int(exp)}"


def no_analyses(sc: Scale, scale: str) -> list[tuple[str, dict[str, Any], str]]:
    """Experiment.analyses of an experiment that reads only the grokking times (none to compute)."""
    return []


# ---------------------------------------------------------------------- the registry
# Every experiment module of this package registers its experiments (`register`); the package
# imports them all (experiments/__init__.py), and a package outside the tree adds its
# modules through the entry-point group ENTRY_POINTS (docs/EXTENDING.md).
ENTRY_POINTS = "groklens.experiments"
EXPERIMENTS: Registry[Experiment] = Registry("experiment", entry_points=ENTRY_POINTS)


def register(e: Experiment) -> Experiment:
    """Add experiment `e` to EXPERIMENTS under its name (a duplicate name is an error)."""
    return EXPERIMENTS.register(e.name)(e)


def fit_text(recs: list[Any], variables: list[str]) -> dict[str, tuple[float | None, str]]:
    """The fitted exponent of each variable of a scaling fit (analyses.scaling) with its text:
    var -> (estimate, 'OLS ... (n grokked); Tobit ... (n, k censored)'); Tobit's estimate when
    some runs are censored."""
    return {v: (est, text) for v, (est, _, text) in fit_exponents(recs, variables).items()}


def fit_exponents(recs: list[Any], variables: list[str]) -> dict[str, tuple[float | None, list | None, str]]:
    """fit_text's exponents with their 95% intervals: var -> (estimate, ci95 or None, text), the
    interval of the estimate given (Tobit's when some runs are censored, else OLS's)."""
    from groklens.analyses.scaling import fit_scaling_law

    try:
        fit = fit_scaling_law(recs, variables)
    except BadInput as exc:
        return {v: (None, None, f"no fit: {exc}") for v in variables}
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
        ours, ci = e["estimate"], e["ci95"]
        if tobit is not None:
            t = tobit["exponents"][v]
            text = (f"Tobit {t['estimate']:.2f} [{t['ci95'][0]:.2f}, {t['ci95'][1]:.2f}] (n={tobit['n']}, "
                    f"{tobit['n_censored']} censored); " + text)
            ours, ci = t["estimate"], t["ci95"]
        elif n_c:
            text += f"; Tobit n/a ({terr}): OLS on the grokked runs only is biased"
            ours, ci = None, None
        out[v] = (ours, ci, text)
    return out
