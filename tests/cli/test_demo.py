"""groklens demo end to end at the smoke scale: trains the four variants, analyzes, prints the
table, writes the report, says where it is; refuses to overwrite runs without --force."""

from __future__ import annotations

import json
import re

import pytest

from groklens.demo import SCALES, VARIANTS, run_names
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
    names = [name for _, name, _ in run_names(SCALES["smoke"])]
    assert len(names) == len(VARIANTS) * len(SCALES["smoke"].seeds)
    for name in names:
        assert (out / "runs" / f"{name}.h5").exists() and (out / "runs" / f"{name}.analyses.h5").exists()
    # the printed table: one row per variant, the standard model the baseline
    head = next(i for i, ln in enumerate(lines) if ln.startswith("variant "))
    rows = lines[head + 2: head + 2 + len(VARIANTS)]
    assert rows[0].startswith("norm=ln ") and "1 (baseline)" in rows[0]
    assert any(r.startswith("norm=sphere unembed=bounded ") for r in rows)
    assert any(r.startswith("attention=uniform norm=ln ") for r in rows)
    assert any(r.startswith("act_norm_lambda=1 norm=ln ") for r in rows)
    assert "speed-up [95% CI]" in lines[head]
    # the report has the cheap analyses and sharpness; nothing is missing
    page = index.read_text()
    assert '<table id="comparison">' in page and "None: every figure had its data." in page
    figs = set(re.findall(r'src="(fig_[a-z_]+\.png)"', page))
    assert {"fig_curves.png", "fig_hessian.png", "fig_radial.png", "fig_attention.png"} <= figs
    assert json.loads((out / "report" / "comparison.json").read_text())["baseline"] == "norm=ln"


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


def test_demo_scales_are_valid_configs():
    from groklens.config import RunConfig

    for sc in SCALES.values():
        for _variant, _run, cfg in run_names(sc):
            RunConfig.from_dict(cfg)  # every demo run is a valid config
    paper = dict(run_names(SCALES["paper"])[0][2])
    assert paper["p"] == 113 and paper["train_frac"] == 0.3 and paper["d_model"] == 128 and paper["d_mlp"] == 512
