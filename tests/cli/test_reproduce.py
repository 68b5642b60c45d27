"""`groklens reproduce`: every experiment end to end at smoke scale, the listing, bad input,
resuming, the results ledger (only missing seeds trained, a changed config not mixed in), the
verdict rules on censored cases, and the rows kept in a RESULTS.md."""

from __future__ import annotations

import json
import math
import pkgutil
import re
from pathlib import Path

import h5py
import numpy as np
import pytest

from groklens import experiments as E
from groklens.experiments import get_experiment
from groklens.experiments.ledger import ledger_entries
from groklens.experiments.pipeline import _ledger_dirs, run_configs
from tests.helpers import groklens, train_interrupted

NAMES = list(E.EXPERIMENTS)
PUBLISHED = [n for n in NAMES if E.EXPERIMENTS.get(n).published]  # all but the demo
# the modules of experiments/ that hold no experiment; every other module registers one
# or more (a new experiment is one file: nothing here names it)
SUPPORT_MODULES = {"core", "pipeline", "ledger", "verdicts", "layout", "cost", "peer", "sphere_official",
                   "stablemax_official", "grokfast_official"}


def test_registry_has_every_experiment_module():
    modules = {m.name for m in pkgutil.iter_modules(E.__path__)} - SUPPORT_MODULES
    registered = {E.EXPERIMENTS.get(n).read.__module__.rpartition(".")[2] for n in NAMES}
    assert registered == modules
    assert sorted(set(NAMES) - set(PUBLISHED)) == ["demo"]  # the demo: an experiment without published numbers
    for e in map(E.EXPERIMENTS.get, E.EXPERIMENTS):
        assert set(e.scales) == set(E.SCALES)
        for scale in E.SCALES:
            assert e.scales[scale].note  # every scale says what differs from the paper


def test_the_published_set_is_registered():
    """Every experiment with a committed ledger (docs/results) or a command in docs/RESULTS.md is a
    registered published experiment, and each published one cites its source in REFERENCES.md."""
    ledgers = {p.name.split(".")[0] for p in E.LEDGER_DIR.glob("*.json")}
    commands = set(re.findall(r"groklens reproduce ([a-z0-9][a-z0-9-]*)", E.RESULTS_MD.read_text()))
    assert ledgers and commands
    assert ledgers | commands <= set(PUBLISHED)
    for name in PUBLISHED:
        e = E.EXPERIMENTS.get(name)
        sources = {row.published.source for row in e.read(E.Context(name, "smoke", e.scales["smoke"], e.plan(
            e.scales["smoke"], "smoke"), {}, Path(".")))}
        assert sources and all("REFERENCES.md" in s for s in sources), (name, sources)


def test_paper_scale_is_the_published_sphere_setup():
    cfgs = {v: c for v, _, c in E.run_configs(E.get_experiment("bounded-sphere"), "paper", 1)}
    c = cfgs["sphere_wd0_lr6e-4"]
    assert (c.p, c.train_frac, c.d_model, c.n_heads, c.d_mlp) == (113, 0.3, 128, 4, 512)
    assert (c.norm, c.unembed, c.tau, c.radius, c.causal, tuple(c.betas), c.weight_decay, c.lr) == (
        "sphere", "bounded", 10.0, 1.0, False, (0.9, 0.999), 0.0, 6e-4)
    assert c.init_scheme == "torch" and c.eval_every == 200
    # the paper's five arms (post-norm baselines) at lr 6e-4 and 1e-4, and our arms beside them at 6e-4
    table = ("ln", "rms", "sphere_wd1", "sphere_wd0", "sphere_fourier_wd0")
    assert set(cfgs) == {f"{a}_lr6e-4" for a in (*table, "sphere_wd0_tlinit", "ln_papersplit", "sphere_wd1_papersplit",
                                                 "sphere_wd0_papersplit")} | {f"{a}_lr1e-4" for a in table}
    for a in table:  # lr 1e-4: the same model, only the rate differs
        assert cfgs[f"{a}_lr1e-4"].replace(lr=6e-4) == cfgs[f"{a}_lr6e-4"] and cfgs[f"{a}_lr1e-4"].lr == 1e-4
    # the paper's split of each seed (its make_dataset), and data_seed 598 for the others
    assert (cfgs["sphere_wd0_papersplit_lr6e-4"].split_rule, cfgs["sphere_wd0_papersplit_lr6e-4"].data_seed) == (
        "python_shuffle", 1)
    assert (c.split_rule, c.data_seed) == ("pcg64", 598)
    assert E.run_configs(E.get_experiment("bounded-sphere"), "paper", 3)[-1][2].data_seed == 3
    assert (cfgs["ln_lr6e-4"].norm_placement, cfgs["rms_lr6e-4"].norm_placement) == ("post", "post")
    assert cfgs["sphere_wd0_tlinit_lr6e-4"].init_scheme == "tl"
    assert E.DEFAULT_SEEDS["paper"] == 10


def test_s5_paper_scale_is_the_official_notebooks_setup():
    """S5_Final.ipynb, typed in here from its code: lr 1e-3, full batch, 30% split from the seed
    (python shuffle), 100,000 epochs logged every 200, grokked at test accuracy >= 0.99, the sphere
    wd 1 model with a plain unembedding, the wd 0 one bounded, post-norm baselines at wd 1."""
    cfgs = {v: c for v, _, c in E.run_configs(E.get_experiment("s5-control"), "paper", 2) if c.seed == 2}
    assert set(cfgs) == {"ln", "rms", "sphere_wd1", "sphere_wd0"}
    for c in cfgs.values():
        assert (c.task, c.train_frac, c.lr, c.batch_size, c.steps, c.eval_every, c.grok_threshold) == (
            "s5", 0.3, 1e-3, 0, 100_000, 200, 0.99)
        assert (c.split_rule, c.data_seed, tuple(c.betas), c.warmup_steps, c.causal) == (
            "python_shuffle", 2, (0.9, 0.999), 0, False)
        assert (c.d_model, c.n_heads, c.d_mlp, c.init_scheme) == (128, 4, 512, "torch")
    assert (cfgs["sphere_wd1"].norm, cfgs["sphere_wd1"].unembed,
            cfgs["sphere_wd1"].weight_decay) == ("sphere", "linear", 1.0)
    assert (cfgs["sphere_wd0"].unembed, cfgs["sphere_wd0"].weight_decay) == ("bounded", 0.0)
    assert (cfgs["rms"].norm, cfgs["ln"].weight_decay) == ("rms", 1.0)


def test_uniform_attention_paper_scale_adds_the_fourier_init_wd1_arm():
    cfgs = {v: c for v, _, c in E.run_configs(E.get_experiment("uniform-attention"), "paper", 1)}
    sphere = {v: c for v, _, c in E.run_configs(E.get_experiment("bounded-sphere"), "paper", 1)}
    for att in ("softmax", "uniform"):
        c = cfgs[f"sphere_fourier_wd1_{att}"]
        assert (c.init, c.fourier_freqs, c.weight_decay, c.unembed, c.attention) == (
            "fourier", "14 35 41 42 52", 1.0, "bounded", att)  # inject_fourier_bias's key_freqs
        # the same model as bounded-sphere's Fourier-init arm but for the weight decay and attention
        assert c.replace(weight_decay=0.0, attention="softmax") == sphere["sphere_fourier_wd0_lr6e-4"]
    assert cfgs["ln_softmax"] == sphere["ln_lr6e-4"].replace(attention="softmax")  # the shared runs stay shared


def test_fourier_fve_paper_rows_come_from_the_bounded_sphere_runs():
    sphere = {n: c.to_dict() for _, n, c in E.run_configs(E.get_experiment("bounded-sphere"), "paper", 3)}
    fve = {n: c.to_dict() for _, n, c in E.run_configs(E.get_experiment("fourier-fve"), "paper", 3)}
    assert set(fve) == {f"{a}_lr6e-4_s{s}" for a in ("ln", "sphere_wd1", "sphere_wd0") for s in (1, 2, 3)}
    assert all(fve[n] == sphere[n] for n in fve)  # same names, same configs: the same files


@pytest.mark.parametrize("name", ["bounded-sphere", "uniform-attention", "s5-control", "fourier-fve"])
def test_sphere_paper_baselines_are_post_norm(name):
    for scale in E.SCALES:
        for _, _, c in E.run_configs(E.get_experiment(name), scale, 1):
            assert c.norm not in ("ln", "rms") or c.norm_placement == "post", (name, scale)


def test_activation_norm_runs_on_the_no_norm_transformer_and_the_mlp():
    for scale in E.SCALES:
        for variant, _, c in E.run_configs(E.get_experiment("activation-norm"), scale, 1):
            assert c.norm == "none", (scale, variant)
            assert c.model == ("mlp" if variant.startswith("mlp") else "transformer")


def test_published_numbers_are_those_of_references():
    # spot checks against REFERENCES.md, typed in here independently of the experiment module
    assert E.SPHERE_TABLE[(6e-4, "ln")] == 7_800 and E.SPHERE_TABLE[(1e-4, "sphere_fourier_wd0")] == 2_100
    assert E.SCALING_PUBLISHED == {"width": -0.27, "train_frac": -2.04, "lr": -0.50, "weight_decay": -0.64}


def test_the_flop_model_counts_flops():
    # canonical p=113 model, full batch: 3831 inputs x 3 tokens; weights per token
    # 4*128*128 (QKVO) + 2*128*512 (MLP) + 2*3*128 (attention) + 128*113 (unembed)
    from groklens.config import RunConfig

    cfg = RunConfig(steps=10, eval_every=10, checkpoint_every=10)
    per = 4 * 128 * 128 + 2 * 128 * 512 + 2 * 3 * 128 + 128 * 113
    train, ev = E.step_flops(cfg)
    assert train == pytest.approx(6 * per * round(0.3 * 113 * 113) * 3)
    assert ev == pytest.approx(2 * per * 113 * 113 * 3)


def test_list_prints_every_experiment_with_costs():
    # --no-measure: the FLOP model, so the listing needs no step timed (test_cost.py covers timing)
    proc = groklens("reproduce", "--list", "--no-measure")
    assert proc.returncode == 0, proc.stderr
    for name in NAMES:
        assert name in proc.stdout
    assert "estimate" in proc.stdout.lower() and f"{E.EXPECTED_MARGIN:g}x" in proc.stdout
    items = json.loads(groklens("reproduce", "--list", "--json", "--no-measure", check=True).stdout)
    assert [i["name"] for i in items] == NAMES
    for it in items:
        for s in E.SCALES:
            sc = it["scales"][s]
            assert 0 < sc["cpu_seconds_expected"] <= sc["cpu_seconds_cap"]
            assert sc["rate_basis"] == ["flop model"] and sum(sc["stop_basis"].values()) == sc["runs"]
        # smoke < quick <= paper at the cap: the estimate counts training, and a paper scale may differ
        # from the quick one in its analysis alone (llc-grokking: the LLC at 4x the checkpoints)
        caps = [it["scales"][s]["cpu_seconds_cap"] for s in E.SCALES]
        assert caps[0] < caps[1] <= caps[2]
    sphere = next(i for i in items if i["name"] == "bounded-sphere")["scales"]["paper"]
    # every arm with runs in the committed ledger is costed from them (all its planned runs: 10 seeds
    # by default), the others to 2x the published grok epochs
    recorded = {e["arm"] for e in ledger_entries(_ledger_dirs(), "bounded-sphere", "paper")}
    planned = [v for v, _, _ in run_configs(get_experiment("bounded-sphere"), "paper", 10)]
    with_ledger = sum(v in recorded for v in planned)
    # the 6 arms of 10 seeds, at least (every arm has runs since lr 1e-4's LayerNorm/RMSNorm were recorded)
    assert 60 <= with_ledger <= len(planned)
    assert sphere["stop_basis"]["ledger"] == with_ledger
    assert sphere["stop_basis"]["expected"] == sphere["runs"] - with_ledger
    grokfast = next(i for i in items if i["name"] == "grokfast")["scales"]["paper"]
    assert grokfast["stop_basis"]["cap"] == 0  # its recorded arms' last steps, else the published iterations


@pytest.mark.parametrize("args, needle", [
    (["no-such-experiment"], "unknown experiment"),
    (["fourier-fve", "--scale", "huge"], "--scale must be one of"),
    (["fourier-fve", "--seeds", "0"], "--seeds must be a positive integer"),
    ([], "missing experiment NAME"),
    (["fourier-fve", "--list"], "--list takes no experiment NAME"),
    (["fourier-fve", "--results-md", "/no/such/dir/R.md"], "does not exist"),
    (["fourier-fve", "--results", "R.md"], "--results is now --results-md"),
    (["geomdr", "--scale", "smoke", "--arms", "base,nope"], "--arms 'nope' matches no arm of geomdr at smoke"),
    (["--list", "--arms", "x"], "--list takes no experiment NAME, no --arms and no --executor"),
])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    proc = groklens("reproduce", *args, "-o", str(tmp_path / "out"))
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
@pytest.mark.parametrize("name", PUBLISHED)  # the demo's own test runs it (tests/cli/test_demo.py)
def test_every_experiment_runs_end_to_end_at_smoke_scale(name, tmp_path):
    md = tmp_path / "RESULTS.md"
    out = tmp_path / name
    res = E.reproduce(name, "smoke", out, results_md=md, ledger_dir=tmp_path / "ledger", progress=False,
                      echo=lambda _m: None)
    # trajectories, comparison, report, results, ledger
    assert res.runs and all(p.exists() for p in res.runs)
    with h5py.File(res.runs[0], "r", locking=False) as f:
        assert len(f["steps"]) >= 2
    assert (out / "comparison.csv").exists() and (out / "comparison.txt").exists()
    assert res.report is not None and res.report.exists()
    assert list((out / "report").glob("fig_*.png"))
    saved = json.loads((out / "results.json").read_text())
    assert saved["experiment"] == name and saved["scale"] == "smoke" and saved["rows"]
    ledger = json.loads((tmp_path / "ledger" / f"{name}.smoke.json").read_text())
    assert len(ledger["runs"]) == len(res.runs)
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
    from groklens.trainers import train as training

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
    training.train(cfg, tmp_path / "fresh.h5", progress=False)
    fresh = Trajectory(tmp_path / "fresh.h5").params(30)
    for name, value in traj.params(30).items():
        assert np.array_equal(value.numpy(), fresh[name].numpy()), name
    assert res.rows


def test_results_md_replaces_rows_of_the_same_experiment_and_scale(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text("# Title\n\nintro kept\n")

    def result(name: str, cmd_seeds: int, ours: float, run_wall: str = "") -> E.Result:
        row = E.Row("m", E.Published(2.0, "2", "src"), ours, f"{ours}", "diff")
        return E.Result(name, "quick", cmd_seeds, tmp_path, [row], 65.0, E.command_text(name, "quick", cmd_seeds),
                        [], None, run_wall=run_wall)

    E.update_results_md(md, result("x", 1, 1.0))
    E.update_results_md(md, result("y", 2, 3.0))
    E.update_results_md(md, result("x", 3, 4.0, "2 min per run (mean of 3, max 3 min; cpu)"))  # replaces x's row
    text = md.read_text()
    assert text.startswith("# Title\n\nintro kept\n")
    rows = [ln for ln in text.splitlines() if ln.startswith("| `groklens reproduce")]
    assert len(rows) == 2
    # x's rows stay where they were (first), y's after them
    assert "reproduce x --scale quick --seeds 3` | quick | m | 2 (src) | 4.0 | 2 |" in rows[0]
    assert "2 min per run (mean of 3, max 3 min; cpu)" in rows[0]
    assert "reproduce y --scale quick --seeds 2` | quick | m | 2 (src) | 3.0 | 1.5 |" in rows[1]
    assert "65 s (whole command)" in rows[1]


def test_cli_runs_one_experiment_and_writes_its_rows(tmp_path):
    md = tmp_path / "RESULTS.md"
    proc = groklens("reproduce", "grokfast", "--scale", "smoke", "-o", str(tmp_path / "gf"),
                    "--results-md", str(md), "-q")
    assert proc.returncode == 0, proc.stderr
    assert "published" in proc.stdout and "iterations to 95% validation accuracy" in proc.stdout
    assert "39890" in proc.stdout.replace(",", "")
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| `groklens reproduce grokfast --scale smoke")]
    assert len(rows) == 3
    res = json.loads((tmp_path / "gf" / "results.json").read_text())
    derived = res["rows"][2]
    assert derived["published"]["value"] == pytest.approx(39_890 / 910)
    assert all(math.isfinite(r["ours"]) for r in res["rows"] if r["ours"] is not None)


# ---------------------------------------------------------------------- the results ledger
def _quiet(name, out, seeds, ledger, **kw):
    return E.reproduce(name, "smoke", out, seeds, ledger_dir=ledger, progress=False, echo=lambda _m: None, **kw)


@pytest.mark.slow
def test_ledger_rerun_with_more_seeds_trains_only_the_missing_ones(tmp_path):
    ledger = tmp_path / "ledger"
    res1 = _quiet("grokfast", tmp_path / "a", 1, ledger)
    assert res1.trained == 2  # base and grokfast, seed 1
    doc = json.loads((ledger / "grokfast.smoke.json").read_text())
    assert sorted((e["arm"], e["seed"]) for e in doc["runs"]) == [("base", 1), ("grokfast", 1)]
    entry = next(e for e in doc["runs"] if e["arm"] == "base")
    t, censored = _grok_time_from_file(tmp_path / "a" / "runs" / "base_s1.h5")
    assert entry["censored"] == censored and entry["last_step"] == 30
    assert entry["grokking_step"]["0.95"] == (None if censored else t)
    assert entry["config"]["seed"] == 1 and len(entry["config_hash"]) == 16 and entry["wall_s"] >= 0
    assert entry["device"].startswith("cpu") and entry["groklens_version"]
    # another output directory, the same ledger, two seeds: only seed 2 is trained; rows hold n=2
    res2 = _quiet("grokfast", tmp_path / "b", 2, ledger)
    assert res2.trained == 2
    assert sorted(p.name for p in (tmp_path / "b" / "runs").glob("*_s*.h5") if "analyses" not in p.name) == [
        "base_s2.h5", "grokfast_s2.h5"]
    assert all("(n=2" in r.ours_text for r in res2.rows if r.measure.startswith("iterations"))
    doc = json.loads((ledger / "grokfast.smoke.json").read_text())
    assert len(doc["runs"]) == 4
    # a rerun trains nothing
    assert _quiet("grokfast", tmp_path / "b", 2, ledger).trained == 0


@pytest.mark.slow
def test_ledger_keeps_a_changed_config_apart(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger"
    _quiet("grokfast", tmp_path / "a", 1, ledger)
    base = E.get_experiment("grokfast").scales["smoke"].base
    monkeypatch.setitem(base, "lr", base.get("lr", 1e-3) * 2)  # "a changed default"
    res = _quiet("grokfast", tmp_path / "b", 1, ledger)
    assert res.trained == 2  # retrained, not taken from the ledger
    doc = json.loads((ledger / "grokfast.smoke.json").read_text())
    assert len(doc["runs"]) == 4 and len({e["arm_hash"] for e in doc["runs"]}) == 4
    assert all("(n=1" in r.ours_text for r in res.rows if r.measure.startswith("iterations"))
    assert any("recorded with another config (differs in lr)" in n for n in res.notes)
    # a finished file of the old config in OUT/runs is refused, not mixed in
    import shutil

    (tmp_path / "c" / "runs").mkdir(parents=True)
    shutil.copy(tmp_path / "a" / "runs" / "base_s1.h5", tmp_path / "c" / "runs" / "base_s1.h5")
    with pytest.raises(E.GroklensError, match="different config"):
        _quiet("grokfast", tmp_path / "c", 1, tmp_path / "ledger2")


def test_config_hash_ignores_new_fields_at_their_legacy_default():
    from groklens.experiments.ledger import LEGACY_DEFAULTS, arm_hash, config_hash

    cfg = {n: c for _, n, c in E.run_configs(E.get_experiment("grokfast"), "smoke", 1)}["base_s1"].to_dict()
    assert cfg["norm_placement"] == "pre" and cfg["init_scheme"] == "tl"
    old = {k: v for k, v in cfg.items() if k not in LEGACY_DEFAULTS}  # a config from before the fields existed
    assert config_hash(old) == config_hash(cfg)
    assert config_hash({**cfg, "init_scheme": "torch"}) != config_hash(cfg)  # a changed default
    assert config_hash({**cfg, "device": "cuda"}) == config_hash(cfg)  # where, not what
    assert config_hash({**cfg, "compile": True}) == config_hash(cfg)  # how: the eager numbers to rounding
    assert config_hash({**cfg, "seed": 2}) != config_hash(cfg) and arm_hash({**cfg, "seed": 2}) == arm_hash(cfg)


def test_every_config_field_is_known_to_the_ledger_hash():
    """A config field added after the ledger began needs its legacy value (the one that reproduces
    the behaviour from before it existed) in ledger.LEGACY_DEFAULTS, or old entries no longer
    match: add it there when this fails."""
    from groklens.config import field_names
    from groklens.experiments.ledger import FIELDS_V1, LEGACY_DEFAULTS

    new = set(field_names()) - FIELDS_V1 - set(LEGACY_DEFAULTS)
    assert not new, f"add the legacy value of {sorted(new)} to experiments/ledger.py LEGACY_DEFAULTS"


def test_list_states_fit_and_measured_time_from_a_ledger(tmp_path):
    from groklens.experiments.ledger import LEDGER_FORMAT

    # --list reads the checkout's committed ledgers too (docs/results/), which hold quick and
    # paper runs; smoke runs are never committed, so the smoke scale sees only this ledger
    led = tmp_path / "led"
    led.mkdir()
    def entry(arm, s, w):  # the fields every entry has, its identity its config's (the ledger's validator)
        from groklens.config import RunConfig
        from groklens.experiments.ledger import arm_hash, config_hash

        cfg = RunConfig(seed=s, steps=30).to_dict()
        return {"arm": arm, "seed": s, "config_hash": config_hash(cfg), "arm_hash": arm_hash(cfg), "wall_s": w,
                "device": "cpu (x86_64, 2 cores)", "run": f"{arm}_s{s}", "config": cfg, "memorization_step": {},
                "grokking_step": {}, "last_step": 20}

    def write(entries):
        (led / "grokfast.smoke.json").write_text(json.dumps({"format": LEDGER_FORMAT, "experiment": "grokfast",
                                                              "scale": "smoke", "runs": entries}))

    args = ("reproduce", "--list", "--no-measure", "--ledger", str(led))
    # one arm recorded: its runs are costed to their last step (20 of 30), the other arm's to the cap,
    # and "fits" judges the estimate (the recorded arm's time says nothing of the other's)
    write([entry("base", 1, 100.0)])
    q = next(i for i in json.loads(groklens(*args, "--json", check=True).stdout) if i["name"] == "grokfast")
    assert q["scales"]["smoke"]["stop_basis"] == {"ledger": 1, "expected": 0, "cap": 1}
    assert q["scales"]["smoke"]["fits_basis"] == "estimate"
    # every arm recorded: the measured time is what "fits" judges
    entries = [entry("base", 1, 100.0), entry("grokfast", 1, 300.0)]
    write(entries)
    items = json.loads(groklens(*args, "--json", check=True).stdout)
    q = next(i for i in items if i["name"] == "grokfast")["scales"]["smoke"]
    assert q["measured"]["n"] == 2 and q["measured"]["wall"]["mean_s"] == pytest.approx(200.0)
    assert q["measured"]["cpu"] is None
    assert q["fits_basis"] == "measured wall" and q["fits_cpu"] is True
    assert q["stop_basis"] == {"ledger": 2, "expected": 0, "cap": 0}
    text = groklens(*args, check=True).stdout
    assert "fits this CPU" in text and "wall 3 min mean, 5 min max (n=2, cpu)" in text
    # entries with a recorded CPU time: that is what is shown (and judged), labelled CPU
    for e, c in zip(entries, (40.0, 80.0)):
        e["cpu_s"] = c
    write(entries)
    q = next(i for i in json.loads(groklens(*args, "--json", check=True).stdout) if i["name"] == "grokfast")
    assert q["scales"]["smoke"]["measured"]["cpu"]["mean_s"] == pytest.approx(60.0)
    assert q["scales"]["smoke"]["fits_basis"] == "measured cpu"
    assert "CPU 60 s mean, 80 s max (n=2, cpu)" in groklens(*args, check=True).stdout


def test_list_reads_the_ledgers_the_demo_and_reproduce_leave_in_the_working_directory(tmp_path):
    """Right after `groklens demo` (./demo-out/ledger) or `groklens reproduce NAME` with no --out
    (./reproduce-NAME-SCALE/ledger), --list run in that directory shows their measured times, not
    'not run yet'; a directory given again as --ledger is read once."""
    from groklens.config import RunConfig
    from groklens.experiments.ledger import LEDGER_FORMAT, arm_hash, config_hash

    def write(directory: Path, name: str, arms: list[str], wall: float) -> None:
        entries = []
        for arm in arms:
            cfg = RunConfig(seed=1, steps=30).to_dict()
            entries.append({"arm": arm, "seed": 1, "config_hash": config_hash(cfg), "arm_hash": arm_hash(cfg),
                            "wall_s": wall, "device": "cpu (x86_64, 2 cores)", "run": f"{arm}_s1", "config": cfg,
                            "memorization_step": {}, "grokking_step": {}, "last_step": 20})
        (directory / "ledger").mkdir(parents=True)
        (directory / "ledger" / f"{name}.smoke.json").write_text(json.dumps(
            {"format": LEDGER_FORMAT, "experiment": name, "scale": "smoke", "runs": entries}))

    write(tmp_path / "demo-out", "demo", ["standard", "sphere"], 60.0)
    write(tmp_path / "reproduce-grokfast-smoke", "grokfast", ["base"], 40.0)

    def smoke(*extra):
        items = json.loads(groklens("reproduce", "--list", "--no-measure", "--json", *extra, check=True,
                                    cwd=tmp_path).stdout)
        return {i["name"]: i["scales"]["smoke"]["measured"] for i in items}

    got = smoke()
    assert got["demo"]["n"] == 2 and got["demo"]["wall"]["mean_s"] == pytest.approx(60.0)
    assert got["grokfast"]["n"] == 1 and got["grokfast"]["wall"]["mean_s"] == pytest.approx(40.0)
    assert got["stablemax"] is None
    assert smoke("--ledger", str(tmp_path / "demo-out" / "ledger"))["demo"]["n"] == 2
    text = groklens("reproduce", "--list", "--no-measure", check=True, cwd=tmp_path).stdout
    demo = next(ln for ln in text.splitlines() if ln.startswith("demo "))
    assert "not run yet" not in demo and "wall 60 s mean" in demo


# ---------------------------------------------------------------------- verdicts on censored cases
class _R:
    def __init__(self, grok, last):
        self.grokking, self.last_step = grok, last

    @property
    def grok_censored(self):
        return self.grokking is None

    def grok_time(self):
        return float(self.grokking if self.grokking is not None else self.last_step)


def test_speedup_verdict_only_where_the_bound_decides():
    from groklens.analyses.compare import speedup
    from groklens.experiments.verdicts import speedup_verdict

    crossed = speedup([_R(800, 900), _R(1000, 1100), _R(900, 1000)], [_R(100, 200), _R(110, 210), _R(105, 205)])
    assert crossed["ci"][0] > 1  # ~8.6x with a tight interval: decided
    assert speedup_verdict(crossed) == "agrees"
    assert speedup_verdict(crossed, above=1.05, claim_faster=False) == "disagrees"
    # an interval that contains the threshold decides nothing, whatever the point estimate
    # (0.87x [0.59, 1.27] was "disagrees" under the point-estimate rule)
    spread = speedup([_R(1550, 1600), _R(2200, 2250), _R(1900, 1950)], [_R(1800, 1850), _R(2450, 2500), _R(2250, 2300)])
    assert spread["value"] < 1 and spread["ci"][0] < 1 < spread["ci"][1]
    assert speedup_verdict(spread).startswith("undetermined (the 95% interval")
    assert speedup_verdict(spread, above=1.05, claim_faster=False).startswith("undetermined (the 95% interval")
    slower = speedup([_R(100, 200), _R(110, 210), _R(105, 205)], [_R(800, 900), _R(1000, 1100), _R(900, 1000)])
    assert speedup_verdict(slower) == "disagrees"
    assert speedup_verdict(slower, above=1.05, claim_faster=False) == "agrees"
    # one seed on a side: no interval, no verdict
    assert speedup_verdict(speedup([_R(800, 900)], [_R(100, 200)])).startswith("undetermined (no interval")
    assert speedup_verdict(speedup([_R(None, 100)], [_R(None, 100)])).startswith("undetermined")


def _welch_log_ci(base, runs):
    """Welch's 95% interval on the difference of mean log times, by scipy's own t-test (an
    independent computation of what analyses/speedup.py does by hand)."""
    from scipy import stats

    res = stats.ttest_ind(np.log([r.grok_time() for r in base]), np.log([r.grok_time() for r in runs]), equal_var=False)
    ci = res.confidence_interval(0.95)
    return math.exp(ci.low), math.exp(ci.high)


def test_censored_speedups_get_a_one_sided_interval_and_decide_only_its_way():
    from groklens.analyses.compare import speedup
    from groklens.experiments.verdicts import speedup_verdict

    # every baseline seed censored at its cap 3000, the variant tight: [lo, inf) with lo the
    # lower end of the interval computed as if 3000 were the grokking steps
    base, fast = [_R(None, 3000), _R(None, 3000), _R(None, 3100)], [_R(100, 200), _R(110, 210), _R(105, 205)]
    sp = speedup(base, fast)
    lo, _ = _welch_log_ci(base, fast)
    assert sp["bound"] == "lower" and sp["ci"][1] == math.inf and sp["ci"][0] == pytest.approx(lo, rel=1e-9)
    assert lo > 1 and speedup_verdict(sp) == "agrees"
    # a lower bound never shows "not faster": claim "<= 1.05" is disagreed with only when lo > 1.05
    assert speedup_verdict(sp, above=1.05, claim_faster=False) == "disagrees"
    # the s5-control case: partly censored baseline, an interval whose lower end is below the
    # threshold (the point bound 1.28x alone said "disagrees")
    partly = speedup([_R(None, 6000), _R(None, 6000), _R(5500, 6000)], [_R(4000, 4400), _R(5400, 5800), _R(4800, 5200)])
    assert partly["bound"] == "lower" and partly["value"] > 1.05 and partly["ci"][0] < 1.05
    assert speedup_verdict(partly, above=1.05, claim_faster=False).startswith("undetermined (the 95% interval")
    # a censored variant: [0, hi]; decides "not faster" only when hi <= 1, never "faster"
    slow = speedup([_R(100, 200), _R(110, 210)], [_R(None, 1000), _R(None, 1100)])
    _, hi = _welch_log_ci([_R(100, 200), _R(110, 210)], [_R(None, 1000), _R(None, 1100)])
    assert slow["bound"] == "upper" and slow["ci"][0] == 0 and slow["ci"][1] == pytest.approx(hi, rel=1e-9)
    assert speedup_verdict(slow) == "disagrees"
    # the uniform-attention case: one variant seed censored, a wide interval: undetermined
    wide = speedup([_R(1400, 1500), _R(2150, 2250), _R(1750, 1850)], [_R(1400, 1500), _R(4900, 5000), _R(None, 6000)])
    assert wide["bound"] == "upper" and wide["ci"][1] > 1
    assert speedup_verdict(wide).startswith("undetermined (the 95% interval")
    assert speedup_verdict(speedup([_R(5000, 5100)] * 2, [_R(None, 1000)] * 2)).startswith("undetermined")
    # a censored side with one seed: no interval
    assert speedup_verdict(speedup([_R(None, 3000)],
                                   [_R(100, 200), _R(110, 210)])).startswith("undetermined (no interval")


def test_collapsed_runs_and_ungrokked_arms_decide_nothing():
    from groklens.analyses.compare import speedup
    from groklens.experiments.verdicts import generalized_arms, speedup_verdict

    crossed = speedup([_R(800, 900), _R(1000, 1100), _R(900, 1000)], [_R(100, 200), _R(110, 210), _R(105, 205)])
    assert speedup_verdict(crossed, collapsed=1).startswith(  # the second reading not given
        "undetermined (1 run(s) behind it crossed and then collapsed")
    grokked, never = [_R(100, 200)] * 2, [_R(None, 200), _R(150, 200)]
    assert generalized_arms({"penalty": grokked, "baseline": grokked}) is None
    why = generalized_arms({"penalty": never, "baseline": grokked})
    assert why.startswith("compares a grokked with an ungrokked model") and "penalty generalized on 1 of 2" in why
    collapsed = _R(100, 200)
    collapsed.collapsed = True
    assert "generalized on 1 of 2" in generalized_arms({"arm": [collapsed, _R(100, 200)]})


def test_a_collapsed_run_decides_only_where_both_of_its_readings_agree():
    from groklens.analyses.speedup import collapsed_as_censored
    from groklens.experiments.core import Context
    from groklens.experiments.verdicts import speedup_verdict

    def run(grok, last, collapsed=False):
        r = _R(grok, last)
        r.collapsed = collapsed
        return r

    fast = [run(100, 200), run(110, 210), run(105, 205)]
    slow = [run(800, 900), run(1000, 1100), run(900, 2000, collapsed=True)]
    sc = E.get_experiment("bounded-sphere").scales["smoke"]
    ctx = Context("bounded-sphere", "smoke", sc, None, {"base": slow, "fast": fast}, None)
    value, text, sp = ctx.speedup("base", "fast")
    # the collapsed baseline seed read as never grokked: censored at its last step, 2000
    alt = sp["if_censored"]
    assert value == pytest.approx((800 * 1000 * 900) ** (1 / 3) / (100 * 110 * 105) ** (1 / 3))
    assert alt["bound"] == "lower" and alt["value"] == pytest.approx(
        (800 * 1000 * 2000) ** (1 / 3) / (100 * 110 * 105) ** (1 / 3))
    assert "read as censored at their last step: >= " in text
    assert speedup_verdict(sp, collapsed=sp["collapsed"]) == (
        "agrees (under both readings of the 1 collapsed run(s): grokked at the crossing, or censored at the last step)")
    # the collapsed seed on the fast side: read as censored, the variant's bound is an upper one whose
    # interval holds 1, so the readings differ
    ctx.arms = {"base": [run(800, 900), run(1000, 1100), run(900, 1000)],
                "fast": [run(100, 200), run(110, 210), run(105, 3000, collapsed=True)]}
    _, _, sp = ctx.speedup("base", "fast")
    assert [r.grok_time() for r in collapsed_as_censored(ctx.arms["fast"])] == [100, 110, 3000]
    assert speedup_verdict(sp, collapsed=sp["collapsed"]).startswith(
        "undetermined (1 run(s) behind it crossed and then collapsed; read as grokked at the crossing: agrees; "
        "as censored at the last step: undetermined (the 95% interval [0, ")


def test_phase_ratios_are_decided_by_a_paired_interval():
    from scipy import stats

    from groklens.experiments.verdicts import paired_interval, ratio_verdict

    ratios = [0.55, 0.60, 0.62, 0.58]
    mean, ci = paired_interval(ratios)
    ref = stats.ttest_1samp(ratios, 1.0).confidence_interval(0.95)  # scipy's own one-sample interval
    assert mean == pytest.approx(np.mean(ratios)) and ci == pytest.approx([ref.low, ref.high], rel=1e-12)
    assert ratio_verdict(mean, ci, below=True, missing="") == "agrees"
    assert ratio_verdict(mean, ci, below=False, missing="") == "disagrees"
    # two seeds far apart (the structural-attention case): the interval contains 1
    mean2, ci2 = paired_interval([0.75, 1.14])
    assert ratio_verdict(mean2, ci2, below=False, missing="").startswith("undetermined (the 95% interval")
    one, none = paired_interval([0.9])
    assert none is None and ratio_verdict(one, none,
                                          below=True, missing="", n=1).startswith("undetermined (no interval: n=1")
    assert ratio_verdict(None, None, below=True, missing="no checkpoint").startswith("undetermined (missing")


def test_groks_verdict_needs_a_cap_far_beyond_the_reference():
    from groklens.experiments.verdicts import FAR, groks_verdict

    never = [_R(None, 6000)] * 3
    # the published / baseline time 1000: a cap of 6000 is not FAR x beyond it
    assert groks_verdict(never, should_grok=True, reference=1000, reference_what="t").startswith("undetermined")
    assert groks_verdict(never, should_grok=False, reference=1000, reference_what="t").startswith("undetermined")
    assert groks_verdict(never, should_grok=True, reference=None, reference_what="t").startswith("undetermined")
    far = 6000 / FAR
    assert groks_verdict(never, should_grok=True, reference=far, reference_what="t").startswith("disagrees")
    assert groks_verdict(never, should_grok=False, reference=far, reference_what="t").startswith("agrees")
    mixed = [_R(500, 6000), _R(None, 6000)]
    assert groks_verdict(mixed, should_grok=True,
                         reference=far, reference_what="t") == "undetermined (1 of 2 seeds grokked)"
    assert groks_verdict([_R(500, 600)] * 2, should_grok=True, reference=None, reference_what="t") == "agrees"


def test_groks_verdict_within_a_published_run_length():
    """A figure whose N-step run grokked: a cap of N decides; a shorter cap falls back to FAR."""
    from groklens.experiments.verdicts import groks_verdict

    never = [_R(None, 6000)] * 2
    assert groks_verdict(never, should_grok=True, reference=6000, reference_what="t", within=6000) == \
        "disagrees (no seed grokked by step 6000; the published run groks within 6000)"
    assert groks_verdict(never, should_grok=True, reference=8000, reference_what="t",
                         within=8000).startswith("undetermined (censored: no seed grokked by step 6000")
    # "does not grok" is not a claim about a run length
    assert groks_verdict(never, should_grok=False, reference=1000, reference_what="t",
                         within=6000).startswith("undetermined")
    assert groks_verdict([_R(500, 6000)], should_grok=True, reference=None, reference_what="t", within=6000) == "agrees"


# ---------------------------------------------------------------------- the GPU script
@pytest.mark.slow
def test_gpu_script_dry_run_checks_resume_and_plans_every_experiment(tmp_path):
    """benchmarks/gpu_paper_scale.sh --dry-run on CPU: trains, interrupts and resumes a tiny model
    for real (ending equal to the uninterrupted run), then lists the paper-scale commands it would
    run, one seed at a time, without training any of them."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_paper_scale.sh"
    proc = subprocess.run(["bash", str(script), "--dry-run", "--work", str(tmp_path / "w"), "--ledger",
                           str(tmp_path / "led"), "--seeds", "2", "--python", sys.executable],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resume: ok" in proc.stdout and "max |param diff| 0," in proc.stdout
    would = [ln.split("would run: ", 1)[1] for ln in proc.stdout.splitlines() if "would run: " in ln]
    assert len(would) == 2 * len(PUBLISHED)
    for name in PUBLISHED:
        for k in (1, 2):
            assert any(f" reproduce {name} --scale paper --seeds {k} " in f" {c} " for c in would), (name, k)
    # the scaling law's paper grid: a GPU sweep of ensembles and its fit, after the reproduce commands
    assert any(" sweep " in ln and "scaling_law_gpu.yaml" in ln and "--ensemble" in ln
               for ln in proc.stdout.splitlines() if "would sweep: " in ln)
    assert any("scaling-law" in ln and "--censored" in ln for ln in proc.stdout.splitlines() if "would fit: " in ln)
    assert not (tmp_path / "led").exists()  # nothing trained, nothing recorded


def test_exponent_with_censored_runs_is_tobit_beside_ols():
    """The weight-decay exponent with censored runs: ours is the Tobit estimate, checked against a
    right-censored normal likelihood maximized here independently (Nelder-Mead), with OLS on the
    grokked runs beside it."""
    from scipy import optimize, stats

    from groklens.analyses.scaling import GrokRecord

    rng = np.random.default_rng(0)
    wds = np.repeat([0.1, 0.3, 1.0, 3.0], 5)
    logt = 7.0 - 1.0 * np.log(wds) + rng.normal(0, 0.4, len(wds))
    cap = np.log(3000.0)
    recs = [GrokRecord(f"r{i}", {"weight_decay": float(w)}, None if lt > cap else int(round(math.exp(lt))), 3000)
            for i, (w, lt) in enumerate(zip(wds, logt))]
    n_cens = sum(r.grok_step is None for r in recs)
    assert 0 < n_cens < len(recs) - 3
    ours, text = E.fit_text(recs, ["weight_decay"])["weight_decay"]
    assert text.startswith("Tobit ") and "; OLS " in text and f"{n_cens} censored" in text

    x = np.log([r.values["weight_decay"] for r in recs])
    y = np.log([r.grok_step if r.grok_step is not None else r.last_step for r in recs])
    c = np.array([r.grok_step is None for r in recs])

    def nll(theta):
        a, b, log_s = theta
        z = (y - a - b * x) / math.exp(log_s)
        return -(np.sum(stats.norm.logpdf(z[~c]) - log_s) + np.sum(stats.norm.logsf(z[c])))

    best = optimize.minimize(nll, [7.0, -0.5, 0.0], method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10,
                                                                                    "maxiter": 20_000})
    assert ours == pytest.approx(best.x[1], abs=1e-3)
    ols = np.polyfit(x[~c], y[~c], 1)[0]
    assert f"OLS {ols:.2f}" in text


def test_no_train_records_only_the_finished_runs(tmp_path):
    """--no-train: the finished runs are recorded and read, the missing ones listed, none trained."""
    import json

    from groklens.experiments import get_experiment, run_configs
    from groklens.trainers.train import train

    out = tmp_path / "gf"
    (out / "runs").mkdir(parents=True)
    variant, name, cfg = run_configs(get_experiment("grokfast"), "smoke", 1)[0]
    train(cfg, out / "runs" / f"{name}.h5", progress=False)
    proc = groklens("reproduce", "grokfast", "--scale", "smoke", "-o", str(out), "--no-train", "-q", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    ledger = json.loads((out / "ledger" / "grokfast.smoke.json").read_text())
    assert [e["run"] for e in ledger["runs"]] == [name]
    assert sorted(p.name for p in (out / "runs").glob("*.h5")) == [f"{name}.h5"]  # nothing trained
    assert any(n.startswith("not trained (--no-train): 1 run(s)") for n in result["notes"])


def test_results_md_is_replaced_whole_or_not_at_all(tmp_path):
    """A full disk while the rows are written leaves the old results file and no temporary."""
    import subprocess
    import sys
    import textwrap

    md = tmp_path / "R.md"
    md.write_text("# Results\n\nkept\n")
    before = md.read_bytes()
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from groklens.fileio import write_text_atomic
        from groklens.errors import RunFailure
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))
        try:
            write_text_atomic(__import__("pathlib").Path({str(md)!r}), "x" * 10_000)
        except RunFailure as exc:
            print(exc)
            sys.exit(1)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "the file is as it was" in proc.stdout, proc.stdout + proc.stderr
    assert md.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R.md"]


@pytest.mark.slow  # compiles one smoke model: ~5-20 s on a cold inductor cache
def test_compile_trains_what_it_can_compiled_into_the_same_ledger_rows(tmp_path):
    """--compile: the run torch.compile applies to trains compiled, the one with a regularizer
    term eagerly, and both fill the ledger rows an eager reproduce fills (compile is not hashed)."""
    from groklens.checkpoints import Trajectory
    from tests.trainers.test_compile import compile_works

    if not compile_works():
        pytest.skip("torch.compile cannot build CPU kernels here")
    ledger, lines = tmp_path / "ledger", []
    res = E.reproduce("nanogpt-addition", "smoke", tmp_path / "a", 1, ledger_dir=ledger, progress=False,
                      echo=lines.append, compile=True)
    assert res.trained == 2
    runs = tmp_path / "a" / "runs"
    assert Trajectory(runs / "base_s1.h5").config.compile and not Trajectory(runs / "actnorm_s1.h5").config.compile
    assert any(line.startswith("compiled (torch.compile): 1 of 2 run(s)") and "eager, regularizer terms" in line
               for line in lines), lines
    devices = {e["arm"]: e["device"] for e in json.loads((ledger / "nanogpt-addition.smoke.json").read_text())["runs"]}
    assert devices["base"].endswith(", compiled") and not devices["actnorm"].endswith(", compiled")
    assert _quiet("nanogpt-addition", tmp_path / "b", 1, ledger).trained == 0  # an eager rerun: the same rows


def test_compile_without_a_cpp_compiler_is_refused_before_training(tmp_path):
    proc = groklens("reproduce", "grokfast", "--scale", "smoke", "--compile", "-q", "-o", str(tmp_path / "gf"),
                    env={"CXX": "/nonexistent"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "C++ compiler" in proc.stderr
    assert not (tmp_path / "gf").exists()


def test_compile_leaves_runs_of_several_cpu_threads_eager(tmp_path):
    """Where the layout gives a CPU run several threads, --compile trains it eagerly (the compiled
    step measured slower there), and says so; on one thread it compiles what it can."""
    from groklens.experiments.pipeline import PlannedRun, compile_runs

    todo = [PlannedRun(v, n, c.replace(device="cpu"), c.seed, "h", tmp_path / f"{n}.h5")
            for v, n, c in E.run_configs(E.get_experiment("nanogpt-addition"), "smoke", 1)]
    lines = []
    assert not any(r.cfg.compile for r in compile_runs(todo, lines.append, threads=2))
    assert "2 threads per run on the CPU" in lines[-1]
    one = compile_runs(todo, lines.append, threads=1)
    assert [r.cfg.compile for r in one] == [True, False]  # base compiled; actnorm has a regularizer term
