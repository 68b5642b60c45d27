"""Run one of Grokfast's README commands for modular multiplication with their own code
(ironjr/grokfast main.py), on this machine, as a peer of groklens' grokfast paper arms (issue 38).
Not part of the package: the code run is theirs.

The commands are read from their README: the `python main.py ...` lines of its modular
multiplication block (the baseline written there as a comment, `# python main.py --label test #
Baseline.`), one per arm: base (no filter), grokfast (--filter ema), grokfast_ma (--filter ma),
groklens' names. Their main.py and grokfast.py run unchanged, in a temporary directory (they
write results/ there), with `--seed S` and `--budget B` appended: their default budget is 300,000
iterations with no stop, so a run is shortened to B, which must be a whole number of 100 epochs
(they save their log every 100 epochs). Threads: OMP_NUM_THREADS (default 1); their device is
CUDA when there is one, else the CPU. Their log (results/res_*.pt, read as plain data) holds, per
epoch, the iterations taken and the train and validation accuracy (evaluated after the epoch's
updates); `grok_iteration` is the first logged iteration count with validation accuracy >= 0.95,
their README's "iterations to 95% validation accuracy", and their iteration count is groklens'
step.

  python benchmarks/peer/grokfast_official.py --repo REPO --arm grokfast --seed 1 --budget 3000 --out r.json
  python benchmarks/peer/grokfast_official.py --repo REPO --list
REPO: a checkout of the repository, or the git directory `fetch` gives.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_repo import head_commit, read  # noqa: E402  (benchmarks/peer/peer_repo.py)

FILES = ("main.py", "grokfast.py")
GROK = 0.95  # their README's "95% validation accuracy" (groklens' GROK_THRESHOLD)
FILTER_ARM = {"none": "base", "ema": "grokfast", "ma": "grokfast_ma"}  # their --filter -> groklens' arm
EPOCHS_PER_SAVE = 100  # main.py saves its log when (epoch + 1) % 100 == 0


def commands(repo: Path) -> dict[str, list[str]]:
    """arm -> the README's command for modular multiplication, as argv after `python main.py`."""
    out: dict[str, list[str]] = {}
    for line in read(repo, "README.md").splitlines():
        m = re.fullmatch(r"#?\s*python main\.py (.*)", line.strip())
        if m:
            argv = shlex.split(m.group(1), comments=True)
            flags = dict(zip(argv[::2], argv[1::2]))
            out[FILTER_ARM[flags.get("--filter", "none")]] = argv
    if set(out) != set(FILTER_ARM.values()):
        raise SystemExit(f"grokfast_official: the README's main.py commands are not one per filter ({sorted(out)})")
    return out


def steps_per_epoch(p: int, batch_size: int) -> int:
    """Their epoch: the training half of the p (p - 1) pairs in batches (main.py)."""
    return math.ceil((p * (p - 1)) // 2 / batch_size)


def run(repo: Path, arm: str, seed: int, budget: int, extra: list[str] | None = None, threads: int = 1) -> dict:
    theirs = commands(repo)[arm]
    argv = [*theirs, "--seed", str(seed), "--budget", str(budget), *(extra or [])]
    flags = dict(zip(argv[::2], argv[1::2]))  # argparse keeps the last of a repeated flag, as dict() does
    spe = steps_per_epoch(int(flags.get("--p", 97)), int(flags.get("--batch_size", 512)))
    if budget % (EPOCHS_PER_SAVE * spe):
        raise SystemExit(f"grokfast_official: --budget must be a multiple of {EPOCHS_PER_SAVE * spe} iterations "
                         f"({EPOCHS_PER_SAVE} epochs of {spe}: their log is saved every {EPOCHS_PER_SAVE} epochs)")
    with tempfile.TemporaryDirectory(prefix="grokfast_official_") as tmp:
        work = Path(tmp)
        for name in FILES:
            (work / name).write_text(read(repo, name))
        (work / "results").mkdir()
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TQDM_DISABLE": "1", "MPLBACKEND": "Agg"}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        out = subprocess.run([sys.executable, "main.py", *argv], cwd=work, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode:
            raise SystemExit(f"grokfast_official: their run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
        (res,) = work.glob("results/res_*.pt")
        log = torch.load(res, weights_only=True)  # lists of numbers: nothing in it runs code
    its = [int(i) for i in log["its"]]
    if not its or its[-1] != budget // spe * spe:
        raise SystemExit(f"grokfast_official: their log ends at iteration {its[-1] if its else None}, not at the "
                         f"budget's {budget // spe * spe}")
    grok = next((i for i, acc in zip(its, log["val_acc"]) if acc >= GROK), None)
    return {"arm": arm, "seed": seed, "their_command": theirs, "argv": argv, "repo_commit": head_commit(repo),
            "p": int(flags.get("--p", 97)), "budget": budget, "steps_per_epoch": spe, "threads": threads,
            "device": "cuda" if torch.cuda.is_available() else "cpu", "grok_iteration": grok,
            "log": {"iterations": its, "train_acc": [float(x) for x in log["train_acc"]],
                    "val_acc": [float(x) for x in log["val_acc"]]},
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--list", action="store_true", help="print the README's commands and stop")
    ap.add_argument("--arm", choices=sorted(FILTER_ARM.values()))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--budget", type=int, help="iterations (theirs: 300,000), a whole number of 100 epochs")
    ap.add_argument("--set", default="", help="more of their flags, appended as given (tests: a small --p)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if not a.repo.exists():
        print(f"grokfast_official: {a.repo} does not exist", file=sys.stderr)
        return 2
    try:
        if a.list:
            for arm, c in commands(a.repo).items():
                print(f"{arm}: python main.py {' '.join(c)}")
            return 0
        if None in (a.arm, a.seed, a.budget, a.out):
            ap.error("--arm, --seed, --budget and --out are needed (or --list)")
        result = run(a.repo, a.arm, a.seed, a.budget, shlex.split(a.set), a.threads)
    except SystemExit as exc:  # a changed README, a bad budget, or their run failing: said in one message
        if isinstance(exc.code, int):
            raise
        print(str(exc), file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(result))
    grok = "never" if result["grok_iteration"] is None else f"iteration {result['grok_iteration']:,}"
    print(f"{a.arm} seed {a.seed}: validation accuracy >= {GROK} first at {grok} of {a.budget:,}; "
          f"{result['cpu_s']:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
