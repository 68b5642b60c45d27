"""How many threads a groklens process gives torch and the BLAS libraries (docs/CLI.md, "Threads").

The rule, in order:
1. `--threads N` (train), else the environment variable GROKLENS_THREADS=N: N threads.
2. else OMP_NUM_THREADS, when set: left as it is (torch and numpy read it themselves).
3. else automatic: the cores this process may run on, shared with the other groklens processes
   that compute on this machine (trainers, sweep and analysis workers): cores // (others + 1);
   one thread when the machine is already busy (1-minute load average above the core count).

Small models gain nothing from more threads, and OpenMP threads that wait for each other's time
slices on loaded cores slow a run down many times over (a 400-step run: 50 s with the default
threads on a busy 2-core machine, 7 s with one). When the machine is oversubscribed (load average
above the cores, or other groklens processes running) `note` is one line saying so.

Nothing here imports torch: the counts go into the environment before torch is first imported
(and into torch itself when it already is), so `--help` and `info` stay fast.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from groklens.errors import BadInput

ENV = "GROKLENS_THREADS"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
# argv words of a groklens process that computes (the coordinator of a sweep counts as its workers do)
COMPUTING = {"train", "sweep", "reproduce", "demo", "analyze", "probe", "report", "compare", "llc-calibrate"}


@dataclass
class ThreadChoice:
    threads: int | None  # None: left to OMP_NUM_THREADS
    why: str  # "--threads", GROKLENS_THREADS, OMP_NUM_THREADS or "automatic"
    cores: int
    load: float | None
    others: int
    note: str = ""  # one line when the machine is oversubscribed


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def other_groklens_processes(proc: Path = Path("/proc")) -> int:
    """groklens processes that compute, other than this one and its parents (Linux's /proc;
    0 where it cannot be read)."""
    mine = {os.getpid(), os.getppid()}
    count = 0
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return 0
    for p in entries:
        if int(p.name) in mine:
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if is_computing([a.decode(errors="replace") for a in argv if a]):
            count += 1
    return count


def is_computing(argv: list[str]) -> bool:
    """argv of a groklens command that computes, or of a worker process of one."""
    text = " ".join(argv)
    if "groklens.trainers" in text or "groklens.analyses.runner" in text:  # forkserver / spawn workers
        return True
    for i, a in enumerate(argv):
        if a == "groklens" or a.endswith("/groklens"):  # the script, or `python -m groklens`
            return any(w in COMPUTING for w in argv[i + 1:])
    return False


def parse_threads(value, where: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        n = 0
    if n < 1:
        raise BadInput(f"{where} must be a whole number of threads >= 1; got {value!r}")
    return n


def choose_threads(threads: int | None = None, env: dict | None = None, cores: int | None = None,
                   load: float | None = -1.0, others: int | None = None) -> ThreadChoice:
    """The thread count by the rule of the module docstring (arguments other than `threads` are
    for tests: by default read from this machine)."""
    env = os.environ if env is None else env
    cores = available_cores() if cores is None else cores
    load = load_average() if load == -1.0 else load
    others = other_groklens_processes() if others is None else others
    if threads is not None:
        n, why = parse_threads(threads, "--threads"), "--threads"
    elif env.get(ENV, "").strip():
        n, why = parse_threads(env[ENV], ENV), ENV
    elif env.get("OMP_NUM_THREADS", "").strip():
        n, why = None, "OMP_NUM_THREADS"
    else:
        busy = load is not None and load > cores
        n, why = (1 if busy else max(1, cores // (others + 1))), "automatic"
    choice = ThreadChoice(n, why, cores, load, others)
    loaded = load is not None and load > cores
    if loaded or others:
        parts = ([f"load average {load:.1f} on {cores} core{'s' * (cores != 1)}"] if loaded else []) + (
            [f"{others} other groklens process{'es' * (others != 1)} computing"] if others else [])
        uses = (f"{n} thread{'s' * (n != 1)} ({why})" if n is not None
                else f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']} threads")
        choice.note = f"the machine is busy ({', '.join(parts)}): torch uses {uses}; --threads N or {ENV}=N chooses"
    return choice


def apply_threads(threads: int | None = None, *, quiet: bool = False, echo=None) -> ThreadChoice:
    """Choose (choose_threads) and set the thread count for this process; the busy-machine note
    goes to stderr unless `quiet`."""
    choice = choose_threads(threads)
    n = choice.threads
    if n is not None:
        for var in THREAD_VARS:  # read by torch and numpy's BLAS when they load, and by child processes
            os.environ[var] = str(n)
        if "torch" in sys.modules:  # already loaded (Python callers, tests): tell it directly
            import torch

            torch.set_num_threads(n)
        if "numpy" in sys.modules:
            from threadpoolctl import threadpool_limits

            threadpool_limits(n)
    if choice.note and not quiet:
        (echo or (lambda m: print(m, file=sys.stderr)))(f"groklens: {choice.note}")
    return choice


__all__ = ["ENV", "ThreadChoice", "apply_threads", "choose_threads", "is_computing", "other_groklens_processes"]
