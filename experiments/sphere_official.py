"""The sphere paper's own code as a peer: its runs, kept in a small committed ledger beside groklens'.

`benchmarks/peer/sphere_official.py` trains one arm with the official notebooks
(AlperYildirim1/geometric-grokking) and writes one JSON per run; `benchmarks/peer/record_sphere_official.py`
records those files in PEER_LEDGER (docs/results/peer/sphere-official.json; never a trajectory).
bounded-sphere's paper rows read it (sphere_paper.py): the official code's grok steps beside
groklens' runs of the same seeds and split, and beside the paper's table.

An entry is one run: `arm` (a key of the arms given: sphere_paper.ARCH), `seed`, `notebook`, `repo_commit`, `lr`,
`weight_decay`, `p`, `frac_train`, `epochs`, `grok_epoch` (theirs: the first logged epoch with test
accuracy > 0.95, strictly; null if none), `log` (their logged evaluations: `epochs`, `train_acc`,
`test_acc`), `train_pairs_sha256` (sha256 of their training pairs, sorted, as JSON), `cpu_s`,
`device`, `recorded`. Their epoch e is evaluated after the optimizer step of epoch e (0-based), so
it is groklens' step e + 1 (OfficialRun reads it so).

Checked on load (`load_official`, by experiments/peer.py; BadInput naming the file, the entry and
the field): every field of its type, the weight decay the arm's (ARCH), the log's epochs
increasing within [0, epochs - 1] and ending at epochs - 1 (the run finished), accuracies in
[0, 1], `grok_epoch` equal to the first logged epoch with test accuracy > 0.95 in the log (their
rule, recomputed), and one entry per (arm, seed, lr, p).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from groklens.errors import BadInput
from groklens.experiments import peer
from groklens.experiments.core import LEDGER_DIR
from groklens.experiments.peer import Peer

PEER_LEDGER = LEDGER_DIR / "peer" / "sphere-official.json"
PEER_REPO = "AlperYildirim1/geometric-grokking"
THEIR_GROK = 0.95  # their grok epoch: the first logged test accuracy > this (strictly)
ENTRY_TYPES: dict[str, tuple[type, ...]] = {
    "arm": (str,), "seed": (int,), "notebook": (str,), "repo_commit": (str,), "lr": (float, int),
    "weight_decay": (float, int), "p": (int,), "frac_train": (float,), "epochs": (int,),
    "grok_epoch": (int, type(None)), "log": (dict,), "train_pairs_sha256": (str,), "cpu_s": (float, int),
    "device": (str,), "recorded": (str,),
}


def pairs_sha256(pairs: list[tuple[int, int]] | list[list[int]]) -> str:
    """sha256 of a set of (a, b) pairs: sorted, as compact JSON (equal sets, equal hashes)."""
    text = json.dumps(sorted([int(a), int(b)] for a, b in pairs), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def groklens_split_sha256(p: int, frac_train: float, seed: int) -> str:
    """pairs_sha256 of the training pairs of groklens' add task with split_rule python_shuffle and
    data_seed = seed (the *_papersplit arms' split of that seed)."""
    from groklens.config import RunConfig
    from groklens.tasks import TASKS

    cfg = RunConfig.from_dict({"task": "add", "p": p, "train_frac": frac_train, "data_seed": seed,
                               "split_rule": "python_shuffle", "device": "cpu"})
    data = TASKS.get("add").build(cfg)
    return pairs_sha256(data.inputs[data.train_idx][:, :2].tolist())


def their_grok_epoch(log: dict[str, list]) -> int | None:
    """Their rule on their log: the first logged epoch with test accuracy > 0.95, None if none."""
    return next((int(e) for e, acc in zip(log["epochs"], log["test_acc"]) if acc > THEIR_GROK), None)


def official_entry(result: dict[str, Any], arms: Mapping[str, dict[str, Any]], device: str = "cpu") -> dict[str, Any]:
    """The ledger entry of one result JSON of benchmarks/peer/sphere_official.py, checked against
    `arms` (arm -> config fields, sphere_paper.ARCH)."""
    try:
        hist = result["history"]
        entry = {
            "arm": result["arm"], "seed": result["seed"], "notebook": result["notebook"],
            "repo_commit": result["repo_commit"], "lr": result["lr"], "weight_decay": result["weight_decay"],
            "p": result["p"], "frac_train": float(result.get("frac_train", 0.3)),  # their FRAC_TRAIN
            "epochs": result["epochs"],
            # their train_model returns ">N" for a run that never crossed
            "grok_epoch": result["grok_epoch"] if isinstance(result["grok_epoch"], int) else None,
            "log": {k: list(hist[k]) for k in ("epochs", "train_acc", "test_acc")},
            "train_pairs_sha256": pairs_sha256(result["train_pairs"]),
            "cpu_s": round(float(result["cpu_s"]), 1), "device": str(result.get("device", device)),
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"not a result of benchmarks/peer/sphere_official.py (missing or bad {exc})") from None
    return peer.checked(PEER, entry, arms)


def _check(e: dict[str, Any], arms: Mapping[str, dict[str, Any]]) -> str | None:
    """The sphere peer's own checks: the arm's weight decay, the ranges, the split's digest."""
    if e["weight_decay"] != arms[e["arm"]]["weight_decay"]:
        return f"'weight_decay' is {e['weight_decay']!r}, not arm {e['arm']}'s {arms[e['arm']]['weight_decay']!r}"
    if not (e["epochs"] >= 1 and e["p"] >= 2 and 0 < e["frac_train"] < 1 and math.isfinite(e["cpu_s"])
            and e["cpu_s"] >= 0 and e["lr"] > 0):
        return "'epochs', 'p', 'frac_train', 'lr' or 'cpu_s' out of range"
    if not re.fullmatch(r"[0-9a-f]{64}", e["train_pairs_sha256"]):
        return "'train_pairs_sha256' is not a sha256 hex digest"
    return None


PEER = Peer(
    repo=PEER_REPO,
    what="runs of the official notebooks (benchmarks/peer/sphere_official.py), recorded by "
         "benchmarks/peer/record_sphere_official.py; their epoch e is groklens' step e + 1",
    entry_types=ENTRY_TYPES, key=("arm", "seed", "lr", "p"), order=("arm", "lr", "p", "seed"),
    log_keys=("epochs", "train_acc", "test_acc"), grok_rule=f"test acc > {THEIR_GROK}", grok_epoch=their_grok_epoch,
    last_logged=lambda e: e["epochs"] - 1, check=_check)


def load_official(path: Path, arms: Mapping[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The checked entries of the sphere peer ledger ([] when the file does not exist)."""
    return peer.load(PEER, path, arms)


def record(path: Path, entries: list[dict[str, Any]], arms: Mapping[str, dict[str, Any]]) -> Path:
    """Add entries to the ledger at `path` (an entry of the same arm, seed, lr and p is replaced)."""
    return peer.record(PEER, path, entries, arms)


# ---------------------------------------------------------------------- their FVE on models they trained
FVE_DIR = LEDGER_DIR / "peer" / "sphere-fve"
FVE_MODELS = ("spherical_nowd", "spherical_wd", "layernorm")  # Fourier_Analysis_Last's three models


def load_official_fve(directory: Path = FVE_DIR) -> list[dict[str, Any]]:
    """The readings of models their Fourier_Analysis_Last trained and read
    (`benchmarks/peer/sphere_fve_official.py --train MODEL --seed S`), one per `official_*.json` in
    `directory`: model_type, seed, lr, the checkpoint's test accuracy (their stop: the first logged
    epoch with test accuracy >= 0.99), their mean of ten U/V values (a fraction) and groklens'
    fve_ls_top5 of the same weights. BadInput names a file that is not one."""
    out = []
    for path in sorted(directory.glob("official_*.json")):
        try:
            d = json.loads(path.read_text())
            (c,) = d["checkpoints"]
            e = {"model_type": d["model_type"], "seed": d["seed"], "lr": d["lr"], "test_acc": c["test_acc"],
                 "fve": c["theirs"]["fve_mean10_pct"] / 100, "groklens_fve": c["groklens"]["fve_ls_top5"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{path}: not a reading of sphere_fve_official.py --train ({type(exc).__name__}: {exc})") \
                from None
        if d.get("model") != "official-trained" or e["model_type"] not in FVE_MODELS:
            raise BadInput(f"{path}: model {d.get('model')!r} / {e['model_type']!r} is not a model their code trained")
        bad = [k for k in ("test_acc", "fve", "groklens_fve")
               if not (isinstance(e[k], (int, float)) and math.isfinite(e[k]) and 0 <= e[k] <= 1)]
        if bad or not isinstance(e["seed"], int):
            raise BadInput(f"{path}: {', '.join(bad) or 'seed'} out of range")
        out.append(e)
    return out
