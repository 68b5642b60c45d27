"""The report's figures: turns the comparison's runs (their metrics and stored analyses) into
arrays and draws them with `groklens.analyses.figures` (which only draws). Means over seeds,
neuron counts and checkpoint choices are made here. A figure is made only when its data exists;
the others are listed with the reason."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from groklens.analyses import figures as F
from groklens.analyses.grokking import grokked_rule
from groklens.analyses.compare import (
    Comparison, Group, Measure, RunSummary, fmt_number, measure_key, nearest_checkpoint)
from groklens.analyses.clock_pizza import (ALGORITHM_RULE, CLOCK_MAX_SYMMETRICITY, CLOCK_MIN_IRRELEVANCE,
                                           PIZZA_MIN_SYMMETRICITY)
from groklens.analyses.fourier import CLUSTER_THRESHOLD
from groklens.analyses.phases import phase_checkpoint
from groklens.analyses.progress import phase_boundaries, progress_curves, PHASE_RULE
from groklens.analyses.trajectory_pca import parameter_pca
from groklens.config import PHASE_THRESHOLDS

DPI = 110
# the figures every report makes from the metrics (make_figures), before the analysis families
BASE_FIGURES = ("curves", "grokking_times")


@dataclass(frozen=True)
class FigureFamily:
    """Figures drawn from one stored analysis (registered with @figure, in page order)."""

    make: Callable[[Any], None]  # make(f: _Figs): appends its FigureSpecs to f.figs, or (title, why) to f.missing
    names: tuple[str, ...]  # the figures it can make (fig_<name>.<format>)
    missing: dict[str, tuple[str, ...]]  # each "Missing figures" title it may list -> the figures it stands for


FAMILIES: list[FigureFamily] = []


def figure(*names: str, missing: dict[str, tuple[str, ...]] | None = None) -> Callable:
    """Decorator registering a figure family (a function of _Figs) that makes the figures `names`;
    `missing`: each title it lists when its data is missing -> the figures the title stands for."""

    def add(func: Callable[[Any], None]) -> Callable[[Any], None]:
        FAMILIES.append(FigureFamily(func, tuple(names), dict(missing or {})))
        return func

    return add


@dataclass
class FigureSpec:
    name: str
    title: str
    caption: str
    figure: Any  # matplotlib Figure


# ---------------------------------------------------------------------- series helpers
def _positive(steps: np.ndarray, *arrays: np.ndarray):
    keep = np.asarray(steps) > 0  # a log step axis has no step 0
    return (np.asarray(steps)[keep], *[np.asarray(a)[keep] for a in arrays])


def _on_common_steps(series: Sequence[tuple[np.ndarray, np.ndarray]]):
    """(steps every series has, [series, steps] values) of several (steps, values) series; None if < 2."""
    if len(series) < 2:
        return None
    common = set(np.asarray(series[0][0]).tolist())
    for s, _ in series[1:]:
        common &= set(np.asarray(s).tolist())
    if not common:
        return None
    steps = np.array(sorted(common))
    vals = []
    for s, v in series:
        idx = {int(x): i for i, x in enumerate(np.asarray(s).tolist())}
        vals.append(np.asarray(v, dtype=float)[[idx[int(x)] for x in steps]])
    return steps, np.stack(vals)


def _mean_over_common(series: Sequence[tuple[np.ndarray, np.ndarray]]):
    """Mean of several (steps, values) series over the steps every series has; None if < 2."""
    common = _on_common_steps(series)
    return None if common is None else (common[0], np.nanmean(common[1], axis=0))


def _spread_over_common(series: Sequence[tuple[np.ndarray, np.ndarray]]):
    """(steps, median, min, max) of several series over the steps every series has; None if < 2."""
    common = _on_common_steps(series)
    if common is None:
        return None
    steps, vals = common
    return steps, np.nanmedian(vals, axis=0), np.nanmin(vals, axis=0), np.nanmax(vals, axis=0)


def run_curves(run: RunSummary) -> F.RunCurves:
    m = run.metrics
    steps, tra, tea, trl, tel = _positive(m["step"], m["train_acc"], m["test_acc"], m["train_loss"], m["test_loss"])
    return F.RunCurves(steps, tra, tea, trl, tel, grok_step=run.grokking, label=run.name)


def variant_curves(groups: Sequence[Group], colours: Sequence[str]) -> list[F.VariantCurves]:
    out = []
    for g, c in zip(groups, colours):
        runs = [run_curves(r) for r in g.runs]
        mean = None
        if len(runs) > 1:
            parts = {}
            for key in ("train_acc", "test_acc", "train_loss", "test_loss"):
                parts[key] = _mean_over_common([(r.steps, getattr(r, key)) for r in runs])
            if all(v is not None for v in parts.values()):
                mean = F.RunCurves(parts["test_acc"][0], *(parts[k][1] for k in
                                   ("train_acc", "test_acc", "train_loss", "test_loss")), label="mean")
        out.append(F.VariantCurves(g.label, runs, mean, c))
    return out


def stored_series(run: RunSummary, analysis: str, key: str, reduce: str = "scalar"):
    """(steps, values) of one stored value over the stored checkpoints, steps > 0; None if absent."""
    st = run.stored.get(analysis)
    if st is None or key not in st.values or not st.steps:
        return None
    vals = []
    for v in st.values[key]:
        a = np.asarray(v, dtype=float).reshape(-1)
        vals.append(np.nan if a.size == 0 else a[0] if reduce in ("scalar", "first") else a.mean())
    steps, vals = _positive(np.asarray(st.steps), np.asarray(vals))
    return (steps, vals) if len(steps) else None


def _key_for(run: RunSummary, analysis: str, pattern: str) -> str | None:
    """The stored value name for `pattern`: '{site}' is the last hidden representation, '{mlp}'
    the last block's MLP neurons (blocks.{l}.mlp.hook_post)."""
    st = run.stored.get(analysis)
    if st is None:
        return None
    if "{mlp}" in pattern:
        prefix = pattern.split("@", 1)[0] + "@"
        hits = [(int(m.group(1)), k) for k in st.values
                if (m := re.fullmatch(re.escape(prefix) + r"blocks\.(\d+)\.mlp\.hook_post", k))]
        return max(hits)[1] if hits else None

    return measure_key(Measure("", analysis, pattern, ""), list(st.values))


def measure_lines(groups: Sequence[Group], colours: Sequence[str], analysis: str, pattern: str,
                  reduce: str = "scalar", label_groups: bool = True) -> list[F.Line]:
    """Per seed a thin line, per group the mean over seeds bold (one line per group when 1 seed)."""
    lines = []
    for g, c in zip(groups, colours):
        series = []
        for r in g.runs:
            key = _key_for(r, analysis, pattern)
            s = stored_series(r, analysis, key, reduce) if key else None
            if s is not None:
                series.append(s)
        if not series:
            continue
        if len(series) == 1:
            lines.append(F.Line(series[0][0], series[0][1], c, g.label if label_groups else None, bold=True,
                                marker="o" if len(series[0][0]) < 30 else None))
            continue
        for s in series:  # sparse series (few analyzed checkpoints) get markers, so points read as points
            lines.append(F.Line(s[0], s[1], c, marker="o" if len(s[0]) < 30 else None))
        mean = _mean_over_common(series)
        if mean is not None:
            lines.append(F.Line(mean[0], mean[1], c, g.label if label_groups else None, bold=True))
        else:
            lines[-1].label = g.label if label_groups else None
    return lines


def accuracy_lines(groups: Sequence[Group], colours: Sequence[str]) -> list[F.Line]:
    lines = []
    for g, c in zip(groups, colours):
        series = []
        for r in g.runs:
            s, acc = _positive(r.metrics["step"], r.metrics["test_acc"])
            series.append((s, acc))
            lines.append(F.Line(s, acc, c, None if len(g.runs) > 1 else g.label, bold=len(g.runs) == 1))
        mean = _mean_over_common(series)
        if mean is not None:
            lines.append(F.Line(mean[0], mean[1], c, g.label, bold=True,
                                ends_early=F.ends_early(mean[0], [s for s, _ in series])))
        elif len(g.runs) > 1:
            lines[-1].label = g.label  # no evaluation shared by every seed: name the group anyway
    return lines


def _yscale(lines: Sequence[F.Line]) -> str:
    ys = np.concatenate([np.asarray(ln.y, dtype=float) for ln in lines]) if lines else np.zeros(0)
    ys = ys[np.isfinite(ys)]
    return "log" if len(ys) and (ys > 0).all() and ys.max() / max(ys.min(), 1e-300) > 20 else "linear"


# ---------------------------------------------------------------------- the figures
def _present(groups: Sequence[Group], analysis: str) -> bool:
    return any(analysis in r.stored and r.stored[analysis].steps for g in groups for r in g.runs)


def why_missing(groups: Sequence[Group], analysis: str) -> str:
    return (f"no run has '{analysis}' results in its sidecar: run `groklens analyze RUN.h5 --metric {analysis}` "
            f"(or `groklens report --analyze --metric {analysis}`)")


def chosen_checkpoints(run: RunSummary, stored_steps: Sequence[int], steps: Sequence[int] | None):
    """(step, label) pairs for the per-checkpoint grids: the stored steps nearest the asked ones, or
    nearest to the start, memorization, grokking and the last checkpoint."""
    if not stored_steps:
        return []
    if steps:
        wanted = [(s, f"step {s}") for s in steps]
    else:
        wanted = [(stored_steps[0], "start"), (run.memorization, "memorized"), (run.grokking, "grokked"),
                  (run.checkpoints[-1] if run.checkpoints else None, "end")]
    out, seen = [], set()
    for target, label in wanted:
        s = nearest_checkpoint(stored_steps, target)
        if s is None:
            out.append((None, f"{label}: never" if label == "grokked" else label))
            continue
        if s in seen:
            continue
        seen.add(s)
        if label.startswith("step"):
            out.append((s, f"step {s}" if s == target else f"step {s} (nearest {target})"))
        else:  # the event's own step when the nearest stored checkpoint is not at it
            out.append((s, f"step {s} ({label})" if s == target or label in ("start", "end")
                        else f"step {s} ({label} at {target})"))
    return out


def cluster_counts(neuron_frequency, neuron_fraction, threshold: float, n_freq: int) -> tuple[np.ndarray, int]:
    """MLP neurons per frequency 1..n_freq whose variance lies >= `threshold` in that frequency's
    2-D block (the fourier analysis' neuron_frequency / neuron_fraction), and how many are not."""
    nf = np.asarray(neuron_frequency).reshape(-1).astype(int)
    fr = np.asarray(neuron_fraction, dtype=float).reshape(-1)
    clustered = (fr >= threshold) & (nf >= 1)
    return np.bincount(nf[clustered], minlength=n_freq + 1)[1: n_freq + 1], int((~clustered).sum())


def cluster_threshold(stored_fourier) -> float:
    """The cluster threshold the stored fourier analysis ran with."""
    return float(json.loads(stored_fourier.attrs.get("params", "{}")).get("cluster_threshold", CLUSTER_THRESHOLD))


def fourier_grids(groups: Sequence[Group], colours: Sequence[str], steps: Sequence[int] | None):
    """Spectrum and cluster figures of each group's first run at its chosen checkpoints."""
    reps = [(g, c, g.runs[0]) for g, c in zip(groups, colours) if "fourier" in g.runs[0].stored
            and g.runs[0].stored["fourier"].steps]
    if not reps:
        return None
    plans = [chosen_checkpoints(r, r.stored["fourier"].steps, steps) for _, _, r in reps]
    n_cols = max(len(p) for p in plans)
    n_freq = max(len(np.asarray(r.stored["fourier"].values["embedding_power"][0]).reshape(-1)) for _, _, r in reps)
    freqs = np.arange(1, n_freq + 1)
    power = np.full((len(reps), n_cols, n_freq), np.nan)
    counts = np.full((len(reps), n_cols, n_freq), np.nan)
    uncl = np.zeros((len(reps), n_cols))
    col_labels = [[""] * n_cols for _ in reps]
    keys = [[[] for _ in range(n_cols)] for _ in reps]
    thresholds = set()
    for i, ((_g, _c, r), plan) in enumerate(zip(reps, plans)):
        st = r.stored["fourier"]
        where = {s: j for j, s in enumerate(st.steps)}
        thr = cluster_threshold(st)
        thresholds.add(thr)
        for k, (s, label) in enumerate(plan):
            col_labels[i][k] = label
            if s is None:
                continue
            j = where[s]
            pw = np.asarray(st.values["embedding_power"][j], dtype=float).reshape(-1)
            power[i, k, : len(pw)] = pw
            keys[i][k] = [int(x) for x in np.asarray(st.values["key_frequencies"][j]).reshape(-1)]
            counts[i, k], uncl[i, k] = cluster_counts(st.values["neuron_frequency"][j], st.values["neuron_fraction"][j],
                                                      thr, n_freq)
    rows = [f"{g.label} (run {r.name})" if g.n > 1 else g.label for g, _, r in reps]
    cols = [c for _, c, _ in reps]
    spec = F.spectrum_grid(freqs, power, rows, col_labels, key_frequencies=keys, colours=cols)
    clus = F.cluster_grid(freqs, counts, uncl, rows, col_labels,
                          threshold=thresholds.pop() if len(thresholds) == 1 else None, colours=cols)
    return spec, clus


OPERAND_POSITIONS = ("a", "b", "=")  # the binary tasks' sequence (groklens/tasks.py)


def position_names(n_pos: int) -> list[str]:
    """The names of a pattern's source positions: a, b, = for the binary tasks, else their indices."""
    return list(OPERAND_POSITIONS) if n_pos == 3 else [str(j) for j in range(n_pos)]


def pattern_grid(groups: Sequence[Group], steps: Sequence[int] | None):
    """Heat maps of the last attention layer's readout pattern, each group's first run at its
    chosen checkpoints; None when no run stored the pattern (sidecars written before it existed)."""
    reps = [(g.label, g.runs[0].stored["attention"], g.runs[0]) for g in groups
            if "attention" in g.runs[0].stored and g.runs[0].stored["attention"].steps
            and "pattern" in g.runs[0].stored["attention"].values]
    if not reps:
        return None
    shapes = [np.asarray(st.values["pattern"][0]).shape[1:] for _, st, _ in reps]  # [H, n_ctx]
    if len(set(shapes)) > 1:  # different head counts or sequence lengths: one figure cannot hold them
        reps = reps[:1]
    shape = shapes[0]
    plans = [chosen_checkpoints(run, st.steps, steps) for _, st, run in reps]
    n_cols = max(len(p) for p in plans)
    pats = np.full((len(reps), n_cols, *shape), np.nan)
    col_labels = [[label for _, label in plan] + [""] * (n_cols - len(plan)) for plan in plans]
    for i, ((_, st, _), plan) in enumerate(zip(reps, plans)):
        where = {s: j for j, s in enumerate(st.steps)}
        for k, (s, _) in enumerate(plan):
            if s is not None:
                pats[i, k] = np.asarray(st.values["pattern"][where[s]], dtype=float)[-1]
    n_heads, n_pos = shape
    names = position_names(n_pos)
    rows = [label.replace(" ", "\n") for label, _, _ in reps]  # "norm=ln act_norm_lambda=1": one field a line
    return F.pattern_grid(pats, rows, col_labels, names, [f"head {h}" for h in range(n_heads)])


def make_figures(comp: Comparison,
                 steps: Sequence[int] | None = None) -> tuple[list[FigureSpec], list[tuple[str, str]]]:
    """Every figure whose data exists, and (title, why) for each that is missing."""
    groups = comp.groups
    colours = [F.colour(i) for i in range(len(groups))]
    thr = comp.threshold
    figs: list[FigureSpec] = []
    missing: list[tuple[str, str]] = []

    # training curves and grokking times: from the metrics every run has
    figs.append(FigureSpec(
        "curves", "Accuracy and loss against step",
        "Train (dashed) and test (solid) accuracy and loss, log step axis; one colour per variant, seeds thin "
        "and the mean over seeds bold, over the evaluations every seed has: where a seed stopped early (its stop "
        "rule) the mean ends, marked by a dotted vertical line, and the longer seeds go on alone; dots: grokking "
        f"points ({grokked_rule([r.grok_evals for g in groups for r in g.runs], f'{thr:g}')}).",
        F.training_curves(variant_curves(groups, colours), threshold=thr)))
    times, cens, means = [], [], []
    for g in groups:
        times.append([r.grok_time() if r.grok_time() is not None else np.nan for r in g.runs])
        cens.append([r.grok_censored for r in g.runs])
        ok = [r.grokking for r in g.runs if r.grokking is not None]
        means.append(float(np.mean(ok)) if ok and len(ok) == len(g.runs) else None)
    figs.append(FigureSpec(
        "grokking_times", "Grokking time per seed",
        "Each point is a seed's grokking step; an open triangle is a censored seed, drawn at the step where it "
        "was censored (it had not grokked by then); the bar is the group mean when every seed grokked.",
        F.grokking_times([g.label for g in groups], times, cens, means=means, colours=colours)))
    acc = accuracy_lines(groups, colours)
    marks = [(m, c) for m, c in zip(means, colours) if m is not None]
    f = _Figs(groups, colours, thr, acc, marks, steps, figs, missing)
    for family in FAMILIES:
        family.make(f)
    return figs, missing


@dataclass
class _Figs:
    """What every figure family reads, the lists it adds to, and the steps they share."""

    groups: Sequence[Group]
    colours: Sequence[str]
    thr: float
    acc: list  # the test-accuracy lines every analysis figure is aligned with
    marks: list  # (mean grokking step, colour) per group that grokked
    steps: Sequence[int] | None
    figs: list[FigureSpec]
    missing: list[tuple[str, str]]

    def lacks(self, analysis: str, *titles: str) -> bool:
        """True, with each title listed as missing and why, when no run stored `analysis`."""
        if _present(self.groups, analysis):
            return False
        why = why_missing(self.groups, analysis)
        self.missing += [(t, why) for t in titles]
        return True

    def lines(self, analysis: str, pattern: str, reduce: str = "scalar") -> list[F.Line]:
        return measure_lines(self.groups, self.colours, analysis, pattern, reduce)

    def over_time(self, name: str, title: str, caption: str, panels: list, panel_title: str) -> None:
        """A figure of `panels` against step, aligned with test accuracy and the grokking marks."""
        self.figs.append(FigureSpec(name, title, caption, F.aligned_panels(
            self.acc, panels, title=panel_title, threshold=self.thr, marks=self.marks)))

    def which_runs(self) -> str:
        return "first seed of each group" if any(g.n > 1 for g in self.groups) else "each run"


@figure("fourier_fve", "fourier_spectrum", "neuron_clusters",
        missing={"Fourier-circuit FVE against step": ("fourier_fve",),
                 "Embedding Fourier spectrum": ("fourier_spectrum",),
                 "Neuron-frequency clusters": ("neuron_clusters",)})
def _fourier_figures(f: _Figs) -> None:
    """Fourier FVE over time, the spectrum and the neuron clusters at chosen checkpoints."""
    if f.lacks("fourier", "Fourier-circuit FVE against step", "Embedding Fourier spectrum",
               "Neuron-frequency clusters"):
        return
    # an embedding without Fourier structure puts the key set's share of the frequencies in the key
    # set (key_share): drawn dotted, the level the embedding FVE is at by construction (at small p
    # the key set holds most frequencies and the FVE sits near 1 whatever the embedding)
    chance = [F.Line(ln.x, ln.y, ln.colour, None, style=":") for ln in f.lines("fourier", "key_share")]
    panels = [F.Panel(lbl, f.lines("fourier", key) + (chance if key == "embedding_fve" else []), ylim=(-0.02, 1.02))
              for key, lbl in (("neuron_fve", "FVE, neuron (Nanda)"), ("ls_fve", "FVE, least squares"),
                               ("embedding_fve", "FVE, embedding\n(dotted: key set's share\nof the frequencies)"))]
    f.over_time(
        "fourier_fve", "Fourier-circuit FVE against step",
        "Fraction of variance explained by the key frequencies: neuron activations (Nanda's 2-D block "
        "definition), least squares on the readout directions (bounded-sphere paper), and the embedding; "
        "aligned with test accuracy. Dotted in the embedding panel: the key set's share of the p//2 "
        "frequencies, what an embedding without Fourier structure scores (at small p the key set holds most "
        "frequencies, so the embedding FVE is near 1 by construction: read its distance above the dotted line). "
        "Definitions: docs/ANALYSES.md.", panels, "Fourier-circuit FVE")
    spec, clus = fourier_grids(f.groups, f.colours, f.steps)
    which = f.which_runs()
    f.figs.append(FigureSpec(
        "fourier_spectrum", "Embedding Fourier spectrum at chosen checkpoints",
        f"Share of the embedding's Fourier power per frequency k (W_E without the '=' row), {which}, at the "
        "stored checkpoints nearest the start, memorization, grokking and the end; key frequencies outlined.",
        spec))
    f.figs.append(FigureSpec(
        "neuron_clusters", "Neuron-frequency clusters at chosen checkpoints",
        f"MLP neurons whose variance lies >= the cluster threshold in one frequency's 2-D block, counted per "
        f"frequency ({which}, same checkpoints); the rest are unclustered.", clus))


FVE_TOP5 = "The bounded-sphere paper's FVE reading over seeds and along the run"


def value_at_accuracy(run: RunSummary, series: tuple[np.ndarray, np.ndarray], accuracy: float):
    """(step, value) of a stored series at the first evaluation with test accuracy >= `accuracy`,
    read at the stored checkpoint within one evaluation interval of it (compare's phase rule); None
    when the run never reached it or no stored checkpoint is that close."""
    hit = np.nonzero(np.asarray(run.metrics["test_acc"], dtype=float) >= accuracy)[0]
    if not len(hit):
        return None
    steps, values = series
    cp, _ = phase_checkpoint([int(s) for s in steps], int(run.metrics["step"][hit[0]]),
                             int(run.config.get("eval_every", 1)), f"test accuracy {accuracy:g}")
    return None if cp is None else (cp, float(values[list(steps).index(cp)]))


@figure("fve_top5", missing={FVE_TOP5: ("fve_top5",)})
def _fve_top5_figures(f: _Figs) -> None:
    """The least-squares FVE of W_L's top 5 frequencies (the bounded-sphere paper's reading) over
    seeds: its distribution along the run and where the paper reads it (test accuracy 0.99)."""
    if f.lacks("fourier", FVE_TOP5):
        return
    at = PHASE_THRESHOLDS[1]
    groups = []
    for g, c in zip(f.groups, f.colours):
        series, marked = [], []
        for r in g.runs:
            key = _key_for(r, "fourier", "ls_fve_top_k")
            s = stored_series(r, "fourier", key) if key else None
            if s is None:
                continue
            series.append(s)
            if (m := value_at_accuracy(r, s, at)) is not None:
                marked.append(m)
        groups.append(F.SeedSpread(g.label, c, series, _spread_over_common(series), marked))
    f.figs.append(FigureSpec(
        "fve_top5", FVE_TOP5,
        "Least-squares FVE of the cos and sin directions of the top 5 frequencies of W_L by Fourier norm, the mean "
        "of those 10 values (fve_ls_top5: the bounded-sphere paper's notebook's reading, docs/ANALYSES.md), at every "
        "analyzed checkpoint: each seed thin, each group's median bold with its min-max band over the checkpoints "
        f"every seed has. Dots and the right panel: each seed's value at its first evaluation with test accuracy >= "
        f"{at:g} (the stored checkpoint within one evaluation interval; the notebook's checkpoint), the bar the "
        "group's median. Analyze every checkpoint (`groklens analyze RUN --metric fourier --every 1`) to see the "
        "whole run.",
        F.spread_over_seeds(groups, ylabel="FVE, least squares, top 5 of W_L", mark_label=f"test accuracy >= {at:g}",
                            title="Fourier FVE (top 5 of W_L) over seeds")))


def progress_panel(run: RunSummary) -> F.ProgressPanel | None:
    """Nanda's progress-measure curves of one run with its phases (analyses/progress.py); None when
    no restricted / excluded loss is stored at two or more checkpoints."""
    c = progress_curves(run.path)
    if len(c.ck_steps) < 2:
        return None
    ph = phase_boundaries(c)
    bounds = [0, ph["memorization_end"], ph["circuit_formation_end"], ph["cleanup_end"]]
    names = ("memorization", "circuit formation", "cleanup")
    phases = [(lo, hi, n) for lo, hi, n in zip(bounds, bounds[1:], names) if lo is not None and hi is not None]
    known = [b for b in bounds if b is not None]
    if len(known) < len(bounds):  # the phase the run stopped in: shaded to its last step, said open
        phases.append((known[-1], int(c.steps[-1]), f"{names[len(known) - 1]} (not over by the last step)"))
    return F.ProgressPanel(run.name, c.steps, c.train_loss, c.test_loss, c.weight_sq, c.ck_steps, c.restricted,
                           c.excluded, phases, c.key_source)


@figure("progress_measures",
        missing={"Progress measures (Nanda et al.): losses and weight norm against step": ("progress_measures",)})
def _progress_figures(f: _Figs) -> None:
    """Nanda's progress measures of the first run of each group that has them."""
    title = "Progress measures (Nanda et al.): losses and weight norm against step"
    panels = [p for g in f.groups if (p := progress_panel(g.runs[0])) is not None]
    if not panels:
        f.missing.append((title, "no run has the fourier analysis stored at two or more checkpoints: run `groklens "
                                 "analyze RUN.h5 --metric fourier --param fourier.key_frequencies=last`"))
        return

    f.figs.append(FigureSpec(
        "progress_measures", title,
        f"{f.which_runs().capitalize()}: train and test loss (every evaluation), restricted and excluded loss "
        "(the checkpoints analyzed, with the key set in the title: fixed = one set for every checkpoint, as Nanda "
        "computes the curves), log loss axis; below, the total sum of squared weights. Phases shaded by our rule: "
        f"{PHASE_RULE}.", F.progress_measures(panels)))


def _head_lines(f: _Figs) -> list[F.Line]:
    """The attention mass of every head of every run, dotted, over time."""
    heads = []
    for g, c in zip(f.groups, f.colours):
        for r in g.runs:
            st = r.stored.get("attention")
            if st is None or not st.steps:
                continue
            per = np.stack([np.asarray(v, dtype=float) for v in st.values["mass_per_head"]])  # [n, L, H]
            s = np.asarray(st.steps)
            for layer in range(per.shape[1]):
                for h in range(per.shape[2]):
                    x, y = _positive(s, per[:, layer, h])
                    heads.append(F.Line(x, y, c, style=(0, (1, 1))))
    return heads


@figure("attention", "attention_patterns",
        missing={"Attention at the readout position": ("attention", "attention_patterns")})
def _attention_figures(f: _Figs) -> None:
    """Attention at the readout position over time and its patterns at chosen checkpoints."""
    if f.lacks("attention", "Attention at the readout position"):
        return
    unit = (-0.02, 1.02)
    panels = [F.Panel("mass on informative tokens\n(mean over heads and inputs)", f.lines("attention", "mass", "mean"),
                      ylim=unit),
              F.Panel("per head (dotted)", _head_lines(f), ylim=unit),
              F.Panel("least-attended informative token\n(mean over inputs)",
                      f.lines("attention", "min_token_mass", "mean"), ylim=unit)]
    f.over_time(
        "attention", "Attention at the readout position over time",
        "Attention of the readout query on the informative tokens (a, b): total mass, per head, and the mass "
        "on the least-attended informative token; uniform attention sits at 2/3 by construction.",
        panels, "Attention at the readout position")
    grid = pattern_grid(f.groups, f.steps)
    if grid is not None:
        f.figs.append(FigureSpec(
            "attention_patterns", "Attention patterns at the readout position at chosen checkpoints",
            f"The readout query's attention weights over the source positions (columns) for every head (rows) "
            f"of the last attention layer, mean over all inputs; {f.which_runs()}, at the stored checkpoints "
            "nearest the start, memorization, grokking and the end.", grid))


@figure("hessian", missing={"Hessian top eigenvalue and trace": ("hessian",)})
def _hessian_figures(f: _Figs) -> None:
    """Hessian top eigenvalue and trace over time."""
    if f.lacks("sharpness", "Hessian top eigenvalue and trace"):
        return
    top, tr = f.lines("sharpness", "top_eigenvalues", "first"), f.lines("sharpness", "trace")
    f.over_time(
        "hessian", "Hessian top eigenvalue and trace over time",
        "Largest Hessian eigenvalue of the float64 training loss (eigsh, largest algebraic) and its "
        "Hutchinson trace, weight decay excluded.",
        [F.Panel("Hessian top eigenvalue", top, yscale=_yscale(top)),
         F.Panel("Hessian trace (Hutchinson)", tr, yscale=_yscale(tr))], "Sharpness")


@figure("llc", missing={"Local learning coefficient over time": ("llc",)})
def _llc_figures(f: _Figs) -> None:
    """The local learning coefficient over time, with its spread over SGLD chains."""
    if f.lacks("llc", "Local learning coefficient over time"):
        return
    mean, spread = f.lines("llc", "llc_mean"), f.lines("llc", "llc_std")
    f.over_time(
        "llc", "Local learning coefficient over time",
        "LLC estimate n*beta (E[L] - L(w*)) by devinterp's SGLD at each analyzed checkpoint, mean over chains, "
        "on a log axis (small positive estimates stay apart from each other and from zero); an estimate <= 0 "
        "(flagged negative: not a learning coefficient) leaves its line and is marked with a triangle on the "
        "dotted line below the smallest positive one; below, the standard deviation across chains. An X marks a "
        "positive estimate flagged with its chains pinned by the localization (distance from w* ~ sqrt(d/gamma)): "
        "not a learning coefficient either. The "
        "sampler's hyperparameters and how to calibrate them: docs/ANALYSES.md, \"llc\".",
        [positive_log_panel("LLC (mean over chains)", mean, llc_flag_lines(f.groups, f.colours)),
         F.Panel("LLC spread\n(std across chains)", spread, yscale=_yscale(spread))],
        "Local learning coefficient")


NOT_POSITIVE = "estimate <= 0 (flagged negative),\non the dotted line"


def positive_log_panel(ylabel: str, lines: list[F.Line], marks: list[F.Line]) -> F.Panel:
    """`lines` and their `marks` on a log axis. A symmetric-log axis drew every estimate below its
    linear threshold (1) at about 0, on top of each other; here a value <= 0 leaves its line (a gap)
    and is drawn, in its line's colour, as a triangle on a dotted floor line below the smallest
    positive value, named in the panel's legend (a mark at such a value, its negative flag, is that
    triangle)."""
    values = np.concatenate([np.asarray(ln.y, dtype=float) for ln in lines]) if lines else np.zeros(0)
    positive = values[np.isfinite(values) & (values > 0)]
    if not (np.isfinite(values) & (values <= 0)).any():
        return F.Panel(ylabel, lines + marks, yscale="log" if len(positive) else "linear")
    floor = float(positive.min()) / 4 if len(positive) else 1.0
    out, low = [], []
    for ln in lines + marks:  # a mark at a value <= 0 (flagged negative) is the triangle itself
        y = np.asarray(ln.y, dtype=float)
        below = np.isfinite(y) & (y <= 0)
        out.append(replace(ln, y=np.where(below, np.nan, y)))
        if below.any() and not any(ln is m for m in marks):
            low.append(F.Line(np.asarray(ln.x)[below], np.full(int(below.sum()), floor), ln.colour, bold=True,
                              style="none", marker="v", ms=7, edge="black"))
    low.append(F.Line(np.zeros(0), np.zeros(0), "white", NOT_POSITIVE, style="none", marker="v", ms=7, edge="black",
                      own_label=True))
    return F.Panel(ylabel, out + low, hlines=[(floor, "grey", None)], yscale="log")


def llc_flag_lines(groups: Sequence[Group], colours: Sequence[str]) -> list[F.Line]:
    """X markers at each run's llc estimates flagged negative or pinned (analyses/llc.py), in its
    group's colour, and a black X naming them in the panel's legend."""
    lines = []
    for g, c in zip(groups, colours):
        for r in g.runs:
            series = [stored_series(r, "llc", k) for k in ("llc_mean", "negative", "pinned")]
            if any(s is None for s in series):
                continue
            (x, y), (_, negative), (_, pinned) = series
            bad = (negative == 1) | (pinned == 1)
            if bad.any():  # edged: one group's marks stay visible where they overlap another's
                lines.append(F.Line(x[bad], y[bad], c, bold=True, style="none", marker="X", ms=9, edge="black"))
    if lines:
        lines.append(F.Line(np.zeros(0), np.zeros(0), "black", "flagged: negative or pinned", bold=True,
                            style="none", marker="X", ms=9, own_label=True))
    return lines


@figure("effective_rank", missing={"Effective rank over time": ("effective_rank",)})
def _rank_figures(f: _Figs) -> None:
    """Effective rank over time."""
    if f.lacks("rank", "Effective rank over time"):
        return
    panels = [F.Panel("effective rank, last hidden\nrepresentation (centred)",
                      f.lines("rank", "roy_vetterli_centred@{site}"))]
    mlp = f.lines("rank", "roy_vetterli_centred@{mlp}")
    if mlp:
        panels.append(F.Panel("effective rank,\nMLP neurons (centred)", mlp))
    f.over_time(
        "effective_rank", "Effective rank over time",
        "Roy-Vetterli effective rank exp(entropy of normalised singular values) of the centred activations at "
        "the readout position over all inputs.", panels, "Effective rank")


@figure("radial", missing={"Radius and rho": ("radial",)})
def _radial_figures(f: _Figs) -> None:
    """Radius and rho against the 1/d baseline over time."""
    if f.lacks("radial", "Radius and rho"):
        return
    radius, rho = f.lines("radial", "radius_mean@{site}"), f.lines("radial", "rho@{site}")
    baselines = {}
    for g, c in zip(f.groups, f.colours):
        for r in g.runs:
            s = stored_series(r, "radial", _key_for(r, "radial", "rho_baseline@{site}") or "", "scalar")
            if s is not None:
                baselines.setdefault(round(float(s[1][0]), 12), c)
    hl = ([(b, "black", f"isotropic 1/d = {fmt_number(b)}") for b in baselines] if len(baselines) == 1 else
          [(b, c, f"1/d = {fmt_number(b)}") for b, c in baselines.items()])
    f.over_time(
        "radial", "Radius and rho against the 1/d baseline",
        "Activation radius of the last hidden representation and its radial gradient energy rho (share of "
        "each gradient along its activation), against the isotropic baseline 1/d (dotted).",
        [F.Panel("activation radius\n||h|| / sqrt(d)", radius, yscale=_yscale(radius)),
         F.Panel("radial gradient\nenergy rho", rho, hlines=hl, yscale=_yscale(rho))],
        "Radial-angular decomposition")


@figure("clock_pizza", missing={"Clock or pizza over time": ("clock_pizza",)})
def _clock_pizza_figures(f: _Figs) -> None:
    """Gradient symmetricity and distance irrelevance over time, against the labelling rule's thresholds."""
    if f.lacks("clock_pizza", "Clock or pizza over time"):
        return
    sym, irr = f.lines("clock_pizza", "gradient_symmetricity"), f.lines("clock_pizza", "distance_irrelevance")
    f.over_time(
        "clock_pizza", "Clock or pizza over time",
        "Gradient symmetricity (mean cosine of the logit's gradients w.r.t. the two operand embeddings) and "
        "distance irrelevance (how little the correct logit depends on a-b), Zhong et al. 2023; dotted: the "
        f"thresholds of our rule, {ALGORITHM_RULE}. Definitions: docs/ANALYSES.md, \"clock_pizza\".",
        [F.Panel("gradient\nsymmetricity", sym, ylim=(-1.02, 1.02),
                 hlines=[(CLOCK_MAX_SYMMETRICITY, "#1f77b4", "clock below"), (PIZZA_MIN_SYMMETRICITY, "#d62728",
                                                                               "pizza above")]),
         F.Panel("distance\nirrelevance", irr, hlines=[(CLOCK_MIN_IRRELEVANCE, "black", "clock above, pizza below")])],
        "Clock or pizza (Zhong et al. 2023)")


@figure("hessian_density", missing={"Hessian eigenvalue density": ("hessian_density",)})
def _hessian_density_figures(f: _Figs) -> None:
    """The SLQ eigenvalue density of each group's first run at its chosen checkpoints."""
    title = "Hessian eigenvalue density"
    if f.lacks("hessian_density", title):
        return
    panels = []
    for g in f.groups:
        r = g.runs[0]
        st = r.stored.get("hessian_density")
        if st is None or not st.steps:
            continue
        where = {s: j for j, s in enumerate(st.steps)}
        curves = [F.DensityCurve(label, np.asarray(st.values["grid"][where[s]], dtype=float),
                                 np.asarray(st.values["density"][where[s]], dtype=float))
                  for s, label in chosen_checkpoints(r, st.steps, f.steps) if s is not None]
        panels.append((r.name, curves))
    f.figs.append(FigureSpec(
        "hessian_density", title,
        f"Eigenvalue density of the float64 training loss's Hessian by stochastic Lanczos quadrature (PyHessian's "
        f"method: Rademacher start vectors, Gaussian-broadened Ritz values), {f.which_runs()}, at the stored "
        "checkpoints nearest the start, memorization, grokking and the end; log density axis.",
        F.eigenvalue_densities(panels)))


@figure("parameter_pca", missing={"Parameter trajectory PCA": ("parameter_pca",)})
def _parameter_pca_figures(f: _Figs) -> None:
    """Each group's first run's parameter trajectory on its first two principal components."""
    paths = []
    for g in f.groups:
        r = g.runs[0]
        if len(r.checkpoints) < 3:
            continue
        res = parameter_pca(r.path, n_components=2)
        paths.append(F.PcaPath(r.name, res["steps"], res["projections"], res["explained_variance_ratio"],
                               res["phases"]))
    if not paths:
        f.missing.append(("Parameter trajectory PCA", "no run has three or more checkpoints"))
        return
    f.figs.append(FigureSpec(
        "parameter_pca", "Parameter trajectory PCA",
        f"Every checkpoint's flattened parameters, {f.which_runs()}, on the run's own first two principal "
        "components (centred on the mean checkpoint); dots coloured by phase: memorization before the "
        "memorization step, circuit formation until the grokking step, cleanup after "
        "(docs/ANALYSES.md, \"Parameter trajectory PCA\").", F.parameter_paths(paths)))


# every figure a report can make (fig_<name>.<format>), in page order, and the figures each
# "Missing figures" title stands for
FIGURE_NAMES = BASE_FIGURES + tuple(n for fam in FAMILIES for n in fam.names)
MISSING_NAMES = {title: names for fam in FAMILIES for title, names in fam.missing.items()}
