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
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from groklens.analyses.grokking import grok_evals_of
from groklens.analyses.llc import DEFAULT_LOCALIZATION, DEFAULT_LR
from groklens.analyses.measures import MEASURES, measure_key, reduce_value
from groklens.analyses.phases import run_phases
from groklens.analyses.radial import EpsDependenceWarning
from groklens.analyses.registry import Analysis, canonical_params, default_names, get, params_json
from groklens.analyses.store import Sidecar, identity_attrs, matches, variant_id
from groklens.checkpoints import Trajectory
from groklens.config import GROK_THRESHOLD
from groklens.errors import BadInput
from groklens.analyses.fourier import trivial_key_note
from groklens.fileio import json_depth

BATCH_CHECKPOINTS = 32  # checkpoints per call of an analysis's batch_func
COMMIT_SECONDS = 10.0  # a killed analysis loses at most this much finished work
PARAM_MAX_CHARS = 10_000  # an analysis parameter is a number, a name or a short list
PARAM_MAX_DEPTH = 4


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
    """Several analyses in one pass over the checkpoints of one run (each model is loaded once).

    With a `notes` list, analyses that do not apply to this run are skipped and explained there
    instead of raising BadInput (what `groklens analyze` does for its default set).
    """
    traj = trajectory if isinstance(trajectory, Trajectory) else Trajectory(trajectory)
    names = [n for n, _ in requests]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise BadInput(f"analysis {dup[0]!r} asked twice in one call")
    jobs = []
    for name, params in requests:
        a = get(name)
        p = canonical_params(a, a.resolve(traj, dict(params)) if a.resolve else params)
        jobs.append(_Job(a, p, params_json(p)))
    data = traj.dataset()
    chosen, model0, jobs = _validate(traj, jobs, data, steps, every, notes)  # before anything is written
    step_jobs = [j for j in jobs if j.analysis.kind == "step"]
    init = None
    if any(j.analysis.needs_init for j in step_jobs):
        if 0 not in set(int(s) for s in traj.steps):
            raise BadInput(f"{traj.path}: no checkpoint at step 0, so distance from initialisation is undefined")
        init = traj.params(0)
    sidecar = Sidecar(traj.path, traj.copy or 0)  # copy m >= 1 of a routed run keeps its own sidecar
    sidecar.check()
    _reuse_stored(sidecar, jobs, chosen, json.dumps(traj.config_dict, sort_keys=True), recompute)
    if store and any(j.todo for j in jobs):
        sidecar.check(writing=True)  # a read-only place is refused before anything is computed
    results = _run_level(traj, sidecar, jobs, store)
    _step_level(traj, sidecar, step_jobs, chosen, model0, data, init, store=store, progress=progress,
                commit_seconds=commit_seconds)
    for j in step_jobs:
        keys = list(j.have[chosen[0]]) if chosen else []
        results[j.name] = AnalysisResult(
            j.name, j.params, "step", list(chosen), {k: [j.have[s][k] for s in chosen] for k in keys},
            computed_steps=sorted(j.computed), reused_steps=[s for s in chosen if s not in set(j.computed)],
        )
    return {n: results[n] for n in names if n in results}


def _validate(traj, jobs: list[_Job], data, steps, every, notes: list[str] | None):
    """(chosen steps, model at the first, the jobs that apply): BadInput, or with a `notes` list a
    note per analysis that does not apply to this run, before anything is computed or written."""
    cfg = traj.config
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
    return chosen, model0, kept


def _reuse_stored(sidecar: Sidecar, jobs: list[_Job], chosen: list[int], config_json: str, recompute: bool) -> None:
    """Each job's identity, its stored rows at the chosen steps (unless recompute) and what is left to do."""
    for j in jobs:
        j.attrs = identity_attrs(j.name, j.params_json, config_json, j.analysis.kind)
        j.variant = variant_id(j.params_json)
        if j.analysis.kind == "step" and not recompute:
            stored = sidecar.read(j.name, j.variant)
            if matches(stored, j.attrs):
                j.have = {s: r for s, r in stored.rows().items() if s in set(chosen)}
        j.todo = [s for s in chosen if s not in j.have] if j.analysis.kind == "step" else []


def _run_level(traj, sidecar: Sidecar, jobs: list[_Job], store: bool) -> dict[str, AnalysisResult]:
    """Run-level analyses: cheap, always recomputed from the committed metrics."""
    results: dict[str, AnalysisResult] = {}
    for j in jobs:
        if j.analysis.kind != "run":
            continue
        params = dict(j.params)
        if params.get("grok_evals") == 0:  # the grokking table reads the run's own N
            params["grok_evals"] = grok_evals_of(traj.config_dict)
        values = _normalise(j.analysis.func(traj.metrics, **params), j.name)
        last = int(values["last_step"]) if "last_step" in values else 0
        stored = sidecar.read(j.name, j.variant)
        same = matches(stored, j.attrs) and stored.steps == [last] and set(stored.values) == set(values) and all(
            np.array_equal(stored.values[k][0], v) for k, v in values.items())
        if store and not same:  # rewrite only when the run's evaluations moved on
            sidecar.check(writing=True)
            sidecar.commit(j.name, j.variant, j.attrs, {last: values}, replace=True)
        results[j.name] = AnalysisResult(j.name, j.params, "run", [last], {k: [v] for k, v in values.items()},
                                         computed_steps=[last])
    return results


def _step_level(traj, sidecar: Sidecar, step_jobs: list[_Job], chosen: list[int], model0, data, init, *,
                store: bool, progress: bool, commit_seconds: float) -> None:
    """Per-checkpoint analyses at the steps some job lacks, committed every commit_seconds."""
    def flush() -> None:
        for j in step_jobs:
            if j.pending:
                sidecar.commit(j.name, j.variant, j.attrs, j.pending)
                j.pending = {}

    batched = [j for j in step_jobs if j.analysis.batch_func is not None]
    single = [j for j in step_jobs if j.analysis.batch_func is None]
    todo_steps = sorted(set().union(*[set(j.todo) for j in single])) if single else []
    from tqdm.auto import tqdm

    bar = tqdm(total=sum(len(j.todo) for j in step_jobs), disable=not progress, desc="analyze", unit="ckpt",
               dynamic_ncols=True, leave=False)
    last_commit = time.monotonic()
    try:
        for j in batched:  # checkpoints computed together, BATCH_CHECKPOINTS at a time
            for start in range(0, len(j.todo), BATCH_CHECKPOINTS):
                part = j.todo[start : start + BATCH_CHECKPOINTS]
                bar.set_postfix_str(f"{j.name} @ steps {part[0]}..{part[-1]}", refresh=False)
                models = [model0 if s == chosen[0] else traj.model(s) for s in part]
                for s, values in zip(part, j.analysis.batch_func(models, data, **_kwargs(j, init, None, traj.config))):
                    _keep(j, s, _normalise(values, j.name))
                bar.update(len(part))
                if store and time.monotonic() - last_commit >= commit_seconds:
                    flush()
                    last_commit = time.monotonic()
        for s in todo_steps:
            model = model0 if s == chosen[0] else traj.model(s)
            for j in single:
                if s in j.todo:
                    bar.set_postfix_str(f"{j.name} @ step {s}", refresh=False)
                    _compute_one(j, model, data, init, s, traj.config)
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


def _kwargs(j: _Job, init, step: int | None, cfg) -> dict[str, Any]:
    kwargs = dict(j.params)
    if "loss" in kwargs and kwargs["loss"] is None:  # the loss the run trained with
        kwargs["loss"] = getattr(cfg, "loss", "ce")
    if j.analysis.needs_init:
        kwargs["init_params"] = init
    if j.analysis.needs_step and step is not None:
        kwargs["step"] = int(step)
    return kwargs


def _keep(j: _Job, step: int, values: dict[str, np.ndarray]) -> None:
    j.have[step] = values
    j.pending[step] = values
    j.computed.append(step)


def _compute_one(j: _Job, model, data, init, step: int, cfg) -> None:
    _keep(j, step, _normalise(j.analysis.func(model, data, **_kwargs(j, init, step, cfg)), j.name))


# ---------------------------------------------------------------------- several runs
def choose_checkpoints(traj, spec: str, threshold: float = GROK_THRESHOLD) -> list[int]:
    """The checkpoints of `traj` that `spec` names: '+'-joined parts, each 'all', 'end' (the last
    checkpoint), 'phases' (those standing for memorization, grokking and the end, see
    analyses/phases.py), 'phases@T' (the same at accuracy threshold T, e.g. phases@0.99),
    'every:N' (every N-th, plus the last) or 'about:N' (about N spread along, plus the last)."""
    available = [int(s) for s in traj.steps]
    out: set[int] = set()
    for part in str(spec).split("+"):
        kind, _, n = part.strip().partition(":")
        if kind == "all":
            out |= set(available)
        elif kind == "end":
            out |= set(available[-1:])
        elif kind == "phases" or kind.startswith("phases@"):
            at = kind.partition("@")[2]
            try:
                t = float(at) if at else threshold
            except ValueError:
                t = -1.0
            if not 0 < t <= 1:
                raise ValueError(f"checkpoint choice {part!r}: phases@T needs a threshold T in (0, 1]")
            out |= set(run_phases(traj, t).checkpoint_steps())
        elif kind in ("every", "about") and n.isdigit() and int(n) >= 1:
            every = int(n) if kind == "every" else max(1, len(available) // int(n))
            out |= set(select_steps(available, every=every)) if available else set()
        else:
            raise ValueError(f"checkpoint choice {part!r} is not all, end, phases, phases@T, every:N or about:N")
    return sorted(out)


def analyze_runs(paths: Sequence[str | Path], requests: Sequence[tuple], *, checkpoints: str = "all",
                 threshold: float = GROK_THRESHOLD, workers: int = 1, skip_inapplicable: bool = True,
                 progress: bool = False) -> list[str]:
    """Analyses of several runs, each at chosen checkpoints, kept in each run's sidecar (what
    demo, reproduce, compare --analyze and report --analyze do); returns notes 'RUN.h5: ...'.

    `requests`: (name, params) computed at `checkpoints`, or (name, params, checkpoints) with
    their own choice (see choose_checkpoints; 'phases' uses `threshold`). Requests that share a
    choice run in one pass over the checkpoints. `skip_inapplicable`: an analysis that does not
    apply to a run is a note, else BadInput. `workers` > 1: one process per run at a time.
    """
    # (choice, requests) passes; an analysis asked twice at one choice with two parameter sets (the
    # demo's fourier, each checkpoint's key set and the last one's) goes into a second pass
    groups: list[tuple[str, list[tuple[str, dict]]]] = []
    for req in requests:
        spec = str(req[2]) if len(req) > 2 else checkpoints
        group = next((g for s, g in groups if s == spec and req[0] not in {n for n, _ in g}), None)
        if group is None:
            groups.append((spec, group := []))
        group.append((req[0], dict(req[1])))
    tasks = [dict(path=str(p), groups=groups, threshold=threshold, skip=skip_inapplicable,
                  progress=progress and workers <= 1) for p in paths]
    if workers <= 1 or len(tasks) <= 1:
        return [n for t in tasks for n in _analyze_one(t)]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tqdm.auto import tqdm

    notes: list[str] = []
    ctx = multiprocessing.get_context("forkserver" if os.name == "posix" else "spawn")
    with tqdm(total=len(tasks), disable=not progress, unit="run", desc="analyze", dynamic_ncols=True) as bar, \
            ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        for n in pool.map(_analyze_one, tasks):
            notes += n
            bar.update(1)
    return notes


def _analyze_one(task: dict[str, Any]) -> list[str]:
    """One run of analyze_runs (in this process or a worker)."""
    if _in_worker():
        import scipy.sparse.linalg  # noqa: F401  (loads scipy's own BLAS, so that the limit below reaches it)
        import torch
        from threadpoolctl import threadpool_limits

        # one run per core: torch's threads and the BLAS pools of numpy/scipy (eigsh, SVDs), whose
        # default of one thread per core made two workers slower than one (the demo's analyses:
        # 245 s with 2 workers, 211 s with 1, 77 s with the 2 workers at one thread each)
        torch.set_num_threads(1)
        threadpool_limits(1)

    traj = Trajectory(task["path"])
    notes: list[str] = []
    for spec, requests in task["groups"]:
        steps = choose_checkpoints(traj, spec, task["threshold"])
        if not steps:
            continue
        skipped: list[str] = []
        with warnings.catch_warnings():  # said once below, from the stored flags, not per checkpoint
            warnings.simplefilter("ignore", EpsDependenceWarning)
            results = compute_many(traj, requests, steps=steps, progress=task["progress"],
                                   notes=skipped if task["skip"] else None)
        notes += [f"{Path(task['path']).name}: {n}" for n in skipped + eps_notes(results)]
    return notes


def _in_worker() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None


# ---------------------------------------------------------------------- the CLI's entry points
def parse_params(items: Iterable[str], metrics: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`METRIC.KEY=VALUE` strings -> {metric: {key: value}}; VALUE is JSON, else a string."""
    out: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for item in items:
        head, sep, raw = item.partition("=")
        metric, dot, key = head.partition(".")
        if not sep or not dot or not metric or not key:
            raise BadInput(f"--param takes METRIC.KEY=VALUE (e.g. sharpness.top_k=3); got {item!r}")
        if metric not in metrics:
            raise BadInput(f"--param {item!r} is for metric {metric!r}, which is not being computed")
        if len(raw) > PARAM_MAX_CHARS:
            raise BadInput(f"--param {head}: the value is {len(raw)} characters long, over {PARAM_MAX_CHARS}")

        if json_depth(raw) > PARAM_MAX_DEPTH:
            raise BadInput(f"--param {head}: the value is nested deeper than {PARAM_MAX_DEPTH} levels")
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):
            value = raw
        if head in seen:
            raise BadInput(f"--param {head} is given twice")
        seen.add(head)
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

    traj = Trajectory(run, copy=copy)
    steps, every = with_phases(traj, parse_steps(steps), every)
    with warnings.catch_warnings():  # said once per analysis below, from the stored flags
        warnings.simplefilter("ignore", EpsDependenceWarning)
        results = compute_many(traj, [(m, parsed.get(m, {})) for m in chosen], steps=steps, every=every,
                               recompute=recompute, progress=progress, notes=None if asked else notes)
    notes += eps_notes(results) + key_notes(results, traj.config_dict.get("p")) + llc_notes(results)
    return {name: r.to_json() for name, r in results.items()}, notes


def with_phases(traj, steps: list[int] | None, every: int | None) -> tuple[list[int] | None, int | None]:
    """(steps, every) for compute_many: `--every K` means every K-th checkpoint, the last and the
    phase checkpoints (memorization, grokking: analyses/phases.py), so that compare and report
    find values there; explicit --checkpoints stay as given."""
    if every is None or steps is not None:
        return steps, every
    select_steps(traj.steps, every=every)  # BadInput for a bad --every or a run without checkpoints
    return choose_checkpoints(traj, f"every:{every}+phases"), None


def key_notes(results: dict[str, AnalysisResult], p: int | None) -> list[str]:
    """The fourier analysis' warning when its key set is most of the frequencies (small p)."""
    r = results.get("fourier")
    if r is None or not p or "n_key_frequencies" not in r.values:
        return []
    note = trivial_key_note(r.steps, [float(np.asarray(v).reshape(-1)[0]) for v in r.values["n_key_frequencies"]], p)
    return [note] if note else []


LLC_CALIBRATE_PROMPT = ("note: llc ran with its default lr and localization, calibrated on the README's p=23 "
                        "transformer; on a new architecture run `groklens llc-calibrate RUN` first (docs/ANALYSES.md, "
                        "'Calibrating')")


def llc_notes(results: dict[str, AnalysisResult]) -> list[str]:
    """The llc analysis' warnings from its stored flags (analyses/llc.py): negative estimates,
    chains pinned by the localization, and the prompt to calibrate where the defaults ran."""
    r = results.get("llc")
    if r is None or "pinned" not in r.values:
        return []

    def flagged(key: str) -> list[int]:
        return [s for s, v in zip(r.steps, r.values[key]) if np.any(np.asarray(v) == 1)]

    out = []
    negative, pinned = flagged("negative"), flagged("pinned")
    if negative:
        out.append(f"warning: llc is negative at step(s) {_step_list(negative)}: the chains found lower loss than the "
                   "checkpoint (not a local minimum, or an uncalibrated sampler); not a learning coefficient")
    if pinned:
        where = "every checkpoint" if len(pinned) == len(r.steps) else f"step(s) {_step_list(pinned)}"
        ratios = [float(np.asarray(v)) for v in r.values["distance_ratio"]]
        out.append(f"warning: llc chains are pinned by the localization at {where} (distance from w* / sqrt(d/gamma) "
                   f"= {min(ratios):.2f}-{max(ratios):.2f}): the localization dominates, the estimate reflects gamma, "
                   "not the loss")
    if (r.params.get("lr"), r.params.get("localization")) == (DEFAULT_LR, DEFAULT_LOCALIZATION):
        out.append(LLC_CALIBRATE_PROMPT)
    return out


def _step_list(steps: list[int], shown: int = 6) -> str:
    return ", ".join(map(str, steps[:shown])) + (f" and {len(steps) - shown} more" if len(steps) > shown else "")


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
    params = {k: v for k, v in params.items() if v is not None}
    traj = Trajectory(run, copy=copy)
    steps, every = with_phases(traj, parse_steps(steps), every)
    result = compute(traj, "probe", steps=steps, every=every, recompute=recompute, progress=progress,
                     site=site, target=target, **params)
    return {"probe": result.to_json()}


def summary_lines(run: str | Path, results: dict[str, Any], copy: int | None = None) -> list[str]:
    """`analyze --summary`: a line per measure the computed analyses declare (compare's columns):
    its value at the first analyzed checkpoint, at memorization and grokking (when their phase
    checkpoints were analyzed: `--every K` takes them) and at the last analyzed checkpoint."""
    ph = run_phases(Trajectory(run, copy=copy))
    lines = []
    for m in MEASURES:
        obj = results.get(m.analysis)
        key = measure_key(m, [k for k in obj if k != "steps"]) if obj and obj.get("steps") else None
        if key is None:
            continue
        at = dict(zip(obj["steps"], obj[key]))
        t = f"@{GROK_THRESHOLD:g}"  # the phases `--every K` adds (with_phases)
        points = (("start", obj["steps"][0]), ("memorization" + t, ph.steps.get("memorization")),
                  ("grokking" + t, ph.steps.get("grokking")), ("end", obj["steps"][-1]))
        cells = [f"{name} {_fmt(reduce_value(at[s], m.reduce))} (step {s})" if s in at else f"{name} —"
                 for name, s in points]
        lines.append(f"{m.label}: " + ", ".join(cells))
    return lines or ["no measure among the analyses computed (the full table: without --summary)"]


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
