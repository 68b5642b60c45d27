"""Grokfast's own code as a peer: its runs on this machine, kept in a small committed ledger
(PEER_LEDGER, docs/results/peer/grokfast-official.json; never a trajectory) that grokfast's paper
rows read beside groklens' runs of the same arms.

`benchmarks/peer/grokfast_official.py` runs one README command of ironjr/grokfast (main.py,
modular multiplication) for a budget of iterations and writes one JSON;
`benchmarks/peer/record_grokfast_official.py` records those files here. The arms are groklens'
paper arms: base, grokfast (EMA), grokfast_ma.

An entry is one run: `arm`, `seed`, `argv` (what ran after `python main.py`), `repo_commit`, `p`,
`epochs` (the budget in iterations: their run's length here; theirs is 300,000),
`steps_per_epoch`, `grok_epoch` (the first logged iteration count with validation accuracy >=
0.95, their README's measure; null if none), `log` (`iterations`, `train_acc`, `val_acc`, after
every epoch), `cpu_s`, `threads`, `device`, `recorded`. Their iteration count is groklens' step.
Checked on load as experiments/peer.py says, and here: the ranges, and a log of every epoch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from groklens.config import GROK_THRESHOLD
from groklens.errors import BadInput
from groklens.experiments import peer
from groklens.experiments.core import LEDGER_DIR
from groklens.experiments.peer import Peer

PEER_LEDGER = LEDGER_DIR / "peer" / "grokfast-official.json"
PEER_REPO = "ironjr/grokfast"
ARMS = ("base", "grokfast", "grokfast_ma")  # groklens' paper arms: their README's commands by --filter
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "arm": (str,), "seed": (int,), "argv": (list,), "repo_commit": (str,), "p": (int,), "epochs": (int,),
    "steps_per_epoch": (int,), "grok_epoch": (int, type(None)), "log": (dict,), "cpu_s": (float, int),
    "threads": (int,), "device": (str,), "recorded": (str,),
}


def grok_iteration(log: dict[str, list]) -> int | None:
    """The first logged iteration count with validation accuracy >= 0.95, None if none."""
    return next((int(i) for i, acc in zip(log["iterations"], log["val_acc"]) if acc >= GROK_THRESHOLD), None)


def _check(e: dict[str, Any], arms: Mapping[str, Any]) -> str | None:
    spe = e["steps_per_epoch"]
    if not (e["p"] >= 2 and spe >= 1 and e["epochs"] >= spe and e["epochs"] % spe == 0 and e["threads"] >= 1
            and math.isfinite(e["cpu_s"]) and e["cpu_s"] >= 0):
        return "'p', 'steps_per_epoch', 'epochs', 'threads' or 'cpu_s' out of range"
    its = e["log"].get("iterations")
    if isinstance(its, list) and its != list(range(spe, e["epochs"] + 1, spe)):
        return f"log iterations are not every epoch's ({spe}, {2 * spe}, ..., {e['epochs']})"
    return None


PEER = Peer(
    repo=PEER_REPO,
    what="runs of their main.py (benchmarks/peer/grokfast_official.py), recorded by "
         "benchmarks/peer/record_grokfast_official.py; 'epochs' is the run's budget in iterations, and their "
         "iteration count is groklens' step",
    entry_types=ENTRY_TYPES, key=("arm", "seed", "p", "epochs"), order=("arm", "p", "epochs", "seed"),
    log_keys=("iterations", "train_acc", "val_acc"), grok_rule=f"validation acc >= {GROK_THRESHOLD}",
    grok_epoch=grok_iteration, last_logged=lambda e: e["epochs"], check=_check,
    accuracy_key="val_acc", step_offset=0)


def official_entry(result: dict[str, Any]) -> dict[str, Any]:
    """The ledger entry of one result JSON of benchmarks/peer/grokfast_official.py (checked)."""
    try:
        entry = {
            "arm": result["arm"], "seed": result["seed"], "argv": list(result["argv"]),
            "repo_commit": result["repo_commit"], "p": result["p"], "epochs": result["budget"],
            "steps_per_epoch": result["steps_per_epoch"], "grok_epoch": result["grok_iteration"],
            "log": {k: list(result["log"][k]) for k in PEER.log_keys},
            "cpu_s": round(float(result["cpu_s"]), 1), "threads": result["threads"], "device": result["device"],
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"not a result of benchmarks/peer/grokfast_official.py (missing or bad {exc})") from None
    return peer.checked(PEER, entry, ARMS)


def load_official(path: Path = PEER_LEDGER) -> list[dict[str, Any]]:
    """The checked entries of the ledger ([] when the file does not exist)."""
    return peer.load(PEER, path, ARMS)

