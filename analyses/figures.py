"""Report figures. Each function takes arrays (in the small dataclasses below) and an optional
matplotlib Axes (or a sequence of Axes for multi-panel figures) and returns the Figure.
They compute nothing: means over seeds, histograms and checkpoint choices are made by the
caller (`groklens.analyses.report`). They never touch pyplot's global state: figures are
`matplotlib.figure.Figure` objects (Agg canvas), so they render headless and never show.

  training_curves    train/test accuracy and loss vs step (log x), grokking points marked,
                     one colour per variant, seeds thin, the mean bold
  grokking_times     grokking step per seed and variant, censored runs marked
  aligned_panels     test accuracy on top and measures below, on one shared step axis
                     (used for Fourier FVE, attention mass, Hessian, effective rank, radius/rho)
  spectrum_grid      embedding Fourier power per frequency at chosen checkpoints
  cluster_grid       neurons per key frequency (Nanda's clustering) at chosen checkpoints
  progress_measures  Nanda's figure: train, test, restricted and excluded loss (log y) and the
                     total sum of squared weights against step, the three phases shaded
  parameter_paths    each run's parameter trajectory on its first two principal components,
                     the checkpoints coloured by phase
  eigenvalue_densities  Hessian eigenvalue densities (SLQ) at chosen checkpoints, log density
  spread_over_seeds  one measure against step over seeds (each seed, the median and min-max band)
                     and its per-seed values at a marked checkpoint
"""

from __future__ import annotations

import re
import textwrap

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
THIN = dict(lw=0.8, alpha=0.45)
BOLD = dict(lw=2.2, alpha=1.0)
MEAN_END = dict(ls=(0, (1, 1.5)), lw=1.6)  # where a mean over seeds stops because a seed stopped
LEGEND_CHARS = 34  # a legend entry wraps at this width (variant labels name every differing field)
# past this many variants the palette repeats and a legend entry each would outgrow the figure (a
# sweep's 96 cells collapsed the layout): one entry says so, fig_grokking_times names each variant
LEGEND_MAX_VARIANTS = len(PALETTE)
TICK_PT = 7
TICK_CHAR_IN = 0.6 * TICK_PT / 72  # the width of a character of a TICK_PT label, in inches (about)


def run_title(name: str, chars: int = 40) -> str:
    """A run name as a panel title that stays over its panel: broken after its `__` separators
    (a sweep's names, `field=value__...__seed=S`, have no spaces for textwrap to break at)."""
    lines = [""]
    for part in re.split(r"(?<=__)", name):
        if lines[-1] and len(lines[-1]) + len(part) > chars:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def log_step_axis(a) -> None:
    """Log x axis of steps labelled as plain numbers (1000, not 10^3) at 1, 2 and 5 per decade,
    without matplotlib's crowded minor labels when the data span about one decade."""
    a.set_xscale("log")
    a.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    a.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.0f}" if x >= 1 else f"{x:g}"))
    a.xaxis.set_minor_formatter(NullFormatter())


def ends_early(mean_steps: np.ndarray, seed_steps: Sequence[np.ndarray]) -> bool:
    """Whether a mean over the steps every seed has ends before the longest seed does."""
    ends = [s[-1] for s in seed_steps if len(s)]
    return bool(len(mean_steps)) and bool(ends) and mean_steps[-1] < max(ends)


def _figure(ax, n_panels: int = 1, *, figsize=(7.0, 4.0), sharex: bool = True, height_ratios=None):
    """(figure, list of axes): the given axes, or a new figure with n_panels stacked rows."""
    if ax is not None:
        axes = list(ax) if isinstance(ax, (list, tuple, np.ndarray)) else [ax]
        if len(axes) != n_panels:
            raise ValueError(f"this figure draws {n_panels} panel(s); got {len(axes)} axes")
        return axes[0].figure, axes
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(n_panels, 1, sharex=sharex, squeeze=False,
                        gridspec_kw={"height_ratios": height_ratios} if height_ratios else None)[:, 0]
    return fig, list(axes)


# ---------------------------------------------------------------------- training curves
@dataclass
class RunCurves:
    """One run's evaluation rows (steps > 0 for a log axis)."""

    steps: np.ndarray
    train_acc: np.ndarray
    test_acc: np.ndarray
    train_loss: np.ndarray
    test_loss: np.ndarray
    grok_step: float | None = None  # marked on the test-accuracy curve
    label: str = ""


@dataclass
class VariantCurves:
    label: str
    runs: list[RunCurves]
    mean: RunCurves | None = None  # the mean over seeds (drawn bold); None: the single run is bold
    colour: str | None = None


def training_curves(variants: Sequence[VariantCurves], *, threshold: float | None = None, log_x: bool = True,
                    ax=None) -> Figure:
    """Accuracy (top) and loss (bottom, log y) against step: train dashed, test solid."""
    fig, (a_acc, a_loss) = _figure(ax, 2, figsize=(8.0, 6.4), height_ratios=[1.1, 1])
    cut_short = False
    for i, v in enumerate(variants):
        c = v.colour or colour(i)
        bold_runs = [v.mean] if v.mean is not None else []
        single = v.mean is None and len(v.runs) == 1
        for r in v.runs:
            style = BOLD if single else THIN
            a_acc.plot(r.steps, r.train_acc, ls="--", color=c, **style)
            a_acc.plot(r.steps, r.test_acc, ls="-", color=c, **style)
            a_loss.plot(r.steps, r.train_loss, ls="--", color=c, **style)
            a_loss.plot(r.steps, r.test_loss, ls="-", color=c, **style)
            if r.grok_step is not None:
                k = int(np.searchsorted(r.steps, r.grok_step))
                if k < len(r.steps):
                    a_acc.plot([r.steps[k]], [r.test_acc[k]], "o", ms=6, mfc=c, mec="black", mew=0.8, zorder=5)
        for m in bold_runs:
            a_acc.plot(m.steps, m.train_acc, ls="--", color=c, **BOLD)
            a_acc.plot(m.steps, m.test_acc, ls="-", color=c, **BOLD)
            a_loss.plot(m.steps, m.train_loss, ls="--", color=c, **BOLD)
            a_loss.plot(m.steps, m.test_loss, ls="-", color=c, **BOLD)
            if ends_early(m.steps, [r.steps for r in v.runs]):
                cut_short = True  # a seed stopped (stop_after_grok): the mean over every seed ends there
                for a in (a_acc, a_loss):
                    a.axvline(m.steps[-1], color=c, **MEAN_END)
        if len(variants) <= LEGEND_MAX_VARIANTS:
            a_acc.plot([], [], color=c, lw=2.2, label=textwrap.fill(f"{v.label} (n={len(v.runs)})", LEGEND_CHARS))
    if len(variants) > LEGEND_MAX_VARIANTS:
        a_acc.plot([], [], color="0.5", lw=2.2, label=f"{len(variants)} variants: colours\nrepeat (fig_grokking_times\n"
                   "names each)")
    if threshold is not None:
        a_acc.axhline(threshold, color="grey", lw=0.8, ls=":")
    a_acc.plot([], [], color="black", ls="--", lw=1, label="train")
    a_acc.plot([], [], color="black", ls="-", lw=1, label="test")
    a_acc.plot([], [], "o", mfc="white", mec="black", label="grokked")
    if cut_short:
        a_acc.plot([], [], **MEAN_END, color="black", label="the mean ends: a seed\nstopped there")
    a_acc.set_ylabel("accuracy")
    a_acc.set_ylim(-0.02, 1.02)
    a_acc.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    a_loss.set_ylabel("loss")
    a_loss.set_yscale("log")
    a_loss.set_xlabel("step")
    for a in (a_acc, a_loss):
        if log_x:
            log_step_axis(a)
        a.grid(alpha=0.25, which="both", lw=0.4)
    a_acc.set_title("Training curves (thin: seeds, bold: mean over seeds)", fontsize=10)
    return fig


# ---------------------------------------------------------------------- grokking times
def grokking_times(labels: Sequence[str], times: Sequence[Sequence[float]], censored: Sequence[Sequence[bool]], *,
                   means: Sequence[float | None] | None = None, colours: Sequence[str] | None = None,
                   log_x: bool = True, ax=None) -> Figure:
    """One row per variant, one point per seed at its grokking step; a censored seed is an open
    triangle at the step where it was censored (it had not grokked by then)."""
    fig, (a,) = _figure(ax, 1, figsize=(7.0, 1.2 + 0.55 * max(len(labels), 1)))
    offsets = np.linspace(-0.18, 0.18, max(max((len(t) for t in times), default=1), 1))
    for i, (t, cen) in enumerate(zip(times, censored)):
        c = colours[i] if colours else colour(i)
        t = np.asarray(t, dtype=float)
        cen = np.asarray(cen, dtype=bool)
        y = i + offsets[: len(t)] if len(t) > 1 else np.full(len(t), float(i))
        if (~cen).any():
            a.plot(t[~cen], y[~cen], "o", ms=7, mfc=c, mec="black", mew=0.6, ls="none")
        if cen.any():
            a.plot(t[cen], y[cen], ">", ms=9, mfc="none", mec=c, mew=1.6, ls="none")
        if means is not None and means[i] is not None:
            a.plot([means[i]], [i], "|", ms=22, mew=2.5, color=c)
    a.plot([], [], "o", mfc="grey", mec="black", ls="none", label="grokked")
    a.plot([], [], ">", mfc="none", mec="grey", mew=1.6, ls="none", label="censored (not grokked by then)")
    if means is not None:
        a.plot([], [], "|", ms=12, mew=2.5, color="grey", ls="none", label="mean of the group")
    a.set_yticks(range(len(labels)))
    a.set_yticklabels([textwrap.fill(lb, LEGEND_CHARS) for lb in labels], fontsize=8)
    a.set_ylim(len(labels) - 0.5, -0.5)
    a.margins(x=0.06)  # censored triangles sit at the last step: keep them inside the frame
    if log_x:
        log_step_axis(a)
    a.set_xlabel("grokking step")
    a.grid(alpha=0.25, axis="x", which="both", lw=0.4)
    if ax is None:  # our figure: the legend below the axes, off the points and the long labels
        fig.legend(*a.get_legend_handles_labels(), fontsize=7, loc="outside lower center", ncol=3, frameon=False)
    else:
        a.legend(fontsize=7, loc="best", framealpha=0.8)
    a.set_title("Grokking time per seed", fontsize=10)
    return fig


# ---------------------------------------------------------------------- measures over steps
@dataclass
class Line:
    x: np.ndarray
    y: np.ndarray
    colour: str | None = None
    label: str | None = None  # legend entry (None: no entry)
    bold: bool = False
    style: str = "-"
    band: tuple[np.ndarray, np.ndarray] | None = None  # (low, high) shaded around the line
    marker: str | None = None
    ends_early: bool = False  # a mean over seeds that ends where a seed stopped: its end is marked
    ms: float = 3.0  # marker size
    own_label: bool = False  # in a lower panel of aligned_panels: keep the label (a mark's meaning, not a group)
    edge: str | None = None  # the markers' edge colour: marks of one colour stay visible over another's


@dataclass
class Panel:
    ylabel: str
    lines: list[Line]
    hlines: list[tuple[float, str | None, str | None]] = field(default_factory=list)  # (y, colour, label)
    yscale: str = "linear"
    ylim: tuple[float, float] | None = None


def _draw_line(a, ln: Line, i: int) -> None:
    c = ln.colour or colour(i)
    style = BOLD if ln.bold else THIN
    label = textwrap.fill(ln.label, LEGEND_CHARS) if ln.label else ln.label
    edge = dict(mec=ln.edge, mew=0.8) if ln.edge and ln.marker else {}
    a.plot(ln.x, ln.y, ls=ln.style, color=c, label=label, marker=ln.marker, ms=ln.ms if ln.marker else None,
           **style, **edge)
    if ln.band is not None:
        a.fill_between(ln.x, ln.band[0], ln.band[1], color=c, alpha=0.12, lw=0)
    if ln.ends_early and len(ln.x):
        a.axvline(ln.x[-1], color=c, **MEAN_END)


def aligned_panels(accuracy: Sequence[Line], panels: Sequence[Panel], *, title: str = "", log_x: bool = True,
                   threshold: float | None = None, marks: Sequence[tuple[float, str | None]] = (),
                   ax=None) -> Figure:
    """Test accuracy on top, then one panel per measure, all on one shared step axis; `marks`
    (step, colour) are drawn as vertical dashed lines through every panel (e.g. grokking steps).
    The legend of the lines is on the top panel; a panel's own legend lists its reference lines."""
    n = 1 + len(panels)
    fig, axes = _figure(ax, n, figsize=(8.0, 1.9 + 1.8 * n), height_ratios=[0.8] + [1] * len(panels))
    top = axes[0]
    for i, ln in enumerate(accuracy):
        _draw_line(top, ln, i)
    if threshold is not None:
        top.axhline(threshold, color="grey", lw=0.8, ls=":")
    top.set_ylabel("test accuracy")
    top.set_ylim(-0.02, 1.02)
    for a, panel in zip(axes[1:], panels):
        for i, ln in enumerate(panel.lines):
            _draw_line(a, ln if ln.own_label else Line(**{**ln.__dict__, "label": None}), i)
        for y, c, label in panel.hlines:
            a.axhline(y, color=c or "black", ls=":", lw=1.2, label=label)
        a.set_ylabel(panel.ylabel, fontsize=8)
        a.set_yscale(panel.yscale)
        if panel.ylim is not None:
            a.set_ylim(*panel.ylim)
    for a in axes:
        for x, c in marks:
            a.axvline(x, color=c or "grey", ls="--", lw=0.9, alpha=0.7)
        if log_x:
            log_step_axis(a)
        a.grid(alpha=0.25, which="both", lw=0.4)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    if any(ln.ends_early for ln in accuracy):
        top.plot([], [], **MEAN_END, color="black", label="the mean ends: a seed\nstopped there")
    if marks:
        top.plot([], [], color="grey", ls="--", lw=0.9, label="grokking step (group mean)")
    if marks or any(ln.ends_early for ln in accuracy):
        top.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    axes[-1].set_xlabel("step")
    if title:
        top.set_title(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------- one measure over seeds
@dataclass
class SeedSpread:
    """One group's seeds of a measure: each seed's (steps, values), the spread over the steps every
    seed has (steps, median, low, high) or None, and each seed's (step, value) at a marked checkpoint."""

    label: str
    colour: str
    series: list[tuple[np.ndarray, np.ndarray]]
    spread: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None
    marked: list[tuple[float, float]]


def spread_over_seeds(groups: Sequence[SeedSpread], *, ylabel: str, mark_label: str, title: str = "",
                      log_x: bool = True, ylim: tuple[float, float] | None = (-0.02, 1.02), ax=None) -> Figure:
    """Left: the measure against step, every seed thin, each group's median bold with its min-max
    band, each seed's marked checkpoint a dot. Right: the values at the marked checkpoints, one row
    per group, a dot per seed and the group's median as a bar (the distribution, not only a mean)."""
    # the right panel: per group a column as wide as its label's longest field (at least 14 characters),
    # the label horizontal and wrapped at its spaces to that width
    chars = max([14] + [len(word) for g in groups for word in g.label.split()])
    right_in = max(1.8, len(groups) * (chars * TICK_CHAR_IN + 0.2))
    if ax is not None:
        fig, (left, right) = ax[0].figure, ax
    else:
        fig = Figure(figsize=(7.0 + right_in, 4.0), layout="constrained")
        left, right = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [5.5, right_in]})
    for i, g in enumerate(groups):
        for steps, values in g.series:
            left.plot(steps, values, color=g.colour, **THIN)
        if g.spread is not None:
            steps, med, lo, hi = g.spread
            left.plot(steps, med, color=g.colour, label=f"{g.label}: median, min-max of {len(g.series)} seeds", **BOLD)
            left.fill_between(steps, lo, hi, color=g.colour, alpha=0.12, lw=0)
        elif g.series:
            left.plot([], [], color=g.colour, label=g.label, **BOLD)
        if g.marked:
            xs, ys = np.asarray(g.marked, dtype=float).T
            left.plot(xs, ys, "o", ms=5, mfc=g.colour, mec="black", mew=0.5, ls="none")
            jitter = np.linspace(-0.15, 0.15, len(ys)) if len(ys) > 1 else np.zeros(1)
            right.plot(i + jitter, ys, "o", ms=6, mfc=g.colour, mec="black", mew=0.5, ls="none")
            right.plot([i - 0.3, i + 0.3], [np.median(ys)] * 2, color=g.colour, lw=2.5)
    left.plot([], [], "o", mfc="grey", mec="black", ls="none", label=f"each seed at {mark_label}")
    if log_x:
        log_step_axis(left)
    left.set_xlabel("step")
    left.set_ylabel(ylabel)
    if ylim is not None:
        left.set_ylim(*ylim)
    left.grid(alpha=0.25, which="both", lw=0.4)
    left.legend(fontsize=7, loc="best", framealpha=0.8)
    right.set_xticks(range(len(groups)))
    # whole labels (shortened, rows that differ only after the first field read the same), readable
    right.set_xticklabels([textwrap.fill(g.label, chars, break_long_words=False, break_on_hyphens=False)
                           for g in groups], rotation=0, fontsize=TICK_PT)
    right.set_xlim(-0.6, len(groups) - 0.4)
    right.set_title(f"at {mark_label}\n(bar: median)", fontsize=8)
    right.grid(alpha=0.25, axis="y", lw=0.4)
    if not any(g.marked for g in groups):
        right.text(0.5, 0.5, f"no seed reached\n{mark_label}", ha="center", va="center", fontsize=8,
                   transform=right.transAxes)
    if title:
        left.set_title(title, fontsize=10)
    return fig


# ---------------------------------------------------------------------- per-checkpoint grids
def _grid(ax, n_rows: int, n_cols: int, figsize):
    if ax is not None:
        axes = np.asarray(ax, dtype=object).reshape(n_rows, n_cols)
        return axes[0, 0].figure, axes
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(n_rows, n_cols, squeeze=False, sharex=True)


ROW_LABEL_PT = 8


def _labelled_rows(ax, row_labels: Sequence[str], n_cols: int, figsize, colours: Sequence[str] | None):
    """(figure, axes[row, col]) of a grid whose rows are variants: each row a subfigure headed by
    its label, written across the figure's width and wrapped there (a label on the y axis of the
    first column runs past its row when it is longer than the row is high). Given axes (`ax`)
    keep the label on the first column's y axis, wrapped at its spaces."""
    n_rows = len(row_labels)
    if ax is not None:
        fig, axes = _grid(ax, n_rows, n_cols, figsize)
        for r, label in enumerate(row_labels):
            axes[r, 0].set_ylabel(label.replace(" ", "\n"), fontsize=7)
        return fig, axes
    fig = Figure(figsize=figsize, layout="constrained")
    rows = fig.subfigures(n_rows, 1, squeeze=False)[:, 0]
    axes = np.empty((n_rows, n_cols), dtype=object)
    chars = max(20, int(figsize[0] * 72 / (0.6 * ROW_LABEL_PT)))  # characters across the figure
    for r, (sub, label) in enumerate(zip(rows, row_labels)):
        axes[r] = sub.subplots(1, n_cols, squeeze=False, sharex=True, sharey=True)[0]
        sub.suptitle(textwrap.fill(label, chars), x=0.005, ha="left", fontsize=ROW_LABEL_PT, fontweight="bold",
                     color=colours[r] if colours else colour(r))
    return fig, axes


def spectrum_grid(frequencies: np.ndarray, power: np.ndarray, row_labels: Sequence[str],
                  col_labels: Sequence[Sequence[str]], *, key_frequencies=None, colours: Sequence[str] | None = None,
                  ax=None) -> Figure:
    """Embedding Fourier power share per frequency, `power[row, col, k]` (NaN row: no checkpoint);
    rows are variants, columns checkpoints; `key_frequencies[row][col]` are outlined in black."""
    power = np.asarray(power, dtype=float)
    n_rows, n_cols = power.shape[:2]
    fig, axes = _labelled_rows(ax, row_labels, n_cols, (2.3 * n_cols + 1.2, 1.75 * n_rows + 0.9), colours)
    width = 0.8 if len(frequencies) < 2 else 0.8 * float(np.min(np.diff(frequencies)))
    for r in range(n_rows):
        c = colours[r] if colours else colour(r)
        for k in range(n_cols):
            a = axes[r, k]
            a.set_title(col_labels[r][k], fontsize=7)  # kept on an empty cell: "grokked: never"
            if np.all(np.isnan(power[r, k])):
                a.set_axis_off()
                continue
            keys = set(key_frequencies[r][k]) if key_frequencies is not None else set()
            edges = ["black" if f in keys else c for f in frequencies]
            a.bar(frequencies, power[r, k], width=width, color=c, edgecolor=edges, lw=0.9)
            a.set_ylim(0, max(0.05, float(np.nanmax(power[r]) * 1.1)))
            a.tick_params(labelsize=6)
        if ax is None:
            axes[r, 0].set_ylabel("power share", fontsize=7)
        axes[n_rows - 1, 0].set_xlabel("frequency k", fontsize=7)
    fig.suptitle("Embedding Fourier spectrum: power share per frequency (outlined: key frequencies)", fontsize=9)
    return fig


def cluster_grid(frequencies: np.ndarray, counts: np.ndarray, unclustered: np.ndarray, row_labels: Sequence[str],
                 col_labels: Sequence[Sequence[str]], *, threshold: float | None = None,
                 colours: Sequence[str] | None = None, ax=None) -> Figure:
    """Neurons per frequency among clustered neurons (`counts[row, col, k]`, NaN: no checkpoint),
    and how many neurons are unclustered (`unclustered[row, col]`)."""
    counts = np.asarray(counts, dtype=float)
    n_rows, n_cols = counts.shape[:2]
    fig, axes = _labelled_rows(ax, row_labels, n_cols, (2.3 * n_cols + 1.2, 1.75 * n_rows + 0.9), colours)
    width = 0.8 if len(frequencies) < 2 else 0.8 * float(np.min(np.diff(frequencies)))
    for r in range(n_rows):
        c = colours[r] if colours else colour(r)
        top = max(1.0, float(np.nanmax(counts[r])) * 1.15) if not np.all(np.isnan(counts[r])) else 1.0
        for k in range(n_cols):
            a = axes[r, k]
            a.set_title(col_labels[r][k], fontsize=7)  # kept on an empty cell: "grokked: never"
            if np.all(np.isnan(counts[r, k])):
                a.set_axis_off()
                continue
            a.bar(frequencies, counts[r, k], width=width, color=c)
            a.set_ylim(0, top)
            a.yaxis.set_major_locator(MaxNLocator(integer=True))  # neurons are counted: no 0.5 of one
            a.text(0.98, 0.95, f"unclustered: {int(unclustered[r, k])}", transform=a.transAxes, ha="right",
                   va="top", fontsize=6)
            if not np.nansum(counts[r, k]):
                a.text(0.5, 0.45, "no clustered neurons", transform=a.transAxes, ha="center", va="center",
                       fontsize=7, color="#555555")
            a.tick_params(labelsize=6)
        if ax is None:
            axes[r, 0].set_ylabel("neurons", fontsize=7)
        axes[n_rows - 1, 0].set_xlabel("frequency k", fontsize=7)
    t = f" (fraction >= {threshold:g})" if threshold is not None else ""
    fig.suptitle(f"Neuron-frequency clusters: MLP neurons per frequency{t}", fontsize=9)
    return fig


def pattern_grid(patterns: np.ndarray, row_labels: Sequence[str], col_labels: Sequence[Sequence[str]],
                 position_labels: Sequence[str], head_labels: Sequence[str], ax=None) -> Figure:
    """Attention of the readout query over source positions, `patterns[row, col, head, position]`
    (NaN: no checkpoint), as heat maps: rows are variants, columns checkpoints; in each map the
    heads run down and the source positions across."""
    patterns = np.asarray(patterns, dtype=float)
    n_rows, n_cols, n_heads, n_pos = patterns.shape
    fig, axes = _grid(ax, n_rows, n_cols, (0.45 * n_pos * n_cols + 1.6, (0.3 * n_heads + 0.7) * n_rows + 1.0))
    image = None
    for r in range(n_rows):
        for k in range(n_cols):
            a = axes[r, k]
            a.set_title(col_labels[r][k], fontsize=7)  # kept on an empty cell: "grokked: never"
            if np.all(np.isnan(patterns[r, k])):
                a.set_axis_off()
                continue
            image = a.imshow(patterns[r, k], vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto",
                             interpolation="nearest")
            a.set_xticks(range(n_pos), position_labels, fontsize=6)
            a.set_yticks(range(n_heads), head_labels if k == 0 else [""] * n_heads, fontsize=6)
            if k == 0:
                a.set_ylabel(row_labels[r], fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="attention weight")
    fig.suptitle("Attention pattern of the readout query (mean over inputs)", fontsize=9)
    return fig



# ---------------------------------------------------------------------- Nanda's progress measures
@dataclass
class ProgressPanel:
    """One run's progress-measure curves (analyses/progress.py) and its phase boundaries."""

    label: str
    steps: np.ndarray  # evaluations
    train_loss: np.ndarray
    test_loss: np.ndarray
    weight_sq: np.ndarray
    ck_steps: np.ndarray  # checkpoints with restricted / excluded loss
    restricted: np.ndarray
    excluded: np.ndarray
    phases: Sequence[tuple[float, float, str]] = ()  # (start, end, name) shaded
    key_text: str = ""


PHASE_COLOURS = ("#fde0c5", "#d5e8d4", "#dae8fc")


def progress_measures(panels: Sequence[ProgressPanel], *, ax=None) -> Figure:
    """Per run a column: losses on a log y axis (train, test, restricted and excluded loss, as in
    Nanda et al.'s figure) above the total sum of squared weights, on a linear step axis (the
    phases are long stretches of steps), the phases shaded; the key set in each column's title."""
    n = len(panels)
    if ax is not None:
        axes = np.asarray(ax).reshape(2, n)
        fig = axes[0, 0].figure
    else:
        fig = Figure(figsize=(max(6.5, 4.6 * n), 5.6), layout="constrained")
        axes = fig.subplots(2, n, sharex="col", squeeze=False, gridspec_kw={"height_ratios": [2, 1]})
    for j, p in enumerate(panels):
        top, bottom = axes[0, j], axes[1, j]
        top.plot(p.steps, p.train_loss, color=PALETTE[0], lw=1.4, label="train loss")
        top.plot(p.steps, p.test_loss, color=PALETTE[1], lw=1.4, label="test loss")
        if len(p.ck_steps):
            top.plot(p.ck_steps, p.restricted, color=PALETTE[2], lw=1.4, marker=".", ms=3, label="restricted loss")
            top.plot(p.ck_steps, p.excluded, color=PALETTE[3], lw=1.4, marker=".", ms=3, label="excluded loss")
        top.set_yscale("log")
        bottom.plot(p.steps, p.weight_sq, color="black", lw=1.4)
        bottom.set_ylabel("sum of squared weights", fontsize=8)
        for a in (top, bottom):
            for (lo, hi, name), c in zip(p.phases, PHASE_COLOURS):
                a.axvspan(lo, hi, color=c, alpha=0.6, lw=0, label=name if a is top else None)
            a.grid(alpha=0.25, lw=0.4)
        top.set_ylabel("loss (log)")
        # a long key-set note wrapped to its column, so neighbouring titles never run into each other
        top.set_title(p.label + "\n" + textwrap.fill(p.key_text, 60), fontsize=8)
        bottom.set_xlabel("step")
        if ax is not None:  # axes of the caller's figure: each column's own legend where it covers least
            top.legend(fontsize=7, loc="best", framealpha=0.8)
    if ax is None:  # one legend for every column, below the panels: it covers no curve
        entries: dict[str, object] = {}
        for a in axes[0]:
            for handle, label in zip(*a.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        fig.legend(list(entries.values()), list(entries), loc="outside lower center", fontsize=7, frameon=False,
                   ncol=min(4, len(entries)))
    return fig


# ---------------------------------------------------------------------- parameter trajectory PCA
PHASE_MARKS = {"memorization": "#ff7f0e", "circuit formation": "#2ca02c", "cleanup": "#1f77b4"}


@dataclass
class PcaPath:
    """One run's checkpoints on its first two principal directions (analyses/trajectory_pca.py)."""

    label: str
    steps: Sequence[int]
    pc: np.ndarray  # [n, 2]
    explained: np.ndarray  # [2] explained-variance ratios
    phases: Sequence[str]  # per checkpoint, a key of PHASE_MARKS


def parameter_paths(paths: Sequence[PcaPath], *, ax=None) -> Figure:
    """Per run a panel: its path through PC1-PC2 in grey, each checkpoint a dot in its phase's
    colour, the first and last checkpoint named by step."""
    n = len(paths)
    if ax is not None:
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        fig = axes[0].figure
    else:
        fig = Figure(figsize=(max(4.8, 4.2 * n), 4.0), layout="constrained")
        axes = list(fig.subplots(1, n, squeeze=False)[0])
    for a, p in zip(axes, paths):
        a.plot(p.pc[:, 0], p.pc[:, 1], color="grey", lw=0.9, alpha=0.7)
        for phase, c in PHASE_MARKS.items():
            keep = np.array([ph == phase for ph in p.phases], dtype=bool)
            if keep.any():
                a.scatter(p.pc[keep, 0], p.pc[keep, 1], s=14, color=c, label=phase, zorder=3)
        for i in (0, len(p.steps) - 1):
            a.annotate(f"step {p.steps[i]:,}", p.pc[i], fontsize=7, xytext=(3, 3), textcoords="offset points")
        a.set_xlabel(f"PC1 ({100 * p.explained[0]:.0f} % of variance)")
        a.set_ylabel(f"PC2 ({100 * p.explained[1]:.0f} %)" if len(p.explained) > 1 else "PC2")
        a.set_title(run_title(p.label), fontsize=9)
        a.grid(alpha=0.25, lw=0.4)
        a.legend(fontsize=7, frameon=False)
    return fig


# ---------------------------------------------------------------------- Hessian eigenvalue density
@dataclass
class DensityCurve:
    label: str
    grid: np.ndarray
    density: np.ndarray
    colour: str | None = None


def eigenvalue_densities(panels: Sequence[tuple[str, Sequence[DensityCurve]]], *, ax=None) -> Figure:
    """Per run a panel of densities against eigenvalue on a log density axis (PyHessian's plot:
    density + 1e-7, so that empty stretches show)."""
    n = len(panels)
    if ax is not None:
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        fig = axes[0].figure
    else:
        fig = Figure(figsize=(max(5.0, 4.4 * n), 3.8), layout="constrained")
        axes = list(fig.subplots(1, n, squeeze=False)[0])
    for a, (title, curves) in zip(axes, panels):
        for i, c in enumerate(curves):
            a.semilogy(c.grid, c.density + 1e-7, color=c.colour or colour(i), lw=1.2, label=c.label)
        a.set_xlabel("eigenvalue")
        a.set_ylabel("density (log)")
        a.set_title(run_title(title), fontsize=9)
        a.grid(alpha=0.25, lw=0.4)
        a.legend(fontsize=7, frameon=False)
    return fig
