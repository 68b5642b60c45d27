"""groklens compare: grouping, censoring, speed-up interval, stored analyses, refusals.

Every expected number is recomputed here from the run's raw metrics (h5py) or from the model
directly, never taken from compare's own output.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from groklens.analyses.compare import compare, speedup
from scipy import stats

from groklens.errors import BadInput
from tests.helpers import groklens, tiny_config

# Small enough to train in a second or two; p=7 with 80% of pairs reaches ~50% test accuracy
# within 150 steps, so test-accuracy thresholds around 0.3-0.5 are crossed at different steps.
BASE = dict(p=7, train_frac=0.8, d_model=32, n_heads=2, d_head=16, d_mlp=64, lr=1e-2, steps=150,
            eval_every=10, checkpoint_every=30)
VARIANTS = {"ln": dict(norm="ln"), "sphere": dict(norm="sphere", unembed="bounded")}
SEEDS = (1, 2)


def make_runs(directory: Path) -> dict[str, Path]:
    """Two variants x two seeds of real tiny runs: {"ln_s1": path, ...}."""
    from groklens.trainers.train import train

    out = {}
    for name, over in VARIANTS.items():
        for seed in SEEDS:
            path = directory / f"{name}_s{seed}.h5"
            train(tiny_config(**BASE, **over, seed=seed), path, progress=False)
            out[f"{name}_s{seed}"] = path
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return make_runs(tmp_path_factory.mktemp("compare"))


def raw_metrics(path: Path) -> dict[str, np.ndarray]:
    """The evaluation rows straight from the HDF5 file (independent of groklens' reader)."""
    with h5py.File(path, "r", locking=False) as f:
        n = f["metrics/step"].shape[0]
        return {k: f["metrics"][k][:n] for k in f["metrics"]}


def first_step(path: Path, key: str, t: float) -> int | None:
    """Memorization (train_acc): the first evaluation >= t; grokking (test_acc): the first of 3
    (the runs' grok_evals, the default) consecutive evaluations >= t."""
    m = raw_metrics(path)
    n = 3 if key == "test_acc" else 1
    hits = [i for i in range(len(m[key]) - n + 1) if all(v >= t for v in m[key][i:i + n])]
    return int(m["step"][hits[0]]) if hits else None


def all_grok_threshold(paths) -> float:
    """A test-accuracy threshold that every run crosses after step 0."""
    start = max(raw_metrics(p)["test_acc"][0] for p in paths)
    best = min(raw_metrics(p)["test_acc"].max() for p in paths)
    assert best > start, "the tiny runs did not improve on their step-0 test accuracy"
    return float((start + best) / 2)


# ---------------------------------------------------------------------- rows and grouping
def test_one_row_per_run_with_steps_from_the_metrics(runs):
    paths = list(runs.values())
    t = all_grok_threshold(paths)
    comp = compare(paths, threshold=t)
    rows = comp.rows()
    assert len(rows) == 4 and [r["runs"] for r in rows] == [[str(p)] for p in paths]
    for row, p in zip(rows, paths):
        assert row["grokking_step"]["values"] == [first_step(p, "test_acc", t)]
        assert row["memorization_step"]["values"] == [first_step(p, "train_acc", t)]
        g, m = first_step(p, "test_acc", t), first_step(p, "train_acc", t)
        if m is not None:
            assert row["gap"]["mean"] == g - m
    # variant: found automatically, seed included when rows are runs
    assert set(comp.variant_fields) == {"seed", "norm", "unembed"}
    head, body = comp.core_cells()
    assert head[:5] == ["variant", "run", "memorized", "grokked", "gap"]
    assert [b[1] for b in body] == [p.stem for p in paths]


def test_group_by_variant_mean_std_and_n(runs):
    paths = list(runs.values())
    t = all_grok_threshold(paths)
    comp = compare(paths, group_by="variant", threshold=t)
    assert comp.grouped and comp.variant_fields == ["norm", "unembed"]  # seed left out
    rows = comp.rows()
    assert [r["n"] for r in rows] == [2, 2]
    assert rows[0]["variant"] == "norm=ln unembed=linear" and rows[1]["variant"] == "norm=sphere unembed=bounded"
    for row, name in zip(rows, VARIANTS):
        steps = [first_step(runs[f"{name}_s{s}"], "test_acc", t) for s in SEEDS]
        assert row["grokking_step"]["mean"] == pytest.approx(np.mean(steps))
        assert row["grokking_step"]["std"] == pytest.approx(np.std(steps, ddof=1))
        assert sorted(row["seeds"]) == list(SEEDS)
    table = comp.format("table")
    assert "mean ± std" in table and "norm=sphere unembed=bounded" in table


def test_every_row_names_the_same_fields_defaults_included(tmp_path):
    """The row at RunConfig's defaults (norm none, act_norm_lambda 0, unembed linear) and the rows
    that change one or two of them all name the three fields that differ between the rows."""
    from groklens.trainers.train import train

    paths = []
    for i, over in enumerate(({}, {"act_norm_lambda": 1.0}, {"norm": "sphere", "unembed": "bounded"})):
        paths.append(tmp_path / f"v{i}.h5")
        train(tiny_config(**{**BASE, "steps": 30, "norm": "none", **over}), paths[-1], progress=False)
    assert [r["variant"] for r in compare(paths, group_by="variant").rows()] == [
        "act_norm_lambda=0 norm=none unembed=linear", "act_norm_lambda=1 norm=none unembed=linear",
        "act_norm_lambda=0 norm=sphere unembed=bounded"]


def test_group_by_a_config_field(runs):
    comp = compare(list(runs.values()), group_by="unembed", threshold=0.3)
    assert [r["variant"] for r in comp.rows()] == ["unembed=linear", "unembed=bounded"]
    assert comp.variant_fields == ["unembed"] and not [n for n in comp.notes if "differs" in n]  # run facts only
    comp = compare(list(runs.values()), group_by="seed", threshold=0.3)
    assert [r["n"] for r in comp.rows()] == [2, 2] and [r["variant"] for r in comp.rows()] == ["seed=1", "seed=2"]
    assert any("also differs in norm, unembed" in n for n in comp.notes)  # the groups pool other differences


def short_twin(run: Path, directory: Path, steps: int = 40, **over) -> Path:
    """The same run stopped at `steps` (same seed: identical up to there): censored where the
    full run crosses a threshold only later."""
    from groklens.trainers.train import train

    path = directory / f"{run.stem}_short.h5"
    train(tiny_config(**{**BASE, **over, "steps": steps}), path, progress=False)
    return path


def late_threshold(run: Path, before: int) -> float:
    """A test-accuracy threshold `run` first crosses after step `before`."""
    m = raw_metrics(run)
    early, best = m["test_acc"][m["step"] <= before].max(), m["test_acc"].max()
    assert best > early, "scenario needs test accuracy to rise after the short run stops"
    return float((early + best) / 2)


def test_censored_runs_are_shown_never_dropped(runs, tmp_path):
    a = runs["ln_s1"]
    b = short_twin(a, tmp_path, 40, norm="ln", seed=1)
    t = late_threshold(a, 40)
    per_run = compare([a, b], threshold=t)
    cells = {row[1]: row for row in per_run.core_cells()[1]}
    assert cells[b.stem][3] == "> 40"  # grokked column of the censored run
    assert cells[a.stem][3] == str(first_step(a, "test_acc", t))
    assert cells[b.stem][4].startswith("> ")  # its gap is a lower bound
    assert "never reached the threshold" in per_run.format("table")
    grouped = compare([a, b], group_by="norm", threshold=t)
    row = grouped.rows()[0]
    assert row["n"] == 2 and row["grokking_step"]["censored"] == 1
    assert row["grokking_step"]["censored_at"] == [None, 40]
    # the group's mean counts the censoring step (a lower bound) and says so
    assert row["grokking_step"]["mean"] == pytest.approx((first_step(a, "test_acc", t) + 40) / 2)
    cell = grouped.core_cells()[1][0][3]
    assert cell.startswith(">= ") and "(1/2 censored)" in cell
    data = json.loads(grouped.format("json"))
    assert data["rows"][0]["grokking_step"]["values"] == [first_step(a, "test_acc", t), None]
    every = compare([b], threshold=t, group_by="variant")
    assert every.core_cells()[1][0][3] == "> 40"
    # every seed censored, at different steps: the mean of the censoring steps, a lower bound, as the
    # JSON's mean (it showed '> 40 (all 2 censored)', the lowest, where the docs say '>= mean ± std')
    (tmp_path / "c").mkdir()
    c = short_twin(a, tmp_path / "c", 60, norm="ln", seed=1)
    both = compare([b, c], group_by="norm", threshold=max(t, late_threshold(a, 60)))
    row = both.rows()[0]["grokking_step"]
    assert row["censored"] == 2 and row["censored_at"] == [40, 60] and row["mean"] == 50
    assert both.core_cells()[1][0][3] == f">= 50 ± {np.std([40, 60], ddof=1):.0f} (all 2 censored)"


# ---------------------------------------------------------------------- speed-up
def test_speedup_interval_is_welch_on_log_steps(runs):
    paths = list(runs.values())
    t = all_grok_threshold(paths)
    comp = compare(paths, baseline=runs["ln_s1"], group_by="variant", threshold=t)
    rows = comp.rows()
    assert rows[0]["baseline"] and rows[0]["speedup"]["value"] == 1.0
    sp = rows[1]["speedup"]
    lb = np.log([first_step(runs[f"ln_s{s}"], "test_acc", t) for s in SEEDS])
    lc = np.log([first_step(runs[f"sphere_s{s}"], "test_acc", t) for s in SEEDS])
    assert sp["value"] == pytest.approx(math.exp(lb.mean() - lc.mean()))
    if lb.var() + lc.var() == 0:
        pytest.skip("identical grokking steps across seeds: the interval is a point")
    ci = stats.ttest_ind(lb, lc, equal_var=False).confidence_interval(0.95)
    assert sp["ci"] == pytest.approx([math.exp(ci.low), math.exp(ci.high)])
    assert sp["ci"][0] <= sp["value"] <= sp["ci"][1]
    assert "Welch" in comp.format("table") and "speed-up [95% CI]" in comp.format("table")


def test_speedup_with_censoring_is_a_bound_without_interval(runs, tmp_path):
    from groklens.analyses.compare import load_run

    a = runs["ln_s1"]
    b = short_twin(a, tmp_path, 40, norm="ln", seed=1)
    t = late_threshold(a, 40)

    ra, rb = load_run(a, t), load_run(b, t)
    assert rb.grok_censored and not ra.grok_censored
    lower = speedup([rb], [ra])  # censored baseline: at least this much faster
    assert lower["bound"] == "lower" and lower["ci"] is None
    assert lower["value"] == pytest.approx(rb.last_step / first_step(a, "test_acc", t))
    upper = speedup([ra], [rb])
    assert upper["bound"] == "upper" and upper["ci"] is None
    assert speedup([rb], [rb])["value"] is None  # censored on both sides: undetermined
    one = speedup([ra], [ra])
    assert one["value"] == 1.0 and one["ci"] is None and "2 seeds" in one["ci_note"]


# ---------------------------------------------------------------------- stored analyses
def test_stored_analyses_at_memorization_grokking_end_and_analyze(runs, tmp_path):
    import shutil

    from groklens.analyses import attention_mass, compute
    from groklens.checkpoints import Trajectory

    path = tmp_path / "run.h5"
    shutil.copy(runs["sphere_s1"], path)
    t = all_grok_threshold(list(runs.values()))
    traj = Trajectory(path)
    cps = [int(s) for s in traj.steps]
    comp = compare([path], threshold=t)
    assert comp.rows()[0]["analyses"]["attn_mass"]["end"]["mean"] is None  # nothing stored: missing
    assert "missing:" in comp.format("table")
    compute(path, "attention", steps=[cps[-1]])  # stored at the end only
    comp = compare([path], threshold=t)
    cell = comp.rows()[0]["analyses"]["attn_mass"]
    direct = attention_mass(traj.model(cps[-1]), traj.dataset())["mass"].mean()  # independent of the sidecar
    assert cell["end"]["mean"] == pytest.approx(direct)
    comp = compare([path], threshold=t, analyze=True, metrics=["attention"])
    cell = comp.rows()[0]["analyses"]["attn_mass"]
    phases = comp.rows()[0]["phase_steps"][0]
    cps_raw, interval = raw_checkpoints(path)
    for ph, key in (("memorization", "train_acc"), ("grokking", "test_acc"), ("end", None)):
        s = cps_raw[-1] if key is None else first_step(path, key, t)
        near = [c for c in cps_raw if abs(c - s) < interval]
        if not near:  # no checkpoint within one evaluation interval: refused, never a farther one
            assert phases[ph] is None and cell[ph]["mean"] is None
            continue
        assert phases[ph] == min(near, key=lambda c: (abs(c - s), -c))
        want = attention_mass(traj.model(phases[ph]), traj.dataset())["mass"].mean()
        assert cell[ph]["mean"] == pytest.approx(want)


def raw_checkpoints(path: Path) -> tuple[list[int], int]:
    """Checkpoint steps and the evaluation interval, straight from the HDF5 file."""
    with h5py.File(path, "r", locking=False) as f:
        return [int(s) for s in f["steps"][:]], int(json.loads(f.attrs["config"])["eval_every"])


def test_phase_value_from_a_distant_checkpoint_is_refused(runs, tmp_path):
    """A memorization step with no checkpoint within one evaluation interval shows `—` and the
    reason, even when the sidecar holds the value at the nearest checkpoint (old files without
    phase checkpoints; or a threshold the trainer did not checkpoint)."""
    import shutil

    from groklens.analyses import compute

    path = tmp_path / "run.h5"
    shutil.copy(runs["ln_s1"], path)
    cps, interval = raw_checkpoints(path)
    m = raw_metrics(path)
    t = s = None
    for step, acc in zip(m["step"], m["train_acc"]):  # a memorization threshold crossed between checkpoints
        if first_step(path, "train_acc", float(acc)) == step and all(abs(c - step) >= interval for c in cps):
            t, s = float(acc), int(step)
            break
    assert t is not None, "every new train-accuracy maximum fell on a checkpoint"
    compute(path, "attention", steps=cps)  # a value at every checkpoint, the nearest included
    comp = compare([path], threshold=t)
    row = comp.rows()[0]
    assert row["memorization_step"]["values"] == [s]
    cell = row["analyses"]["attn_mass"]["memorization"]
    assert cell["mean"] is None and "not within one evaluation interval" in cell["missing"]
    assert row["analyses"]["attn_mass"]["end"]["mean"] is not None
    table = comp.format("table")
    assert f"no checkpoint at memorization (step {s})" in table


# ---------------------------------------------------------------------- formats
def test_csv_and_json_formats(runs):
    paths = list(runs.values())
    comp = compare(paths, baseline=runs["ln_s1"], group_by="variant", threshold=0.3)
    rows = list(csv.DictReader(io.StringIO(comp.format("csv"))))
    assert len(rows) == 2 and rows[0]["variant"] == "norm=ln unembed=linear" and rows[0]["n"] == "2"
    assert {"speedup", "speedup_ci_low", "fve_neuron@grokking_mean", "radius@end_mean"} <= set(rows[0])
    data = json.loads(comp.format("json"))
    assert data["grouped"] and data["baseline"] == "norm=ln unembed=linear" and len(data["rows"]) == 2
    assert "Welch" in data["speedup_method"]
    with pytest.raises(BadInput):
        comp.format("xml")


# ---------------------------------------------------------------------- refusals (CLI)
def _one_line_error(proc):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("groklens: error:"), proc.stderr
    return lines[0]


def test_runs_of_different_tasks_are_refused(runs, tmp_path):
    from groklens.trainers.train import train

    other = tmp_path / "sub.h5"
    train(tiny_config(task="sub", p=7, steps=10, eval_every=5, checkpoint_every=5), other, progress=False)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(BadInput, match="different tasks"):
        compare([runs["ln_s1"], other])
    msg = _one_line_error(groklens("compare", str(runs["ln_s1"]), str(other), "--analyze"))
    assert "different tasks" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # --analyze wrote nothing


def test_bad_input_is_one_line_exit_2(runs, tmp_path):
    a = str(runs["ln_s1"])
    assert "no such file" in _one_line_error(groklens("compare", a, str(tmp_path / "missing.h5")))
    assert "unknown --group-by field 'nrom'" in _one_line_error(groklens("compare", a, "--group-by", "nrom"))
    assert "at least one" in _one_line_error(groklens("compare"))
    assert "given twice" in _one_line_error(groklens("compare", a, a))
    assert "--baseline" in _one_line_error(groklens("compare", a, "--baseline", str(tmp_path / "nope.h5")))
    sidecar = tmp_path / "x.analyses.h5"
    sidecar.write_bytes(b"")
    assert "sidecar" in _one_line_error(groklens("compare", str(sidecar)))


def test_cli_compare_prints_table_csv_json(runs):
    paths = [str(p) for p in runs.values()]
    out = groklens("compare", *paths, "--group-by", "variant", "--baseline", paths[0], "--threshold", "0.3",
                   check=True).stdout
    assert "speed-up" in out and "norm=sphere unembed=bounded" in out
    data = json.loads(groklens("compare", *paths, "--format", "json", check=True).stdout)
    assert len(data["rows"]) == 4 and not data["grouped"]
    text = groklens("compare", *paths, "--format", "csv", check=True).stdout
    assert text.splitlines()[0].startswith("variant,n,runs")


def test_compare_analyze_computes_the_llc_only_when_asked(tmp_path, monkeypatch):
    """SGLD is minutes per run: `compare --analyze` leaves it out unless `--metric llc` names it,
    and the missing-measures hint names the command that computes what is missing."""
    import groklens.analyses.runner as runner
    from groklens.analyses.measures import ANALYSES_USED

    path = tmp_path / "r.h5"
    from groklens.trainers.train import train

    train(tiny_config(**{**BASE, "steps": 30}, seed=1), path, progress=False)
    asked = []
    monkeypatch.setattr(runner, "analyze_runs",
                        lambda paths, requests, **kw: asked.append([n for n, _ in requests]) or [])
    compare([path], analyze=True)
    compare([path], analyze=True, metrics=["llc"])
    from groklens.analyses.registry import get

    assert asked == [[n for n in ANALYSES_USED if get(n).tier != "named"], ["llc"]]  # llc, induced_reg: named only
    table = compare([path]).format("table")
    assert "--metric llc" in table.split("missing: ", 1)[1]
