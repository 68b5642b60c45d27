"""The report's explorer page (analyses/explorer.py, explorer.js): its data against the stored
analyses, and the page itself in a real headless Chromium, opened from disk: no script error,
every slider position draws its checkpoint, and a hostile run name stays text."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from groklens.analyses.clock_pizza import algorithm_label
from groklens.analyses.compare import compare
from groklens.analyses.explorer import explorer_data, script_json, thinned
from groklens.analyses.report import build_report
from tests.analyses.test_report import chromium, probe_page
from tests.helpers import tiny_config, train_interrupted, train_tiny

# a file name, as a user may give one (no "/": the JSON's "</script>" is test_script_json_cannot_close_the_element's)
HOSTILE = 'x<img src=x onerror="document.title=1"><b>&amp;'


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run with fourier, attention and clock_pizza stored (the attention at every second
    checkpoint only), under a hostile name; a run with nothing stored; one stopped after its
    first step (its only evaluation at step 0)."""
    from groklens.analyses import compute

    d = tmp_path_factory.mktemp("explorer")
    rich, bare, young = d / f"{HOSTILE}.h5", d / "bare.h5", d / "young.h5"
    train_tiny(rich, norm="ln", steps=120, checkpoint_every=20)
    train_tiny(bare, norm="ln", steps=60)
    train_interrupted(tiny_config(norm="ln", seed=3), young, at_step=1)
    compute(rich, "fourier")
    compute(rich, "clock_pizza")
    compute(rich, "attention", every=2)
    return rich, bare, young


def test_the_page_data_is_the_stored_analyses(runs):
    rich = runs[0]
    comp = compare([rich], group_by="run")
    run = comp.groups[0].runs[0]
    data = explorer_data(comp)["runs"][0]
    st = {n: run.stored[n] for n in ("fourier", "attention", "clock_pizza")}
    # the slider: every checkpoint where any of them is stored
    assert data["positions"] == sorted(set(st["fourier"].steps) | set(st["clock_pizza"].steps))
    assert len(st["attention"].steps) < len(data["positions"])  # so the attention panel uses its nearest
    for k, step in enumerate(data["positions"]):
        j = data["clock_pizza"]["at"][k]
        assert st["clock_pizza"].steps[j] == step
        gs = float(np.asarray(st["clock_pizza"].values["gradient_symmetricity"][j]).reshape(-1)[0])
        di = float(np.asarray(st["clock_pizza"].values["distance_irrelevance"][j]).reshape(-1)[0])
        assert data["clock_pizza"]["label"][j] == algorithm_label(gs, di)
        a = data["attention"]["at"][k]  # nearest stored attention checkpoint (the later on a tie)
        dist = [abs(s - step) for s in st["attention"].steps]
        assert a == max(i for i, x in enumerate(dist) if x == min(dist))
        want = np.asarray(st["attention"].values["pattern"][a], dtype=float)[-1]
        assert np.allclose(np.array(data["attention"]["pattern"][a], dtype=float), want, rtol=1e-3, atol=1e-6)
    f = data["fourier"]
    for j in range(len(st["fourier"].steps)):  # cluster counts by a plain loop over the neurons
        nf = np.asarray(st["fourier"].values["neuron_frequency"][j]).reshape(-1)
        fr = np.asarray(st["fourier"].values["neuron_fraction"][j]).reshape(-1)
        counts = [0] * len(f["counts"][j])
        for freq, frac in zip(nf, fr):
            if frac >= f["threshold"] and freq >= 1:
                counts[int(freq) - 1] += 1
        assert f["counts"][j] == counts and f["unclustered"][j] == len(nf) - sum(counts)
        assert np.allclose(f["power"][j], st["fourier"].values["embedding_power"][j], rtol=1e-3)


def test_script_json_cannot_close_the_element():
    data = {"name": HOSTILE + "</script>", "x": "<!-- & -->"}
    text = script_json(data)
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == data


def test_long_curves_are_thinned_log_spaced():
    idx = thinned(50_000, 1_000)
    assert len(idx) <= 1_000 and idx[0] == 0 and idx[-1] == 49_999 and np.all(np.diff(idx) > 0)
    assert list(idx[:10]) == list(range(10))  # the early evaluations, dense on a log axis, are all kept
    assert list(thinned(300, 1_000)) == list(range(300))


# The test's probe, injected first into <head> of a copy of the page: it records script errors,
# then moves the slider through every position and switches the run, recording what is drawn.
_PROBE = """<script>
window.__errors = [];
window.addEventListener('error', function (e) { window.__errors.push(String(e.message)); });
window.addEventListener('load', function () {
  var out = {images: document.images.length, title: document.title, states: []};
  function text(id) { return document.getElementById(id).textContent; }
  function state() {
    var s = {step: text('step'), label: text('algorithm'), attention_note: text('attention-note'),
             fourier_note: text('fourier-note'), readout: text('curves-readout')};
    ['curves', 'attention', 'spectrum', 'clusters', 'clock-plane'].forEach(function (id) {
      s[id] = document.getElementById(id).innerHTML;
    });
    var cursor = document.querySelector('#curves .cursor');
    s.cursor = cursor ? Number(cursor.getAttribute('x1')) : null;
    s.cells = Array.prototype.map.call(document.querySelectorAll('#attention rect.cell title'),
                                       function (t) { return t.textContent; });
    ['spectrum', 'clusters'].forEach(function (id) {  // how far down its text reaches, against its viewBox
      var svg = document.getElementById(id), bottom = 0;
      Array.prototype.forEach.call(svg.querySelectorAll('text'), function (t) {
        var b = t.getBBox();
        bottom = Math.max(bottom, b.y + b.height);
      });
      s[id + '_bottom'] = bottom;
      s[id + '_height'] = svg.viewBox.baseVal.height;
      s[id + '_texts'] = Array.prototype.map.call(svg.querySelectorAll('text'), function (t) { return t.textContent; });
    });
    return s;
  }
  try {
    var slider = document.getElementById('checkpoint'), run = document.getElementById('run');
    out.opened_at = Number(slider.value);
    out.options = Array.prototype.map.call(run.options, function (o) { return o.textContent; });
    for (var k = 0; k <= Number(slider.max); k++) {
      slider.value = String(k);
      slider.dispatchEvent(new Event('input'));
      out.states.push(state());
    }
    out.others = [];
    for (var i = 1; i < run.options.length; i++) {
      run.value = String(i);
      run.dispatchEvent(new Event('change'));
      out.others.push(state());
    }
  } catch (e) { window.__errors.push('probe: ' + e); }
  out.errors = window.__errors;
  var pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def probe(page: Path, profile: Path) -> dict:
    return probe_page(page, profile, _PROBE, first=True)


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium binary (Debian package `chromium`; .ci/run installs it)")
def test_explorer_in_headless_chromium(runs, tmp_path):
    res = build_report(list(runs), tmp_path / "rep", group_by="run")
    page = res.explorer
    assert page == tmp_path / "rep" / "explorer.html" and 'href="explorer.html"' in res.index.read_text()
    size = page.stat().st_size
    assert size < 200_000, size  # self-contained: the data, the script and the style, nothing loaded
    assert not re.search(r'<(?:script|link|img)[^>]+(?:src|href)=', page.read_text())
    data = explorer_data(res.comparison)["runs"]
    out = probe(page, tmp_path / "profile")
    assert out["errors"] == []
    assert out["images"] == 0 and out["title"] == "groklens explorer"  # the name's <img> stayed text
    assert out["options"][0] == f"{data[0]['name']} ({data[0]['group']})" and HOSTILE in out["options"][0]
    states, rich_data = out["states"], data[0]
    assert out["opened_at"] == len(rich_data["positions"]) - 1 and len(states) == len(rich_data["positions"])
    cp, att, fo = rich_data["clock_pizza"], rich_data["attention"], rich_data["fourier"]
    for k, s in enumerate(states):
        step = rich_data["positions"][k]
        assert s["step"].startswith(f"step {step:,} (checkpoint {k + 1} of {len(states)})")
        assert s["label"] == cp["label"][cp["at"][k]]
        assert len(s["cells"]) == len(att["pattern"][0]) * len(att["positions"])
        stored_step = att["steps"][att["at"][k]]
        assert (s["attention_note"] == "") == (stored_step == step)
        if stored_step != step:
            assert f"step {stored_step:,}" in s["attention_note"]
    # moving the slider moves what is drawn: the cursor always, each panel where its data differ
    for k in range(1, len(states)):
        a, b = states[k - 1], states[k]
        assert b["cursor"] > a["cursor"]
        assert (a["attention"] != b["attention"]) == (att["pattern"][att["at"][k - 1]] != att["pattern"][att["at"][k]])
        assert (a["spectrum"] != b["spectrum"]) == (fo["power"][fo["at"][k - 1]] != fo["power"][fo["at"][k]] or
                                                    fo["keys"][fo["at"][k - 1]] != fo["keys"][fo["at"][k]])
        assert (a["clusters"] != b["clusters"]) == (fo["counts"][fo["at"][k - 1]] != fo["counts"][fo["at"][k]] or
                                                    fo["keys"][fo["at"][k - 1]] != fo["keys"][fo["at"][k]])
        assert a["clock-plane"] != b["clock-plane"]  # the current point moves along the path
    assert len({s["attention"] for s in states}) > 1 and len({s["spectrum"] for s in states}) > 1
    # the bar panels' text (the "frequency k" label was cut at its descenders) inside their boxes; a
    # checkpoint without a clustered neuron says so, and its count axis never reads 0 to 0
    for k, s in enumerate(states):
        for panel in ("spectrum", "clusters"):
            assert 0 < s[panel + "_bottom"] <= s[panel + "_height"], (panel, s[panel + "_bottom"])
        empty = not any(fo["counts"][fo["at"][k]])
        assert ("no clustered neurons" in s["clusters_texts"]) == empty
        assert s["clusters_texts"].count("0") == 1  # the axis' bottom only: its top is the largest count or 1
    assert any(not any(c) for c in fo["counts"])  # the run has such a checkpoint (its initialisation)
    # the run without stored analyses: every panel says how to compute its analysis
    bare, young = out["others"]
    assert "groklens analyze bare.h5 --metric attention" in bare["attention_note"]
    assert "--metric fourier" in bare["fourier_note"] and bare["label"] == "" and bare["cells"] == []
    assert bare["readout"].startswith("evaluation at step")
    assert young["readout"] == "no evaluation after step 0 yet" and young["step"].startswith("step 0 (checkpoint 1 of")
