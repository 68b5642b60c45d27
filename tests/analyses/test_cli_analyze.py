"""`groklens analyze` and `groklens probe` as a user runs them (subprocesses)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from groklens.checkpoints import Trajectory, sidecar_path
from tests.helpers import config_flags, groklens, tiny_config, train_tiny


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "run.h5"
    train_tiny(path)
    return path


def _stamp(path):
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


@pytest.mark.slow
def test_analyze_json_stores_then_reuses_and_recompute_rewrites(run):
    side = sidecar_path(run)
    side.unlink(missing_ok=True)
    out = groklens("analyze", str(run), "--metric", "norms", "--metric", "fourier", "--every", "2", "--json", "-q",
                   check=True)
    res = json.loads(out.stdout)
    assert set(res) == {"norms", "fourier"}
    assert res["norms"]["steps"] == [0, 40, 60]
    assert len(res["norms"]["weight_norm"]) == 3 and res["norms"]["distance_from_init"][0] == 0.0
    for key in ("key_frequencies", "neuron_fve", "embedding_fve", "ls_fve", "restricted_loss_all",
                "excluded_loss_train", "key_frequencies_clustered", "ls_fve_top_k"):
        assert len(res["fourier"][key]) == 3
    assert side.exists()
    stamp = _stamp(side)
    again = json.loads(groklens("analyze", str(run), "--metric", "norms", "--metric", "fourier", "--every", "2",
                                "--json", "-q", check=True).stdout)
    assert again == res
    assert _stamp(side) == stamp  # nothing recomputed, nothing written
    groklens("analyze", str(run), "--metric", "norms", "--checkpoints", "0,20", "--recompute", "-q", check=True)
    assert _stamp(side) != stamp


@pytest.mark.slow
def test_analyze_table_and_sharpness_param(run):
    out = groklens("analyze", str(run), "--metric", "sharpness", "--checkpoints", "60", "--param", "sharpness.top_k=2",
                   "--param", "sharpness.trace_samples=4", "-q", check=True)
    assert "== sharpness" in out.stdout and "step 60:" in out.stdout and "top_eigenvalues=[" in out.stdout


def test_analyze_takes_several_runs_and_says_a_shared_note_once(tmp_path):
    """Several runs: each analyzed into its own sidecar, the JSON keyed by run, the text headed
    per run; a note that holds for every run (the fourier key set at p=7, most frequencies) is one
    line naming the others; a bad run among them is refused before any is analyzed."""
    import h5py
    import numpy as np

    paths = [tmp_path / "a.h5", tmp_path / "b.h5"]
    for seed, path in enumerate(paths):
        train_tiny(path, seed=seed)
    out = groklens("analyze", *map(str, paths), "--metric", "norms", "--metric", "fourier", "--checkpoints", "0,60",
                   "--json", "-q", check=True)
    res = json.loads(out.stdout)
    assert list(res) == [str(p) for p in paths]
    for path in paths:
        assert res[str(path)]["norms"]["steps"] == [0, 60] and sidecar_path(path).exists()
        with h5py.File(path, "r") as f:  # the weight norm at step 60, from the file's parameters
            i = list(f["steps"][:]).index(60)
            norm = np.sqrt(sum(float((f["params"][k][i].astype(np.float64) ** 2).sum()) for k in f["params"]))
        assert res[str(path)]["norms"]["weight_norm"][1] == pytest.approx(norm, rel=1e-5)
    assert res[str(paths[0])] != res[str(paths[1])]
    notes = [ln for ln in out.stderr.splitlines() if "key set" in ln or "key frequencies" in ln]
    assert len(notes) == 1 and "[and 1 more run(s) alike: b.h5]" in notes[0]
    text = groklens("analyze", *map(str, paths), "--metric", "norms", "--summary", "-q", check=True).stdout
    assert [ln for ln in text.splitlines() if ln.startswith("=== ")] == [f"=== {p}" for p in paths]
    third = tmp_path / "c.h5"
    train_tiny(third)
    proc = groklens("analyze", str(third), str(tmp_path / "missing.h5"), "--metric", "norms", "-q")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert not sidecar_path(third).exists()


@pytest.mark.parametrize("args, message", [
    (["--metric", "nope"], "unknown analysis 'nope'"),
    (["--metric", "norms", "--checkpoints", "7"], "no checkpoint at step(s) 7"),
    pytest.param(["--metric", "rank", "--param", 'rank.sites=["blocks.3.hook_resid_post"]'], "unknown hook site",
                 marks=pytest.mark.slow),
    (["--metric", "rank", "--param", "norms.x=1"], "not being computed"),
])
def test_analyze_bad_input_is_one_line_exit_2_and_no_file(tmp_path, args, message):
    path = tmp_path / "run.h5"
    train_tiny(path)
    proc = groklens("analyze", str(path), *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("groklens: error:") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not sidecar_path(path).exists()


@pytest.mark.slow
def test_probe_command(run):
    out = groklens("probe", str(run), "--site", "hook_embed", "--target", "a", "--position", "0", "--checkpoints", "60",
                   "--json", "-q", check=True)
    res = json.loads(out.stdout)["probe"]
    assert res["steps"] == [60] and res["accuracy"] == [1.0]
    bad = groklens("probe", str(run), "--site", "hook_nope", "--target", "a")
    assert bad.returncode == 2 and "unknown hook site" in bad.stderr


@pytest.mark.slow
def test_analyze_a_run_while_it_is_being_trained(tmp_path):
    path = tmp_path / "live.h5"
    cfg = tiny_config(steps=200_000, eval_every=100, checkpoint_every=100)
    trainer = subprocess.Popen([sys.executable, "-m", "groklens", "train", "-q", "--out", str(path),
                                *config_flags(cfg)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               # a suite started in the background (`make test &`) ignores SIGINT and
                               # children inherit that: give the trainer the default handler back
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if path.exists():
                try:
                    if len(Trajectory(path).steps) >= 3:
                        break
                except Exception:  # noqa: BLE001 - the file is being created
                    pass
            time.sleep(0.2)
        assert Trajectory(path).is_live
        out = groklens("analyze", str(path), "--metric", "norms", "--metric", "grokking", "--json", "-q", check=True)
        res = json.loads(out.stdout)
        committed = set(Trajectory(path).steps.tolist())
        assert len(res["norms"]["steps"]) >= 3 and set(res["norms"]["steps"]) <= committed
        assert Trajectory(path).is_live  # the trainer kept going
    finally:
        trainer.send_signal(signal.SIGINT)
        trainer.wait(timeout=60)


def test_summary_mode_is_one_line_per_measure_at_the_phases(tmp_path):
    """`analyze --summary`: each measure at the first, memorization, grokking and last analyzed
    checkpoints, the numbers those of the full JSON; a phase not reached is a dash."""
    path = tmp_path / "r.h5"
    train_tiny(path, steps=400, eval_every=10, checkpoint_every=100, lr=1e-2, train_frac=0.6, weight_decay=3.0)
    full = json.loads(groklens("analyze", str(path), "--metric", "rank", "-q", "--json", check=True).stdout)["rank"]
    key = next(k for k in full if k.startswith("roy_vetterli_centred@blocks"))
    out = groklens("analyze", str(path), "--metric", "rank", "-q", "--summary", check=True).stdout.strip()
    assert len(out.splitlines()) == 1 and out.startswith("effective rank")
    assert f"start {full[key][0]:.4g} (step 0)" in out and f"end {full[key][-1]:.4g} (step 400)" in out
    assert "memorization@0.95 —" in out  # train accuracy stays below 0.95 in 400 steps here
    assert "give one of them" in groklens("analyze", str(path), "--summary", "--json").stderr
