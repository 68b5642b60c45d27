"""Record runs of a paper's own code (the JSONs of benchmarks/peer/PEER_official.py) in the peer
ledger that the paper rows read (groklens/experiments/PEER_official.py), for the peers
`stablemax` (Prieto et al.) and `grokfast` (Lee et al.):

  python benchmarks/peer/record_peer.py stablemax /work/runs/peer/stablemax/*.json \
      --ledger docs/results/peer/stablemax-official.json
  python benchmarks/peer/record_peer.py grokfast /work/runs/peer/grokfast/*.json \
      --ledger docs/results/peer/grokfast-official.json

Each JSON becomes one checked entry (its log of evaluations; their model and data stay out); an
entry of the same run (arm, seed, p and length) is replaced. Then `groklens reproduce EXPERIMENT
--scale paper --no-train --results-md docs/RESULTS.md` writes the rows. A bad file is refused in
one line (exit 2) and nothing is written. (The sphere paper's peer has its own recorder,
record_sphere_official.py: its entries also carry the split's digest.)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from groklens.errors import BadInput
from groklens.experiments import peer
from groklens.fileio import load_json_file

PEERS = {"stablemax": "groklens.experiments.stablemax_official", "grokfast": "groklens.experiments.grokfast_official"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("peer", choices=sorted(PEERS))
    ap.add_argument("runs", type=Path, nargs="+", help="result JSONs of benchmarks/peer/PEER_official.py")
    ap.add_argument("--ledger", type=Path, help="the peer ledger (default: the committed one of that peer)")
    a = ap.parse_args(argv)
    mod = importlib.import_module(PEERS[a.peer])
    try:
        entries = [mod.official_entry(load_json_file(path, f"{a.peer}_official result")) for path in a.runs]
        path = peer.record(mod.PEER, a.ledger or mod.PEER_LEDGER, entries, mod.ARMS)
    except BadInput as exc:
        print(f"record_peer: {exc}", file=sys.stderr)
        return 2
    for e in entries:
        t = e["grok_epoch"]
        first = "never" if t is None else f"{t:,} (groklens step {t + mod.PEER.step_offset:,})"
        print(f"{e['arm']} seed {e['seed']}: {mod.PEER.grok_rule} first at {first} of {e['epochs']:,}")
    print(f"recorded {len(entries)} run(s) in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
