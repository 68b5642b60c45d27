"""Prieto et al.'s own code as a peer: its runs on this machine, kept in a small committed ledger
(PEER_LEDGER, docs/results/peer/stablemax-official.json; never a trajectory) that stablemax's
paper rows read beside groklens' runs of the same arms.

`benchmarks/peer/stablemax_official.py` runs one command of their run_main_experiments.sh with
their grokking_experiments.py and writes one JSON; `benchmarks/peer/record_peer.py stablemax`
records those files here. The arms are their commands (ARMS: arm -> figure, command), named as
groklens' paper arms (experiments/stablemax.py) where groklens runs the same setup.

An entry is one run: `arm`, `seed`, `figure`, `command`, `argv` (what ran, after their script's
words), `repo_commit`, `lr`, `p` (their --modulo), `train_fraction`, `epochs`, `log_frequency`,
`grok_epoch` (the first logged epoch with test accuracy >= 0.95, groklens' threshold: their code
has no grokking rule; null if none), `final_test_acc` (their evaluation after the last epoch),
`log` (`epochs`, `train_acc`, `test_acc`, `softmax_collapse`: the share of training rows whose
softmax sum is exactly 1), `cpu_s`, `threads`, `torchvision_stub`, `device`, `recorded`. Their
epoch e is logged after that epoch's step: groklens' step e + 1 (peer.OfficialRun).
Checked on load as experiments/peer.py says, and here: the arm's figure and command, a run that
logged its last multiple of log_frequency, values in range.
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

PEER_LEDGER = LEDGER_DIR / "peer" / "stablemax-official.json"
PEER_REPO = "LucasPrietoAl/grokking-at-the-edge-of-numerical-stability"
# arm -> (figure, command): the command's place in their run_main_experiments.sh
ARMS = {"stablemax": (1, 1), "perp_adamw": (1, 2), "ce_float64": (1, 3)}
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "arm": (str,), "seed": (int,), "figure": (int,), "command": (int,), "argv": (list,), "repo_commit": (str,),
    "lr": (float, int), "p": (int,), "train_fraction": (float,), "epochs": (int,), "log_frequency": (int,),
    "grok_epoch": (int, type(None)), "final_test_acc": (float, int), "log": (dict,), "cpu_s": (float, int),
    "threads": (int,), "torchvision_stub": (bool,), "device": (str,), "recorded": (str,),
}


def grok_epoch(log: dict[str, list]) -> int | None:
    """The first logged epoch with test accuracy >= 0.95 (groklens' threshold), None if none."""
    return next((int(e) for e, acc in zip(log["epochs"], log["test_acc"]) if acc >= GROK_THRESHOLD), None)


def _check(e: dict[str, Any], arms: Mapping[str, Any]) -> str | None:
    if (e["figure"], e["command"]) != ARMS[e["arm"]]:
        f, c = ARMS[e["arm"]]
        return f"'figure', 'command' are {e['figure']}, {e['command']}, not arm {e['arm']}'s {f}, {c}"
    if not (e["epochs"] >= 1 and e["log_frequency"] >= 1 and e["p"] >= 2 and 0 < e["train_fraction"] < 1
            and e["lr"] > 0 and e["threads"] >= 1 and math.isfinite(e["cpu_s"]) and e["cpu_s"] >= 0
            and 0 <= e["final_test_acc"] <= 1):
        return "'epochs', 'log_frequency', 'p', 'train_fraction', 'lr', 'threads', 'cpu_s' or 'final_test_acc' " \
               "out of range"
    return None


PEER = Peer(
    repo=PEER_REPO,
    what="runs of their grokking_experiments.py (benchmarks/peer/stablemax_official.py), recorded by "
         "benchmarks/peer/record_peer.py stablemax; their epoch e is groklens' step e + 1",
    entry_types=ENTRY_TYPES, key=("arm", "seed", "p", "epochs"), order=("arm", "p", "epochs", "seed"),
    log_keys=("epochs", "train_acc", "test_acc", "softmax_collapse"),
    grok_rule=f"test acc >= {GROK_THRESHOLD}", grok_epoch=grok_epoch,
    last_logged=lambda e: (e["epochs"] - 1) // e["log_frequency"] * e["log_frequency"], check=_check)


def official_entry(result: dict[str, Any]) -> dict[str, Any]:
    """The ledger entry of one result JSON of benchmarks/peer/stablemax_official.py (checked)."""
    try:
        where = (result["figure"], result["command"])
        arm = next((a for a, c in ARMS.items() if c == where), None)
        if arm is None:
            raise BadInput(f"figure {where[0]} command {where[1]} is none of the recorded arms "
                           f"({', '.join(f'{a}: figure {f} command {c}' for a, (f, c) in ARMS.items())})")
        args, log = result["args"], result["log"]
        entry = {
            "arm": arm, "seed": result["seed"], "figure": where[0], "command": where[1], "argv": list(result["argv"]),
            "repo_commit": result["repo_commit"], "lr": args["lr"], "p": args["modulo"],
            "train_fraction": float(args["train_fraction"]), "epochs": args["num_epochs"],
            "log_frequency": args["log_frequency"], "grok_epoch": result["grok_epoch"],
            "final_test_acc": round(float(result["final_test_acc"]), 6),  # their line prints a percentage
            "log": {k: list(log[k]) for k in PEER.log_keys},
            "cpu_s": round(float(result["cpu_s"]), 1), "threads": result["threads"],
            "torchvision_stub": result["torchvision_stub"], "device": args["device"],
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"not a result of benchmarks/peer/stablemax_official.py (missing or bad {exc})") from None
    return peer.checked(PEER, entry, ARMS)


def load_official(path: Path = PEER_LEDGER) -> list[dict[str, Any]]:
    """The checked entries of the ledger ([] when the file does not exist)."""
    return peer.load(PEER, path, ARMS)

