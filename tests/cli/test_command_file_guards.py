"""Commands' files guarded (issue 29): every writer writes whole and never through a link or
over a file it did not create; ledgers, sweep manifests, error records, sidecars and parameters
go through one validator each; read-only places, odd names and bombs are one line, exit 2.

Test ids start with the issue's category: loss- (data loss), wrong- (silently wrong), raw- (raw
exception), bomb-, left- (leftovers).
"""

import json
import os
import shutil

import h5py
import numpy as np
import pytest

from tests.helpers import one_line_exit, snapshot, dead_pid, groklens, readonly_groklens, tiny_config, train_tiny

EXP = ["bounded-sphere", "--scale", "smoke"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("h3cli") / "run.h5"
    train_tiny(path)
    return path


def _refused(root, args, needle="", **kw):
    before = snapshot(root)
    err = one_line_exit(groklens(*args, cwd=root, timeout=kw.pop("timeout", 120), **kw))
    assert needle in err, err
    assert snapshot(root) == before
    return err


# ---------------------------------------------------------------------- writers and links
def _grokked_runs(directory, n=3):
    """Finished runs of different lr whose evaluations say they grokked at different steps."""
    for i in range(n):
        path = directory / f"r{i}.h5"
        train_tiny(path, lr=1e-3 * (i + 1))
        with h5py.File(path, "r+") as f:
            for key in ("train_acc", "test_acc"):
                acc = f["metrics"][key][:]
                acc[2 + i:] = 1.0
                f["metrics"][key][:] = acc


def test_loss_scaling_law_never_writes_through_a_link(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    _grokked_runs(d)
    victims = {name: tmp_path / f"victim-{name}" for name in ("scaling-law.json", "scaling-law.png")}
    for name, victim in victims.items():
        victim.write_text("precious\n")
        (d / name).symlink_to(victim)
    out = groklens("scaling-law", str(d), "--vars", "lr", "--json")
    assert out.returncode == 0, out.stderr
    assert all(v.read_text() == "precious\n" for v in victims.values())
    assert all((d / n).is_file() and not (d / n).is_symlink() for n in victims)
    assert json.loads((d / "scaling-law.json").read_text())["fit"]


def test_loss_reproduce_never_writes_through_a_link(run, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (out_dir / "results.json").symlink_to(victim)
    proc = groklens("reproduce", *EXP, "-o", str(out_dir), "--no-train", "-q")
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n" and not (out_dir / "results.json").is_symlink()
    # comparison.txt / .csv: the same writer (whole, a link replaced)
    from groklens.experiments.pipeline import _compare_and_report

    (out_dir / "comparison.txt").symlink_to(victim)
    _compare_and_report(out_dir, [run], [], [])
    assert victim.read_text() == "precious\n" and (out_dir / "comparison.txt").is_file()


GRID = "base: {%s}\naxes: {lr: [0.003]}\nseeds: [0]\n" % ", ".join(
    f"{k}: {json.dumps(v)}" for k, v in tiny_config().to_dict().items() if k not in ("lr", "seed", "betas"))
RUN_NAME = "lr=0.003__seed=0"


@pytest.mark.parametrize("kind", ["text", "foreign-hdf5", "truncated-run"])
def test_loss_sweep_never_replaces_a_foreign_file(run, tmp_path, kind):
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    d = tmp_path / "sweep"
    d.mkdir()
    target = d / f"{RUN_NAME}.h5"
    if kind == "text":
        target.write_text("my notes\n")
    elif kind == "foreign-hdf5":
        with h5py.File(target, "w") as f:
            f["x"] = [1]
    else:
        target.write_bytes(run.read_bytes()[: run.stat().st_size // 2])
    blob = target.read_bytes()
    dry = groklens("sweep", str(grid), "-o", str(d), "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("blocked"), dry.stdout
    out = groklens("sweep", str(grid), "-o", str(d), "-q")
    assert out.returncode == 1 and "move it away" in out.stdout, out.stdout + out.stderr
    assert target.read_bytes() == blob and not (d / f"{RUN_NAME}.error.json").exists()
    status = json.loads(groklens("sweep", "--status", str(d), "--json").stdout)
    assert status["counts"]["blocked"] == 1 and RUN_NAME in status["failed"]


# ---------------------------------------------------------------------- manifests and error records
def _sweep_dir(tmp_path, manifest):
    d = tmp_path / "sw"
    d.mkdir()
    (d / "sweep.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return d


@pytest.mark.parametrize("name,manifest,needle", [
    ("wrong-manifest-escapes-dir", {"format": "groklens-sweep", "runs": {"../../base/a": {}}}, "not a run name"),
    ("wrong-manifest-runs-text", {"format": "groklens-sweep", "runs": "abc"}, "'runs'"),
    ("raw-manifest-list", [1, 2], "not a mapping"),
    ("raw-manifest-null", None, "not a mapping"),
    ("raw-manifest-runs-list", {"format": "groklens-sweep", "runs": ["a"]}, "'runs'"),
    ("raw-manifest-deep", "[" * 30_000 + "]" * 30_000, "nested"),
    ("wrong-manifest-duplicate-run", '{"format": "groklens-sweep", "runs": {"a": {}, "a": {}}}', "twice"),
], ids=["wrong-manifest-escapes-dir", "wrong-manifest-runs-text", "raw-manifest-list", "raw-manifest-null",
        "raw-manifest-runs-list", "raw-manifest-deep", "wrong-manifest-duplicate-run"])
def test_bad_manifest_is_refused(tmp_path, name, manifest, needle):
    d = _sweep_dir(tmp_path, manifest)
    base = tmp_path / "base"
    base.mkdir()
    train_tiny(base / "a.h5")  # what "../../base/a" would have counted
    _refused(tmp_path, ["sweep", "--status", str(d)], needle)


@pytest.mark.parametrize("record", [[1, 2], None, "[" * 30_000 + "]" * 30_000, {"error": ["x"]}],
                         ids=["raw-error-record-list", "raw-error-record-null", "raw-error-record-deep",
                              "raw-error-record-no-message"])
def test_raw_bad_error_record_is_one_status_line(tmp_path, record):
    d = _sweep_dir(tmp_path, {"format": "groklens-sweep", "runs": {"a": {}}})
    (d / "a.error.json").write_text(record if isinstance(record, str) else json.dumps(record))
    out = groklens("sweep", "--status", str(d))
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert "unreadable error file" in out.stdout and len(out.stdout.strip().splitlines()) == 2


# ---------------------------------------------------------------------- ledgers
@pytest.fixture(scope="module")
def entry(run):
    from groklens.checkpoints import Trajectory
    from groklens.experiments.ledger import summarize_run

    seed = Trajectory(run).config.seed  # an entry's seed is its run's (the ledger's validator)
    return json.loads(json.dumps(summarize_run(run, "bounded-sphere", "standard", seed, [])))


def _ledger(tmp_path, runs):
    d = tmp_path / "ledger"
    d.mkdir(exist_ok=True)
    doc = {"format": 1, "experiment": "bounded-sphere", "scale": "smoke", "runs": runs}
    (d / "bounded-sphere.smoke.json").write_text(runs if isinstance(runs, str) else json.dumps(doc))
    return d


def _without(e, key):
    return {k: v for k, v in e.items() if k != key}


@pytest.mark.parametrize("name,make,needle", [
    ("wrong-ledger-duplicate-entry", lambda e: [e, dict(e)], "twice"),
    ("raw-ledger-deep", lambda e: "[" * 30_000 + "]" * 30_000, "nested"),
    ("raw-ledger-missing-arm", lambda e: [_without(e, "arm")], "'arm'"),
    ("raw-ledger-missing-config-hash", lambda e: [_without(e, "config_hash")], "'config_hash'"),
    ("raw-ledger-string-seed", lambda e: [{**e, "seed": "1"}], "'seed'"),
    ("raw-ledger-measures-not-a-mapping", lambda e: [{**e, "measures": [1]}], "'measures'"),
], ids=["wrong-ledger-duplicate-entry", "raw-ledger-deep", "raw-ledger-missing-arm", "raw-ledger-missing-config-hash",
        "raw-ledger-string-seed", "raw-ledger-measures-not-a-mapping"])
def test_bad_ledger_is_refused(tmp_path, entry, name, make, needle):
    ledger = _ledger(tmp_path, make(entry))
    _refused(tmp_path, ["reproduce", *EXP, "-o", str(tmp_path / "out"), "--no-train", "--ledger", str(ledger), "-q"],
             needle)


def test_a_real_ledger_entry_passes_the_validator(tmp_path, entry):
    ledger = _ledger(tmp_path, [entry])
    out = groklens("reproduce", *EXP, "-o", str(tmp_path / "out"), "--no-train", "--ledger", str(ledger), "-q")
    assert out.returncode == 0, out.stderr


def test_wrong_one_run_through_a_hard_link_is_refused(run, tmp_path):
    a = tmp_path / "a.h5"
    shutil.copy(run, a)
    os.link(a, tmp_path / "b.h5")
    _refused(tmp_path, ["compare", str(a), str(tmp_path / "b.h5"), "--group-by", "variant"], "same file")


# ---------------------------------------------------------------------- sidecars
def _sidecar(f, what):
    g = f.require_group("analyses").require_group("norms").require_group("0123456789abcdef")
    if what == "steps-2e40":
        g.create_dataset("steps", shape=(2**40,), dtype="i8", chunks=(1024,))
    else:
        g.create_group("steps")


@pytest.mark.parametrize("what", ["steps-2e40", "steps-group", "analyses-dataset"],
                         ids=["raw-sidecar-steps-2e40", "raw-sidecar-steps-group", "raw-sidecar-analyses-dataset"])
def test_bad_sidecar_is_refused(run, tmp_path, what):
    r = tmp_path / "r.h5"
    shutil.copy(run, r)
    with h5py.File(tmp_path / "r.analyses.h5", "w") as f:
        f.attrs.update({"format": "groklens-analyses", "format_version": 1, "run": "r.h5"})
        if what == "analyses-dataset":
            f["analyses"] = np.zeros(3)
        else:
            _sidecar(f, what)
    _refused(tmp_path, ["analyze", str(r), "--metric", "norms", "-q"], "r.analyses.h5", timeout=60)


# ---------------------------------------------------------------------- read-only places
RO_COMMANDS = {
    "analyze": lambda r, ro: ["analyze", str(r), "--metric", "norms", "-q"],
    "probe": lambda r, ro: ["probe", str(r), "--site", "blocks.0.hook_resid_post", "--target", "a", "-q"],
    "compare-analyze": lambda r, ro: ["compare", str(r), "--analyze", "-q"],
    "report-analyze": lambda r, ro: ["report", str(r), "-o", str(ro.parent / "rep"), "--analyze", "--metric", "norms",
                                     "-q"],
    "scaling-law": lambda r, ro: ["scaling-law", str(ro), "--vars", "lr"],
    "sweep-new-dir": lambda r, ro: ["sweep", str(ro.parent / "grid.yaml"), "-o", str(ro / "sw"), "-q"],
    "sweep-dir": lambda r, ro: ["sweep", str(ro.parent / "grid.yaml"), "-o", str(ro), "-q"],
    "reproduce": lambda r, ro: ["reproduce", *EXP, "-o", str(ro / "rp"), "-q"],
}


@pytest.mark.parametrize("command", list(RO_COMMANDS), ids=[f"raw-read-only-{c}" for c in RO_COMMANDS])
def test_read_only_place_is_one_line_exit_2(run, tmp_path, command):
    ro = tmp_path / "ro"
    ro.mkdir()
    if command == "scaling-law":
        _grokked_runs(ro)
    else:
        shutil.copy(run, ro / "r.h5")
    (tmp_path / "grid.yaml").write_text(GRID)
    before = snapshot(tmp_path)
    err = one_line_exit(readonly_groklens(ro, *RO_COMMANDS[command](ro / "r.h5", ro)))
    assert "read-only" in err, err
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------- names, YAML, parameters, bombs
@pytest.mark.parametrize("command", ["analyze", "report"], ids=["raw-odd-name-analyze", "raw-odd-name-report"])
def test_a_file_name_that_is_not_utf8_is_refused(run, tmp_path, command):
    odd = os.fsencode(tmp_path) + b"/bad\xff.h5"
    shutil.copy(run, odd)
    args = ["analyze", os.fsdecode(odd), "--metric", "norms", "-q"] if command == "analyze" else \
        ["report", os.fsdecode(odd), "-o", str(tmp_path / "rep"), "-q"]
    _refused(tmp_path, args, "not valid UTF-8")


def _yaml(tmp_path, text, name="c.yaml"):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


CASES = [
    ("raw-yaml-p-100000-digits", lambda t: ["train", "--out", str(t / "n.h5"), "--config",
                                            _yaml(t, "p: " + "9" * 100_000 + "\n")], "characters"),
    ("left-yaml-duplicate-key", lambda t: ["train", "--out", str(t / "n.h5"), "--config", _yaml(t, "p: 7\np: 11\n")],
     "twice"),
    ("left-sweep-yaml-duplicate-key", lambda t: ["sweep", _yaml(t, GRID + "seeds: [1]\n"), "-o", str(t / "sw"),
                                                 "--dry-run"], "twice"),
    ("raw-param-llc-lr-1e308", lambda t: ["analyze", str(t / "r.h5"), "--metric", "llc", "--param", "llc.lr=1e308",
                                          "-q"], "lr"),
    ("raw-param-json-30000-deep", lambda t: ["analyze", str(t / "r.h5"), "--metric", "norms", "--param",
                                             "norms.x=" + "[" * 30_000 + "]" * 30_000, "-q"], "--param norms.x"),
    ("bomb-reproduce-seeds-1e9", lambda t: ["reproduce", "fourier-fve", "--scale", "smoke", "--seeds", "1000000000",
                                            "-o", str(t / "rp")], "--seeds"),
    ("bomb-llc-chains-1e20", lambda t: ["analyze", str(t / "r.h5"), "--metric", "llc", "--param",
                                        "llc.chains=100000000000000000000", "-q"], "chains"),
    ("bomb-llc-draws-1e12", lambda t: ["analyze", str(t / "r.h5"), "--metric", "llc", "--param",
                                       "llc.draws=1000000000000", "-q"], "draws"),
    ("bomb-llc-burnin-1e12", lambda t: ["analyze", str(t / "r.h5"), "--metric", "llc", "--param",
                                        "llc.burnin=1000000000000", "-q"], "burnin"),
    ("left-dry-run-bad-act-norm-sites", lambda t: ["sweep", _yaml(t, GRID.replace(
        "act_norm_sites: \"\"", "act_norm_sites: \"nope.*\"").replace("act_norm_lambda: 0.0", "act_norm_lambda: 1.0")),
        "-o", str(t / "sw"), "--dry-run"], "nope"),
    ("left-sweep-threads-100000", lambda t: ["sweep", _yaml(t, GRID), "-o", str(t / "sw"), "--threads", "100000", "-q"],
     "threads"),
]


@pytest.mark.parametrize("name,make,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2(run, tmp_path, name, make, needle):
    shutil.copy(run, tmp_path / "r.h5")
    args = make(tmp_path)
    _refused(tmp_path, args, needle, timeout=60)


def test_left_a_killed_reports_staging_directory_is_removed(run, tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    stale = rep / f".rep.stage-{dead_pid()}"
    stale.mkdir()
    (stale / "index.html").write_text("half")
    live = rep / f".rep.stage-{os.getpid()}"  # another report's, still running: kept
    live.mkdir()
    out = groklens("report", str(run), "-o", str(rep), "-q")
    assert out.returncode == 0, out.stderr
    assert not stale.exists() and live.exists() and (rep / "index.html").is_file()
