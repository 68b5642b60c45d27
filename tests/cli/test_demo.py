"""groklens demo end to end at the smoke scale: trains the four variants, analyzes, prints the
table, writes the report, says where it is; refuses to overwrite runs without --force. The demo
is the experiment "demo" of the registry, run through the reproduce pipeline."""

from __future__ import annotations

import json
import re

import pytest

from groklens import experiments as E
from groklens.experiments.demo import SCALES, VARIANTS, run_names
from tests.helpers import groklens


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    proc = groklens("demo", "-o", str(out), "--scale", "smoke", "-q", "--workers", "1", timeout=600)
    return out, proc


@pytest.mark.slow
def test_smoke_demo_end_to_end(smoke):
    out, proc = smoke
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    index = out / "report" / "index.html"
    assert lines[-1].startswith("demo finished in ") and lines[-1].endswith(f"report: {index.resolve()}")
    assert index.exists()
    # every run trained, with its analyses beside it
    names = run_names("smoke")
    assert len(names) == len(VARIANTS) * 2
    for name in names:
        assert (out / "runs" / f"{name}.h5").exists() and (out / "runs" / f"{name}.analyses.h5").exists()
    # the reproduce pipeline's records: every run in the ledger, the rows in results.json
    ledger = json.loads((out / "ledger" / "demo.smoke.json").read_text())
    assert sorted(f"{r['arm']}_s{r['seed']}" for r in ledger["runs"]) == sorted(names)
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["measure"].split(", ", 1)[0] for r in rows[:4]] == ["grok step"] * 4
    assert len(rows) == 4 + 3 and all(r["published"]["value"] is None and r["ratio"] is None for r in rows)
    # the printed table: one row per variant, the standard model the baseline
    head = next(i for i, ln in enumerate(lines) if ln.startswith("variant "))
    rows = lines[head + 2: head + 2 + len(VARIANTS)]
    # every row names the four fields the variants differ in, defaults included
    assert rows[0].startswith("act_norm_lambda=0 attention=softmax norm=ln unembed=linear ")
    assert "1 (baseline)" in rows[0]
    assert any(r.startswith("act_norm_lambda=0 attention=softmax norm=sphere unembed=bounded ") for r in rows)
    assert any(r.startswith("act_norm_lambda=0 attention=uniform norm=ln unembed=linear ") for r in rows)
    assert any(r.startswith("act_norm_lambda=1 attention=softmax norm=ln unembed=linear ") for r in rows)
    assert "speed-up [95% CI]" in lines[head]
    # the report has the cheap analyses and sharpness; the LLC is missing (SGLD is asked for
    # explicitly: ~10-25 s per checkpoint does not fit the demo's minutes), with the command for it
    page = index.read_text()
    assert '<table id="comparison">' in page
    missing = re.findall(r"<li><b>([^<]+)</b>: ([^<]+)</li>", page.split('id="missing"', 1)[1])
    # the named analyses the demo does not run (the LLC, clock/pizza, the Hessian density) are the
    # only figures missing, each with the command that computes it
    assert sorted(t for t, _ in missing) == ["Clock or pizza over time", "Hessian eigenvalue density",
                                             "Local learning coefficient over time"]
    for title, metric in (("Local learning coefficient over time", "llc"), ("Clock or pizza over time", "clock_pizza"),
                          ("Hessian eigenvalue density", "hessian_density")):
        assert f"--metric {metric}" in dict(missing)[title]
    # the progress-measures figure reads one fixed key set (the last checkpoint's), which the demo stores
    from groklens.analyses.progress import progress_curves

    assert all(progress_curves(out / "runs" / f"{name}.h5").key_set for name in names)
    figs = set(re.findall(r'src="(fig_[a-z_]+\.png)"', page))
    assert {"fig_curves.png", "fig_hessian.png", "fig_radial.png", "fig_attention.png"} <= figs
    baseline = json.loads((out / "report" / "comparison.json").read_text())["baseline"]
    assert baseline == "act_norm_lambda=0 attention=softmax norm=ln unembed=linear"


@pytest.mark.slow
def test_demo_refuses_to_overwrite_runs(smoke):
    out, proc = smoke
    assert proc.returncode == 0, proc.stderr
    keep = out / "runs" / "notes.txt"
    keep.write_text("mine")
    before = {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()}
    again = groklens("demo", "-o", str(out), "--scale", "smoke", "-q")
    assert again.returncode == 2
    assert "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()} == before
    assert keep.read_text() == "mine"


def test_demo_bad_input(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    proc = groklens("demo", "-o", str(f), "--scale", "smoke")
    assert proc.returncode == 2 and "is a file" in proc.stderr
    proc = groklens("demo", "-o", str(tmp_path / "d"), "--scale", "huge")
    assert proc.returncode == 2 and not (tmp_path / "d").exists()
    # the old name of the quick scale: refused with a one-line hint, nothing written
    proc = groklens("demo", "-o", str(tmp_path / "d"), "--scale", "laptop")
    assert proc.returncode == 2 and not (tmp_path / "d").exists()
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "quick" in proc.stderr
    proc = groklens("demo", "-o", str(tmp_path / "no" / "such" / "dir"), "--scale", "smoke")
    assert proc.returncode == 2 and "does not exist" in proc.stderr


def test_demo_scales_are_the_reproduce_scales():
    from groklens.experiments.core import SCALES as REPRODUCE_SCALES

    assert set(SCALES) == set(REPRODUCE_SCALES)


def test_demo_is_the_registry_experiment_with_its_own_seeds_and_schedule():
    exp = E.get_experiment("demo")
    assert not exp.published and exp.scales is SCALES
    for scale in SCALES:
        runs = E.run_configs(exp, scale, exp.seeds_default(scale))  # every demo run is a valid config
        assert [name for _, name, _ in runs] == run_names(scale)
    assert (exp.seeds_default("quick"), exp.seeds_default("smoke")) == (3, 2)
    paper = E.run_configs(exp, "paper", 1)[0][2]
    assert (paper.p, paper.train_frac, paper.d_model, paper.d_mlp) == (113, 0.3, 128, 512)
    # the cheap default set at every second checkpoint, sharpness at every tenth; both at the phases
    where = {name: w for name, _, w in exp.analyses(SCALES["quick"], "quick")}
    assert where.pop("sharpness") == "every:10+phases" and set(where.values()) == {"every:2+phases"}
