"""The figure of `groklens llc-calibrate`: the SGLD loss traces of a sweep, one panel per (lr,
localization) at one nbeta, as devinterp's calibration notebook draws them (its
`plot_sweep_single_model`: rows epsilon, columns gamma, each chain's trace of the loss above its
start, the LLC as a dashed line). devinterp 2.x ships no plotting (its 1.x `plot_trace` is gone),
so this is matplotlib, in the style of analyses/figures.py: arrays in, a Figure out, no pyplot.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from groklens.analyses.figures import colour


@dataclass
class TracePanel:
    blocks: np.ndarray  # [chains, bins]: n*beta (L_t - L(w*)) in equal blocks of steps
    llc: float  # the estimate (mean over chains of the draws)
    passes: bool  # every check passed
    marks: str  # the checks, e.g. "fcapl.o"
    recommended: bool = False
    pinned: bool = False  # the chains sit at sqrt(d / gamma): the localization alone holds them


def trace_grid(panels: Sequence[Sequence[TracePanel | None]], row_labels: Sequence[str], col_labels: Sequence[str], *,
               steps: int, burnin: int, title: str = "") -> Figure:
    """panels[row][col] (None: not run): each chain's trace over the SGLD steps, the burn-in
    shaded, the LLC dashed; a passing setting's frame green, the recommended one's thick, a pinned
    one's title red with PINNED and its background hatched. The title ends with what the frames
    and marks mean, as this grid draws them; it wraps at the figure's width."""
    n_rows, n_cols = len(panels), len(panels[0]) if panels else 0
    fig = Figure(figsize=(2.3 * n_cols + 0.8, 1.7 * n_rows + 0.9), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False, sharex=True)
    for i in range(n_rows):
        for j in range(n_cols):
            a, p = axes[i, j], panels[i][j]
            if p is None:
                a.set_axis_off()
                continue
            bins = p.blocks.shape[1]
            x = (np.arange(bins) + 0.5) * steps / bins
            for c, row in enumerate(p.blocks if math.isfinite(p.llc) else ()):  # a failed setting: no lines
                a.plot(x, row, color=colour(c), lw=0.9, alpha=0.8)
            if math.isfinite(p.llc):
                a.axhline(p.llc, color="black", ls="--", lw=1.0)
            a.axhline(0, color="grey", ls=":", lw=0.7)
            a.axvspan(0, burnin, color="grey", alpha=0.12, lw=0)
            finite = p.blocks[np.isfinite(p.blocks)] if math.isfinite(p.llc) else np.zeros(0)
            if finite.size:
                lo, hi = float(min(0.0, finite.min())), float(max(finite.max(), 1e-9))
                a.set_ylim(lo - 0.05 * (hi - lo), hi + 0.1 * (hi - lo))
            a.set_title((f"LLC {p.llc:.3g}  [{p.marks}]" if math.isfinite(p.llc) else f"failed [{p.marks}]")
                        + ("  PINNED" if p.pinned else ""), fontsize=7, color=PINNED_RED if p.pinned else "black")
            if p.pinned:
                a.patch.set_hatch("////")
                a.patch.set_edgecolor("#f2c4c4")
            for side in a.spines.values():
                side.set_color("#2ca02c" if p.passes else "#bbbbbb")
                side.set_linewidth(2.5 if p.recommended else (1.3 if p.passes else 0.8))
            a.tick_params(labelsize=6)
            a.yaxis.set_major_formatter(PLAIN)  # no offset or x10^k text: it sat on the panel's title
            if j == 0:
                a.set_ylabel(row_labels[i], fontsize=7)
            if i == n_rows - 1:
                a.set_xlabel("SGLD step", fontsize=7)
            if i == 0:
                a.annotate(col_labels[j], (0.5, 1.25), xycoords="axes fraction", ha="center", fontsize=8)
    passing = [p for row in panels for p in row if p is not None and p.passes]
    frames = ("green frame: passes every check" if passing else "no setting passes every check (grey frames)") \
        + ("; thick frame: recommended" if any(p.recommended for row in panels for p in row if p is not None) else "")
    if any(p.pinned for row in panels for p in row if p is not None):
        frames += "; red PINNED, hatched: chains held at sqrt(d/gamma) by the localization alone (never recommended)"
    title = f"{title}; {frames}" if title else frames
    fig.suptitle(textwrap.fill(title, max(30, int(fig.get_figwidth() * 72 / (0.55 * 9)))), fontsize=9)
    return fig


PINNED_RED = "#c0392b"
PLAIN = FuncFormatter(lambda v, _pos: f"{v:.3g}")
