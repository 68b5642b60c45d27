"""`groklens report`: the comparison table and a figure set, on one HTML page.

`build_report(paths, out_dir, fmt=...)` compares the runs (`groklens.analyses.compare`), turns
their metrics and stored analyses into arrays (means over seeds, neuron counts, checkpoint
choices are made here; `figures` only draws), writes one file per figure and `index.html`.
A figure is made only when its data exists; the page lists the others and why they are missing.
Nothing is computed on the models unless `analyze=True` (then the default analyses are run along
the checkpoints first, through `groklens.analyses.compute_many`, and kept in each run's sidecar).

Files written into OUT_DIR (other files there are left alone; these names are overwritten):
  index.html, comparison.csv, comparison.json, and fig_<name>.<png|pdf|svg> per figure
  (with --format pdf also fig_<name>.png, the page's preview of each PDF).
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from groklens.analyses import figures as F
from groklens.analyses.compare import (
    Comparison,
    Group,
    RunSummary,
    compare,
    fmt_number,
    measure_key,
)

from groklens.errors import BadInput, RunFailure

FORMATS = ("png", "pdf", "svg")
DPI = 110


@dataclass
class FigureSpec:
    name: str
    title: str
    caption: str
    figure: Any  # matplotlib Figure


@dataclass
class ReportResult:
    out_dir: Path
    index: Path
    figures: list[Path]
    missing: list[tuple[str, str]]
    comparison: Comparison
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------- series helpers
def _positive(steps: np.ndarray, *arrays: np.ndarray):
    keep = np.asarray(steps) > 0  # a log step axis has no step 0
    return (np.asarray(steps)[keep], *[np.asarray(a)[keep] for a in arrays])


def _mean_over_common(series: Sequence[tuple[np.ndarray, np.ndarray]]):
    """Mean of several (steps, values) series over the steps every series has; None if < 2."""
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
    return steps, np.nanmean(np.stack(vals), axis=0)


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
    from groklens.analyses.compare import Measure

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
            lines.append(F.Line(mean[0], mean[1], c, g.label, bold=True))
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


def _why_missing(groups: Sequence[Group], analysis: str) -> str:
    return (f"no run has '{analysis}' results in its sidecar: run `groklens analyze RUN.h5 --metric {analysis}` "
            f"(or `groklens report --analyze`)")


def chosen_checkpoints(run: RunSummary, stored_steps: Sequence[int], steps: Sequence[int] | None):
    """(step, label) pairs for the per-checkpoint grids: the stored steps nearest the asked ones, or
    nearest to the start, memorization, grokking and the last checkpoint."""
    from groklens.analyses.compare import nearest_checkpoint

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
        out.append((s, f"step {s} ({label})" if not label.startswith("step") else f"step {s}"))
    return out


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
        params = json.loads(st.attrs.get("params", "{}"))
        thr = float(params.get("cluster_threshold", 0.85))
        thresholds.add(thr)
        for k, (s, label) in enumerate(plan):
            col_labels[i][k] = label
            if s is None:
                continue
            j = where[s]
            pw = np.asarray(st.values["embedding_power"][j], dtype=float).reshape(-1)
            power[i, k, : len(pw)] = pw
            keys[i][k] = [int(x) for x in np.asarray(st.values["key_frequencies"][j]).reshape(-1)]
            nf = np.asarray(st.values["neuron_frequency"][j]).reshape(-1).astype(int)
            fr = np.asarray(st.values["neuron_fraction"][j], dtype=float).reshape(-1)
            clustered = (fr >= thr) & (nf >= 1)
            counts[i, k] = np.bincount(nf[clustered], minlength=n_freq + 1)[1: n_freq + 1]
            uncl[i, k] = int((~clustered).sum())
    rows = [f"{g.label}\n({r.name})" if g.n > 1 else g.label for g, _, r in reps]
    cols = [c for _, c, _ in reps]
    spec = F.spectrum_grid(freqs, power, rows, col_labels, key_frequencies=keys, colours=cols)
    clus = F.cluster_grid(freqs, counts, uncl, rows, col_labels,
                          threshold=thresholds.pop() if len(thresholds) == 1 else None, colours=cols)
    return spec, clus


_OPERAND_POSITIONS = ("a", "b", "=")  # the binary tasks' sequence (trainers/tasks.py)


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
    names = _OPERAND_POSITIONS if n_pos == 3 else [str(j) for j in range(n_pos)]
    rows = [label.replace(" ", "\n") for label, _, _ in reps]  # "norm=ln act_norm_lambda=1": one field a line
    return F.pattern_grid(pats, rows, col_labels, names, [f"head {h}" for h in range(n_heads)])


def make_figures(comp: Comparison, steps: Sequence[int] | None = None) -> tuple[list[FigureSpec], list[tuple[str, str]]]:
    groups = comp.groups
    colours = [F.colour(i) for i in range(len(groups))]
    thr = comp.threshold
    figs: list[FigureSpec] = []
    missing: list[tuple[str, str]] = []

    # training curves and grokking times: from the metrics every run has
    figs.append(FigureSpec(
        "curves", "Accuracy and loss against step",
        "Train (dashed) and test (solid) accuracy and loss, log step axis; one colour per variant, seeds thin "
        "and the mean over seeds bold (over the evaluations all seeds have); dots: grokking points "
        f"(first test accuracy >= {thr:g}).",
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

    # Fourier FVE over time, spectrum and clusters
    if _present(groups, "fourier"):
        panels = [F.Panel(lbl, measure_lines(groups, colours, "fourier", key), ylim=(-0.02, 1.02))
                  for key, lbl in (("neuron_fve", "FVE, neuron (Nanda)"), ("ls_fve", "FVE, least squares"),
                                   ("embedding_fve", "FVE, embedding"))]
        figs.append(FigureSpec(
            "fourier_fve", "Fourier-circuit FVE against step",
            "Fraction of variance explained by the key frequencies: neuron activations (Nanda's 2-D block "
            "definition), least squares on the readout directions (bounded-sphere paper), and the embedding; "
            "aligned with test accuracy. Definitions: docs/ANALYSES.md.",
            F.aligned_panels(acc, panels, title="Fourier-circuit FVE", threshold=thr, marks=marks)))
        grids = fourier_grids(groups, colours, steps)
        spec, clus = grids
        which = "first seed of each group" if any(g.n > 1 for g in groups) else "each run"
        figs.append(FigureSpec(
            "fourier_spectrum", "Embedding Fourier spectrum at chosen checkpoints",
            f"Share of the embedding's Fourier power per frequency k (W_E without the '=' row), {which}, at the "
            "stored checkpoints nearest the start, memorization, grokking and the end; key frequencies outlined.",
            spec))
        figs.append(FigureSpec(
            "neuron_clusters", "Neuron-frequency clusters at chosen checkpoints",
            f"MLP neurons whose variance lies >= the cluster threshold in one frequency's 2-D block, counted per "
            f"frequency ({which}, same checkpoints); the rest are unclustered.", clus))
    else:
        why = _why_missing(groups, "fourier")
        missing += [("Fourier-circuit FVE against step", why), ("Embedding Fourier spectrum", why),
                    ("Neuron-frequency clusters", why)]

    # attention at the readout position
    if _present(groups, "attention"):
        mass = measure_lines(groups, colours, "attention", "mass", "mean")
        mn = measure_lines(groups, colours, "attention", "min_token_mass", "mean")
        heads = []
        for g, c in zip(groups, colours):
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
        panels = [F.Panel("mass on informative tokens\n(mean over heads and inputs)", mass, ylim=(-0.02, 1.02)),
                  F.Panel("per head (dotted)", heads, ylim=(-0.02, 1.02)),
                  F.Panel("least-attended informative token\n(mean over inputs)", mn, ylim=(-0.02, 1.02))]
        figs.append(FigureSpec(
            "attention", "Attention at the readout position over time",
            "Attention of the readout query on the informative tokens (a, b): total mass, per head, and the mass "
            "on the least-attended informative token; uniform attention sits at 2/3 by construction.",
            F.aligned_panels(acc, panels, title="Attention at the readout position", threshold=thr,
                             marks=marks)))
        grid = pattern_grid(groups, steps)
        if grid is not None:
            which = "first seed of each group" if any(g.n > 1 for g in groups) else "each run"
            figs.append(FigureSpec(
                "attention_patterns", "Attention patterns at the readout position at chosen checkpoints",
                f"The readout query's attention weights over the source positions (columns) for every head (rows) "
                f"of the last attention layer, mean over all inputs; {which}, at the stored checkpoints nearest "
                "the start, memorization, grokking and the end.", grid))
    else:
        missing.append(("Attention at the readout position", _why_missing(groups, "attention")))

    # Hessian
    if _present(groups, "sharpness"):
        top = measure_lines(groups, colours, "sharpness", "top_eigenvalues", "first")
        tr = measure_lines(groups, colours, "sharpness", "trace")
        panels = [F.Panel("Hessian top eigenvalue", top, yscale=_yscale(top)),
                  F.Panel("Hessian trace (Hutchinson)", tr, yscale=_yscale(tr))]
        figs.append(FigureSpec(
            "hessian", "Hessian top eigenvalue and trace over time",
            "Largest Hessian eigenvalue of the float64 training loss (eigsh, largest algebraic) and its "
            "Hutchinson trace, weight decay excluded.",
            F.aligned_panels(acc, panels, title="Sharpness", threshold=thr, marks=marks)))
    else:
        missing.append(("Hessian top eigenvalue and trace", _why_missing(groups, "sharpness")))

    # effective rank
    if _present(groups, "rank"):
        resid = measure_lines(groups, colours, "rank", "roy_vetterli_centred@{site}")
        mlp = measure_lines(groups, colours, "rank", "roy_vetterli_centred@{mlp}")
        panels = [F.Panel("effective rank, last hidden\nrepresentation (centred)", resid)]
        if mlp:
            panels.append(F.Panel("effective rank,\nMLP neurons (centred)", mlp))
        figs.append(FigureSpec(
            "effective_rank", "Effective rank over time",
            "Roy-Vetterli effective rank exp(entropy of normalised singular values) of the centred activations at "
            "the readout position over all inputs.",
            F.aligned_panels(acc, panels, title="Effective rank", threshold=thr, marks=marks)))
    else:
        missing.append(("Effective rank over time", _why_missing(groups, "rank")))

    # radius and rho
    if _present(groups, "radial"):
        radius = measure_lines(groups, colours, "radial", "radius_mean@{site}")
        rho = measure_lines(groups, colours, "radial", "rho@{site}")
        baselines = {}
        for g, c in zip(groups, colours):
            for r in g.runs:
                s = stored_series(r, "radial", _key_for(r, "radial", "rho_baseline@{site}") or "", "scalar")
                if s is not None:
                    baselines.setdefault(round(float(s[1][0]), 12), c)
        hl = ([(b, "black", f"isotropic 1/d = {fmt_number(b)}") for b in baselines] if len(baselines) == 1 else
              [(b, c, f"1/d = {fmt_number(b)}") for b, c in baselines.items()])
        panels = [F.Panel("activation radius\n||h|| / sqrt(d)", radius, yscale=_yscale(radius)),
                  F.Panel("radial gradient\nenergy rho", rho, hlines=hl, yscale=_yscale(rho))]
        figs.append(FigureSpec(
            "radial", "Radius and rho against the 1/d baseline",
            "Activation radius of the last hidden representation and its radial gradient energy rho (share of "
            "each gradient along its activation), against the isotropic baseline 1/d (dotted).",
            F.aligned_panels(acc, panels, title="Radial-angular decomposition", threshold=thr,
                             marks=marks)))
    else:
        missing.append(("Radius and rho", _why_missing(groups, "radial")))
    return figs, missing


# ---------------------------------------------------------------------- the page
_STATUS_SCRIPT = """<script>
// Marks each image's load status in the DOM (checked by the test suite in headless Chromium).
function groklensMarkImages() {
  var rows = [];
  for (var i = 0; i < document.images.length; i++) {
    var im = document.images[i];
    var ok = im.complete && im.naturalWidth > 0;
    im.setAttribute('data-loaded', ok ? 'yes' : 'no');
    rows.push({src: im.getAttribute('src'), loaded: ok, width: im.naturalWidth});
  }
  var out = document.getElementById('image-status');
  out.textContent = JSON.stringify(rows);
  out.setAttribute('data-done', 'yes');
}
window.addEventListener('load', groklensMarkImages);
</script>"""

_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 60em; }
.note { color: #555; font-size: 0.9em; }
#image-status { display: none; }
</style>"""


def _table(head: Sequence[str], body: Sequence[Sequence[str]], table_id: str) -> str:
    e = html.escape
    rows = ["<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in body]
    return f'<table id="{table_id}">\n' + "\n".join(rows) + "\n</table>"


def render_html(comp: Comparison, figures: Sequence[tuple[FigureSpec, str, str | None]],
                missing: Sequence[tuple[str, str]], notes: Sequence[str] = ()) -> str:
    """figures: (spec, file shown on the page, file linked when different: the PDF)."""
    from groklens.analyses.compare import SPEEDUP_METHOD

    from groklens import __version__

    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>groklens report</title>", _STYLE, _STATUS_SCRIPT, "</head><body>",
             "<h1>groklens report</h1>",
             (f'<p class="note">{len([r for g in comp.groups for r in g.runs])} run(s), grokking threshold '
              f'{comp.threshold:g}; groklens {e(__version__)}; written {e(time.strftime("%Y-%m-%d %H:%M:%S"))}.</p>'),
             "<h2>Comparison</h2>"]
    head, body = comp.core_cells()
    parts.append(_table(head, body, "comparison"))
    if comp.baseline is not None:
        parts.append(f'<p class="note">Speed-up = grokking step of <b>{e(comp.baseline.label)}</b> / the row\'s: '
                     f"{e(SPEEDUP_METHOD)}. &gt; N: not grokked by step N (censored).</p>")
    head, body = comp.analysis_cells()
    if body:
        parts.append("<h3>Stored analyses at memorization, grokking and the end</h3>")
        parts.append('<p class="note">At the checkpoint nearest each event; — = not stored at that checkpoint; '
                     "n/a = the event never happened. Groups: mean ± std over seeds.</p>")
        parts.append(_table(head, body, "analyses"))
    parts.append("<h3>Runs</h3><ul>")
    for g in comp.groups:
        for r in g.runs:
            parts.append(f"<li>{e(g.label)}: <code>{e(str(r.path))}</code> (seed {e(str(r.config.get('seed')))}, "
                         f"{e(r.status)})</li>")
    parts.append("</ul>")
    parts.append("<h2>Figures</h2>")
    for spec, shown, linked in figures:
        img = f'<img src="{e(shown)}" alt="{e(spec.title)}">'
        if linked:
            img = f'<a href="{e(linked)}">{img}</a>'
        parts.append(f'<figure id="fig-{e(spec.name)}"><h3>{e(spec.title)}</h3>{img}'
                     f"<figcaption>{e(spec.caption)}</figcaption></figure>")
    parts.append('<h2>Missing figures</h2>')
    if missing:
        parts.append('<ul id="missing">' + "".join(f"<li><b>{e(t)}</b>: {e(w)}</li>" for t, w in missing) + "</ul>")
    else:
        parts.append('<p id="missing">None: every figure had its data.</p>')
    if notes or comp.notes:
        parts.append("<h3>Notes</h3><ul>" + "".join(f"<li>{e(n)}</li>" for n in [*comp.notes, *notes]) + "</ul>")
    parts.append('<div id="image-status"></div>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------- writing, whole or not at all
FIXED_OUTPUTS = ("index.html", "comparison.csv", "comparison.json")


def _check_targets(out: Path, names: Sequence[str], inputs: Sequence[Path]) -> None:
    """Refuse, before anything is written, an output that is a directory or one of the inputs,
    and an output directory this process cannot write into."""
    where = out if out.exists() else out.parent
    if not os.access(where, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write into {where} (permission denied)")
    for name in names:
        target = out / name
        if target.is_dir() and not target.is_symlink():
            raise BadInput(f"{target} is a directory; the report writes a file there")
        for p in inputs:
            if target.exists() and p.exists() and os.path.samefile(target, p):
                raise BadInput(f"{p} is an input of this report and would be overwritten by its {name}; "
                               "choose another --out")


@contextmanager
def _staging(out: Path):
    """A temporary directory beside `out` that receives every file; on success its files are
    moved into `out` (a link in the way is replaced, never written through); on any failure
    it is removed and `out` is as it was."""
    import shutil
    import tempfile

    parent = out if out.exists() else out.parent
    try:
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name or 'report'}.report-tmp-", dir=parent))
    except OSError as exc:
        raise RunFailure(f"cannot write into {parent}: {exc.strerror or exc}") from None
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(stage, 0o777 & ~mask)  # mkdtemp's 0700 would become the report directory's mode
    try:
        yield stage
        if not out.exists():
            os.rename(stage, out)  # the whole report appears at once
            return
        for item in sorted(stage.iterdir()):
            os.replace(item, out / item.name)
    except OSError as exc:
        raise RunFailure(f"writing the report into {out} failed ({exc.strerror or exc}); nothing was "
                         "written there") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _write_figures(specs: Sequence[FigureSpec], stage: Path, fmt: str):
    written: list[Path] = []
    shown: list[tuple[FigureSpec, str, str | None]] = []
    for spec in specs:
        main = stage / f"fig_{spec.name}.{fmt}"
        spec.figure.savefig(main, dpi=DPI, format=fmt)
        written.append(main)
        if fmt == "pdf":
            preview = stage / f"fig_{spec.name}.png"
            spec.figure.savefig(preview, dpi=DPI, format="png")
            written.append(preview)
            shown.append((spec, preview.name, main.name))
        else:
            shown.append((spec, main.name, None))
    return written, shown


# ---------------------------------------------------------------------- entry point
def analyze_for_report(paths: Sequence[str | Path], metrics: Sequence[str] | None, every: int | None,
                       progress: bool = False) -> list[str]:
    """Run the report's analyses along each run's checkpoints (every `every`-th), keeping results."""
    from groklens.analyses.compare import ANALYSES_USED
    from groklens.analyses.registry import default_names, get
    from groklens.analyses.runner import analyze_runs

    # unless told: the default set, of what the figures draw (the comparison's analyses)
    names = list(dict.fromkeys(metrics or default_names(ANALYSES_USED)))
    for n in names:
        get(n)
    return analyze_runs(paths, [(n, {}) for n in names], checkpoints=f"every:{every}" if every else "all",
                        skip_inapplicable=not metrics, progress=progress)


def build_report(paths: Sequence[str | Path], out_dir: str | Path, *, fmt: str = "png",
                 baseline: str | Path | None = None, group_by: str | Sequence[str] | None = "variant",
                 threshold: float = 0.95, analyze: bool = False, metrics: Sequence[str] | None = None,
                 every: int | None = None, steps: Sequence[int] | None = None, progress: bool = False,
                 comparison: Comparison | None = None) -> ReportResult:
    """Write the figures, comparison.csv/json and index.html into out_dir (see the module docstring)."""
    if fmt not in FORMATS:
        raise BadInput(f"--format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if not str(out_dir).strip():
        raise BadInput("--out is empty; give the report's directory")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory")
    if not out.exists() and not out.parent.exists():
        raise BadInput(f"directory {out.parent} does not exist")
    if metrics and not analyze:
        raise BadInput("--metric chooses what --analyze computes; give --analyze too")
    if every is not None and (isinstance(every, bool) or every < 1):
        raise BadInput(f"--every must be a positive integer; got {every!r}")
    inputs = [Path(p) for p in paths] + ([Path(baseline)] if baseline else [])
    _check_targets(out, FIXED_OUTPUTS, inputs)  # before any work: nothing half-done to undo
    comp = comparison or compare(paths, baseline=baseline, group_by=group_by, threshold=threshold)  # validates
    notes: list[str] = []
    if analyze:
        run_paths = [r.path for g in comp.groups for r in g.runs]
        notes += analyze_for_report(run_paths, metrics, every, progress=progress)
        comp = compare(paths, baseline=baseline, group_by=group_by, threshold=threshold)
    if any(np.any(np.asarray(r.metrics["step"]) > 0) for g in comp.groups for r in g.runs):
        specs, missing = make_figures(comp, steps)
    else:  # every axis is a log step axis: a run that has just started has nothing to draw yet
        specs, missing = [], [("every figure", "no run has an evaluation after step 0 yet")]
    names = [f"fig_{spec.name}.{fmt}" for spec in specs] + ([f"fig_{spec.name}.png" for spec in specs]
                                                             if fmt == "pdf" else [])
    _check_targets(out, names, inputs)
    with _staging(out) as stage:
        written, shown = _write_figures(specs, stage, fmt)
        (stage / "comparison.csv").write_text(comp.to_csv())
        (stage / "comparison.json").write_text(json.dumps(comp.to_json(), indent=1))
        (stage / "index.html").write_text(render_html(comp, shown, missing, notes))
    written = [out / p.name for p in written]
    index = out / "index.html"
    return ReportResult(out, index, written, missing, comp, notes)
