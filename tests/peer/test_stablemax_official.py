"""Prieto et al.'s own code as a peer (benchmarks/peer/stablemax_official.py): the commands of
their run_main_experiments.sh are groklens' paper arms, and their grokking_experiments.py runs
here (tiny sizes) with its log read back. Skipped when their repository is not here: set
GROKLENS_STABLEMAX_REPO to a checkout of LucasPrietoAl/grokking-at-the-edge-of-numerical-stability
(or its git directory)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import peer_script

REPO = Path(os.environ.get("GROKLENS_STABLEMAX_REPO",
                           "/work/.mirror/LucasPrietoAl+grokking-at-the-edge-of-numerical-stability/repo"))
pytestmark = pytest.mark.skipif(not REPO.exists(), reason="Prieto et al.'s repository is not here")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer" / "stablemax_official.py"
TINY = ["--modulo", "11", "--input_size", "11", "--hidden_sizes", "16", "16"]


def _peer():
    return peer_script("stablemax_official")


def _flags(argv: list[str]) -> dict[str, str | bool]:
    """--flag value / --switch pairs of one command (argparse's last value wins)."""
    out: dict[str, str | bool] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else "--"
            out[a[2:]] = True if nxt.startswith("--") else nxt
    return out


def test_groklens_paper_arms_are_the_commands_of_their_figure_1():
    from groklens.experiments.stablemax import PAPER, PAPER_ARMS, RUN_LENGTH

    peer = _peer()
    stablemax, perp, f64 = (_flags(c) for c in peer.commands(REPO)[1])
    assert PAPER["train_frac"] * 113 ** 2 == int(float(stablemax["train_fraction"]) * 113 ** 2)  # their split size
    for theirs, arm in ((stablemax, "stablemax"), (f64, "ce_float64")):
        ours = {**PAPER, **PAPER_ARMS[arm][0]}
        assert float(theirs["lr"]) == ours["lr"] and int(theirs["num_epochs"]) == ours["steps"] == RUN_LENGTH
        assert float(theirs["beta2"] if "beta2" in theirs else 0.99) == ours["betas"][1]  # their default beta2
    assert stablemax["loss_function"] == "stablemax" and f64["softmax_precision"] == "64"
    assert perp["orthogonal_gradients"] is True and int(perp["num_epochs"]) == PAPER_ARMS["perp_adamw"][0]["steps"]
    fig6 = [_flags(c) for c in peer.commands(REPO)[6]]
    assert [c.get("use_transformer", False) for c in fig6[:3]] == [True, True, True]


def test_their_perp_adamw_runs_here_and_its_log_is_read_back():
    out = _peer().run(REPO, 1, 2, seed=3, epochs=30, extra=TINY)
    assert out["epochs"] == 30 and out["args"]["modulo"] == 11 and out["args"]["orthogonal_gradients"]
    log = out["log"]
    assert log["epochs"] == [0, 10, 20]  # their --log_frequency 10, after the step of each logged epoch
    assert all(0 <= x <= 1 for k in ("train_acc", "test_acc", "softmax_collapse") for x in log[k])
    first = next((e for e, acc in zip(log["epochs"], log["test_acc"]) if acc >= 0.95), None)
    assert out["grok_epoch"] == first and 0 <= out["final_test_acc"] <= 1 and out["cpu_s"] > 0
    # the same seed is the same run (their code seeds random and torch from --seed)
    assert _peer().run(REPO, 1, 2, seed=3, epochs=30, extra=TINY)["log"] == log


def test_their_figure_6_transformer_runs_here():
    out = _peer().run(REPO, 6, 3, seed=1, epochs=2, extra=["--modulo", "11"])
    assert out["args"]["use_transformer"] and out["log"]["epochs"] == [0]


def test_a_changed_script_or_a_missing_repository_is_one_line(tmp_path, capsys):
    peer = _peer()
    assert peer.main(["--repo", str(tmp_path / "nowhere"), "--list"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    git = ["git", f"--git-dir={REPO}"] if (REPO / "HEAD").is_file() else ["git", "-C", str(REPO)]
    for name in peer.FILES + (peer.SCRIPT,):
        src = REPO / name
        text = src.read_text() if src.is_file() else subprocess.run([*git, "show", f"HEAD:{name}"], capture_output=True,
                                                                      text=True, check=True).stdout
        (checkout / name).write_text(text.replace("torch.set_num_threads(5)", "torch.set_num_threads(8)"))
    out = tmp_path / "r.json"
    args = ["--figure", "1", "--command", "2", "--seed", "1", "--out", str(out)]
    assert peer.main(["--repo", str(checkout), *args]) == 2
    assert "has changed" in capsys.readouterr().err and not out.exists()
