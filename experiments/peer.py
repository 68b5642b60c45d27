"""A paper's own code as a peer: its runs on this machine, kept in a small committed ledger
(docs/results/peer/NAME.json, never a trajectory) that the paper rows read beside groklens' runs.

A `Peer` says what one peer's entries hold and how they are checked: its fields and their types,
the fields that name one run (one entry each), its grokking rule, the last epoch its log must
reach, and its own checks. Each peer's module (sphere_official.py, stablemax_official.py) turns
the JSON of its script in benchmarks/peer/ into entries and declares its Peer. Every entry has at
least `arm`, `seed`, `epochs`, `grok_epoch` (null if none) and `log` (lists of the logged `epochs`
and the values at them, each in [0, 1]).

Checked on load (`load`; BadInput naming the file, the entry and the field): every field of its
type, the arm one of the arms given, the log's epochs increasing from >= 0 and ending at the last
logged epoch of a finished run, its values in [0, 1], `grok_epoch` what the peer's rule gives on
the log (recomputed), the peer's own checks, and one entry per run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groklens.analyses.phases import PhaseTimes
from groklens.config import GROK_THRESHOLD
from groklens.errors import BadInput

PEER_FORMAT = 1
Arms = Mapping[str, Any]


@dataclass(frozen=True)
class Peer:
    repo: str  # the peer's repository, owner/name
    what: str  # the ledger's "what": which script ran the runs, which recorded them, how epochs read
    entry_types: dict[str, tuple[type, ...]]  # every field of an entry and the types it may hold
    key: tuple[str, ...]  # the fields that name one run: one entry per key
    order: tuple[str, ...]  # the order of the saved entries
    log_keys: tuple[str, ...]  # the log's lists: when (epochs or iterations) first, then values in [0, 1]
    grok_rule: str  # the grokking rule in words ("test acc > 0.95")
    grok_epoch: Callable[[dict[str, list]], int | None]  # that rule on a log
    last_logged: Callable[[dict[str, Any]], int]  # the last epoch a finished run logs
    check: Callable[[dict[str, Any], Arms], str | None]  # the peer's own checks of an entry
    accuracy_key: str = "test_acc"  # the log's held-out accuracy
    # groklens' step of a logged time t is t + step_offset: 1 where they log epoch e after its
    # step (the run has then taken e + 1 steps), 0 where they log the iterations taken
    step_offset: int = 1


def entry_problem(peer: Peer, e: dict[str, Any], arms: Arms) -> str | None:
    """What is wrong with one entry (the module docstring; `arms`: the peer's arms), or None."""
    for key, kinds in peer.entry_types.items():
        v = e.get(key)
        if key not in e or not isinstance(v, kinds) or isinstance(v, bool) and bool not in kinds:
            found = "missing" if key not in e else repr(v)[:60]
            return f"{key!r} is {found}, not {' or '.join(k.__name__ for k in kinds)}"
    if e["arm"] not in arms:
        return f"'arm' is {e['arm']!r}, not one of {', '.join(arms)}"
    problem = peer.check(e, arms)
    if problem:
        return problem
    log = e["log"]
    if set(log) != set(peer.log_keys) or not all(isinstance(v, list) for v in log.values()):
        return f"'log' is not {{{', '.join(peer.log_keys)}}} lists"
    ep = log[peer.log_keys[0]]
    if not ep or any(len(log[k]) != len(ep) for k in peer.log_keys):
        return "'log' lists are empty or of different lengths"
    last = peer.last_logged(e)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ep) or ep != sorted(set(ep)) \
            or ep[0] < 0 or ep[-1] != last:
        return f"log {peer.log_keys[0]} are not increasing, ending at the run's last logged one ({last})"
    for key in peer.log_keys[1:]:
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= 1 for x in log[key]):
            return f"log {key} holds a value that is not in [0, 1]"
    want = peer.grok_epoch(log)
    if e["grok_epoch"] != want:
        return f"'grok_epoch' is {e['grok_epoch']}, but their rule ({peer.grok_rule}) on the log gives {want}"
    return None


def checked(peer: Peer, entry: dict[str, Any], arms: Arms) -> dict[str, Any]:
    """`entry`, or BadInput naming its arm, seed and what is wrong."""
    problem = entry_problem(peer, entry, arms)
    if problem:
        raise BadInput(f"{entry.get('arm')} seed {entry.get('seed')}: {problem}")
    return entry


def load(peer: Peer, path: Path, arms: Arms) -> list[dict[str, Any]]:
    """The checked entries of a peer ledger ([] when the file does not exist)."""
    from groklens.fileio import load_json_file

    path = Path(path)
    if not path.exists():
        return []
    data = load_json_file(path, "peer ledger")
    if not isinstance(data, dict) or data.get("format") != PEER_FORMAT or not isinstance(data.get("runs"), list) \
            or data.get("peer") != peer.repo:
        raise BadInput(f"{path} is not a peer ledger of {peer.repo}'s code (format {PEER_FORMAT})")
    seen: dict[tuple, int] = {}
    for i, e in enumerate(data["runs"]):
        problem = entry_problem(peer, e, arms) if isinstance(e, dict) else f"is a {type(e).__name__}, not a mapping"
        if problem:
            raise BadInput(f"{path}: entry {i}: {problem}")
        key = tuple(e[k] for k in peer.key)
        if key in seen:
            named = ", ".join(f"{k} {v}" for k, v in zip(peer.key, key))
            raise BadInput(f"{path}: entry {i} records {named} again, as entry {seen[key]} does: one run counted twice")
        seen[key] = i
    return data["runs"]


def save(peer: Peer, path: Path, entries: list[dict[str, Any]]) -> Path:
    """Write the ledger atomically, one entry per run, in the peer's order."""
    from groklens.fileio import write_text_atomic

    data = {"format": PEER_FORMAT, "peer": peer.repo, "what": peer.what,
            "runs": sorted(entries, key=lambda e: tuple(e[k] for k in peer.order))}
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=1) + "\n")


def record(peer: Peer, path: Path, entries: list[dict[str, Any]], arms: Arms) -> Path:
    """Add entries to the ledger at `path` (an entry of the same run is replaced)."""
    keep = {tuple(e[k] for k in peer.key): e for e in load(peer, path, arms)}
    keep.update({tuple(e[k] for k in peer.key): e for e in entries})
    return save(peer, path, list(keep.values()))


class OfficialRun(PhaseTimes):
    """An entry with the attributes the rows read (as ledger.LedgerRun), in groklens' steps (the
    peer's step_offset: an epoch e logged after its step is step e + 1, and a run of E epochs
    ends at step E). Memorization is not read from their runs (None).

    `stop`: (stop_after_grok, stop_at_event), the groklens stop rule to read them by: their codes
    log to a fixed epoch count where groklens stops a run soon after grokking, so the collapse is
    read over the log up to where that rule would have ended it (the window a groklens run beside
    them observes); `collapse_whole_log` keeps the reading to the log's end."""

    def __init__(self, entry: dict[str, Any], peer: Peer, stop: tuple[int, bool] | None = None):
        from groklens.analyses.grokking import collapse, stop_rule_index

        log, off = entry["log"], peer.step_offset
        steps = [t + off for t in log[peer.log_keys[0]]]
        self.entry, self.seed = entry, entry["seed"]
        self.name = f"official_{entry['arm']}_s{entry['seed']}"
        self.memorization = None
        self.grokking = None if entry["grok_epoch"] is None else entry["grok_epoch"] + off
        self.last_step = entry["epochs"]
        # their last evaluation where the entry has one after the last logged time
        self.final_test_acc = float(entry.get("final_test_acc", log[peer.accuracy_key][-1]))
        # crossing and fall-back read at >= 0.95 on the log (a peer's rule may be > 0.95: the same
        # unless an accuracy is 0.95 exactly)
        acc = log[peer.accuracy_key]
        self.collapse_whole_log = collapse({"step": steps, "test_acc": acc}, GROK_THRESHOLD)
        end = None if stop is None else stop_rule_index(acc, GROK_THRESHOLD, 1, *stop)
        self.collapse = self.collapse_whole_log if end is None else \
            collapse({"step": steps[:end + 1], "test_acc": acc[:end + 1]}, GROK_THRESHOLD)
        self.collapsed = bool(self.collapse["collapsed"])
        self.values, self.phase_notes, self.wall_s = {}, {}, None
        self.split_sha256 = entry.get("train_pairs_sha256")

    def value(self, key: str, phase: str) -> None:
        return None
