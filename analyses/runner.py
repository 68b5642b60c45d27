"""Run analyses along a trajectory: choose checkpoints, reuse stored results, compute the rest,
store them in the sidecar (groklens.analyses.store), and give them back.

`compute(trajectory, name, steps=..., **params)` is the Python entry point; `analyze_run` and
`probe_run` are what `groklens analyze` and `groklens probe` call. Everything the user asked
for (analysis names, parameters, hook sites, steps) is validated, on the model of the first
asked checkpoint, before anything is computed or written: bad input creates or changes no file.
Runs are read only through `Trajectory`, which sees only committed checkpoints, so a run
that is still being trained can be analyzed.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from groklens.analyses.registry import Analysis, canonical_params, default_names, get, params_json
from groklens.analyses.store import Sidecar, identity_attrs, matches, variant_id
from groklens.errors import BadInput

COMMIT_SECONDS = 10.0  # a killed analysis loses at most this much finished work


@dataclass
class AnalysisResult:
    """One analysis over checkpoints: `values[name][i]` is the value at `steps[i]`."""

    name: str
    params: dict[str, Any]
    kind: str
    steps: list[int]
    values: dict[str, list[np.ndarray]]
    computed_steps: list[int] = field(default_factory=list)
    reused_steps: list[int] = field(default_factory=list)

    def __getitem__(self, key: str) -> np.ndarray | list[np.ndarray]:
        """A value over steps: an array [n_steps, ...] when its shape is fixed, else a list."""
        rows = self.values[key]
        if len({np.shape(r) for r in rows}) == 1:
            return np.stack([np.asarray(r) for r in rows]) if rows else np.zeros(0)
        return rows

    def to_json(self) -> dict[str, Any]:
        if self.kind == "run":
            out = {k: _plain(v[0]) for k, v in self.values.items()}
            for key in list(out):  # a censored step (stored as -1) prints as null
                flags = out.get(key[: -len("_step")] + "_censored") if key.endswith("_step") else None
                if isinstance(flags, list) and isinstance(out[key], list):
                    out[key] = [None if c else v for v, c in zip(out[key], flags)]
            return out
        out: dict[str, Any] = {"steps": list(self.steps)}
        for k, rows in self.values.items():
            out[k] = [_plain(r) for r in rows]
        return out


def _plain(x: Any) -> Any:
    """numpy -> JSON values; NaN and infinities -> None (JSON has no NaN)."""
    a = np.asarray(x)
    if a.ndim:
        return [_plain(v) for v in a]
    v = a.item()
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _normalise(values: dict[str, Any], name: str) -> dict[str, np.ndarray]:
    out = {}
    for k, v in values.items():
        a = np.asarray(v)
        if a.dtype == bool or np.issubdtype(a.dtype, np.integer):
            a = a.astype(np.int64)
        elif np.issubdtype(a.dtype, np.floating):
            a = a.astype(np.float64)
        else:
            raise TypeError(f"analysis {name} returned a non-numeric value {k!r}: {v!r}")
        out[k] = a
    return out


# ---------------------------------------------------------------------- choosing checkpoints
def parse_steps(steps: Iterable[Any] | None) -> list[int] | None:
    """Steps from ints or strings ("100", "100,200"); None when none given."""
    if steps is None:
        return None
    out = []
    for item in steps:
        for part in str(item).replace(",", " ").split():
            try:
                out.append(int(part))
            except ValueError:
                raise BadInput(f"--checkpoints takes integer checkpoint steps; got {part!r}") from None
    return out or None


def select_steps(available: Sequence[int], steps: Sequence[int] | None = None, every: int | None = None) -> list[int]:
    """The asked checkpoints: `steps` (each must exist), every `every`-th checkpoint (by index,
    from the first, plus the last), or all of them."""
    available = [int(s) for s in available]
    if not available:
        raise BadInput("the run has no committed checkpoint yet")
    if steps is not None and every is not None:
        raise BadInput("give either --every or --checkpoints, not both")
    if steps is not None:
        have = set(available)
        missing = [s for s in steps if s not in have]
        if missing:
            raise BadInput(f"no checkpoint at step(s) {', '.join(map(str, missing))}; checkpoints: "
                           f"{available[0]}..{available[-1]} ({len(available)} checkpoints)")
        return sorted(set(int(s) for s in steps))
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise BadInput(f"--every must be a positive integer; got {every!r}")
        return sorted(set(available[::every]) | {available[-1]})
    return available


# ---------------------------------------------------------------------- computing
@dataclass
class _Job:
    analysis: Analysis
    params: dict[str, Any]
    params_json: str
    attrs: dict[str, str] = field(default_factory=dict)
    variant: str = ""
    have: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    todo: list[int] = field(default_factory=list)
    pending: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    computed: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.analysis.name


def compute(trajectory, name: str, *, steps: Sequence[int] | None = None, every: int | None = None,
            recompute: bool = False, store: bool = True, progress: bool = False, **params) -> AnalysisResult:
    """Analysis `name` at the asked checkpoints of `trajectory` (a Trajectory or a path).

    Stored results with the same parameters are reused per step (`recompute=True` recomputes);
    new results are stored in the run's sidecar unless `store=False`.
    """
    return compute_many(trajectory, [(name, params)], steps=steps, every=every, recompute=recompute,
                        store=store, progress=progress)[name]


def compute_many(trajectory, requests: Sequence[tuple[str, dict[str, Any]]], *, steps: Sequence[int] | None = None,
                 every: int | None = None, recompute: bool = False, store: bool = True, progress: bool = False,
                 notes: list[str] | None = None, commit_seconds: float = COMMIT_SECONDS) -> dict[str, AnalysisResult]:
    """Several analyses in one pass over the checkpoints (each model is loaded once).

    With a `notes` list, analyses that do not apply to this run are skipped and explained there
    instead of raising BadInput (what `groklens analyze` does for its default set).
    """
    from groklens.checkpoints import Trajectory

    traj = trajectory if isinstance(trajectory, Trajectory) else Trajectory(trajectory)
    names = [n for n, _ in requests]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput(f"analysis {dup[0]!r} asked twice in one call")
    jobs = []
    for name, params in requests:
        a = get(name)
        p = canonical_params(a, params)
        jobs.append(_Job(a, p, params_json(p)))

    # ---- validate everything before computing or writing anything
    cfg = traj.config
    config_json = json.dumps(traj.config_dict, sort_keys=True)
    data = traj.dataset()
    step_jobs = [j for j in jobs if j.analysis.kind == "step"]
    chosen = select_steps(traj.steps, steps, every) if step_jobs else []
    model0 = traj.model(chosen[0]) if step_jobs else None
    kept = []
    for j in jobs:
        try:
            if j.analysis.tasks is not None and cfg.task not in j.analysis.tasks:
                raise BadInput(f"analysis {j.name!r} applies to tasks {', '.join(j.analysis.tasks)}; "
                               f"this run's task is {cfg.task!r}")
            if j.analysis.kind == "step" and j.analysis.check is not None:
                j.analysis.check(model0, data, j.params)
        except BadInput as exc:
            if notes is None:
                raise
            notes.append(f"skipped {j.name}: {exc}")
            continue
        kept.append(j)
    jobs = kept
    step_jobs = [j for j in jobs if j.analysis.kind == "step"]
    init = None
    if any(j.analysis.needs_init for j in step_jobs):
        if 0 not in set(int(s) for s in traj.steps):
            raise BadInput(f"{traj.path}: no checkpoint at step 0, so distance from initialisation is undefined")
        init = traj.params(0)
    sidecar = Sidecar(traj.path, traj.copy or 0)  # copy m >= 1 of a routed run keeps its own sidecar
    sidecar.check()
    for j in jobs:
        j.attrs = identity_attrs(j.name, j.params_json, config_json, j.analysis.kind)
        j.variant = variant_id(j.params_json)
        if j.analysis.kind == "step" and not recompute:
            stored = sidecar.read(j.name, j.variant)
            if matches(stored, j.attrs):
                j.have = {s: r for s, r in stored.rows().items() if s in set(chosen)}
        j.todo = [s for s in chosen if s not in j.have] if j.analysis.kind == "step" else []

    results: dict[str, AnalysisResult] = {}
    # ---- run-level analyses: cheap, always recomputed from the committed metrics
    for j in jobs:
        if j.analysis.kind != "run":
            continue
        values = _normalise(j.analysis.func(traj.metrics, **j.params), j.name)
        last = int(values["last_step"]) if "last_step" in values else 0
        stored = sidecar.read(j.name, j.variant)
        same = matches(stored, j.attrs) and stored.steps == [last] and set(stored.values) == set(values) and all(
            np.array_equal(stored.values[k][0], v) for k, v in values.items())
        if store and not same:  # rewrite only when the run's evaluations moved on
            sidecar.commit(j.name, j.variant, j.attrs, {last: values}, replace=True)
        results[j.name] = AnalysisResult(j.name, j.params, "run", [last], {k: [v] for k, v in values.items()},
                                         computed_steps=[last])

    # ---- per-checkpoint analyses
    def flush() -> None:
        for j in step_jobs:
            if j.pending:
                sidecar.commit(j.name, j.variant, j.attrs, j.pending)
                j.pending = {}

    todo_steps = sorted(set().union(*[set(j.todo) for j in step_jobs])) if step_jobs else []
    from tqdm.auto import tqdm

    bar = tqdm(total=sum(len(j.todo) for j in step_jobs), disable=not progress, desc="analyze", unit="ckpt",
               dynamic_ncols=True, leave=False)
    last_commit = time.monotonic()
    try:
        for s in todo_steps:
            model = model0 if s == chosen[0] else traj.model(s)
            for j in step_jobs:
                if s not in j.todo:
                    continue
                bar.set_postfix_str(f"{j.name} @ step {s}", refresh=False)
                kwargs = dict(j.params)
                if "loss" in kwargs and kwargs["loss"] is None:  # the loss the run trained with
                    kwargs["loss"] = getattr(cfg, "loss", "ce")
                if j.analysis.needs_init:
                    kwargs["init_params"] = init
                if j.analysis.needs_step:
                    kwargs["step"] = int(s)
                values = _normalise(j.analysis.func(model, data, **kwargs), j.name)
                j.have[s] = values
                j.pending[s] = values
                j.computed.append(s)
                bar.update(1)
            if store and time.monotonic() - last_commit >= commit_seconds:
                flush()
                last_commit = time.monotonic()
    except BadInput:
        raise  # a damaged checkpoint is bad input: the command leaves every file as it was
    except BaseException:
        if store:
            try:
                flush()  # keep every finished checkpoint, then report the failure
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
        raise
    finally:
        bar.close()
    if store:
        flush()
    for j in step_jobs:
        keys = list(j.have[chosen[0]]) if chosen else []
        results[j.name] = AnalysisResult(
            j.name, j.params, "step", list(chosen), {k: [j.have[s][k] for s in chosen] for k in keys},
            computed_steps=sorted(j.computed), reused_steps=[s for s in chosen if s not in set(j.computed)],
        )
    return {n: results[n] for n in names if n in results}


# ---------------------------------------------------------------------- the CLI's entry points
def parse_params(items: Iterable[str], metrics: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`METRIC.KEY=VALUE` strings -> {metric: {key: value}}; VALUE is JSON, else a string."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        head, sep, raw = item.partition("=")
        metric, dot, key = head.partition(".")
        if not sep or not dot or not metric or not key:
            raise BadInput(f"--param takes METRIC.KEY=VALUE (e.g. sharpness.top_k=3); got {item!r}")
        if metric not in metrics:
            raise BadInput(f"--param {item!r} is for metric {metric!r}, which is not being computed")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        out.setdefault(metric, {})[key] = value
    return out


def analyze_run(run: str | Path, *, metrics: Sequence[str] = (), steps: Iterable[Any] | None = None,
                every: int | None = None, params: Iterable[str] = (), recompute: bool = False,
                progress: bool = True, copy: int | None = None) -> tuple[dict[str, Any], list[str]]:
    """`groklens analyze`: {metric: {"steps": [...], value: [...]}} and notes (skipped metrics).
    `copy`: which copy of a routed run (default: the file as stored, copy 0)."""
    asked = list(dict.fromkeys(metrics))
    for m in asked:
        get(m)  # unknown metric -> BadInput before anything else
    chosen = asked or default_names()
    parsed = parse_params(params, chosen)
    notes: list[str] = []
    from groklens.checkpoints import Trajectory

    from groklens.analyses.radial import EpsDependenceWarning

    with warnings.catch_warnings():  # said once per analysis below, from the stored flags
        warnings.simplefilter("ignore", EpsDependenceWarning)
        results = compute_many(Trajectory(run, copy=copy), [(m, parsed.get(m, {})) for m in chosen],
                               steps=parse_steps(steps), every=every,
                               recompute=recompute, progress=progress, notes=None if asked else notes)
    notes += eps_notes(results)
    return {name: r.to_json() for name, r in results.items()}, notes


def eps_notes(results: dict[str, AnalysisResult]) -> list[str]:
    """A warning per analysis whose stored result flags a value as set by a norm's eps."""
    out = []
    for name, r in results.items():
        flagged = sorted(k.partition("@")[2] or "the model" for k, rows in r.values.items()
                         if k.startswith("eps_dependent") and any(np.any(np.asarray(v) == 1) for v in rows))
        if flagged:
            out.append(f"warning: {name} at {', '.join(flagged)} depends on a scale-invariant norm's eps "
                       f"(eps_dependent = 1; see docs/ANALYSES.md, 'Where radial and sharpness mean something')")
    return out


def probe_run(run: str | Path, *, site: str, target: str, steps: Iterable[Any] | None = None,
              every: int | None = None, recompute: bool = False, progress: bool = True,
              copy: int | None = None, **params) -> dict[str, Any]:
    """`groklens probe`: {"probe": {"steps": [...], value: [...]}}; `copy` as analyze_run."""
    from groklens.checkpoints import Trajectory

    params = {k: v for k, v in params.items() if v is not None}
    result = compute(Trajectory(run, copy=copy), "probe", steps=parse_steps(steps), every=every, recompute=recompute, progress=progress,
                     site=site, target=target, **params)
    return {"probe": result.to_json()}


def format_results(results: dict[str, Any], max_items: int = 8) -> str:
    """A readable table per metric: one row per step, scalar and short values only."""
    lines = []
    for name, obj in results.items():
        lines.append(f"== {name}")
        if "steps" not in obj:
            for k, v in obj.items():
                lines.append(f"  {k}: {v}")
            continue
        keys = [k for k in obj if k != "steps" and all(_short(v, max_items) for v in obj[k])]
        hidden = len(obj) - 1 - len(keys)
        for i, s in enumerate(obj["steps"]):
            cells = ", ".join(f"{k}={_fmt(obj[k][i])}" for k in keys)
            lines.append(f"  step {s}: {cells}")
        if hidden:
            lines.append(f"  ({hidden} longer values not shown; use --json)")
    return "\n".join(lines)


def _short(v: Any, max_items: int) -> bool:
    return not isinstance(v, list) or (len(v) <= max_items and all(not isinstance(x, list) for x in v))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + " ".join(_fmt(x) for x in v) + "]"
    return "nan" if v is None else str(v)
