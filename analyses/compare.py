"""Put runs side by side: when each memorized and generalized, how much faster than a baseline,
and what the stored analyses said at those moments.

`compare(paths, baseline=..., group_by=..., threshold=...)` reads each run's committed metrics
and its sidecar of analysis results (never its parameters, unless `analyze=True`) and returns a
`Comparison`: one row per run, or per group of runs. `groklens compare` prints it as a table,
CSV or JSON; `groklens report` puts it on the report page.

Definitions (REFERENCES.md, definition 7):
- memorization / grokking step: first evaluated step with train / test accuracy >= threshold;
  a run that never crosses is right-censored at its last evaluated step and shown `> N`, never
  dropped. A group with censored members says how many.
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

import csv
import io
import json
import math
import re
from collections.abc import Sequence
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
from groklens.errors import BadInput

SEED_FIELDS = ("seed", "data_seed")
GROUP_VARIANT = "variant"  # --group-by variant: runs whose configs differ only in seed / data_seed
GROUP_RUN = "run"  # --group-by run: one row per run (compare's default)
CI_LEVEL = 0.95
SPEEDUP_METHOD = "ratio of geometric means; 95% CI: Welch t-interval on mean log grokking step"


@dataclass(frozen=True)
class Measure:
    """One number per checkpoint taken from a stored analysis."""

    key: str  # column name in CSV / JSON
    analysis: str  # registry name of the analysis that stores it
    value: str  # stored value name; '{site}' is filled with the last hidden-representation site
    label: str  # column label in the table
    reduce: str = "scalar"  # scalar | first (value[0]) | mean (mean over layers)


MEASURES: tuple[Measure, ...] = (
    Measure("fve_neuron", "fourier", "neuron_fve", "Fourier FVE (neuron, Nanda)"),
    Measure("fve_ls", "fourier", "ls_fve", "Fourier FVE (least squares, mean over the key frequencies)"),
    Measure("fve_ls_top5", "fourier", "ls_fve_top_k", "Fourier FVE (least squares, top-5 mean)"),
    Measure("attn_mass", "attention", "mass", "attention mass on informative tokens", "mean"),
    Measure("hessian_top", "sharpness", "top_eigenvalues", "Hessian top eigenvalue", "first"),
    Measure("hessian_trace", "sharpness", "trace", "Hessian trace (Hutchinson)"),
    Measure("eff_rank", "rank", "roy_vetterli_centred@{site}", "effective rank (Roy-Vetterli, centred)"),
    Measure("radius", "radial", "radius_mean@{site}", "activation radius ||h||/sqrt(d)"),
    Measure("rho", "radial", "rho@{site}", "radial gradient energy rho"),
    Measure("rho_baseline", "radial", "rho_baseline@{site}", "isotropic baseline of rho (1/d)"),
)
ANALYSES_USED = tuple(dict.fromkeys(m.analysis for m in MEASURES))


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
    phase_steps: dict[str, int | None] = field(default_factory=dict)  # phase -> checkpoint step
    phase_notes: dict[str, str] = field(default_factory=dict)  # phase -> why it has no checkpoint
    values: dict[str, dict[str, float | None]] = field(default_factory=dict)  # measure -> phase -> value
    value_keys: dict[str, str] = field(default_factory=dict)  # measure -> stored value name used
    analysis_state: dict[str, str] = field(default_factory=dict)  # analysis -> what the sidecar holds
    stored: dict[str, Any] = field(default_factory=dict)  # analysis -> store.Stored (for figures)

    @property
    def name(self) -> str:
        n = self.path.name
        return n.removesuffix(".h5")


def load_run(path: str | Path, threshold: float = 0.95) -> RunSummary:
    """A run's grokking times and its stored analyses at memorization, grokking and the end."""
    from groklens.checkpoints import Trajectory

    traj = Trajectory(path)  # BadInput for a missing or foreign file
    ph = run_phases(traj, threshold)
    metrics = traj.metrics
    run = RunSummary(path=Path(path), config=traj.config_dict, status=traj.status,
                     checkpoints=[int(s) for s in traj.steps], steps=np.asarray(metrics["step"]),
                     metrics=metrics, memorization=ph.memorization, grokking=ph.grokking,
                     last_step=ph.last_step, phase_steps=ph.steps, phase_notes=ph.notes)
    read_measures(run)
    return run


def stored_analysis(run_path: Path, config: dict, name: str):
    """The stored results of analysis `name` for this run: the default parameter set when it is
    stored, else the most recently updated one; only results of this run's config. None if none."""
    from groklens.analyses.registry import canonical_params, get, params_json
    from groklens.analyses.store import Sidecar, config_sha, variant_id

    sidecar = Sidecar(run_path)
    sha = config_sha(json.dumps(config, sort_keys=True))
    variants = [(v, a) for v, a in sidecar.variants(name) if _text(a.get("run_config_sha256")) == sha]
    if not variants:
        return None
    default = variant_id(params_json(canonical_params(get(name), {})))
    ids = [v for v, _ in variants]
    if default in ids:
        chosen = default
    else:
        chosen = max(variants, key=lambda va: _text(va[1].get("updated", "")))[0]
    return sidecar.read(name, chosen)


def _text(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


def hidden_site(keys: Sequence[str], prefix: str) -> str | None:
    """The site of the last hidden representation among `prefix@SITE` value names: the highest
    blocks.{l}.hook_resid_post, else the highest layers.{i}.hook_post, else the first site."""
    sites = [k[len(prefix) + 1:] for k in keys if k.startswith(prefix + "@")]
    if not sites:
        return None
    for pattern in (r"blocks\.(\d+)\.hook_resid_post", r"layers\.(\d+)\.hook_post"):
        hits = [(int(m.group(1)), s) for s in sites if (m := re.fullmatch(pattern, s))]
        if hits:
            return max(hits)[1]
    return sites[0]


def measure_key(measure: Measure, keys: Sequence[str]) -> str | None:
    if "{site}" not in measure.value:
        return measure.value if measure.value in keys else None
    prefix = measure.value.split("@", 1)[0]
    site = hidden_site(keys, prefix)
    return None if site is None else measure.value.format(site=site)


def reduce_value(value: Any, how: str) -> float | None:
    a = np.asarray(value, dtype=float)
    if a.size == 0:
        return None
    v = float(a.reshape(-1)[0]) if how == "first" else float(a.mean()) if how == "mean" else float(a.reshape(-1)[0])
    return v if math.isfinite(v) else None


def read_measures(run: RunSummary) -> None:
    """Fill run.values from the sidecar (missing stays None) and say what the sidecar holds."""
    for name in ANALYSES_USED:
        stored = stored_analysis(run.path, run.config, name)
        if stored is None:
            run.analysis_state[name] = "not stored"
        else:
            run.stored[name] = stored
            run.analysis_state[name] = f"stored at {len(stored.steps)} checkpoint(s)"
    for m in MEASURES:
        run.values[m.key] = {ph: None for ph in PHASES}
        stored = run.stored.get(m.analysis)
        if stored is None:
            continue
        key = measure_key(m, list(stored.values))
        if key is None:
            continue
        run.value_keys[m.key] = key
        where = {s: i for i, s in enumerate(stored.steps)}
        for ph in PHASES:
            s = run.phase_steps[ph]
            if s is not None and s in where:
                run.values[m.key][ph] = reduce_value(stored.values[key][where[s]], m.reduce)


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
    notes = [f"skipped {skipped} analyses sidecar file(s) (RUN{SIDECAR_SUFFIX}) given beside their runs"] if skipped else []
    return kept, notes


def load_runs(paths: Sequence[str | Path], threshold: float = 0.95) -> list[RunSummary]:
    """Every run, checked: files exist and are trajectories, no run twice, one task."""
    if not paths:
        raise BadInput("give at least one RUN.h5")
    if not 0 < threshold <= 1:
        raise BadInput(f"--threshold must be in (0, 1]; got {threshold}")
    seen: dict[Path, str] = {}
    for p in paths:
        rp = Path(p).resolve()
        if rp in seen:
            raise BadInput(f"{p} is given twice")
        seen[rp] = str(p)
        if not Path(p).exists():
            raise BadInput(f"{p}: no such file")
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
    from groklens.config import field_names

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
    """The fields whose values are not RunConfig's defaults (compact), or all of them when every
    one is at its default (the reference row)."""
    from groklens.config import RunConfig

    default = RunConfig().to_dict()
    changed = {k: v for k, v in fields.items() if k not in default or json.dumps(default[k]) != json.dumps(v)}
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in (changed or fields).items())


# ---------------------------------------------------------------------- statistics
def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    a = np.asarray(vals, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def speedup(base: Sequence[RunSummary], runs: Sequence[RunSummary], level: float = CI_LEVEL) -> dict[str, Any]:
    """T_base / T_runs: ratio of geometric means of grokking steps, Welch t-interval on logs."""
    from scipy import stats

    tb = [r.grok_time() for r in base]
    tr = [r.grok_time() for r in runs]
    out: dict[str, Any] = {"value": None, "ci": None, "bound": None, "ci_note": None, "method": SPEEDUP_METHOD}
    if any(t is None or t <= 0 for t in tb + tr):
        out["ci_note"] = "no evaluated grokking time"
        return out
    cb = any(r.grok_censored for r in base)
    cr = any(r.grok_censored for r in runs)
    if cb and cr:
        out["ci_note"] = "censored on both sides"
        return out
    lb, lr = np.log(tb), np.log(tr)
    diff = float(lb.mean() - lr.mean())
    out["value"] = float(math.exp(diff))
    if cb:
        out["bound"] = "lower"
        out["ci_note"] = "baseline censored: a lower bound"
        return out
    if cr:
        out["bound"] = "upper"
        out["ci_note"] = "censored seed(s): an upper bound"
        return out
    nb, nr = len(lb), len(lr)
    if nb < 2 or nr < 2:
        out["ci_note"] = "needs >= 2 seeds on both sides"
        return out
    vb, vr = float(lb.var(ddof=1)), float(lr.var(ddof=1))
    se2 = vb / nb + vr / nr
    if se2 == 0:
        out["ci"] = [out["value"], out["value"]]
        return out
    df = se2 ** 2 / ((vb / nb) ** 2 / (nb - 1) + (vr / nr) ** 2 / (nr - 1))
    t = float(stats.t.ppf(0.5 + level / 2, df))
    half = t * math.sqrt(se2)
    out["ci"] = [math.exp(diff - half), math.exp(diff + half)]
    out["df"] = df
    return out


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
                                  "censored_at": [r.last_step if r.grok_censored else None for r in g.runs]},
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
                                     "missing": _missing_reason(g.runs, m, ph)}
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
            "notes": self.notes,
        }

    # ------------------------------------------------------------------ text
    def core_cells(self) -> tuple[list[str], list[list[str]]]:
        """The headline table: variant, runs, memorized, grokked, gap, speed-up."""
        head = ["variant", "n" if self.grouped else "run", "memorized", "grokked", "gap"]
        if self.baseline is not None:
            head.append(f"speed-up [{int(CI_LEVEL * 100)}% CI]")
        body = []
        for g, row in zip(self.groups, self.rows()):
            cells = [g.label, str(g.n) if self.grouped else g.runs[0].name,
                     fmt_steps(g, "memorization"), fmt_steps(g, "grokking"), fmt_gap(row["gap"], g)]
            if self.baseline is not None:
                cells.append(fmt_speedup(row["speedup"]))
            body.append(cells)
        return head, body

    def analysis_cells(self) -> tuple[list[str], list[list[str]]]:
        """One row per (measure, row of the comparison); the measure named on its first row only."""
        head = ["measure", "variant", "at memorization", "at grokking", "at end"]
        body = []
        rows = self.rows()
        for m in self.measures_present():
            for i, (g, row) in enumerate(zip(self.groups, rows)):
                name = g.runs[0].name
                label = g.label if self.grouped or g.label == name else f"{g.label} ({name})"
                body.append([m.label if i == 0 else "", label]
                            + [fmt_measure(row["analyses"][m.key][ph]) for ph in PHASES])
        return head, body

    def missing_measures(self) -> list[tuple[Measure, str]]:
        present = {m.key for m in self.measures_present()}
        out = []
        for m in MEASURES:
            if m.key in present:
                continue
            states = {r.analysis_state.get(m.analysis, "not stored") for g in self.groups for r in g.runs}
            why = (f"analysis '{m.analysis}' not stored for any run" if states == {"not stored"} else
                   f"analysis '{m.analysis}' stored, but not at the memorization / grokking / last checkpoints")
            out.append((m, why))
        return out

    def format_table(self) -> str:
        lines = [f"grokking threshold {self.threshold:g} (first evaluation with train / test accuracy >= it); "
                 + ("rows are groups of seeds (mean ± std)" if self.grouped else "one row per run")]
        head, body = self.core_cells()
        lines += text_table(head, body)
        if self.baseline is not None:
            lines.append(f"speed-up = grokking step of '{self.baseline.label}' / the row's: {SPEEDUP_METHOD}")
        if any(r.grok_censored or r.mem_censored for g in self.groups for r in g.runs):
            lines.append("> N: never reached the threshold by step N (censored); a group's mean then counts N, a lower bound")
        head, body = self.analysis_cells()
        if body:
            lines.append("")
            lines.append("stored analyses at memorization / grokking (a checkpoint less than one evaluation "
                         "interval from the step) and at the last checkpoint (— = no such checkpoint or not "
                         "stored there, reasons below; n/a = never reached; (k/n) = k of the n seeds have it)")
            lines += text_table(head, body)
        far = sorted({f"{r.name}: {note}" for g in self.groups for r in g.runs for ph, note in r.phase_notes.items()
                      if not note.startswith("never")})
        if far and body:
            lines += [f"no phase value: {n}" for n in far]
        missing = self.missing_measures()
        if missing:
            lines.append("")
            lines.append("missing: " + "; ".join(f"{m.label} ({why})" for m, why in missing)
                         + " — `groklens analyze RUN.h5` or `groklens compare --analyze` computes them")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        head = ["variant", "n", "runs", "seeds", "memorization_step_mean", "memorization_step_std",
                "memorization_censored", "grokking_step_mean", "grokking_step_std", "grokking_censored",
                "grokking_steps", "gap_mean", "gap_std", "gap_lower_bound"]
        if self.baseline is not None:
            head += ["speedup", "speedup_ci_low", "speedup_ci_high", "speedup_bound", "speedup_note"]
        for m in MEASURES:
            for ph in PHASES:
                head += [f"{m.key}@{ph}_mean", f"{m.key}@{ph}_std", f"{m.key}@{ph}_n"]
        w.writerow(head)
        for g, row in zip(self.groups, self.rows()):
            ms, gs, gp = row["memorization_step"], row["grokking_step"], row["gap"]
            grok_list = ";".join(str(s) if s is not None else f">{c}" for s, c in zip(gs["values"], gs["censored_at"]))
            cells = [g.label, g.n, ";".join(row["runs"]), ";".join(map(str, row["seeds"])),
                     _c(ms["mean"]), _c(ms["std"]), ms["censored"], _c(gs["mean"]), _c(gs["std"]), gs["censored"],
                     grok_list, _c(gp["mean"]), _c(gp["std"]), int(gp["lower_bound"])]
            if self.baseline is not None:
                sp = row["speedup"]
                ci = sp["ci"] or [None, None]
                cells += [_c(sp["value"]), _c(ci[0]), _c(ci[1]), sp["bound"] or "", sp["ci_note"] or ""]
            for m in MEASURES:
                for ph in PHASES:
                    a = row["analyses"][m.key][ph]
                    cells += [_c(a["mean"]), _c(a["std"]), a["n"]]
            w.writerow(cells)
        return buf.getvalue()

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


def _c(x: Any) -> Any:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.6g}"
    return x


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


def _step(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def fmt_steps(g: Group, which: str) -> str:
    """'1250', '> 8000' (censored), '1250 ± 120', or '>= 1800 ± 400 (1/3 censored)'."""
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
    if k == len(runs):
        lo = min(b for b in bounds if b is not None) if any(b is not None for b in bounds) else None
        return f"> {lo} (all {k} censored)" if lo is not None else "—"
    times = [v if not c else b for v, c, b in zip(vals, cens, bounds)]
    mean, std = mean_std(times)
    text = f"{mean:.0f} ± {std:.0f}"
    return f">= {text} ({k}/{len(runs)} censored)" if k else text


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
        return f"{text} [{sp['ci'][0]:.2f}, {sp['ci'][1]:.2f}]"
    return f"{text} (CI n/a: {sp['ci_note']})"


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


# ---------------------------------------------------------------------- entry points
def compute_missing(runs: Sequence[RunSummary], metrics: Sequence[str] | None = None, *,
                    threshold: float = 0.95, progress: bool = False) -> list[str]:
    """Compute the asked analyses (default: those the comparison shows) at each run's memorization,
    grokking and last checkpoints where the sidecar lacks them; returns notes on skipped ones."""
    from groklens.analyses.registry import get
    from groklens.analyses.runner import analyze_runs

    names = list(dict.fromkeys(metrics or ANALYSES_USED))
    for n in names:
        get(n)  # unknown -> BadInput before anything is computed
        if n not in ANALYSES_USED:
            raise BadInput(f"compare shows {', '.join(ANALYSES_USED)}; {n!r} is not one of them")
    notes = analyze_runs([r.path for r in runs], [(n, {}) for n in names], checkpoints="phases",
                         threshold=threshold, skip_inapplicable=metrics is None, progress=progress)
    for r in runs:
        r.stored.clear()
        r.analysis_state.clear()
        read_measures(r)
    return notes


def compare(paths: Sequence[str | Path], *, baseline: str | Path | None = None,
            group_by: str | Sequence[str] | None = None, threshold: float = 0.95, analyze: bool = False,
            metrics: Sequence[str] | None = None, progress: bool = False) -> Comparison:
    """Compare runs (see the module docstring). The baseline run joins the runs if not among them."""
    paths = list(paths)
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
    variant_fields = differing_fields([g.runs[0].config for g in groups], exclude) if groups_by in (None, [GROUP_VARIANT]) \
        else list(groups_by)
    return Comparison(threshold=threshold, groups=groups, grouped=groups_by is not None, baseline=base,
                      variant_fields=variant_fields, notes=notes)
