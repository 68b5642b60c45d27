"""The comparison as text: the headline and analyses tables, CSV, and the cell formats
(censored steps, mean ± std, speed-up with its interval) shared with the report and the
experiments."""

from __future__ import annotations

import csv
import io
import math
import textwrap
from typing import TYPE_CHECKING, Any

from groklens.analyses.grokking import grokked_rule
from groklens.analyses.measures import MEASURES, Measure
from groklens.analyses.phases import PHASES
from groklens.analyses.speedup import CI_LEVEL, SPEEDUP_METHOD, mean_std

if TYPE_CHECKING:
    from groklens.analyses.compare import Comparison, Group


def core_cells(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """The headline table: variant, runs, memorized, grokked, gap, speed-up."""
    head = ["variant", "n" if comp.grouped else "run", "memorized", "grokked", "gap"]
    if comp.baseline is not None:
        head.append(f"speed-up [{int(CI_LEVEL * 100)}% CI]")
    body = []
    for g, row in zip(comp.groups, comp.rows()):
        cells = [g.label, str(g.n) if comp.grouped else g.runs[0].name,
                 fmt_steps(g, "memorization"), fmt_steps(g, "grokking"), fmt_gap(row["gap"], g)]
        if comp.baseline is not None:
            cells.append(fmt_speedup(row["speedup"]))
        body.append(cells)
    return head, body


def analysis_cells(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """One row per (measure, row of the comparison); the measure named on its first row only."""
    head = ["measure", "variant", "at memorization", "at grokking", "at end"]
    body = []
    rows = comp.rows()
    for m in comp.measures_present():
        for i, (g, row) in enumerate(zip(comp.groups, rows)):
            name = g.runs[0].name
            label = g.label if comp.grouped or g.label == name else f"{g.label} ({name})"
            body.append([m.label if i == 0 else "", label]
                        + [fmt_measure(row["analyses"][m.key][ph]) + cell_marks(row["analyses"][m.key][ph])
                           for ph in PHASES])
    return head, body


EPS_MARK = " †"
EPS_NOTE = ("† = set by a scale-invariant norm's eps, not by the loss's geometry (eps_dependent = 1; "
            "docs/ANALYSES.md, 'Where radial and sharpness mean something')")
LLC_MARK = " ‡"
LLC_NOTE = ("‡ = an LLC estimate flagged negative, or with its chains pinned by the localization (distance from w* "
            "~ sqrt(d/gamma)): not a learning coefficient; calibrate with `groklens llc-calibrate` "
            "(docs/ANALYSES.md, 'llc')")
# a table cell's marks: (mark, the cell's flag, the note under the table)
MARKS = ((EPS_MARK, "eps_dependent", EPS_NOTE), (LLC_MARK, "llc_flagged", LLC_NOTE))


def cell_marks(cell: dict) -> str:
    """The marks of an analyses-table cell with a value (MARKS)."""
    return "".join(mark for mark, flag, _ in MARKS if cell.get(flag) and cell["mean"] is not None)


def mark_notes(body: list[list[str]]) -> list[str]:
    """The notes of the marks present in a table's cells."""
    return [note for mark, _, note in MARKS if any(mark in c for r in body for c in r)]
NEVER = ("never grokked", "never memorized")


def dash_reasons(comp: Comparison, limit: int = 12) -> list[str]:
    """Why each `—` of the analyses table is empty: one line per row, phase and reason (the
    measures named when not all of the row's are), at most `limit` lines."""
    present = comp.measures_present()
    reasons: dict[tuple[str, str, str], list[str]] = {}
    for g, row in zip(comp.groups, comp.rows()):
        name = g.runs[0].name
        label = g.label if comp.grouped or g.label == name else f"{g.label} ({name})"
        for m in present:
            for ph in PHASES:
                cell = row["analyses"][m.key][ph]
                if cell["mean"] is None and cell["missing"] not in NEVER:
                    reasons.setdefault((label, ph, _dash_why(cell["missing"], m)), []).append(m.key)
    lines = []
    for (label, ph, why), keys in reasons.items():
        which = "" if len(keys) == len(present) else f" ({', '.join(keys)})"
        lines.append(f"— {label} at {ph}{which}: {why}")
    if len(lines) > limit:
        lines = lines[:limit] + [f"— ... and {len(lines) - limit} more (`--format json`: each cell's \"missing\")"]
    return lines


def _dash_why(missing: str | None, m: Measure) -> str:
    if missing == "not stored":
        return f"analysis '{m.analysis}' not stored for this run (`groklens compare --analyze` computes it)"
    if missing == "not stored at this checkpoint":
        return (f"'{m.analysis}' not stored at that checkpoint (`groklens compare --analyze` computes it there; "
                "`analyze --every` and `report --every` include the phase checkpoints)")
    return missing or "not stored"


def missing_measures(comp: Comparison) -> list[tuple[Measure, str]]:
    present = {m.key for m in comp.measures_present()}
    out = []
    for m in MEASURES:
        if m.key in present:
            continue
        states = {r.analysis_state.get(m.analysis, "not stored") for g in comp.groups for r in g.runs}
        why = (f"analysis '{m.analysis}' not stored for any run" if states == {"not stored"} else
               f"analysis '{m.analysis}' stored, but not at the memorization / grokking / last checkpoints")
        out.append((m, why))
    return out


def format_table(comp: Comparison) -> str:
    evals = [r.grok_evals for g in comp.groups for r in g.runs]
    lines = [f"grokking threshold {comp.threshold:g} (memorized: the first evaluation with train accuracy >= it; "
             f"grokked: {grokked_rule(evals, 'it')}); "
             + ("rows are groups of seeds (mean ± std)" if comp.grouped else "one row per run")]
    head, body = core_cells(comp)
    lines += text_table(head, body)
    if comp.baseline is not None:
        lines.append(f"speed-up = grokking step of '{comp.baseline.label}' / the row's: {SPEEDUP_METHOD}")
    if any(r.grok_censored or r.mem_censored for g in comp.groups for r in g.runs):
        lines.append("> N: never reached the threshold by step N (censored); a group's mean then counts N, a lower "
                     "bound")
    head, body = analysis_cells(comp)
    if body:
        lines.append("")
        lines += textwrap.wrap(
            "stored analyses at memorization / grokking (a checkpoint less than one evaluation interval from the "
            "step) and at the last checkpoint (— = no value there, reasons below; n/a = never reached; (k/n) = k "
            "of the n seeds have it)", WIDTH)
        lines += text_table(head, body)
        lines += [w for r in dash_reasons(comp) for w in textwrap.wrap(r, WIDTH, subsequent_indent="    ")]
        lines += [w for n in mark_notes(body) for w in textwrap.wrap(n, WIDTH)]
    lines += missing_hint(comp)
    lines += [f"note: {n}" for n in comp.notes]
    return "\n".join(lines)


WIDTH = 100


def missing_hint(comp: Comparison) -> list[str]:
    """Measures no run has, by analysis, and the command that computes them: a few short lines."""
    missing = missing_measures(comp)
    if not missing:
        return []
    by: dict[str, list[str]] = {}
    why_of: dict[str, str] = {}
    for m, why in missing:
        by.setdefault(m.analysis, []).append(m.key)
        why_of[m.analysis] = "not stored" if "not stored for any run" in why else "not at these checkpoints"
    text = "; ".join(f"{a} ({', '.join(keys)}): {why_of[a]}" for a, keys in by.items())
    metric = " ".join(f"--metric {a}" for a in by)
    return ["", *textwrap.wrap(f"missing: {text}", WIDTH, subsequent_indent="  "),
            *textwrap.wrap(f"`groklens compare --analyze {metric}` computes them (or `groklens analyze RUN.h5 "
                           f"{metric}`)", WIDTH, initial_indent="  ", subsequent_indent="  ")]


def to_csv(comp: Comparison) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head, rows = table_rows(comp)
    w.writerow(head)
    for cells in rows:
        w.writerow([_c(c) for c in cells])
    return buf.getvalue()


def table_records(comp: Comparison) -> list[dict[str, Any]]:
    """The CSV's rows as records (column -> value; None where the CSV has an empty cell): what
    `compare --format json` gives as "table" and `Comparison.to_pandas()` as a DataFrame."""
    head, rows = table_rows(comp)
    return [{h: (None if c == "" else c) for h, c in zip(head, cells)} for cells in rows]


def table_rows(comp: Comparison) -> tuple[list[str], list[list[Any]]]:
    """(head, rows) of the flat table: one row per table row, numbers unformatted."""
    head = ["variant", "n", "runs", "seeds", "memorization_step_mean", "memorization_step_std",
            "memorization_censored", "grokking_step_mean", "grokking_step_std", "grokking_censored",
            "grokking_steps", "gap_mean", "gap_std", "gap_lower_bound"]
    if comp.baseline is not None:
        head += ["speedup", "speedup_ci_low", "speedup_ci_high", "speedup_bound", "speedup_note"]
    for m in MEASURES:
        for ph in PHASES:
            head += [f"{m.key}@{ph}_mean", f"{m.key}@{ph}_std", f"{m.key}@{ph}_n"]
    out = []
    for g, row in zip(comp.groups, comp.rows()):
        ms, gs, gp = row["memorization_step"], row["grokking_step"], row["gap"]
        grok_list = ";".join(str(s) if s is not None else f">{c}" for s, c in zip(gs["values"], gs["censored_at"]))
        cells = [g.label, g.n, ";".join(row["runs"]), ";".join(map(str, row["seeds"])),
                 ms["mean"], ms["std"], ms["censored"], gs["mean"], gs["std"], gs["censored"],
                 grok_list, gp["mean"], gp["std"], int(gp["lower_bound"])]
        if comp.baseline is not None:
            sp = row["speedup"]
            ci = sp["ci"] or [None, None]
            cells += [sp["value"], ci[0], ci[1], sp["bound"] or "", sp["ci_note"] or ""]
        for m in MEASURES:
            for ph in PHASES:
                a = row["analyses"][m.key][ph]
                cells += [a["mean"], a["std"], a["n"]]
        out.append(cells)
    return head, out


def _c(x: Any) -> Any:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.6g}"
    return x


def _step(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def fmt_steps(g: Group, which: str) -> str:
    """'1250', '> 8000' (censored), '1250 ± 120', '>= 1800 ± 400 (1/3 censored)' or, every seed
    censored, '>= 1000 ± 0 (all 3 censored)': the mean over the censoring steps, a lower bound (as
    the JSON's mean), not the lowest censoring step."""
    runs = g.runs
    if which == "memorization":
        vals = [r.memorization for r in runs]
        cens = [r.mem_censored for r in runs]
    else:
        vals = [r.grokking for r in runs]
        cens = [r.grok_censored for r in runs]
    bounds = [r.last_step for r in runs]
    if len(runs) == 1:
        return _step(vals[0]) if not cens[0] else (f"> {bounds[0]}" if bounds[0] is not None else "—")
    k = sum(cens)
    times = [v if not c else b for v, c, b in zip(vals, cens, bounds)]
    mean, std = mean_std(times)
    if mean is None:
        return "—"
    text = f"{mean:.0f} ± {std:.0f}"
    return f">= {text} ({'all ' + str(k) if k == len(runs) else f'{k}/{len(runs)}'} censored)" if k else text


def fmt_gap(gap: dict, g: Group) -> str:
    if gap["mean"] is None:
        return "—"
    text = f"{gap['mean']:.0f}" if g.n == 1 else f"{gap['mean']:.0f} ± {gap['std']:.0f}"
    return ("> " if g.n == 1 else ">= ") + text if gap["lower_bound"] else text


def fmt_speedup(sp: dict | None) -> str:
    if sp is None:
        return ""
    if sp.get("ci_note") == "baseline":
        return "1 (baseline)"
    if sp["value"] is None:
        return f"n/a ({sp['ci_note']})"
    sign = {"lower": ">= ", "upper": "<= "}.get(sp["bound"] or "", "")
    text = f"{sign}{sp['value']:.2f}x"
    if sp["ci"] is not None:
        return f"{text} {fmt_interval(sp['ci'])}" + (" (one-sided: censored at the cap)" if sp["bound"] else "")
    return f"{text} (CI n/a: {sp['ci_note']})"


def fmt_interval(ci) -> str:
    """[lo, hi]; a one-sided interval as [lo, inf) or [0, hi]."""
    lo, hi = ci
    return f"[{lo:.2f}, inf)" if math.isinf(hi) else f"[{lo:.2f}, {hi:.2f}]"


def fmt_number(v: float) -> str:
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.2e}"
    return f"{v:.3g}" if a < 100 else f"{v:.0f}"


def fmt_measure(cell: dict) -> str:
    if cell["mean"] is None:
        return "n/a" if cell["missing"] in ("never grokked", "never memorized") else "—"
    text = fmt_number(cell["mean"])
    total = len(cell["values"])
    if total > 1:
        text += f" ± {fmt_number(cell['std'])}"
        if cell["n"] < total:
            text += f" ({cell['n']}/{total})"
    return text


def text_table(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
    return [line(head), line(["-" * w for w in widths]), *[line(r) for r in body]]
