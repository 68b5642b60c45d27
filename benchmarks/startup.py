"""Start-up cost of the commands researchers wait for, as ratios to `python -c "import torch"`.

Run by hand: `python benchmarks/startup.py [--repeat 3]`. In one process tree it times, as
fresh processes, a 1-step tiny `groklens train`, `groklens analyze` of one checkpoint (default
measures, recomputed), `groklens info`, `groklens --help` and `python -c "import torch"`; each
command runs `--repeat` times, interleaved (one round runs every command once) so machine load
hits them alike, and the best time counts. Ratios to the torch import are the reading on a busy
machine; the seconds are printed for context. `--importtime CMD` prints the slowest imports of
one of the commands instead (`python -X importtime`).

Targets (issue 18): 1-step train within 1.5x of the torch import; info and --help under 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = ["--p", "11", "--train-frac", "0.5", "--d-model", "16", "--n-heads", "2", "--d-head", "8",
        "--d-mlp", "32", "--device", "cpu"]


CLI = [sys.executable, "-m", "groklens"]


def train_cmd(out: Path, steps: int, every: int) -> list[str]:
    return CLI + ["train", "-q", "--force", "-o", str(out), *TINY, "--steps", str(steps),
                  "--eval-every", str(every), "--checkpoint-every", str(every)]


def commands(tmp: Path) -> dict[str, list[str]]:
    run = str(tmp / "run.h5")
    return {
        "import torch": [sys.executable, "-c", "import torch"],
        "train 1 step": train_cmd(tmp / "t.h5", 1, 1),
        "analyze 1 ckpt": CLI + ["analyze", run, "-q", "--checkpoints", "20", "--recompute"],
        "info": CLI + ["info", run],
        "--help": CLI + ["--help"],
    }


def timed(cmd: list[str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return elapsed


def top_imports(cmd: list[str], n: int = 15) -> list[tuple[float, str]]:
    """The slowest top-level and second-level imports of `cmd` (cumulative seconds)."""
    proc = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m[2]) <= 2:
            rows.append((int(m[1]) / 1e6, m[2] + m[3]))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the best time of each command counts")
    ap.add_argument("--importtime", metavar="NAME", default=None,
                    help="print the slowest imports of one command (e.g. 'train 1 step') and exit")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        cmds = commands(tmp)
        # the run that analyze and info read: 20 steps, checkpoints at 0, 10, 20
        subprocess.run(train_cmd(tmp / "run.h5", 20, 10), check=True, capture_output=True)
        if args.importtime:
            for secs, name in top_imports(cmds[args.importtime]):
                print(f"{secs:8.3f} s  {name}")
            return
        best = {name: float("inf") for name in cmds}
        for _ in range(args.repeat):
            for name, cmd in cmds.items():
                best[name] = min(best[name], timed(cmd))
    base = best["import torch"]
    result = {name: {"best_s": round(s, 3), "ratio_to_torch": round(s / base, 2)} for name, s in best.items()}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"best of {args.repeat}, ratio to `python -c \"import torch\"` ({base:.2f} s here)")
    for name, r in result.items():
        print(f"  {name:<16} {r['ratio_to_torch']:6.2f}x   ({r['best_s']:.2f} s)")


if __name__ == "__main__":
    main()
