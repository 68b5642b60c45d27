"""`groklens report`: the comparison table and a figure set, on one HTML page.

`build_report(paths, out_dir, fmt=...)` compares the runs (`groklens.analyses.compare`), makes
the figures from their metrics and stored analyses (`report_figures`), writes one file per
figure, `index.html`, and `explorer.html`, the interactive page over the checkpoints (`explorer`).
A figure is made only when its data exists; the page lists the others and why they are missing.
Nothing is computed on the models unless `analyze=True` (then the default analyses are run along
the checkpoints first, through `groklens.analyses.runner.analyze_runs`, and kept in each run's sidecar).

Files written into OUT_DIR (other files there are left alone; these names are overwritten):
  index.html, explorer.html, comparison.csv, comparison.json, and fig_<name>.<png|pdf|svg> per figure
  (with --format pdf also fig_<name>.png, the page's preview of each PDF).
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from groklens import __version__
from groklens.analyses.compare import ANALYSES_USED, Comparison, SPEEDUP_METHOD, compare
from groklens.analyses.registry import default_names, get
from groklens.analyses.report_figures import DPI, FigureSpec, make_figures  # noqa: F401 - DPI re-exported
from groklens.config import GROK_THRESHOLD
from groklens.errors import BadInput
from groklens.fileio import staged_outputs
from groklens.analyses.report_figures import FIGURE_NAMES, MISSING_NAMES
from groklens.analyses.compare_format import dash_reasons, mark_notes
from groklens.analyses.explorer import explorer_data, render_explorer
from groklens.analyses.notes import one_per_kind

FORMATS = ("png", "pdf", "svg")


@dataclass
class ReportResult:
    out_dir: Path
    index: Path
    figures: list[Path]
    missing: list[tuple[str, str]]
    comparison: Comparison
    notes: list[str] = field(default_factory=list)
    explorer: Path | None = None


# ---------------------------------------------------------------------- the page
_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; max-width: 60em; }
.note { color: #555; font-size: 0.9em; }
</style>"""


def _table(head: Sequence[str], body: Sequence[Sequence[str]], table_id: str) -> str:
    e = html.escape
    rows = ["<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in body]
    return f'<table id="{table_id}">\n' + "\n".join(rows) + "\n</table>"


def render_html(comp: Comparison, figures: Sequence[tuple[FigureSpec, str, str | None]],
                missing: Sequence[tuple[str, str]], notes: Sequence[str] = ()) -> str:
    """figures: (spec, file shown on the page, file linked when different: the PDF)."""
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>groklens report</title>", _STYLE, "</head><body>",
             "<h1>groklens report</h1>",
             (f'<p class="note">{len([r for g in comp.groups for r in g.runs])} run(s), grokking threshold '
              f'{comp.threshold:g}; groklens {e(__version__)}; written {e(time.strftime("%Y-%m-%d %H:%M:%S"))}.</p>'),
             '<p id="explorer-link">Interactive: <a href="explorer.html">explorer.html</a>, a checkpoint slider '
             "over the curves, attention patterns, Fourier spectrum, neuron clusters and the clock / pizza label.</p>",
             "<h2>Comparison</h2>"]
    head, body = comp.core_cells()
    parts.append(_table(head, body, "comparison"))
    if comp.baseline is not None:
        parts.append(f'<p class="note">Speed-up = grokking step of <b>{e(comp.baseline.label)}</b> / the row\'s: '
                     f"{e(SPEEDUP_METHOD)}. &gt; N: not grokked by step N (censored).</p>")
    head, body = comp.analysis_cells()
    if body:
        parts.append("<h3>Stored analyses at memorization, grokking and the end</h3>")
        parts.append('<p class="note">At memorization and grokking: the checkpoint less than one evaluation '
                     "interval (eval_every) from the event's step (the trainer writes one there); at the end: the "
                     "last checkpoint. — = no value there (reasons below the table); n/a = the event never "
                     "happened. Groups: mean ± std over seeds.</p>")
        parts.append(_table(head, body, "analyses"))

        notes_below = dash_reasons(comp) + mark_notes(body)
        if notes_below:
            parts.append('<ul class="note" id="analyses-notes">' + "".join(f"<li>{e(n)}</li>" for n in notes_below)
                         + "</ul>")
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
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------- writing, whole or not at all
FIXED_OUTPUTS = ("index.html", "explorer.html", "comparison.csv", "comparison.json")


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


def _staging(out: Path):
    """A temporary directory beside `out` that receives every file; on success its files are
    moved into `out` (a link in the way is replaced, never written through); on any failure
    it is removed and `out` is as it was; one left by a killed report is removed by the next
    (groklens.fileio.staged_outputs)."""
    return staged_outputs(out)


STYLES = ("screen", "paper")
PAPER = {"width_in": 5.5, "font_pt": 8.0, "dpi": 300}  # a one-column paper's text width (NeurIPS / ICML: 5.5 in)
# TrueType fonts in PDF / PS (what publishers ask for); the figure keeps its exact width (its
# layout is matplotlib's constrained one, which fits the margins)
PAPER_RC = {"pdf.fonttype": 42, "ps.fonttype": 42}
# A figure's pixels grow with the square of its width: at 300 dpi, 120 in took 5.4 GB (999 in: a
# MemoryError). 20 in (a two-page spread, 6,000 px wide) bounds a figure to a few hundred MB.
PAPER_LIMITS = {"width_in": (1.0, 20.0), "font_pt": (4.0, 36.0), "dpi": (50, 600)}


def paper_figure(fig, width_in: float = PAPER["width_in"], font_pt: float = PAPER["font_pt"]) -> None:
    """A report figure made for a paper: `width_in` wide (the height scaled alike) and its text at
    `font_pt` (titles and labels keep their relative sizes: the figures' own 8 pt becomes font_pt)."""
    import matplotlib.text

    w, h = fig.get_size_inches()
    fig.set_size_inches(width_in, h * width_in / w)
    for text in fig.findobj(matplotlib.text.Text):
        text.set_fontsize(text.get_fontsize() * font_pt / 8.0)


def _write_figures(specs: Sequence[FigureSpec], stage: Path, fmt: str, style: str = "screen",
                   style_opts: dict | None = None):
    import matplotlib

    written: list[Path] = []
    shown: list[tuple[FigureSpec, str, str | None]] = []
    opts = {**PAPER, **(style_opts or {})}
    dpi = opts["dpi"] if style == "paper" else DPI
    with matplotlib.rc_context(PAPER_RC if style == "paper" else {}):
        for spec in specs:
            if style == "paper":
                paper_figure(spec.figure, opts["width_in"], opts["font_pt"])
            main = stage / f"fig_{spec.name}.{fmt}"
            spec.figure.savefig(main, dpi=dpi, format=fmt)
            written.append(main)
            if fmt == "pdf":
                preview = stage / f"fig_{spec.name}.png"
                spec.figure.savefig(preview, dpi=DPI, format="png")
                written.append(preview)
                shown.append((spec, preview.name, main.name))
            else:
                shown.append((spec, main.name, None))
    return written, shown


def parse_figures(names: str | Sequence[str] | None) -> list[str] | None:
    """--figures NAME,...: known figure names (fig_ prefix allowed), BadInput for others."""
    if names is None:
        return None
    items = [names] if isinstance(names, str) else list(names)
    out = [x.strip().removeprefix("fig_") for item in items for x in str(item).split(",") if x.strip()]
    unknown = [n for n in out if n not in FIGURE_NAMES]
    if unknown or not out:
        raise BadInput(f"--figures takes figure names ({', '.join(FIGURE_NAMES)}); got "
                       f"{unknown[0] if unknown else 'none'!r}")
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------- entry point
def analyze_for_report(paths: Sequence[str | Path], metrics: Sequence[str] | None, every: int | None,
                       progress: bool = False, params: Sequence[str] = ()) -> list[str]:
    """Run the report's analyses along each run's checkpoints (every `every`-th, and always the
    phase checkpoints, so the table's memorization and grokking cells are filled), keeping results;
    `params`: METRIC.KEY=VALUE as `groklens analyze --param`. fourier runs twice unless its
    key_frequencies is given: each checkpoint's own key set, and the last checkpoint's."""
    from groklens.analyses.runner import analyze_runs, parse_params

    # unless told: the default set, of what the figures draw (the comparison's analyses)
    names = list(dict.fromkeys(metrics or default_names(ANALYSES_USED)))
    for n in names:
        get(n)
    parsed = parse_params(params, names)
    requests = [(n, parsed.get(n, {})) for n in names]
    if "fourier" in names and "key_frequencies" not in parsed.get("fourier", {}):
        # and the fourier curves on the last checkpoint's key set, which the progress-measures figure
        # reads (Nanda's fixed key set; without it the figure says it should not be read), as the demo does
        requests.append(("fourier", {**parsed.get("fourier", {}), "key_frequencies": "last"}))
    return analyze_runs(paths, requests, checkpoints=f"every:{every}+phases" if every else "all",
                        skip_inapplicable=not metrics, progress=progress)


def build_report(paths: Sequence[str | Path], out_dir: str | Path, *, fmt: str = "png",
                 baseline: str | Path | None = None, group_by: str | Sequence[str] | None = "variant",
                 threshold: float = GROK_THRESHOLD, analyze: bool = False, metrics: Sequence[str] | None = None,
                 every: int | None = None, steps: Sequence[int] | None = None, progress: bool = False,
                 comparison: Comparison | None = None, params: Sequence[str] = (), style: str = "screen",
                 style_opts: dict | None = None, figures: str | Sequence[str] | None = None) -> ReportResult:
    """Write the figures, comparison.csv/json and index.html into out_dir (see the module docstring).
    `style` 'paper': figures `style_opts['width_in']` wide with `font_pt` text (paper_figure);
    `figures`: only these figures (FIGURE_NAMES)."""
    if fmt not in FORMATS:
        raise BadInput(f"--format must be one of {', '.join(FORMATS)}; got {fmt!r}")
    if style not in STYLES:
        raise BadInput(f"--style must be one of {', '.join(STYLES)}; got {style!r}")
    for key, value in (style_opts or {}).items():
        flag = {"width_in": "--width", "font_pt": "--font-size"}.get(key, key)
        if key not in PAPER:
            raise BadInput(f"style option {key!r} is not one of {', '.join(PAPER)}")
        lo, hi = PAPER_LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            raise BadInput(f"{flag} must be a number from {lo:g} to {hi:g}; got {value!r}")
    wanted = parse_figures(figures)
    if not str(out_dir).strip():
        raise BadInput("--out is empty; give the report's directory")
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory")
    if not out.exists() and not out.parent.exists():
        raise BadInput(f"directory {out.parent} does not exist")
    if metrics and not analyze:
        raise BadInput("--metric chooses what --analyze computes; give --analyze too")
    if params and not analyze:
        raise BadInput("--param sets what --analyze computes; give --analyze too")
    if every is not None and (isinstance(every, bool) or every < 1):
        raise BadInput(f"--every must be a positive integer; got {every!r}")
    inputs = [Path(p) for p in paths] + ([Path(baseline)] if baseline else [])
    _check_targets(out, FIXED_OUTPUTS, inputs)  # before any work: nothing half-done to undo
    comp = comparison or compare(paths, baseline=baseline, group_by=group_by, threshold=threshold)  # validates
    notes: list[str] = []
    if analyze:
        run_paths = [r.path for g in comp.groups for r in g.runs]
        notes += one_per_kind(analyze_for_report(run_paths, metrics, every, progress=progress, params=params))
        comp = compare(paths, baseline=baseline, group_by=group_by, threshold=threshold)
    if any(np.any(np.asarray(r.metrics["step"]) > 0) for g in comp.groups for r in g.runs):
        specs, missing = make_figures(comp, steps)
    else:  # every axis is a log step axis: a run that has just started has nothing to draw yet
        specs, missing = [], [("every figure", "no run has an evaluation after step 0 yet")]
    if wanted is not None:  # --figures: only these, and only their missing entries

        specs = [sp for sp in specs if sp.name in wanted]
        missing = [(t, w) for t, w in missing if t == "every figure" or set(MISSING_NAMES.get(t, ())) & set(wanted)]
    names = [f"fig_{spec.name}.{fmt}" for spec in specs] + ([f"fig_{spec.name}.png" for spec in specs]
                                                             if fmt == "pdf" else [])
    _check_targets(out, names, inputs)
    with _staging(out) as stage:
        written, shown = _write_figures(specs, stage, fmt, style, style_opts)
        (stage / "comparison.csv").write_text(comp.to_csv())
        (stage / "comparison.json").write_text(json.dumps(comp.to_json(), indent=1))
        (stage / "index.html").write_text(render_html(comp, shown, missing, notes))
        (stage / "explorer.html").write_text(render_explorer(explorer_data(comp)))
    written = [out / p.name for p in written]
    index = out / "index.html"
    return ReportResult(out, index, written, missing, comp, notes, out / "explorer.html")
