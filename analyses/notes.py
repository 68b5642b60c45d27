"""Notes and warnings said once per kind: a command over many runs says each kind of note in one
line, naming how many runs it holds for, not once per run (issue 43: the demo printed 12
key-set and 24 eps warnings)."""

from __future__ import annotations

import re
from collections.abc import Sequence

_RUN = re.compile(r"^(?P<run>[^\s:]+\.h5): (?P<text>.*)$", re.S)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def kind_of(text: str) -> str:
    """A note's kind: its text with the numbers left out (steps and counts differ between runs)."""
    return _NUMBER.sub("#", text)


def one_per_kind(notes: Sequence[str]) -> list[str]:
    """`notes` with the notes of one kind about several runs ('RUN.h5: TEXT') said once: the
    first run's line, then how many more runs it holds for and their names; other notes as they
    are, once each, in their first order."""
    order: list[str] = []
    groups: dict[str, list[tuple[str | None, str]]] = {}
    for note in notes:
        m = _RUN.match(note)
        run, text = (m["run"], m["text"]) if m else (None, note)
        key = kind_of(text)
        if key not in groups:
            order.append(key)
            groups[key] = []
        if (run, text) not in groups[key]:
            groups[key].append((run, text))
    out = []
    for key in order:
        (run, text), rest = groups[key][0], groups[key][1:]
        line = f"{run}: {text}" if run else text
        others = [r for r, _ in rest if r]
        if others:
            shown = ", ".join(others[:4]) + (f", ... ({len(others)})" if len(others) > 4 else "")
            line += f" [and {len(others)} more run(s) alike: {shown}]"
        out.append(line)
    return out
