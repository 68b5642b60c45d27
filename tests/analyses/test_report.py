"""groklens report: the figure set and index.html, checked in a real headless Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from groklens.analyses.report import build_report

from groklens.errors import BadInput
from tests.analyses.test_compare import make_runs
from tests.helpers import groklens, tiny_config

ALL_FIGURES = {"curves", "grokking_times", "fourier_fve", "fourier_spectrum", "neuron_clusters",
               "fve_top5", "attention",
               "attention_patterns", "hessian", "llc", "effective_rank", "radial", "progress_measures", "clock_pizza",
               "hessian_density", "parameter_pca"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two variants x two seeds; every analysis stored for all but one seed (which keeps a gap)."""
    from groklens.analyses import compute

    d = tmp_path_factory.mktemp("report")
    paths = make_runs(d)
    for key in ("ln_s1", "ln_s2", "sphere_s1"):
        for name in ("fourier", "attention", "rank", "radial"):
            compute(paths[key], name, every=2)
        compute(paths[key], "sharpness", every=3, top_k=1, trace_samples=4)
        compute(paths[key], "llc", every=3, chains=2, draws=4, burnin=2, minibatch=8)
        compute(paths[key], "clock_pizza", every=2)
        compute(paths[key], "hessian_density", every=3, iters=10, num_bins=50)
    return paths


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.tables, self.ids = [], [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "img":
            self.images.append(a["src"])
        if tag == "table":
            self.tables.append(a.get("id"))


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


def test_report_writes_every_figure_and_the_table(runs, tmp_path):
    out = tmp_path / "rep"
    res = build_report(list(runs.values()), out, baseline=runs["ln_s1"])
    names = {p.name for p in res.figures}
    assert names == {f"fig_{n}.png" for n in ALL_FIGURES}
    assert res.missing == []
    page = parse(res.index)
    assert set(page.images) == names and all((out / n).stat().st_size > 2000 for n in names)
    from PIL import Image

    for n in names:  # every image the page shows decodes as a PNG of a real figure's size
        with Image.open(out / n) as im:
            im.load()
            assert im.format == "PNG" and im.width > 100 and im.height > 100
    assert "<script" not in res.index.read_text()  # the report is a plain page
    assert "comparison" in page.tables and "analyses" in page.tables
    text = res.index.read_text()
    assert "norm=sphere unembed=bounded" in text and "1 (baseline)" in text
    assert (out / "comparison.csv").read_text().startswith("variant,n,runs")
    assert json.loads((out / "comparison.json").read_text())["baseline"] == "norm=ln unembed=linear"


def test_missing_figures_are_listed_with_the_reason(runs, tmp_path):
    res = build_report([runs["sphere_s2"]], tmp_path / "rep")  # nothing stored for this run
    # the metrics' two and the parameter PCA (from the checkpoints) need no stored analysis
    assert {p.stem[4:] for p in res.figures} == {"curves", "grokking_times", "parameter_pca"}
    titles = [t for t, _ in res.missing]
    # every other figure is listed, the attention pair under one title
    assert len(titles) == len(ALL_FIGURES) - 4 and any("Hessian" in t for t in titles)
    assert all("groklens analyze" in why for _, why in res.missing)
    page = parse(res.index)
    assert "missing" in page.ids and "Fourier" in res.index.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["svg", "pdf"])
def test_vector_formats(runs, fmt, tmp_path):
    res = build_report([runs["ln_s1"], runs["sphere_s1"]], tmp_path / fmt, fmt=fmt)
    main = [p for p in res.figures if p.suffix == f".{fmt}"]
    assert len(main) == len(ALL_FIGURES)
    head = main[0].read_bytes()[:200]
    assert (b"%PDF" in head) if fmt == "pdf" else (b"<svg" in main[0].read_bytes()[:2000])
    page = parse(res.index)
    if fmt == "pdf":  # the page shows PNG previews that link to the PDFs
        assert all(src.endswith(".png") for src in page.images)
        assert 'href="fig_curves.pdf"' in res.index.read_text()
    else:
        assert all(src.endswith(".svg") for src in page.images)


def test_bad_input_writes_nothing(runs, tmp_path):
    other = tmp_path / "mul.h5"
    from groklens.trainers.train import train

    train(tiny_config(task="mul", p=7, steps=10, eval_every=5, checkpoint_every=5), other, progress=False)
    out = tmp_path / "rep"
    with pytest.raises(BadInput, match="different tasks"):
        build_report([runs["ln_s1"], other], out)
    assert not out.exists()
    proc = groklens("report", str(runs["ln_s1"]), "-o", str(out), "--group-by", "colour")
    assert proc.returncode == 2 and "unknown --group-by field 'colour'" in proc.stderr and not out.exists()
    afile = tmp_path / "file"
    afile.write_text("x")
    proc = groklens("report", str(runs["ln_s1"]), "-o", str(afile))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    proc = groklens("report", str(tmp_path / "none.h5"), "-o", str(out))
    assert proc.returncode == 2 and "no such file" in proc.stderr and not out.exists()


@pytest.mark.slow
def test_report_analyze_computes_what_is_missing(runs, tmp_path):
    run = tmp_path / "run.h5"
    shutil.copy(runs["sphere_s2"], run)
    proc = groklens("report", str(run), "-o", str(tmp_path / "rep"), "--analyze", "--metric", "attention",
                    "--every", "2", "-q", "--json", check=True)
    res = json.loads(proc.stdout)
    assert any(p.endswith("fig_attention.png") for p in res["figures"])
    assert {m["figure"] for m in res["missing"]} >= {"Radius and rho", "Effective rank over time"}
    assert run.with_name("run.analyses.h5").exists()


# ---------------------------------------------------------------------- a real browser
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--virtual-time-budget=10000"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def dump_dom(index: Path, profile: Path) -> str:
    exe = chromium()
    proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", index.resolve().as_uri()],
                          check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


# The test's own probe, not part of the report: injected into a copy of the page beside it (so
# the images resolve as they do for the report), it writes each image's load state into the DOM.
_PROBE = """<script>
window.addEventListener('load', function () {
  var rows = [];
  for (var i = 0; i < document.images.length; i++) {
    var im = document.images[i];
    rows.push({src: im.getAttribute('src'), loaded: im.complete && im.naturalWidth > 0, width: im.naturalWidth});
  }
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify(rows);
  document.body.appendChild(out);
});
</script>"""


def probe_page(page: Path, profile: Path, script: str, first: bool = False):
    """The JSON a test's `script` writes into <pre id="probe">, run in a copy of `page` beside it
    (so relative links resolve as for the page); `first`: as the head's first element, before the
    page's own scripts (to see their errors), else as its last."""
    copy = page.with_name("_probe.html")
    text = page.read_text()
    copy.write_text(text.replace("<head>", "<head>" + script, 1) if first
                    else text.replace("</head>", script + "</head>", 1))
    try:
        dom = dump_dom(copy, profile)
    finally:
        copy.unlink()
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert m, "the probe script did not run"
    return json.loads(html.unescape(m.group(1)))


def image_status(index: Path, profile: Path) -> list[dict]:
    return probe_page(index, profile, _PROBE)


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="no chromium binary (Debian package `chromium`; .ci/run installs it)")
def test_index_html_in_headless_chromium(runs, tmp_path):
    res = build_report(list(runs.values()), tmp_path / "rep", baseline=runs["ln_s1"])
    assert "<script" not in res.index.read_text()  # the report ships no script; the probe is the test's
    status = image_status(res.index, tmp_path / "profile")
    assert {s["src"] for s in status} == {p.name for p in res.figures}
    assert all(s["loaded"] and s["width"] > 100 for s in status), status
    dom = dump_dom(res.index, tmp_path / "profile1")
    assert '<table id="comparison">' in dom and "norm=sphere unembed=bounded" in dom
    # the check can fail: a figure file gone is reported as not loaded
    (tmp_path / "rep" / "fig_radial.png").unlink()
    status = image_status(res.index, tmp_path / "profile2")
    assert [s["src"] for s in status if not s["loaded"]] == ["fig_radial.png"]
