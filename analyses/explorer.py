"""The report's explorer: `explorer.html`, one self-contained interactive page (no server, no
file beside it) with a checkpoint slider that moves, together, the cursor on the loss and
accuracy curves, the readout query's attention pattern, the embedding's Fourier spectrum, the
neuron-frequency clusters and the clock / pizza label, of one run chosen from the report's runs.

What it draws is what the report's figures draw, read from the same stored analyses (`fourier`,
`attention`, `clock_pizza`; nothing is computed here): the slider's positions are the checkpoints
where any of them is stored, each panel shows its analysis at the stored checkpoint nearest the
slider's (`phases.nearest_checkpoint`, as the figures choose theirs) and says so when it is another;
a panel whose analysis is missing says how to compute it. The page is inline SVG drawn by
`explorer.js` from a JSON block; the data is escaped for a script element (`<`, `>`, `&` as
\\u escapes) and the script puts every string into the page as text, never as markup.
"""

from __future__ import annotations

import html
import json
import math
import time
from importlib import resources
from typing import Any

import numpy as np

from groklens import __version__
from groklens.analyses.clock_pizza import (ALGORITHM_RULE, CLOCK_MAX_SYMMETRICITY, CLOCK_MIN_IRRELEVANCE,
                                           PIZZA_MAX_IRRELEVANCE, PIZZA_MIN_SYMMETRICITY, algorithm_label)
from groklens.analyses.compare import Comparison, RunSummary
from groklens.analyses.phases import nearest_checkpoint
from groklens.analyses.report_figures import cluster_counts, cluster_threshold, position_names

EXPLORED = ("fourier", "attention", "clock_pizza")
MAX_POINTS = 1_000  # per curve: longer ones are thinned to log-spaced evaluations (the axis is log)
DIGITS = 4  # significant digits of every number in the page's data


def _num(x: Any) -> float | None:
    """x to DIGITS significant digits; None for NaN / inf (JSON has neither)."""
    x = float(x)
    return float(f"{x:.{DIGITS}g}") if math.isfinite(x) else None


def _nums(xs) -> list:
    return [_num(x) for x in np.asarray(xs, dtype=float).reshape(-1)]


def thinned(n: int, limit: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most `limit` of n evaluations, log-spaced (the first and last kept)."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.round(np.geomspace(1, n, limit)).astype(int) - 1)


def _curves(run: RunSummary) -> dict[str, list]:
    m = run.metrics
    keep = np.nonzero(np.asarray(m["step"]) > 0)[0]  # a log step axis has no step 0
    keep = keep[thinned(len(keep))]
    return {"step": [int(s) for s in np.asarray(m["step"])[keep]],
            **{k: _nums(np.asarray(m[k])[keep]) for k in ("train_loss", "test_loss", "train_acc", "test_acc")}}


def _fourier(st) -> dict[str, Any]:
    power = [np.asarray(v, dtype=float).reshape(-1) for v in st.values["embedding_power"]]
    n_freq = max(len(p) for p in power)
    thr = cluster_threshold(st)
    clusters = [cluster_counts(nf, fr, thr, n_freq) for nf, fr in zip(st.values["neuron_frequency"],
                                                                      st.values["neuron_fraction"])]
    counts = [c.tolist() for c, _ in clusters]
    return {"power": [_nums(p) for p in power], "power_max": _num(np.nanmax(np.concatenate(power))),
            "keys": [[int(k) for k in np.asarray(v).reshape(-1)] for v in st.values["key_frequencies"]],
            "counts": counts, "counts_max": max(max(c) for c in counts), "unclustered": [u for _, u in clusters],
            "neurons": int(np.asarray(st.values["neuron_frequency"][0]).size), "threshold": thr}


def _attention(st) -> dict[str, Any]:
    pats = [np.asarray(v, dtype=float)[-1] for v in st.values["pattern"]]  # the last layer: [H, n_ctx]
    return {"pattern": [[_nums(row) for row in p] for p in pats], "positions": position_names(pats[0].shape[-1])}


def _clock_pizza(st) -> dict[str, Any]:
    gs = [float(np.asarray(v).reshape(-1)[0]) for v in st.values["gradient_symmetricity"]]
    di = [float(np.asarray(v).reshape(-1)[0]) for v in st.values["distance_irrelevance"]]
    return {"gs": [_num(g) for g in gs], "di": [_num(d) for d in di],
            "label": [algorithm_label(g, d) for g, d in zip(gs, di)]}


READERS = {"fourier": _fourier, "attention": _attention, "clock_pizza": _clock_pizza}
NEEDS = {"fourier": ("embedding_power", "key_frequencies", "neuron_frequency", "neuron_fraction"),
         "attention": ("pattern",), "clock_pizza": ("gradient_symmetricity", "distance_irrelevance")}


def run_data(run: RunSummary, group: str) -> dict[str, Any]:
    """One run's page data: its curves, the slider's positions and each explored analysis there."""
    have = {n: st for n in EXPLORED if (st := run.stored.get(n)) is not None and st.steps
            and all(k in st.values for k in NEEDS[n])}
    positions = sorted({int(s) for st in have.values() for s in st.steps}) or [int(s) for s in run.checkpoints] or [0]
    out: dict[str, Any] = {"name": run.name, "group": group, "path": str(run.path), "curves": _curves(run),
                           "memorization": run.memorization, "grokking": run.grokking, "positions": positions,
                           "missing": {}}
    for name in EXPLORED:
        st = have.get(name)
        if st is None:
            out["missing"][name] = (f"not stored for this run: `groklens analyze {run.path.name} --metric {name}` "
                                    f"(or `groklens report --analyze --metric {name}`) computes it")
            out[name] = None
            continue
        where = {int(s): j for j, s in enumerate(st.steps)}
        out[name] = {"steps": [int(s) for s in st.steps], **READERS[name](st),
                     "at": [where[nearest_checkpoint(list(where), s)] for s in positions]}
    return out


def explorer_data(comp: Comparison) -> dict[str, Any]:
    return {"runs": [run_data(r, g.label) for g in comp.groups for r in g.runs],
            "rule": {"text": ALGORITHM_RULE, "clock_max_symmetricity": CLOCK_MAX_SYMMETRICITY,
                     "clock_min_irrelevance": CLOCK_MIN_IRRELEVANCE, "pizza_min_symmetricity": PIZZA_MIN_SYMMETRICITY,
                     "pizza_max_irrelevance": PIZZA_MAX_IRRELEVANCE}}


def script_json(data: Any) -> str:
    """JSON that cannot end or open anything inside a <script> element (as Django's json_script)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 1em auto; max-width: 78em; color: #222; }
#controls { position: sticky; top: 0; background: #fff; padding: 0.5em 0; border-bottom: 1px solid #ddd; z-index: 1; }
#controls label { margin-right: 1.5em; }
#checkpoint { width: 28em; vertical-align: middle; }
#panels { display: grid; grid-template-columns: 1fr 1fr; gap: 0.5em 2em; }
section { min-width: 0; }
section.wide { grid-column: 1 / span 2; }
h2 { font-size: 1.05em; margin: 0.8em 0 0.2em; }
svg { max-width: 100%; height: auto; }
.axis { font-size: 12px; fill: #333; }
.tick, .value { font-size: 11px; }
.note, .why { color: #555; font-size: 0.9em; margin: 0.2em 0; }
#algorithm { font-size: 2.2em; font-weight: 600; margin: 0.2em 0; }
</style>"""


def render_explorer(data: dict[str, Any]) -> str:
    e = html.escape
    script = resources.files("groklens.analyses").joinpath("explorer.js").read_text()
    assert "</script" not in script.lower()  # it would end the element early
    n = len(data["runs"])
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', "<title>groklens explorer</title>",
        _STYLE, "</head><body>",
        "<h1>groklens explorer</h1>",
        f'<p class="note">{n} run(s); groklens {e(__version__)}; written {e(time.strftime("%Y-%m-%d %H:%M:%S"))}. '
        "The slider steps through the checkpoints where an analysis is stored; every panel follows it. "
        'The figures and the comparison: <a href="index.html">index.html</a>.</p>',
        '<div id="controls"><label>Run <select id="run"></select></label>'
        '<label>Checkpoint <input type="range" id="checkpoint" min="0" max="0" value="0" step="1"></label>'
        '<output id="step"></output><p class="note" id="run-info"></p></div>',
        '<div id="panels">',
        '<section class="wide" id="panel-curves"><h2>Loss and accuracy (cursor: the checkpoint)</h2>'
        '<svg id="curves" viewBox="0 0 780 260" width="1000" role="img" aria-label="loss and accuracy curves"></svg>'
        '<p class="note" id="curves-readout"></p></section>',
        '<section id="panel-attention"><h2>Attention of the readout query, last layer (mean over inputs)</h2>'
        '<p class="why" id="attention-note"></p><svg id="attention" viewBox="0 0 300 120" width="390" role="img" '
        'aria-label="attention pattern"></svg></section>',
        '<section id="panel-label"><h2>Clock or pizza (Zhong et al. 2023)</h2><p class="why" id="clock_pizza-note"></p>'
        '<p id="algorithm"></p><p class="note" id="algorithm-values"></p>'
        '<svg id="clock-plane" viewBox="0 0 400 275" width="460" role="img" aria-label="clock and pizza regions"></svg>'
        f'<p class="note">Our rule: {e(ALGORITHM_RULE)}; grey: the stored checkpoints.</p></section>',
        '<section id="panel-spectrum"><h2>Fourier spectrum of the embedding (W_E without the = row)</h2>'
        '<p class="why" id="fourier-note"></p><svg id="spectrum" viewBox="0 0 560 212" width="560" role="img" '
        'aria-label="Fourier spectrum"></svg><p class="note" id="spectrum-keys"></p></section>',
        '<section id="panel-clusters"><h2>Neuron-frequency clusters (last MLP layer)</h2>'
        '<p class="why" id="clusters-note"></p><svg id="clusters" viewBox="0 0 560 212" width="560" role="img" '
        'aria-label="neuron-frequency clusters"></svg><p class="note" id="clusters-unclustered"></p></section>',
        "</div>",
        f'<script type="application/json" id="explorer-data">{script_json(data)}</script>',
        f"<script>\n{script}</script>",
        "</body></html>", ""])
