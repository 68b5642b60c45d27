"""Put runs side by side: when each memorized and generalized, how much faster than a baseline,
and what the stored analyses said at those moments.

`compare(paths, baseline=..., group_by=..., threshold=...)` reads each run's committed metrics
and its sidecar of analysis results (never its parameters, unless `analyze=True`) and returns a
`Comparison`: one row per run, or per group of runs. `groklens compare` prints it as a table,
CSV or JSON; `groklens report` puts it on the report page.

Definitions (REFERENCES.md, definition 7):
- memorization step: first evaluated step with train accuracy >= threshold; grokking step: the
  first of the run's grok_evals consecutive evaluations with test accuracy >= threshold (its
  first crossing is shown apart, `first_crossing`, and noted when it differs: a crossing that
  fell back is not grokking); a run that never crosses is right-censored at its last evaluated
  step and shown `> N`, never dropped. A group with censored members says how many.
- gap: grokking step - memorization step (a lower bound when grokking is censored).
- variant: the config fields whose values differ between the rows, found automatically
  (`seed` and `data_seed` are left out when rows are groups of seeds).
- speed-up against the baseline: T_baseline / T_row, estimated as the ratio of the geometric
  means of the grokking steps over the seeds of each row, with a 95% confidence interval from
  Welch's t-interval on the difference of mean log grokking steps (exponentiated). It needs
  >= 2 seeds on both sides and no censored seed; otherwise the interval is "n/a" with the
  reason. A censored baseline seed makes the point estimate a lower bound (shown `>=`), a
  censored seed of the row an upper bound (`<=`); both together leave it undetermined.
- analyses at memorization / grokking / end: the stored value at the run's checkpoint at the
  memorization step, the grokking step and the last checkpoint. "At" a phase means less than one
  evaluation interval (`eval_every`) from the step: the trainer's phase checkpoints are exactly
  there; in a file without them only a periodic checkpoint that happens to fall there counts, and
  otherwise the value is `—` with the reason (e.g. "nearest checkpoint 200 steps from
  memorization at 50"), never the value of a distant checkpoint. A value is shown only when the
  sidecar holds it at that checkpoint (`--analyze` computes what is missing); never
  interpolated. Groups show mean +- std over seeds and, when fewer seeds have a value than the
  group has, how many (k/n).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from groklens.analyses.phases import (  # noqa: F401 - nearest_checkpoint, phase_checkpoint: re-exported
    PHASES,
    PhaseTimes,
    nearest_checkpoint,
    phase_checkpoint,
    run_phases,
)
from groklens.analyses import compare_format
from groklens.analyses.compare_format import (  # noqa: F401 - re-exported: the report and experiments use them
    fmt_gap,
    fmt_measure,
    fmt_number,
    fmt_speedup,
    fmt_steps,
    text_table,
)
from groklens.analyses.measures import (  # noqa: F401 - re-exported
    ANALYSES_USED,
    MEASURES,
    Measure,
    hidden_site,
    measure_key,
    read_measures,
    reduce_value,
    stored_analysis,
)
from groklens.analyses.registry import default_names, get
from groklens.analyses.speedup import CI_LEVEL, SPEEDUP_METHOD, mean_std, speedup  # noqa: F401 - re-exported
from groklens.config import GROK_THRESHOLD, SEED_FIELDS, field_names
from groklens.errors import BadInput
from groklens.analyses.fourier import trivial_key_note
from groklens.analyses.grokking import collapse, collapse_text
from groklens.analyses.notes import one_per_kind
from groklens.analyses.tables import comparison_frame

GROUP_VARIANT = "variant"  # --group-by variant: runs whose configs differ only in seed / data_seed
GROUP_RUN = "run"  # --group-by run: one row per run (compare's default)


# ---------------------------------------------------------------------- one run
@dataclass
class RunSummary(PhaseTimes):
    path: Path
    config: dict[str, Any]
    status: str
    checkpoints: list[int]
    steps: np.ndarray  # evaluated steps
    metrics: dict[str, np.ndarray]
    memorization: int | None
    grokking: int | None
    last_step: int | None  # last evaluated step: where a censored run is censored
    first_crossing: int | None = None  # first evaluated step with test accuracy >= threshold
    grok_evals: int = 1  # consecutive evaluations that make grokking (the run's config)
    phase_steps: dict[str, int | None] = field(default_factory=dict)  # phase -> checkpoint step
    phase_notes: dict[str, str] = field(default_factory=dict)  # phase -> why it has no checkpoint
    values: dict[str, dict[str, float | None]] = field(default_factory=dict)  # measure -> phase -> value
    value_keys: dict[str, str] = field(default_factory=dict)  # measure -> stored value name used
    analysis_state: dict[str, str] = field(default_factory=dict)  # analysis -> what the sidecar holds
    stored: dict[str, Any] = field(default_factory=dict)  # analysis -> store.Stored (for figures)
    eps_dependent: dict[str, set] = field(default_factory=dict)  # measure -> phases whose value a norm's eps sets
    llc_flagged: dict[str, set] = field(default_factory=dict)  # measure -> phases whose llc is negative or pinned

    @property
    def name(self) -> str:
        n = self.path.name
        return n.removesuffix(".h5")


def load_run(path: str | Path, threshold: float = GROK_THRESHOLD) -> RunSummary:
    """A run's grokking times and its stored analyses at memorization, grokking and the end."""
    from groklens.checkpoints import Trajectory

    traj = Trajectory(path)  # BadInput for a missing or foreign file
    ph = run_phases(traj, threshold)
    metrics = traj.metrics
    run = RunSummary(path=Path(path), config=traj.config_dict, status=traj.status,
                     checkpoints=[int(s) for s in traj.steps], steps=np.asarray(metrics["step"]),
                     metrics=metrics, memorization=ph.memorization, grokking=ph.grokking,
                     last_step=ph.last_step, first_crossing=ph.first_crossing, grok_evals=ph.grok_evals,
                     phase_steps=ph.steps, phase_notes=ph.notes)
    read_measures(run)
    return run


# ---------------------------------------------------------------------- several runs
def drop_sidecars(paths: Sequence[str | Path]) -> tuple[list[str | Path], list[str]]:
    """`runs/*.h5` also matches the runs' sidecars (RUN.analyses.h5): drop those whose run is
    given too (with a note); a sidecar alone is a BadInput."""
    from groklens.checkpoints import sidecar_path
    from groklens.checkpoints.constants import SIDECAR_SUFFIX

    runs = {Path(sidecar_path(p)).resolve() for p in paths if not str(p).endswith(SIDECAR_SUFFIX)}
    kept, skipped = [], 0
    for p in paths:
        if str(p).endswith(SIDECAR_SUFFIX):
            if Path(p).resolve() in runs:
                skipped += 1
                continue
            raise BadInput(f"{p} is a run's analyses sidecar, not a run; give the RUN.h5 beside it")
        kept.append(p)
    notes = ([f"skipped {skipped} analyses sidecar file(s) (RUN{SIDECAR_SUFFIX}) given beside their runs"]
             if skipped else [])
    return kept, notes


def load_runs(paths: Sequence[str | Path], threshold: float = GROK_THRESHOLD) -> list[RunSummary]:
    """Every run, checked: files exist and are trajectories, no run twice, one task."""
    if not paths:
        raise BadInput("give at least one RUN.h5")
    if not 0 < threshold <= 1:
        raise BadInput(f"--threshold must be in (0, 1]; got {threshold}")
    seen: dict[Path, str] = {}
    files: dict[tuple[int, int], str] = {}  # (device, inode): a hard link is the same run
    for p in paths:
        rp = Path(p).resolve()
        if rp in seen:
            raise BadInput(f"{p} is given twice")
        seen[rp] = str(p)
        if not Path(p).exists():
            raise BadInput(f"{p}: no such file")
        st = Path(p).stat()
        if (st.st_dev, st.st_ino) in files:
            raise BadInput(f"{p} and {files[(st.st_dev, st.st_ino)]} are the same file (a hard link): one run "
                           "would count twice")
        files[(st.st_dev, st.st_ino)] = str(p)
    runs = [load_run(p, threshold) for p in paths]
    check_same_task(runs)
    return runs


def check_same_task(runs: Sequence[RunSummary]) -> None:
    tasks = {}
    for r in runs:
        tasks.setdefault(r.config.get("task"), r.path)
    if len(tasks) > 1:
        shown = ", ".join(f"{p.name} is {t!r}" for t, p in tasks.items())
        raise BadInput(f"runs of different tasks cannot be compared ({shown})")


def differing_fields(configs: Sequence[dict], exclude: Sequence[str] = ()) -> list[str]:
    """Config fields whose values are not the same in every config (in config order)."""
    if not configs:
        return []
    keys = list(dict.fromkeys(k for c in configs for k in c))
    out = []
    for k in keys:
        if k in exclude:
            continue
        vals = {json.dumps(c.get(k), sort_keys=True) for c in configs}
        if len(vals) > 1:
            out.append(k)
    return out


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list):
        return ",".join(_fmt_value(x) for x in v)
    return str(v)


@dataclass
class Group:
    key: tuple
    runs: list[RunSummary]
    label: str = ""
    fields: dict[str, Any] = field(default_factory=dict)  # the variant: field -> value
    baseline: bool = False

    @property
    def n(self) -> int:
        return len(self.runs)


def parse_group_by(group_by: str | Sequence[str] | None, runs: Sequence[RunSummary]) -> list[str] | None:
    if group_by is None:
        return None
    items = [group_by] if isinstance(group_by, str) else list(group_by)
    names = [x.strip() for item in items for x in str(item).split(",") if x.strip()]
    if not names:
        raise BadInput("--group-by needs 'run', 'variant' or config field name(s)")
    if names == [GROUP_VARIANT]:
        return [GROUP_VARIANT]
    if names == [GROUP_RUN]:
        return None

    known = set(field_names())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadInput(f"unknown --group-by field {unknown[0]!r} (use 'run', 'variant' or config fields such as "
                       f"norm, attention, lr; see `groklens train --help`)")
    return names


def make_groups(runs: Sequence[RunSummary], group_by: list[str] | None) -> list[Group]:
    """Rows: one per run (no grouping), per variant (configs equal but for seed/data_seed),
    or per value of the given config fields. Order: first appearance."""
    groups: dict[tuple, Group] = {}
    for r in runs:
        if group_by is None:
            key = (str(r.path),)
        elif group_by == [GROUP_VARIANT]:
            key = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in r.config.items() if k not in SEED_FIELDS))
        else:
            key = tuple((k, json.dumps(r.config.get(k), sort_keys=True)) for k in group_by)
        groups.setdefault(key, Group(key, [])).runs.append(r)
    out = list(groups.values())
    if group_by is not None and group_by != [GROUP_VARIANT]:
        for g in out:
            g.fields = {k: g.runs[0].config.get(k) for k in group_by}
    else:
        exclude = SEED_FIELDS if group_by is not None else ()
        diff = differing_fields([g.runs[0].config for g in out], exclude)
        for g in out:
            g.fields = {k: g.runs[0].config.get(k) for k in diff}
    for g in out:
        g.label = variant_label(g.fields) or (g.runs[0].name if g.n == 1 else "all runs")
    return out


def variant_label(fields: dict[str, Any]) -> str:
    """Every field of the variant, default or not, so that every row names the same fields and
    each reads alone (a row that dropped its defaults would name fewer fields than the row at
    the defaults, and the reader would need RunConfig's defaults to know what it holds)."""
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in fields.items())


# ---------------------------------------------------------------------- the comparison
@dataclass
class Comparison:
    threshold: float
    groups: list[Group]
    grouped: bool
    baseline: Group | None
    variant_fields: list[str]
    notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ rows as data
    def rows(self) -> list[dict[str, Any]]:
        out = []
        for g in self.groups:
            mem = [r.memorization for r in g.runs]
            mem_t = [float(r.memorization) if r.memorization is not None else r.last_step for r in g.runs]
            grok = [r.grok_time() for r in g.runs]
            gaps = [None if (r.memorization is None or r.grok_time() is None) else r.grok_time() - r.memorization
                    for r in g.runs]
            mm, ms = mean_std(mem_t)  # like grokking: a censored run counts its censoring step (a lower bound)
            gm, gs = mean_std(grok)
            pm, ps = mean_std(gaps)
            row: dict[str, Any] = {
                "variant": g.label,
                "fields": g.fields,
                "runs": [str(r.path) for r in g.runs],
                "seeds": [r.config.get("seed") for r in g.runs],
                "n": g.n,
                "memorization_step": {"mean": mm, "std": ms, "values": mem,
                                      "censored": sum(r.mem_censored for r in g.runs)},
                "grokking_step": {"mean": gm, "std": gs, "values": [r.grokking for r in g.runs],
                                  "censored": sum(r.grok_censored for r in g.runs),
                                  "censored_at": [r.last_step if r.grok_censored else None for r in g.runs],
                                  "first_crossing": [r.first_crossing for r in g.runs],
                                  "grok_evals": [r.grok_evals for r in g.runs]},
                "gap": {"mean": pm, "std": ps, "lower_bound": any(r.grok_censored for r in g.runs)},
                "baseline": g.baseline,
                "speedup": None,
                "analyses": {},
                "phase_steps": [r.phase_steps for r in g.runs],
                "phase_notes": [r.phase_notes for r in g.runs],  # why a phase has no checkpoint
                "last_step": [r.last_step for r in g.runs],
                "status": [r.status for r in g.runs],
            }
            if self.baseline is not None:
                row["speedup"] = ({"value": 1.0, "ci": None, "bound": None, "ci_note": "baseline",
                                   "method": SPEEDUP_METHOD} if g.baseline else speedup(self.baseline.runs, g.runs))
            for m in MEASURES:
                per_phase = {}
                for ph in PHASES:
                    vals = [r.values[m.key][ph] for r in g.runs]
                    have = [v for v in vals if v is not None]
                    mean, std = mean_std(have)
                    per_phase[ph] = {"mean": mean, "std": std, "n": len(have), "values": vals,
                                     "missing": _missing_reason(g.runs, m, ph),
                                     "eps_dependent": any(ph in r.eps_dependent.get(m.key, ()) for r in g.runs),
                                     "llc_flagged": any(ph in r.llc_flagged.get(m.key, ()) for r in g.runs)}
                row["analyses"][m.key] = per_phase
            out.append(row)
        return out

    def measures_present(self) -> list[Measure]:
        """Measures stored for at least one run (others are listed as missing)."""
        return [m for m in MEASURES if any(r.values[m.key][ph] is not None
                                           for g in self.groups for r in g.runs for ph in PHASES)]

    def to_json(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "grouped": self.grouped,
            "variant_fields": self.variant_fields,
            "baseline": self.baseline.label if self.baseline is not None else None,
            "speedup_method": SPEEDUP_METHOD,
            "measures": {m.key: {"analysis": m.analysis, "value": m.value, "label": m.label} for m in MEASURES},
            "rows": _plain(self.rows()),
            "table": _plain(compare_format.table_records(self)),  # the CSV's rows: pandas.DataFrame(data["table"])
            "notes": self.notes,
        }

    # ------------------------------------------------------------------ text (analyses/compare_format.py)
    def core_cells(self) -> tuple[list[str], list[list[str]]]:
        return compare_format.core_cells(self)

    def analysis_cells(self) -> tuple[list[str], list[list[str]]]:
        return compare_format.analysis_cells(self)

    def missing_measures(self) -> list[tuple[Measure, str]]:
        return compare_format.missing_measures(self)

    def format_table(self) -> str:
        return compare_format.format_table(self)

    def to_csv(self) -> str:
        return compare_format.to_csv(self)

    def to_pandas(self):
        """The CSV's table as a pandas DataFrame (numbers unrounded); pandas is an optional extra."""
        return comparison_frame(self)

    def format(self, fmt: str) -> str:
        if fmt == "table":
            return self.format_table()
        if fmt == "csv":
            return self.to_csv().rstrip("\n")
        if fmt == "json":
            return json.dumps(self.to_json())
        raise BadInput(f"--format must be table, csv or json; got {fmt!r}")


def _missing_reason(runs: Sequence[RunSummary], m: Measure, phase: str) -> str | None:
    if all(r.values[m.key][phase] is not None for r in runs):
        return None
    if phase == "grokking" and all(r.grok_censored for r in runs):
        return "never grokked"
    if phase == "memorization" and all(r.mem_censored for r in runs):
        return "never memorized"
    far = [r.phase_notes[phase] for r in runs if r.values[m.key][phase] is None and phase in r.phase_notes]
    if far:
        return far[0] + (f" (and {len(far) - 1} more run(s))" if len(far) > 1 else "")
    if all(r.analysis_state.get(m.analysis) == "not stored" for r in runs):
        return "not stored"
    return "not stored at this checkpoint"


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    return x


# ---------------------------------------------------------------------- entry points
def compute_missing(runs: Sequence[RunSummary], metrics: Sequence[str] | None = None, *,
                    threshold: float = GROK_THRESHOLD, progress: bool = False) -> list[str]:
    """Compute the asked analyses (default: those the comparison shows but the ones computed only
    when named) at each run's memorization, grokking and last checkpoints where the sidecar lacks
    them; returns notes on skipped ones."""
    from groklens.analyses.runner import analyze_runs

    extended = default_names(ANALYSES_USED, tier="extended")  # in the comparison's column order
    names = list(dict.fromkeys(metrics or [n for n in ANALYSES_USED if n in extended]))
    for n in names:
        get(n)  # unknown -> BadInput before anything is computed
        if n not in ANALYSES_USED:
            raise BadInput(f"compare shows {', '.join(ANALYSES_USED)}; {n!r} is not one of them")
    notes = analyze_runs([r.path for r in runs], [(n, {}) for n in names], checkpoints="phases",
                         threshold=threshold, skip_inapplicable=metrics is None, progress=progress)
    for r in runs:
        r.stored.clear()
        r.analysis_state.clear()
        r.eps_dependent.clear()
        r.llc_flagged.clear()
        read_measures(r)
    return notes


def run_notes(runs: Sequence[RunSummary], threshold: float) -> list[str]:
    """Facts of single runs a reader must not miss: a run that crossed the threshold and then
    collapsed (or fell back and recovered), and a Fourier key set that is most of the frequencies."""
    out = []
    for r in runs:
        text = collapse_text(collapse(r.metrics, threshold, evals=r.grok_evals))
        if text:
            out.append(f"{r.path.name}: {text} (threshold {threshold:g})")
        if r.first_crossing is not None and r.first_crossing != r.grokking:
            grokked = f"step {r.grokking}" if r.grokking is not None else f"> {r.last_step} (censored)"
            out.append(f"{r.path.name}: first crossed {threshold:g} at step {r.first_crossing}; grokked (the first of "
                       f"{r.grok_evals} consecutive evaluations >= {threshold:g}) at {grokked}")
        stored = r.stored.get("fourier")
        if stored is not None and "n_key_frequencies" in stored.values and r.config.get("p"):
            n = [float(np.asarray(v).reshape(-1)[0]) for v in stored.values["n_key_frequencies"]]
            note = trivial_key_note(stored.steps, n, int(r.config["p"]), where=f"{r.path.name}: ")
            if note:
                out.append(note.removeprefix("warning: "))
    return out


def compare(paths: Sequence[str | Path], *, baseline: str | Path | None = None,
            group_by: str | Sequence[str] | None = None, threshold: float = GROK_THRESHOLD, analyze: bool = False,
            metrics: Sequence[str] | None = None, progress: bool = False) -> Comparison:
    """Compare runs (see the module docstring). The baseline run joins the runs if not among them."""
    # a str would iterate as one-letter paths; None or a number would fail deep inside
    if isinstance(paths, (str, bytes, os.PathLike)) or not isinstance(paths, Iterable):
        raise BadInput(f"compare(paths): a list of RUN.h5 paths; got {type(paths).__name__} {str(paths)[:60]!r}")
    paths = list(paths)
    for p in [*paths, *([] if baseline is None else [baseline])]:
        if not isinstance(p, (str, os.PathLike)):
            raise BadInput(f"compare: a run is a path (str or Path); got {p!r}")
    if baseline is not None:
        if not Path(baseline).exists():
            raise BadInput(f"--baseline {baseline}: no such file")
        if Path(baseline).resolve() not in {Path(p).resolve() for p in paths}:
            paths.insert(0, baseline)
    if metrics and not analyze:
        raise BadInput("--metric chooses what --analyze computes; give --analyze too")
    paths, notes = drop_sidecars(paths)
    runs = load_runs(paths, threshold)
    groups_by = parse_group_by(group_by, runs)
    if analyze:
        notes += compute_missing(runs, metrics, threshold=threshold, progress=progress)
    notes += run_notes(runs, threshold)
    groups = make_groups(runs, groups_by)
    base = None
    if baseline is not None:
        rb = Path(baseline).resolve()
        base = next(g for g in groups if any(r.path.resolve() == rb for r in g.runs))
        base.baseline = True
        groups = [base] + [g for g in groups if g is not base]  # the reference row first
    if groups_by is not None and groups_by != [GROUP_VARIANT]:
        for g in groups:
            inner = differing_fields([r.config for r in g.runs], list(groups_by) + list(SEED_FIELDS))
            if inner:
                notes.append(f"group {g.label} also differs in {', '.join(inner)}")
    exclude = SEED_FIELDS if groups_by is not None else ()
    variant_fields = (differing_fields([g.runs[0].config for g in groups], exclude)
                      if groups_by in (None, [GROUP_VARIANT]) else list(groups_by))
    return Comparison(threshold=threshold, groups=groups, grouped=groups_by is not None, baseline=base,
                      variant_fields=variant_fields, notes=one_per_kind(notes))
