"""Grokfast's own code as a peer (benchmarks/peer/grokfast_official.py): the README's commands are
groklens' paper arms, and their main.py runs here (tiny sizes) with its log read back. Skipped
when their repository is not here: set GROKLENS_GROKFAST_REPO to a checkout of ironjr/grokfast
(or its git directory)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import peer_script

REPO = Path(os.environ.get("GROKLENS_GROKFAST_REPO", "/work/.mirror/ironjr+grokfast/repo"))
pytestmark = pytest.mark.skipif(not REPO.exists(), reason="Grokfast's repository is not here")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer" / "grokfast_official.py"
RECORDER = SCRIPT.with_name("record_peer.py")


def _script(path: Path):
    return peer_script(path.stem)


def test_groklens_paper_arms_are_the_readme_commands():
    from groklens.experiments.grokfast import PAPER
    from groklens.experiments.pipeline import get_experiment

    cmds = _script(SCRIPT).commands(REPO)
    plan = get_experiment("grokfast").plan(get_experiment("grokfast").scales["paper"], "paper")
    for arm, argv in cmds.items():
        flags = dict(zip(argv[::2], argv[1::2]))
        ours = {**PAPER, **plan.variants[arm]}
        assert float(flags.get("--weight_decay", 0)) == ours["weight_decay"]
        if arm != "base":
            assert float(flags["--lamb"]) == ours["grokfast_lambda"]
            assert ours["grokfast_filter"] == flags["--filter"]
    assert float(dict(zip(cmds["grokfast"][::2], cmds["grokfast"][1::2]))["--alpha"]) == \
        plan.variants["grokfast"]["grokfast_alpha"]
    assert int(dict(zip(cmds["grokfast_ma"][::2], cmds["grokfast_ma"][1::2]))["--window_size"]) == \
        plan.variants["grokfast_ma"]["grokfast_window"]


def test_their_code_runs_here_and_its_log_is_recorded(tmp_path, capsys):
    from groklens.experiments.grokfast_official import load_official

    peer = _script(SCRIPT)
    out = tmp_path / "r.json"
    assert peer.main(["--repo", str(REPO), "--arm", "grokfast", "--seed", "3", "--budget", "100", "--set", "--p 7",
                      "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    # p=7: 42 pairs, 21 for training, one batch an epoch, so their log has every iteration 1..100
    assert result["steps_per_epoch"] == 1 and result["log"]["iterations"] == list(range(1, 101))
    first = next((i for i, a in zip(result["log"]["iterations"], result["log"]["val_acc"]) if a >= 0.95), None)
    assert result["grok_iteration"] == first and result["argv"][-2:] == ["--p", "7"]
    ledger = tmp_path / "l.json"
    assert _script(RECORDER).main(["grokfast", str(out), "--ledger", str(ledger)]) == 0
    (entry,) = load_official(ledger)
    assert entry["epochs"] == 100 and entry["log"]["val_acc"] == result["log"]["val_acc"]
    capsys.readouterr()
    assert peer.main(["--repo", str(REPO), "--arm", "base", "--seed", "1", "--budget", "150", "--set", "--p 7",
                      "--out", str(tmp_path / "x.json")]) == 2
    assert "multiple of 100" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
