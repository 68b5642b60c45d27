"""The work of a sweep, cut into tasks: `plan_tasks` groups runs into tasks (one run, or an
ensemble of runs that can share one batched loop), `execute_task` runs one task in a worker.

A task is a plain dict, so every executor can pickle it:
{"runs": [{"name", "config", "path"}, ...], "ensemble": bool, "threads": int, "cost": float}, and
"log" when the sweep mirrors its runs' rows to TensorBoard / W&B (`--log`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from pathlib import Path

from groklens.config import RunConfig
from groklens.sweeps.files import (
    check_same_config,
    claim_run,
    error_path,
    record_failure,
    run_path,
    run_state,
)
from groklens.trainers.loggers import MemberLoggers
from groklens.sweeps.grid import RunSpec
from groklens.errors import BadInput
from groklens.tasks import TASKS


def check_buildable(runs: Sequence[RunSpec]) -> None:
    """BadInput naming the first run whose config builds no run: hook sites of its regularizers,
    its task's data, its memory. What `train` would refuse after it started, refused for the whole
    sweep (and by --dry-run) before anything is trained. The model is built on the meta device."""
    import torch

    from groklens.checkpoints.validate import check_resources
    from groklens.models import build_model
    from groklens.trainers.optim import stack_of_one
    from groklens.trainers.regularizers import build_regularizers

    seen: set[str] = set()
    for r in runs:
        cfg = r.config
        key = repr(sorted((k, v) for k, v in cfg.to_dict().items() if k not in ("seed", "lr", "weight_decay")))
        if key in seen:
            continue
        seen.add(key)
        try:
            check_resources(cfg)
            data = TASKS.get(cfg.task).build(cfg)
            with torch.device("meta"):
                model = build_model(cfg, data)
                build_regularizers([cfg], model, data, stack_of_one(dict(model.named_parameters())))
        except BadInput as exc:
            raise BadInput(f"run {r.name}: {exc}") from None


def plan_tasks(runs: Sequence[RunSpec], out_dir: Path, *, ensemble: bool | Callable[[RunConfig], str | None],
               ensemble_size: int, workers: int, threads: int, cost: Callable[[RunConfig], float] | None = None
               ) -> tuple[list[dict], dict[str, str]]:
    """Tasks for an executor: one per run, or ensembles of runs sharing `ensemble_key`, sized
    by `cost` (seconds a run takes; default its step count) so that the workers finish together
    (`balanced_chunks`), the costliest task first. Each task carries its `cost`. `ensemble` may
    be a rule: cfg -> None where its runs should join an ensemble, else why they train alone.

    Returns (tasks, fallback) where fallback maps runs that train alone to why.
    """
    cost = cost or (lambda cfg: float(cfg.steps))

    def entry(r: RunSpec) -> dict:
        return {"name": r.name, "config": r.config.to_dict(), "path": str(run_path(out_dir, r.name))}

    def task(members: list[RunSpec]) -> dict:
        return {"runs": [entry(m) for m in members], "ensemble": len(members) > 1, "threads": threads,
                "cost": sum(cost(m.config) for m in members)}

    if not ensemble:
        return [task([r]) for r in runs], {}
    from groklens.trainers.ensemble import ensemble_key, unsupported_reason

    groups: dict[tuple, list[RunSpec]] = {}
    singles: list[RunSpec] = []
    fallback: dict[str, str] = {}
    for r in runs:
        alone = None if ensemble is True else ensemble(r.config)
        key = ensemble_key(r.config) if alone is None else None
        if key is None:
            singles.append(r)
            fallback[r.name] = alone or unsupported_reason(r.config) or "not supported"
        else:
            groups.setdefault(key, []).append(r)
    chunks = balanced_chunks([[(r, cost(r.config)) for r in g] for g in groups.values()],
                             [cost(r.config) for r in singles], workers, ensemble_size)
    tasks = [task(c) for c in chunks] + [task([r]) for r in singles]
    return sorted(tasks, key=lambda t: -t["cost"]), fallback  # stable: the plan's order among equals


def balanced_chunks(groups: list[list[tuple[RunSpec, float]]], singles: list[float], workers: int,
                    size: int) -> list[list[RunSpec]]:
    """Cut each group of (run, cost) into ensembles of at most `size` members so that `workers`
    workers, each taking the costliest task left, finish together: every worker gets an equal
    share of the total cost (singles included), filled costliest group first into the least
    loaded worker, a chunk at least one run. So no worker idles while another has more than one
    run's work left (9 equal runs in groups of 3 and 6 on 2 workers: 5 and 4, not 6 and 3)."""
    total = sum(c for g in groups for _, c in g) + sum(singles)
    share = total / max(workers, 1)
    loads = [0.0] * max(workers, 1)
    for c in sorted(singles, reverse=True):  # singles take a worker each, as the executor hands them
        loads[loads.index(min(loads))] += c
    chunks = []
    for g in sorted(groups, key=lambda g: -sum(c for _, c in g)):
        rest = list(g)
        while rest:
            i = loads.index(min(loads))
            room, n, used = share - loads[i], 0, 0.0
            while n < len(rest) and n < size and (n == 0 or used + rest[n][1] <= room + 1e-9):
                used += rest[n][1]
                n += 1
            chunks.append([r for r, _ in rest[:n]])
            loads[i] += used
            rest = rest[n:]
    return chunks


def expected_wall(costs: Sequence[float], workers: int) -> float:
    """When the last worker runs out of work, each worker taking the next task (in the given
    order, the executors' order) as it frees: the sweep's expected wall time in `costs`' unit."""
    free = [0.0] * max(workers, 1)
    for c in costs:
        free[free.index(min(free))] += c
    return max(free)


def execute_task(task: dict) -> list[dict]:
    """Run one task (a single run, or an ensemble of runs) in this process.

    `task` = {"runs": [{"name", "config", "path"}, ...], "ensemble": bool, "threads": int, "cost": float,
    "log": [[kind, target], ...] (optional: `--log`, each run under its name)}.
    Returns one outcome per run: {"name", "state": done|failed|running, "detail"}. Errors are
    written to the run's error file here, so they survive a lost coordinator.
    """
    import torch

    threads = int(task.get("threads") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    runs = task["runs"]
    logs = MemberLoggers([tuple(s) for s in task.get("log") or ()], _warn)
    try:
        if task.get("ensemble") and len(runs) > 1:
            return _execute_ensemble(runs, logs)
        return [_execute_single(r, logs) for r in runs]
    finally:
        logs.close()


def _warn(line: str) -> None:
    print(f"groklens: warning: {line}", file=sys.stderr, flush=True)


def _execute_single(run: dict, logs) -> dict:
    name, path = run["name"], Path(run["path"])
    with claim_run(path.parent, name) as mine:
        if not mine:
            return {"name": name, "state": "running", "detail": "trained by another sweep"}
        return _execute_claimed(run, logs)


def _state_for_retry(path: Path, name: str) -> tuple[str, str]:
    """run_state, after dropping a failed run's error file: a task that reaches a failed run
    retries it (its error stays until the retry succeeds or records a new one)."""
    state, detail = run_state(path.parent, name)
    if state == "failed":
        error_path(path.parent, name).unlink(missing_ok=True)  # a retry
        state, detail = run_state(path.parent, name)
    return state, detail


def _execute_claimed(run: dict, logs) -> dict:
    from groklens.trainers import train as training

    name, path = run["name"], Path(run["path"])
    try:
        cfg = RunConfig.from_dict(run["config"])
        on_eval = (lambda row: logs.log(path, cfg, row)) if logs.specs else None
        state, detail = _state_for_retry(path, name)
        if state == "done":
            return {"name": name, "state": "done", "detail": detail}
        if state == "running":
            return {"name": name, "state": "running", "detail": "written by another process"}
        if state == "blocked":  # not ours: reported, neither replaced nor given an error file
            return {"name": name, "state": "failed", "detail": detail}
        if state == "interrupted":
            check_same_config(path, cfg)
            result = training.resume(path, progress=False, on_eval=on_eval)
            if result.status == "already complete":
                _mark_complete(path)
        else:
            result = training.train(cfg, path, force=True, progress=False, on_eval=on_eval)
        return {"name": name, "state": "done", "detail": f"step {result.last_step}"}
    except Exception as exc:  # noqa: BLE001 - recorded; Ctrl-C and SystemExit (a requeue) go through
        return record_failure(path, name, exc)


def _execute_ensemble(runs: list[dict], logs) -> list[dict]:
    with ExitStack() as stack:
        mine = [r for r in runs if stack.enter_context(claim_run(Path(r["path"]).parent, r["name"]))]
        outcomes = {r["name"]: {"name": r["name"], "state": "running", "detail": "trained by another sweep"}
                    for r in runs if r not in mine}
        outcomes.update({o["name"]: o for o in _execute_ensemble_claimed(mine, logs)} if mine else {})
    return [outcomes[r["name"]] for r in runs]


def _execute_ensemble_claimed(runs: list[dict], logs) -> list[dict]:
    outcomes, groups = _sort_members(runs)
    for kind, group in groups:
        if not group:
            continue
        if len(group) == 1:  # one member: the ordinary loop is the same computation
            outcomes[group[0]["name"]] = _execute_claimed(group[0], logs)
        else:
            outcomes.update(_train_together(kind, group, logs))
    return [outcomes[r["name"]] for r in runs]


def _sort_members(runs: list[dict]) -> tuple[dict[str, dict], list[tuple[str, list[dict]]]]:
    """The outcomes of members with nothing to train (done, running, broken), and the rest as
    groups to train together: the fresh ones, and the interrupted ones by their last step."""
    from groklens.checkpoints import recover

    outcomes: dict[str, dict] = {}
    fresh: list[dict] = []
    by_step: dict[int, list[dict]] = {}
    for run in runs:
        name, path = run["name"], Path(run["path"])
        try:
            state, detail = _state_for_retry(path, name)
            if state == "done":
                outcomes[name] = {"name": name, "state": "done", "detail": detail}
            elif state == "running":
                outcomes[name] = {"name": name, "state": "running", "detail": "written by another process"}
            elif state == "blocked":
                outcomes[name] = {"name": name, "state": "failed", "detail": detail}
            elif state == "interrupted":
                from groklens.trainers.train import check_stored_state

                check_same_config(path, RunConfig.from_dict(run["config"]))
                check_stored_state(path)  # before recover() writes anything
                by_step.setdefault(recover(path), []).append(run)
            else:
                fresh.append(run)
        except Exception as exc:  # noqa: BLE001
            outcomes[name] = record_failure(path, name, exc)
    return outcomes, [("fresh", fresh)] + [("resume", g) for g in by_step.values()]


def _train_together(kind: str, group: list[dict], logs) -> dict[str, dict]:
    """Train (kind "fresh") or resume (kind "resume") `group` as one ensemble; an outcome per member."""
    from groklens.trainers.ensemble import resume_ensemble, train_ensemble

    paths = [Path(r["path"]) for r in group]
    on_eval = logs.on_eval if logs.specs else None
    try:
        if kind == "fresh":
            results = train_ensemble([RunConfig.from_dict(r["config"]) for r in group], paths, force=True,
                                     on_eval=on_eval)
        else:
            results = resume_ensemble(paths, on_eval=on_eval)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - the whole ensemble failed: every member records it
        return {r["name"]: record_failure(Path(r["path"]), r["name"], exc) for r in group}
    outcomes = {}
    for r, res in zip(group, results):
        if res.error is not None:
            outcomes[r["name"]] = record_failure(res.path, r["name"], res.error)
        else:
            outcomes[r["name"]] = {"name": r["name"], "state": "done", "detail": f"step {res.result.last_step}"}
    return outcomes


def _mark_complete(path: Path) -> None:
    """A run killed after its last checkpoint but before closing: repair it and say so."""
    from groklens.checkpoints import TrajectoryWriter, recover

    recover(path)
    TrajectoryWriter.reopen(path).close("completed")
