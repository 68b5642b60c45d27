"""Figures of the scaling-law fit. They draw given arrays and compute nothing."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator


def _axes(ax, figsize=(4.5, 4)):
    if ax is not None:
        return ax.figure, ax
    fig = Figure(figsize=figsize)
    return fig, fig.add_subplot(1, 1, 1)


def measured_vs_predicted(measured: np.ndarray, predicted: np.ndarray, censored: np.ndarray | None = None,
                          ax=None, title: str | None = None) -> Figure:
    """Log-log scatter of measured against predicted grokking step; censored runs drawn at
    their last step as open triangles (their true T is larger)."""
    fig, ax = _axes(ax)
    measured, predicted = np.asarray(measured, float), np.asarray(predicted, float)
    cens = np.zeros(len(measured), bool) if censored is None else np.asarray(censored, bool)
    ax.scatter(predicted[~cens], measured[~cens], s=14, color="C0", label="grokked")
    if cens.any():
        ax.scatter(predicted[cens], measured[cens], s=22, marker="^", facecolors="none", edgecolors="C3",
                   label="censored (> last step)")
    finite = np.concatenate([measured, predicted])
    finite = finite[np.isfinite(finite) & (finite > 0)]
    if len(finite):
        lo, hi = finite.min() / 1.5, finite.max() * 1.5
        ax.plot([lo, hi], [lo, hi], color="0.5", lw=1, ls="--")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted grokking step")
    ax.set_ylabel("measured grokking step")
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    return fig


def phase_map(x: np.ndarray, y: np.ndarray, grokked: np.ndarray, counts: np.ndarray, xlabel: str = "",
              ylabel: str = "", boundary: tuple | None = None, ax=None) -> Figure:
    """One cell per configuration (x, y) on the grid's own levels, coloured by the fraction of its
    runs that grokked and labelled k/n; `boundary` (along_x, estimate, lo, hi): a line at the
    boundary and its interval shaded (hi may be inf)."""
    fig, ax = _axes(ax)
    x, y = np.asarray(x, float), np.asarray(y, float)
    k, n = np.asarray(grokked, float), np.asarray(counts, float)
    xs, ys = np.unique(x), np.unique(y)
    grid = np.full((len(ys), len(xs)), np.nan)
    for xi, yi, ki, ni in zip(x, y, k, n):
        grid[np.searchsorted(ys, yi), np.searchsorted(xs, xi)] = ki / ni
    im = ax.imshow(grid, origin="lower", cmap="RdYlGn", vmin=0, vmax=1, aspect="auto",
                   extent=(-0.5, len(xs) - 0.5, -0.5, len(ys) - 0.5))
    fig.colorbar(im, ax=ax, label="fraction grokked")
    for xi, yi, ki, ni in zip(x, y, k, n):
        ax.text(np.searchsorted(xs, xi), np.searchsorted(ys, yi), f"{ki:.0f}/{ni:.0f}", ha="center", va="center",
                fontsize=7)
    ax.set_xticks(range(len(xs)), labels=[f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), labels=[f"{v:g}" for v in ys])
    if boundary is not None:  # at its place between the grid's levels, interpolated in log
        along_x, est, lo, hi = boundary
        levels = xs if along_x else ys

        def pos(v):
            if v <= levels[0]:
                return -0.5
            if v >= levels[-1]:
                return len(levels) - 0.5
            return float(np.interp(np.log(v), np.log(levels), np.arange(len(levels))))

        span, line = (ax.axvspan, ax.axvline) if along_x else (ax.axhspan, ax.axhline)
        span(pos(lo), pos(hi), color="0.2", alpha=0.15, lw=0)
        line(pos(est), color="k", lw=1.2, ls="--", label=f"boundary {est:.3g}")
        ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("grokked within the cap (cells: runs grokked / runs)", fontsize=9)
    return fig


def steps_against(x: np.ndarray, measured: np.ndarray, censored: np.ndarray, grid: np.ndarray, line: np.ndarray,
                  xlabel: str = "", ylabel: str = "grokking step", ax=None) -> Figure:
    """Grokking step of each run against one variable (log-log), censored runs as open triangles
    at their last step, and the fitted power law through the variable's levels."""
    fig, ax = _axes(ax)
    x, measured, cens = np.asarray(x, float), np.asarray(measured, float), np.asarray(censored, bool)
    ax.scatter(x[~cens], measured[~cens], s=14, color="C0", alpha=0.7, label="grokked")
    if cens.any():
        ax.scatter(x[cens], measured[cens], s=22, marker="^", facecolors="none", edgecolors="C3",
                   label="censored (> last step)")
    ax.plot(grid, line, color="0.3", lw=1.2, label="fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = np.unique(x)
    if len(ticks) <= 12:
        ax.xaxis.set_ticks(ticks, labels=[f"{v:g}" for v in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"grokking step against {xlabel}", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def scaling_law_figure(measured, predicted, censored, against, cells=None, title: str | None = None) -> Figure:
    """Measured against predicted; one panel per variable, `against` = [(name, x, steps, grid,
    line)] (steps adjusted for the other variables where there are several); and, with `cells`
    = (xlabel, ylabel, x, y, grokked, counts, boundary), the phase map."""
    n = 1 + len(against) + (cells is not None)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(5.0 * cols, 4.2 * rows))
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(n)]
    measured_vs_predicted(measured, predicted, censored, ax=axes[0], title=title)
    several = len(against) > 1
    for ax, (name, x, steps, grid, line) in zip(axes[1:], against):
        steps_against(x, steps, censored, grid, line, xlabel=name, ax=ax,
                      ylabel="grokking step (others at their geometric mean)" if several else "grokking step")
    if cells is not None:
        px, py, x, y, k, c, boundary = cells
        phase_map(x, y, k, c, xlabel=px, ylabel=py, boundary=boundary, ax=axes[-1])
    fig.tight_layout()
    return fig


__all__ = ["measured_vs_predicted", "phase_map", "scaling_law_figure", "steps_against"]
