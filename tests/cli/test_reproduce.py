"""`groklens reproduce`: every experiment end to end at smoke scale, the listing, bad input,
resuming, and the rows kept in RESULTS.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from groklens import experiments as E
from tests.helpers import groklens, train_interrupted

NAMES = list(E.EXPERIMENTS)
ISSUE_NAMES = ["bounded-sphere", "uniform-attention", "s5-control", "fourier-fve", "activation-norm", "geomdr",
               "structural-attention", "scaling-law", "nanogpt-addition", "grokfast", "stablemax"]


def test_registry_has_every_experiment_of_the_issue():
    assert NAMES == ISSUE_NAMES
    for e in E.EXPERIMENTS.values():
        assert set(e.scales) == set(E.SCALES)
        for scale in E.SCALES:
            assert e.scales[scale].note  # every scale says what differs from the paper


def test_paper_scale_is_the_published_sphere_setup():
    cfgs = {v: c for v, _, c in E.run_configs(E.get_experiment("bounded-sphere"), "paper", 1)}
    c = cfgs["sphere_wd0_lr6e-4"]
    assert (c.p, c.train_frac, c.d_model, c.n_heads, c.d_mlp) == (113, 0.3, 128, 4, 512)
    assert (c.norm, c.unembed, c.tau, c.radius, c.causal, tuple(c.betas), c.weight_decay, c.lr) == (
        "sphere", "bounded", 10.0, 1.0, False, (0.9, 0.999), 0.0, 6e-4)
    assert {v for v in cfgs} >= {"ln_lr1e-4", "sphere_fourier_wd0_lr1e-4"}  # both learning rates of the table
    assert E.DEFAULT_SEEDS["paper"] == 10


def test_published_numbers_are_those_of_references():
    # spot checks against REFERENCES.md, typed in here independently of the experiment module
    assert E.SPHERE_TABLE[(6e-4, "ln")] == 7_800 and E.SPHERE_TABLE[(1e-4, "sphere_fourier_wd0")] == 2_100
    assert E.SCALING_PUBLISHED == {"width": -0.27, "train_frac": -2.04, "lr": -0.50, "weight_decay": -0.64}


def test_cost_estimate_counts_flops():
    # canonical p=113 model, full batch: 3831 inputs x 3 tokens; weights per token
    # 4*128*128 (QKVO) + 2*128*512 (MLP) + 2*3*128 (attention) + 128*113 (unembed)
    from groklens.config import RunConfig

    cfg = RunConfig(steps=10, eval_every=10, checkpoint_every=10)
    per = 4 * 128 * 128 + 2 * 128 * 512 + 2 * 3 * 128 + 128 * 113
    train, ev = E.step_flops(cfg)
    assert train == pytest.approx(6 * per * round(0.3 * 113 * 113) * 3)
    assert ev == pytest.approx(2 * per * 113 * 113 * 3)
    expected = 10 * (E.STEP_OVERHEAD_S + train / E.CPU_FLOPS) + 2 * (E.STEP_OVERHEAD_S + ev / E.CPU_FLOPS)
    assert E.estimate_seconds([cfg]) == pytest.approx(expected)


def test_list_prints_every_experiment_with_costs():
    proc = groklens("reproduce", "--list")
    assert proc.returncode == 0, proc.stderr
    for name in NAMES:
        assert name in proc.stdout
    assert "estimate" in proc.stdout.lower()
    items = json.loads(groklens("reproduce", "--list", "--json", check=True).stdout)
    assert [i["name"] for i in items] == NAMES
    for it in items:
        costs = [it["scales"][s]["cpu_seconds_estimate"] for s in E.SCALES]
        assert all(c > 0 for c in costs)
        assert costs[0] < costs[1] < costs[2]  # smoke < quick < paper


@pytest.mark.parametrize("args, needle", [
    (["no-such-experiment"], "unknown experiment"),
    (["fourier-fve", "--scale", "huge"], "--scale must be one of"),
    (["fourier-fve", "--seeds", "0"], "--seeds must be a positive integer"),
    ([], "missing experiment NAME"),
    (["fourier-fve", "--list"], "--list takes no experiment NAME"),
])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    proc = groklens("reproduce", *args, "-o", str(tmp_path / "out"), "--no-results")
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _grok_time_from_file(path: Path, threshold: float = 0.95) -> tuple[float, bool]:
    """First evaluated step with test accuracy >= threshold, read with h5py directly (or the
    last evaluated step, censored)."""
    with h5py.File(path, "r", locking=False) as f:
        steps = f["metrics/step"][:]
        acc = f["metrics/test_acc"][: len(steps)]
    hit = np.nonzero(acc >= threshold)[0]
    return (float(steps[hit[0]]), False) if len(hit) else (float(steps[-1]), True)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_runs_end_to_end_at_smoke_scale(name, tmp_path):
    md = tmp_path / "RESULTS.md"
    out = tmp_path / name
    res = E.reproduce(name, "smoke", out, results_md=md, progress=False, echo=lambda _m: None)
    # trajectories, comparison, report, results
    assert res.runs and all(p.exists() for p in res.runs)
    with h5py.File(res.runs[0], "r", locking=False) as f:
        assert len(f["steps"]) >= 2
    assert (out / "comparison.csv").exists() and (out / "comparison.txt").exists()
    assert res.report is not None and res.report.exists()
    assert list((out / "report").glob("fig_*.png"))
    saved = json.loads((out / "results.json").read_text())
    assert saved["experiment"] == name and saved["scale"] == "smoke" and saved["rows"]
    # every row: a published number or a quoted claim with its source; a ratio only with a number
    for row in res.rows:
        assert row.published.source and row.published.text
        if row.published.value is None:
            assert row.ratio is None
        elif row.ours is not None:
            assert row.ratio == pytest.approx(row.ours / row.published.value)
    # the rows went into the markdown table, once each
    text = md.read_text()
    assert text.count(f"| `{res.command}` |") == len(res.rows)
    assert "smoke" in res.rows[0].differs


@pytest.mark.slow
def test_grok_rows_match_the_files_and_a_rerun_resumes_nothing(tmp_path):
    out = tmp_path / "bs"
    md = tmp_path / "RESULTS.md"
    res = E.reproduce("bounded-sphere", "smoke", out, results_md=md, progress=False, echo=lambda _m: None)
    runs = {p.name: p for p in res.runs}
    # "grok epoch, LayerNorm" row = the LayerNorm run's first crossing (or its censoring step)
    row = next(r for r in res.rows if r.measure.startswith("grok epoch, LayerNorm"))
    t, censored = _grok_time_from_file(runs["ln_lr6e-4_s1.h5"])
    assert row.ours == pytest.approx(t)
    assert (row.bound == "lower") == censored
    assert row.ratio == pytest.approx(t / 7_800)
    # the published speed-up is derived from the table: 7800 / 820
    sp = next(r for r in res.rows if r.measure.startswith("speed-up of bounded sphere, wd 0 over"))
    assert sp.published.value == pytest.approx(7_800 / 820)
    # rerun: complete runs are skipped (files untouched), the rows are replaced, not duplicated
    mtimes = {p: p.stat().st_mtime_ns for p in res.runs}
    res2 = E.reproduce("bounded-sphere", "smoke", out, results_md=md, progress=False, echo=lambda _m: None)
    assert {p: p.stat().st_mtime_ns for p in res2.runs} == mtimes
    assert [r.ours_text for r in res2.rows] == [r.ours_text for r in res.rows]
    assert md.read_text().count(f"| `{res.command}` |") == len(res.rows)


@pytest.mark.slow
def test_interrupted_run_is_resumed_exactly(tmp_path):
    """A run interrupted at step 15 is continued from its step-10 checkpoint, not restarted, and
    ends equal to the same run trained without interruption."""
    from groklens.checkpoints import Trajectory
    from groklens.trainers import loop

    out = tmp_path / "gf"
    (out / "runs").mkdir(parents=True)
    cfg = {n: c for _, n, c in E.run_configs(E.get_experiment("grokfast"), "smoke", 1)}["base_s1"]
    path = out / "runs" / "base_s1.h5"
    train_interrupted(cfg, path, 15)
    assert [int(s) for s in Trajectory(path).steps] == [0, 10]
    res = E.reproduce("grokfast", "smoke", out, results_md=None, progress=False, echo=lambda _m: None)
    traj = Trajectory(path)
    assert traj.status.startswith("completed")
    assert [int(s) for s in traj.steps] == [0, 10, 20, 30]
    loop.train(cfg, tmp_path / "fresh.h5", progress=False)
    fresh = Trajectory(tmp_path / "fresh.h5").params(30)
    for name, value in traj.params(30).items():
        assert np.array_equal(value.numpy(), fresh[name].numpy()), name
    assert res.rows


def test_results_md_replaces_rows_of_the_same_command(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text("# Title\n\nintro kept\n")

    def result(cmd_seeds: int, ours: float) -> E.Result:
        row = E.Row("m", E.Published(2.0, "2", "src"), ours, f"{ours}", "diff")
        return E.Result("x", "quick", cmd_seeds, tmp_path, [row], 65.0, E.command_text("x", "quick", cmd_seeds),
                        [], None)

    E.update_results_md(md, result(1, 1.0))
    E.update_results_md(md, result(2, 3.0))
    E.update_results_md(md, result(1, 4.0))  # replaces the first command's row
    text = md.read_text()
    assert text.startswith("# Title\n\nintro kept\n")
    rows = [ln for ln in text.splitlines() if ln.startswith("| `groklens reproduce")]
    assert len(rows) == 2
    assert "--seeds 2` | quick | m | 2 (src) | 3.0 | 1.5 |" in rows[0]
    assert "--seeds 1` | quick | m | 2 (src) | 4.0 | 2 |" in rows[1]
    assert "65 s (whole command)" in rows[1]


def test_cli_runs_one_experiment_and_writes_its_rows(tmp_path):
    md = tmp_path / "RESULTS.md"
    proc = groklens("reproduce", "grokfast", "--scale", "smoke", "-o", str(tmp_path / "gf"), "--results", str(md), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "published" in proc.stdout and "iterations to 95% validation accuracy" in proc.stdout
    assert "39890" in proc.stdout.replace(",", "")
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| `groklens reproduce grokfast --scale smoke")]
    assert len(rows) == 3
    res = json.loads((tmp_path / "gf" / "results.json").read_text())
    derived = res["rows"][2]
    assert derived["published"]["value"] == pytest.approx(39_890 / 910)
    assert all(math.isfinite(r["ours"]) for r in res["rows"] if r["ours"] is not None)
