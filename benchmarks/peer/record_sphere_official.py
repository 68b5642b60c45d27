"""Record runs of the sphere paper's own code (the JSONs of benchmarks/peer/sphere_official.py) in
the peer ledger that bounded-sphere's paper rows read (experiments/sphere_official.py):

  python benchmarks/peer/record_sphere_official.py /work/runs/peer/*.json \
      --ledger docs/results/peer/sphere-official.json

Each JSON becomes one checked entry (its log of evaluations and the sha256 of its training pairs;
the pairs and the full history stay out); an entry of the same arm, seed, lr and p is replaced.
Then `groklens reproduce bounded-sphere --scale paper --no-train --results-md docs/RESULTS.md`
writes the rows. A bad file is refused in one line (exit 2) and nothing is written.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from groklens.errors import BadInput
from groklens.experiments.sphere_official import PEER_LEDGER, groklens_split_sha256, official_entry, record
from groklens.experiments.sphere_paper import ARCH
from groklens.fileio import load_json_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", type=Path, nargs="+", help="result JSONs of benchmarks/peer/sphere_official.py")
    ap.add_argument("--ledger", type=Path, default=PEER_LEDGER, help=f"the peer ledger (default {PEER_LEDGER})")
    a = ap.parse_args(argv)
    try:
        entries = [official_entry(load_json_file(path, "sphere_official result"), ARCH) for path in a.runs]
        path = record(a.ledger, entries, ARCH)
    except BadInput as exc:
        print(f"record_sphere_official: {exc}", file=sys.stderr)
        return 2
    for e in entries:
        same = e["train_pairs_sha256"] == groklens_split_sha256(e["p"], e["frac_train"], e["seed"])
        grok = "never" if e["grok_epoch"] is None else f"epoch {e['grok_epoch']} (step {e['grok_epoch'] + 1})"
        print(f"{e['arm']} seed {e['seed']} lr {e['lr']:g}: grokked {grok} of {e['epochs']}; split "
              f"{'=' if same else '!='} groklens' python_shuffle split")
    print(f"recorded {len(entries)} run(s) in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
