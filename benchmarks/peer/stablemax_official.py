"""Run one command of Prieto et al.'s run_main_experiments.sh with their own code
(LucasPrietoAl/grokking-at-the-edge-of-numerical-stability), on this machine, as a peer of
groklens' stablemax paper arms (issue 38). Not part of the package: the code run is theirs.

The command is read from their script: the K-th `python grokking_experiments.py ...` line of its
FIGURE N block (`--list` prints them). It runs their grokking_experiments.py, unchanged except:
  - `torch.set_num_threads(5)` becomes `--threads` (default 1), refused if that line changed;
  - `--device cpu` for their "$DEVICE", and `--seed S` appended (their default seed is 42);
  - where torchvision is not installed, an empty `torchvision.datasets` module: their datasets.py
    imports it for MNIST only, which figures 1, 2, 4 and 6 do not use;
  - `--epochs E` (appended as --num_epochs) and `--set ARGS` (appended as given) only where asked,
    for tests or a shortened run; argparse takes the last value of a repeated flag.
It runs in a temporary directory (their code writes last_*.pt and loggs/ into the working
directory). Their log (loggs/*/metrics.csv) is read back: train and test accuracy and the share of
softmax-collapsed training rows at every logged epoch (every `--log_frequency` epochs, after that
epoch's step, in eval mode, so dropout is off), and their last line's test accuracy after the last
epoch. `grok_epoch` is the first logged epoch with test accuracy >= 0.95 (groklens' threshold;
their code has no grokking rule), and their epoch e is groklens' step e + 1.

  python benchmarks/peer/stablemax_official.py --repo REPO --figure 6 --command 1 --seed 1 --out r.json
  python benchmarks/peer/stablemax_official.py --repo REPO --list
REPO: a checkout of the repository, or the git directory `fetch` gives.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_repo import head_commit, read  # noqa: E402  (benchmarks/peer/peer_repo.py)

SCRIPT = "run_main_experiments.sh"
MAIN = "grokking_experiments.py"
FILES = ("grokking_experiments.py", "utils.py", "models.py", "datasets.py", "orthograd.py", "logger.py",
         "constants.py", "binary_operations.py")
THREADS_LINE = "torch.set_num_threads(5)"
GROK = 0.95  # groklens' GROK_THRESHOLD (groklens.config): their code has no grokking rule


def commands(repo: Path) -> dict[int, list[list[str]]]:
    """figure -> its commands, in the script's order, each as argv after `python grokking_experiments.py`
    (line continuations joined, "$DEVICE" left as it is)."""
    text = read(repo, SCRIPT).replace("\\\n", " ")
    out: dict[int, list[list[str]]] = {}
    for figure, block in re.findall(r"^if run_figure (\d+); then\n(.*?)^fi$", text, flags=re.M | re.S):
        out[int(figure)] = [shlex.split(line)[2:] for line in block.splitlines()
                            if line.strip().startswith(f"python {MAIN}")]
    if not out:
        raise SystemExit(f"stablemax_official: no figure blocks in {SCRIPT}: the script has changed")
    return out


def their_argv(repo: Path, figure: int, command: int) -> list[str]:
    """The `command`-th (1-based) command of `figure`, as their script writes it."""
    figures = commands(repo)
    if figure not in figures or not 1 <= command <= len(figures[figure]):
        have = ", ".join(f"figure {f}: 1..{len(c)}" for f, c in sorted(figures.items()))
        raise SystemExit(f"stablemax_official: no command {command} of figure {figure} ({have})")
    return figures[figure][command - 1]


def materialize(repo: Path, dest: Path, threads: int) -> bool:
    """Their files in `dest`, with the thread line set; True when a torchvision stub was written."""
    for name in FILES:
        text = read(repo, name)
        if name == MAIN:
            if text.count(THREADS_LINE) != 1:
                raise SystemExit(f"stablemax_official: {MAIN} has changed ({THREADS_LINE!r} not found once)")
            text = text.replace(THREADS_LINE, f"torch.set_num_threads({threads})")
        (dest / name).write_text(text)
    if importlib.util.find_spec("torchvision") is not None:
        return False
    (dest / "torchvision").mkdir()
    (dest / "torchvision" / "__init__.py").write_text("from . import datasets  # a stub: MNIST is not used here\n")
    (dest / "torchvision" / "datasets.py").write_text("")
    return True


def read_log(workdir: Path, log_frequency: int) -> dict[str, list]:
    """Their metrics.csv: per logged epoch, train and test accuracy and the softmax-collapse share.
    Their `epoch` column is the log position (epoch // log_frequency), so the epoch is position x frequency."""
    (path,) = workdir.glob("loggs/*/metrics.csv")
    rows: dict[int, dict[str, float]] = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            key = {("accuracy", "train"): "train_acc", ("accuracy", "test"): "test_acc",
                   ("softmax_collapse", "train"): "softmax_collapse"}.get((r["metric_name"], r["input_type"]))
            if key:
                rows.setdefault(int(float(r["epoch"])), {})[key] = float(r["value"])
    positions = sorted(rows)
    return {"epochs": [p * log_frequency for p in positions],
            **{k: [rows[p].get(k) for p in positions] for k in ("train_acc", "test_acc", "softmax_collapse")}}


def run(repo: Path, figure: int, command: int, seed: int, epochs: int | None = None, extra: list[str] | None = None,
        threads: int = 1) -> dict:
    theirs = their_argv(repo, figure, command)
    argv = [a.replace("$DEVICE", "cpu") for a in theirs] + ["--seed", str(seed)]
    if epochs is not None:
        argv += ["--num_epochs", str(epochs)]
    argv += extra or []
    with tempfile.TemporaryDirectory(prefix="stablemax_official_") as tmp:
        work = Path(tmp)
        stub = materialize(repo, work, threads)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(work)}
        start = time.monotonic()
        out = subprocess.run([sys.executable, MAIN, *argv], cwd=work, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode:
            raise SystemExit(f"stablemax_official: their run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
        args = json.loads(next(work.glob("loggs/*/args.json")).read_text())
        log = read_log(work, args["log_frequency"])
    final = re.search(r"Test set: Average loss: \S+, Accuracy: ([0-9.]+)", out.stdout)
    grok = next((e for e, acc in zip(log["epochs"], log["test_acc"]) if acc is not None and acc >= GROK), None)
    return {"figure": figure, "command": command, "their_command": theirs, "argv": argv, "seed": seed,
            "repo_commit": head_commit(repo), "args": args, "torchvision_stub": stub, "threads": threads,
            "epochs": args["num_epochs"], "grok_epoch": grok, "grok_step": None if grok is None else grok + 1,
            "final_test_acc": round(float(final.group(1)) / 100, 6) if final else None, "log": log,
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--list", action="store_true", help="print every figure's commands and stop")
    ap.add_argument("--figure", type=int)
    ap.add_argument("--command", type=int, help="1-based, in the figure's block")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--epochs", type=int, help="their --num_epochs, only to shorten a run")
    ap.add_argument("--set", default="", help="more of their flags, appended as given (tests: a small --modulo)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if not a.repo.exists():
        print(f"stablemax_official: {a.repo} does not exist", file=sys.stderr)
        return 2
    if a.list:
        for figure, cmds in sorted(commands(a.repo).items()):
            for i, c in enumerate(cmds, 1):
                print(f"figure {figure} command {i}: {' '.join(c)}")
        return 0
    if None in (a.figure, a.command, a.seed, a.out):
        ap.error("--figure, --command, --seed and --out are needed (or --list)")
    try:
        result = run(a.repo, a.figure, a.command, a.seed, a.epochs, shlex.split(a.set), a.threads)
    except SystemExit as exc:  # a changed script, a missing file, or their run failing: said in one message
        print(str(exc), file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(result))
    grok = "never" if result["grok_epoch"] is None else f"epoch {result['grok_epoch']}"
    print(f"figure {a.figure} command {a.command} seed {a.seed}: test acc >= {GROK} first at {grok} of "
          f"{result['epochs']}; final test acc {result['final_test_acc']}; {result['cpu_s']:.0f} s CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
