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


def phase_diagram(x: np.ndarray, y: np.ndarray, grokked_fraction: np.ndarray, counts: np.ndarray | None = None,
                  xlabel: str = "", ylabel: str = "", ax=None) -> Figure:
    """One marker per configuration cell (x, y), coloured by the fraction of its runs that grokked."""
    fig, ax = _axes(ax)
    x, y = np.asarray(x, float), np.asarray(y, float)
    frac = np.asarray(grokked_fraction, float)
    sizes = 30 + 10 * np.asarray(counts if counts is not None else np.ones_like(x), float)
    sc = ax.scatter(x, y, c=frac, s=sizes, cmap="RdYlGn", vmin=0, vmax=1, edgecolors="k", linewidths=0.5)
    fig.colorbar(sc, ax=ax, label="fraction grokked")
    for values, axis, set_scale in ((x, ax.xaxis, ax.set_xscale), (y, ax.yaxis, ax.set_yscale)):
        ticks = np.unique(values)
        if np.all(ticks > 0) and len(ticks) > 1:
            set_scale("log")
        if len(ticks) <= 12:  # label the grid's own values, not decades
            axis.set_ticks(ticks, labels=[f"{v:g}" for v in ticks])
            axis.set_minor_locator(NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title("which configurations grokked", fontsize=9)
    return fig


def scaling_law_figure(measured, predicted, censored, phase_x, phase_y, phase_fraction, phase_counts=None,
                       xlabel: str = "", ylabel: str = "", title: str | None = None, axes=None) -> Figure:
    """Both panels side by side: measured vs predicted, and the phase diagram."""
    if axes is None:
        fig = Figure(figsize=(10, 4.2))
        axes = (fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2))
    else:
        fig = axes[0].figure
    measured_vs_predicted(measured, predicted, censored, ax=axes[0], title=title)
    phase_diagram(phase_x, phase_y, phase_fraction, phase_counts, xlabel=xlabel, ylabel=ylabel, ax=axes[1])
    fig.tight_layout()
    return fig


def steps_against(x: np.ndarray, measured: np.ndarray, censored: np.ndarray, grid: np.ndarray, line: np.ndarray,
                  xlabel: str = "", ax=None) -> Figure:
    """Grokking step of each run against one variable (log-log), censored runs as open triangles
    at their last step, and the fitted power law through the variable's levels."""
    fig, ax = _axes(ax)
    x, measured, cens = np.asarray(x, float), np.asarray(measured, float), np.asarray(censored, bool)
    ax.scatter(x[~cens], measured[~cens], s=14, color="C0", label="grokked")
    if cens.any():
        ax.scatter(x[cens], measured[cens], s=22, marker="^", facecolors="none", edgecolors="C3",
                   label="censored (> last step)")
    ax.plot(grid, line, color="0.3", lw=1, label="fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = np.unique(x)
    if len(ticks) <= 12:
        ax.xaxis.set_ticks(ticks, labels=[f"{v:g}" for v in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("grokking step")
    ax.set_title(f"grokking step against {xlabel}", fontsize=9)
    ax.legend(fontsize=8)
    return fig


def one_variable_figure(measured, predicted, censored, x, grid, line, xlabel: str = "",
                        title: str | None = None) -> Figure:
    """scaling_law_figure for a fit on one variable: measured vs predicted, and T against it."""
    fig = Figure(figsize=(10, 4.2))
    axes = (fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2))
    measured_vs_predicted(measured, predicted, censored, ax=axes[0], title=title)
    steps_against(x, measured, censored, grid, line, xlabel=xlabel, ax=axes[1])
    fig.tight_layout()
    return fig


__all__ = ["measured_vs_predicted", "one_variable_figure", "phase_diagram", "scaling_law_figure", "steps_against"]
