"""Record runs of Prieto et al.'s own code (the JSONs of benchmarks/peer/stablemax_official.py) in
the peer ledger that stablemax's paper rows read (experiments/stablemax_official.py):

  python benchmarks/peer/record_stablemax_official.py /work/runs/peer/stablemax/*.json \
      --ledger docs/results/peer/stablemax-official.json

Each JSON becomes one checked entry (its log of evaluations; their model and data stay out); an
entry of the same arm, seed, p and epochs is replaced. Then `groklens reproduce stablemax --scale
paper --no-train --results-md docs/RESULTS.md` writes the rows. A bad file is refused in one line
(exit 2) and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from groklens.errors import BadInput
from groklens.experiments.stablemax_official import PEER_LEDGER, official_entry, record
from groklens.fileio import load_json_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="result JSONs of benchmarks/peer/stablemax_official.py")
    ap.add_argument("--ledger", type=Path, default=PEER_LEDGER, help=f"the peer ledger (default {PEER_LEDGER})")
    a = ap.parse_args(argv)
    try:
        entries = [official_entry(load_json_file(path, "stablemax_official result")) for path in a.runs]
        path = record(a.ledger, entries)
    except BadInput as exc:
        print(f"record_stablemax_official: {exc}", file=sys.stderr)
        return 2
    for e in entries:
        grok = "never" if e["grok_epoch"] is None else f"epoch {e['grok_epoch']} (step {e['grok_epoch'] + 1})"
        print(f"{e['arm']} seed {e['seed']}: test acc >= 0.95 first at {grok} of {e['epochs']}; "
              f"final test acc {e['final_test_acc']:.4f}")
    print(f"recorded {len(entries)} run(s) in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
