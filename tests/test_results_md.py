"""docs/RESULTS.md says what the committed ledgers say (docs/results/*.json), and nothing else.

- Every row of the reproduce table and every per-run block is recomputed here from the ledger
  alone (`pipeline.ledger_rows`: no run file needed) and must equal the text in the file: a
  re-recorded ledger without `--results-md docs/RESULTS.md`, or a hand edit of a row, fails.
- Every number in the prose around them must appear in that generated text, in
  docs/REFERENCES.md (the published setups and numbers), in the experiments' configs (caps,
  stop rules) or among the reading rules' constants: a sentence that quotes a result the ledger
  no longer holds fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from groklens import experiments as E
from groklens.experiments import pipeline
from groklens.experiments.core import RESULTS_BEGIN, RESULTS_END, Result
from groklens.experiments.ledger import Ledger, ledger_path

DOCS = Path(__file__).resolve().parents[1] / "docs"
RESULTS = DOCS / "RESULTS.md"
# the reading rules' own numbers (thresholds, interval level, the cap rule, evaluation counts)
RULE_NUMBERS = {"0", "1", "2", "3", "5", "10", "0.5", "0.9", "0.95", "0.99", "95", "99", "100"}
_NUM = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _commands(text: str) -> list[tuple[str, str, int]]:
    body = text.split(RESULTS_BEGIN, 1)[1].split(RESULTS_END, 1)[0]
    seen = {}
    for m in re.finditer(r"^\| `groklens reproduce (\S+) --scale (\S+) --seeds (\d+)`", body, re.M):
        seen.setdefault((m.group(1), m.group(2)), int(m.group(3)))
    return [(n, s, k) for (n, s), k in seen.items()]


def _regenerated(name: str, scale: str, seeds: int, tmp: Path) -> Result:
    exp = E.get_experiment(name)
    led = Ledger.load(ledger_path(DOCS / "results", name, scale), name, scale)
    rows, arms, _ = pipeline.ledger_rows(exp, scale, seeds, led, tmp)
    return Result(name, scale, seeds, tmp, rows, 0.0, pipeline.command_text(name, scale, seeds), [], None,
                  run_wall=pipeline._run_wall(arms), run_lines=pipeline.run_table(arms))


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    text = RESULTS.read_text()
    tmp = tmp_path_factory.mktemp("rows")
    return text, {(n, s): _regenerated(n, s, k, tmp) for n, s, k in _commands(text)}


def test_every_row_and_run_block_is_the_ledgers(generated):
    text, results = generated
    assert results, "RESULTS.md has no reproduce rows"
    body = text.split(RESULTS_BEGIN, 1)[1].split(RESULTS_END, 1)[0]
    table = [ln for ln in body.splitlines() if ln.startswith("| `groklens reproduce")]
    expected = {ln for r in results.values() for ln in pipeline.result_lines(r)}
    stale = [ln[:160] for ln in table if ln not in expected]
    assert not stale, (f"{len(stale)} row(s) differ from the ledger (rerun reproduce --no-train --results-md): "
                       f"{stale[:3]}")
    assert len(table) == len(expected)
    for (name, scale), r in results.items():
        begin, end = pipeline._runs_markers(name, scale)
        assert begin in text and end in text, f"no per-run block for {name} {scale}"
        block = text.split(begin, 1)[1].split(end, 1)[0]
        assert block.strip().splitlines()[2:] == r.run_lines, f"per-run block of {name} {scale} differs from the ledger"


def _prose(text: str) -> str:
    """RESULTS.md without its generated parts, code blocks and inline code."""
    head, rest = text.split(RESULTS_BEGIN, 1)
    text = head + rest.split(RESULTS_END, 1)[1]
    text = re.sub(r"<!-- runs .*?<!-- end runs [^>]*-->", "", text, flags=re.S)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"^    .*$", "", text, flags=re.M)  # indented commands
    return _DATE.sub("", re.sub(r"`[^`]*`", "", text))


def _config_numbers() -> set[str]:
    """Every number of every experiment's scales (steps caps, stop rules, sizes, learning rates)."""
    import json

    out: set[str] = set()
    for name in E.EXPERIMENTS:
        for sc in E.get_experiment(name).scales.values():
            for v in json.dumps({**sc.base, **sc.extra}, default=str).replace('"', " ").split():
                out |= _numbers(v)
    return out | {f"{float(x):g}" for x in list(out) if re.fullmatch(r"[\d.e-]+", x)}


def _numbers(text: str) -> set[str]:
    return {m.group(0).replace(",", "").lstrip("-") for m in _NUM.finditer(text)}


def test_every_number_in_the_prose_comes_from_the_ledger_or_the_references(generated):
    text, results = generated
    made = "\n".join(ln for r in results.values() for ln in pipeline.result_lines(r) + r.run_lines)
    allowed = _numbers(made) | _numbers((DOCS / "REFERENCES.md").read_text()) | RULE_NUMBERS | _config_numbers()
    loose = sorted(_numbers(_prose(text)) - allowed, key=lambda x: float(x))
    assert not loose, f"numbers in RESULTS.md's prose that no ledger row or reference holds: {loose}"
