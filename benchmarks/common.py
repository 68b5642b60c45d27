"""Pieces the benchmark scripts share (they run as `python benchmarks/NAME.py`, so this directory
is on sys.path and `from common import ...` finds it)."""

from __future__ import annotations

import time


class Timed:
    """Accumulate wall time (or another `clock`'s) and calls of a method, patched on its class for
    the duration of a run."""

    def __init__(self, cls, name, clock=time.perf_counter):
        self.cls, self.name, self.orig, self.clock = cls, name, getattr(cls, name), clock
        self.total, self.calls = 0.0, 0

    def __enter__(self):
        orig = self.orig

        def wrapper(*args, **kwargs):
            t = self.clock()
            try:
                return orig(*args, **kwargs)
            finally:
                self.total += self.clock() - t
                self.calls += 1

        setattr(self.cls, self.name, wrapper)
        return self

    def __exit__(self, *exc):
        setattr(self.cls, self.name, self.orig)


def flags(overrides: dict) -> str:
    """The `groklens train` flags of config overrides, for the printed commands."""
    out = []
    for key, value in overrides.items():
        flag = "--" + key.replace("_", "-")
        out.append(f"{flag} {value}" if not isinstance(value, bool) else (flag if value else f"--no-{flag[2:]}"))
    return " ".join(out)
