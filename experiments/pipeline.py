"""The reproduce pipeline: configs and cost, `--list`, training what the ledger lacks, the rows, RESULTS.md."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groklens.errors import BadInput, GroklensError
from groklens.experiments.layout import plan_layout
from groklens.experiments.core import (
    FROM_SEED, Context, EXPERIMENT_DEFAULTS, EXPERIMENTS, Experiment, default_out, LEDGER_DIR, RESULTS_BEGIN,
    RESULTS_END, Result,
    SCALES, Scale)


def _fmt_duration(s: float) -> str:
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} days"


# ---------------------------------------------------------------------- configs and cost
def run_configs(exp: Experiment, scale: str, seeds: int) -> list[tuple[str, str, Any]]:
    """(variant, run name, RunConfig) of every run of `exp` at `scale` with seeds 1..seeds; a
    field a variant sets to FROM_SEED takes the run's seed (`data_seed`: a split per seed)."""
    from groklens.config import config_from

    sc = exp.scales[scale]
    plan = exp.plan(sc, scale)
    base = dict(sc.base)
    preset_name = base.pop("preset", None)  # a scale may start from a named preset
    out = []
    for variant, over in plan.variants.items():
        for seed in range(1, seeds + 1):
            fields = {**EXPERIMENT_DEFAULTS, **base, **over, "seed": seed}
            fields = {k: seed if v == FROM_SEED else v for k, v in fields.items()}  # e.g. the split from the seed
            cfg = config_from(preset_name, overrides=fields)
            out.append((variant, f"{variant}_s{seed}", cfg))
    return out


FITS_RUN_S = 4 * 3600  # a scale fits this CPU when no run takes longer on one core ...
FITS_TOTAL_S = 72 * 3600  # ... and all its runs (default seeds) take at most this wall time on this CPU's cores


def _ledger_dirs(extra: str | Path | None = None, local: Sequence[Path] = ()) -> list[Path]:
    """The committed ledgers (docs/results of a checkout), `extra` (--ledger), and the ledgers of
    `local` output directories where they exist; each directory once."""
    dirs = [LEDGER_DIR] if LEDGER_DIR.is_dir() else []
    dirs += [Path(extra)] if extra is not None else []
    dirs += [d / "ledger" for d in local if (d / "ledger").is_dir()]
    return list({d.resolve(): d for d in dirs}.values())


def _last_steps(entries: list[dict[str, Any]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for e in entries:
        out.setdefault(e["arm"], []).append(int(e["last_step"]))
    return out


def estimate_runs(exp: Experiment, scale: str, runs: list[tuple[str, Any]], entries: list[dict[str, Any]],
                  rates: dict[str, Any]) -> list[Any]:
    """cost.RunCost of each (variant, cfg) of `exp` at `scale`: the ledger's last steps of each arm
    (`entries`), else the scale's expected grokking step, else the cap."""
    from groklens.experiments.cost import cost_runs

    return cost_runs(runs, exp.scales[scale].expected_grok, _last_steps(entries), rates)


def listing(ledger_dir: str | Path | None = None, measure: bool = True,
            echo: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every experiment with its runs, their estimated CPU-core time (to the expected stop, and
    to the step cap), the time per run measured where one ran (the ledgers: docs/results/ of a
    checkout, `ledger_dir`, and those of the experiment's default output directories here, such
    as ./demo-out after `groklens demo`: CPU time where recorded, else wall time), and whether
    it fits this CPU. measure=False: the step rates from the FLOP model, nothing timed."""
    from groklens.experiments.cost import EXPECTED_MARGIN, rates_for
    from groklens.experiments.ledger import ledger_entries, measured_time

    cores = os.cpu_count() or 1
    plans = {}
    for name in EXPERIMENTS:
        e = EXPERIMENTS.get(name)
        for scale in SCALES:
            n = e.seeds_default(scale)
            plans[name, scale] = (e, n, [(v, c) for v, _, c in run_configs(e, scale, n)])
    rates = rates_for((c for *_, runs in plans.values() for _, c in runs), measure=measure, echo=echo)
    out = {}
    for (name, scale), (e, n, runs) in plans.items():
        item = out.setdefault(name, {"name": e.name, "summary": e.summary, "scales": {}})
        entries = ledger_entries(_ledger_dirs(ledger_dir, e.default_outs(scale)), e.name, scale)
        costs = estimate_runs(e, scale, runs, entries, rates)
        measured = measured_time(entries)
        kind = None if measured is None or not all(d.startswith("cpu") for d in measured["devices"]) else \
            "cpu" if measured["cpu"] else "wall"
        # the measured time stands for all runs only where every arm has measured runs (a plan whose
        # cheap arms are recorded and whose baseline is not would look as cheap as those arms)
        every_arm = {v for v, _ in runs} <= {e.get("arm") for e in entries}
        m = measured[kind] if kind and every_arm else None
        per_run = m["max_s"] if m else max(c.expected_s for c in costs)
        total = m["mean_s"] * len(runs) if m else sum(c.expected_s for c in costs)
        item["scales"][scale] = {
            "runs": len(runs), "seeds": n, "max_steps": max(c.steps for _, c in runs),
            # CPU-core seconds of all runs on one thread each: to the expected stop, and every run to its cap
            "cpu_seconds_expected": sum(c.expected_s for c in costs),
            "cpu_seconds_cap": sum(c.cap_s for c in costs),
            "expected_margin": EXPECTED_MARGIN,
            "stop_basis": {b: sum(c.stop_basis == b for c in costs) for b in ("ledger", "expected", "cap")},
            "rate_basis": sorted({c.rate_basis for c in costs}),
            "measured": measured,
            "fits_cpu": per_run <= FITS_RUN_S and total / cores <= FITS_TOTAL_S,
            "fits_basis": f"measured {kind}" if m else "estimate",
            "seconds_here": total / cores,  # what "fits" judged: all runs on this CPU's cores
            "note": e.scales[scale].note}
    return list(out.values())


_STOP_MARK = {"ledger": "L", "expected": "E", "cap": "C"}


def _basis_mark(s: dict[str, Any]) -> str:
    step = "+".join("M" if b == "measured" else "F" for b in s["rate_basis"])
    return step + "/" + "+".join(_STOP_MARK[b] for b, k in s["stop_basis"].items() if k)


def format_listing(items: list[dict[str, Any]]) -> str:
    from groklens.experiments.cost import EXPECTED_MARGIN, MEASURE_BUDGET_S, MEASURE_STEPS

    cores = os.cpu_count() or 1
    lines = [f"experiment             scale  runs  {f'fits this CPU ({cores} cores)? all runs here':<42}  "
             f"{'measured per run (ledger)':<40}  estimate: CPU-core time of all runs (every run to its cap) basis"]
    for it in items:
        for scale in SCALES:
            s = it["scales"][scale]
            m = s["measured"]
            kind = "cpu" if m and m["cpu"] else "wall" if m else None
            meas = (f"{'CPU' if kind == 'cpu' else 'wall'} {_fmt_duration(m[kind]['mean_s'])} mean, "
                    f"{_fmt_duration(m[kind]['max_s'])} max (n={m[kind]['n']}, {'/'.join(m['devices'])})"
                    if m else "not run yet")
            fits = (("yes" if s["fits_cpu"] else "no") + f": {_fmt_duration(s['seconds_here'])} ({s['fits_basis']})")
            est = f"{_fmt_duration(s['cpu_seconds_expected'])} ({_fmt_duration(s['cpu_seconds_cap'])}) {_basis_mark(s)}"
            lines.append(f"{it['name'] if scale == 'smoke' else '':<22} {scale:<6} {s['runs']:>4}  {fits:<42}  "
                         f"{meas:<40}  {est}")
        lines.append(f"{'':<22} {it['summary']}")
        lines.append(f"{'':<22} quick: {it['scales']['quick']['note']}")
    lines.append(f"Fits this CPU: no run over {FITS_RUN_S / 3600:g} h on one core and all runs (default seeds) within "
                 f"{FITS_TOTAL_S / 3600:g} h on the {cores} cores; the time shown is that of all runs on the {cores} "
                 "cores: from the ledger's measured time per run where runs were recorded on a CPU (its CPU time where "
                 "recorded, else its wall time; mean x runs / cores), else from the estimate / cores.")
    lines.append(f"Estimate basis, step/stop: M = step and evaluation timed here on one thread ({MEASURE_STEPS} steps "
                 f"at most, {MEASURE_BUDGET_S:g} s of CPU per config; cached), F = the FLOP model (a run meant for a "
                 "GPU here, or --no-measure); L = each run to the mean last step of the ledger's runs of its arm, "
                 f"E = to {EXPECTED_MARGIN:g}x the experiment's expected grokking step (published or a baseline's) "
                 "plus the evaluations its stop rule waits, C = to its step cap. In brackets: every run to its cap.")
    return "\n".join(lines)


def estimate_text(exp: Experiment, scale: str, todo: list[Any], ledger_entries: list[dict[str, Any]],
                  measure: bool = True) -> str:
    """`reproduce`'s line before it trains: the CPU-core time of the runs to train."""
    from groklens.experiments.cost import EXPECTED_MARGIN, rates_for

    runs = [(r.variant, r.cfg) for r in todo]
    costs = estimate_runs(exp, scale, runs, ledger_entries, rates_for([c for _, c in runs], measure=measure))
    basis = {b: sum(c.stop_basis == b for c in costs) for b in ("ledger", "expected", "cap")}
    stops = {"ledger": "the ledger runs of their arm", "expected": f"{EXPECTED_MARGIN:g}x the expected grokking step",
             "cap": "their step cap"}
    how = ", ".join(f"{k} to {stops[b]}" for b, k in basis.items() if k)
    rate = "/".join(sorted({"timed here" if c.rate_basis == "measured" else "the FLOP model" for c in costs}))
    return (f"cost estimate: {_fmt_duration(sum(c.expected_s for c in costs))} of CPU-core time for {len(costs)} "
            f"run(s) ({how}; every run to its cap: {_fmt_duration(sum(c.cap_s for c in costs))}; steps {rate})")


# ---------------------------------------------------------------------- the pipeline
def get_experiment(name: str) -> Experiment:
    return EXPERIMENTS.get(name)


def command_text(name: str, scale: str, seeds: int) -> str:
    return f"groklens reproduce {name} --scale {scale} --seeds {seeds}"


MAX_SEEDS = 1000  # seeds per variant (the papers use up to 10); more is a typo, not a study


@dataclass
class PlannedRun:
    variant: str
    name: str
    cfg: Any
    seed: int
    chash: str
    path: Path


def _check_args(exp: Experiment, name: str, scale: str, seeds: Any, workers: int | None, out_dir,
                results_md) -> tuple[int, Path]:
    if scale not in SCALES:
        raise BadInput(f"--scale must be one of {', '.join(SCALES)}; got {scale!r}")
    seeds = exp.seeds_default(scale) if seeds is None else seeds
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= MAX_SEEDS:
        raise BadInput(f"--seeds must be a positive integer, at most {MAX_SEEDS}; got {seeds!r}")
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1; got {workers}")
    out = Path(out_dir) if out_dir is not None else default_out(name, scale)
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory")
    if not out.exists() and not out.parent.is_dir():
        raise BadInput(f"directory {out.parent} does not exist")
    from groklens.fileio import check_writable_dir

    check_writable_dir(out if out.exists() else out.parent)  # a read-only place: before any work
    if results_md is not None and not Path(results_md).parent.is_dir():
        raise BadInput(f"--results-md {results_md}: directory {Path(results_md).parent} does not exist")
    return seeds, out


def _plan_runs(exp: Experiment, scale: str,
               seeds: int, runs_dir: Path, led) -> tuple[list[PlannedRun], list[PlannedRun],
                                                                                       list[PlannedRun]]:
    """(runs the ledger holds, finished files to record, runs to train) of seeds 1..seeds."""
    from groklens.checkpoints import Trajectory
    from groklens.experiments.ledger import config_hash
    from groklens.sweeps import run_path, run_state

    held, ready, todo = [], [], []
    for variant, run_name, cfg in run_configs(exp, scale, seeds):
        pr = PlannedRun(variant, run_name, cfg, cfg.seed, config_hash(cfg.to_dict()), run_path(runs_dir, run_name))
        if led.find(variant, pr.seed, pr.chash) is not None:
            held.append(pr)
        elif runs_dir.is_dir() and run_state(runs_dir, run_name)[0] == "done" and \
                config_hash(Trajectory(pr.path).config_dict) == pr.chash:
            ready.append(pr)  # finished here (or by an earlier version with the same hash): record it
        else:
            todo.append(pr)
    return held, ready, todo


def check_compilers(cfgs: list[Any]) -> None:
    """`reproduce --compile` where torch.compile cannot build kernels for these runs' devices: a
    one-line refusal before anything is written."""
    from groklens.trainers.engine import resolve_device
    from groklens.trainers.single import check_compiler

    for device_type in sorted({resolve_device(c.device).type for c in cfgs}):
        check_compiler(device_type)


def compile_runs(todo: list[PlannedRun], echo: Callable[[str], None], threads: int = 1) -> list[PlannedRun]:
    """`reproduce --compile`: every run to train from scratch with compile=true where torch.compile
    applies (trainers/single.py `compile_refusal`) and pays: not on a CPU run of several threads
    (there the compiled step measured 1.3-1.4x the eager one: the backward's scatter-adds compile
    to atomic adds the threads contend on; docs/PERFORMANCE.md). The others, and interrupted runs
    (they resume as they began), train eagerly. The config hash leaves `compile` out
    (ledger.NOT_HASHED), so a compiled run fills the same ledger row as an eager one
    (`check_compilers` has run)."""
    from groklens.trainers.engine import resolve_device
    from groklens.trainers.single import compile_refusal

    out, eager = [], {}
    for r in todo:
        why = ("interrupted: resumes as it began" if r.path.exists() else
               f"{threads} threads per run on the CPU, where the compiled step is slower"
               if threads > 1 and resolve_device(r.cfg.device).type == "cpu" else compile_refusal(r.cfg))
        if why is None:
            r = dataclasses.replace(r, cfg=r.cfg.replace(compile=True))
        else:
            eager.setdefault(why, []).append(r.name)
        out.append(r)
    n = sum(r.cfg.compile for r in out)
    echo(f"compiled (torch.compile): {n} of {len(out)} run(s) to train"
         + "".join(f"; eager, {why}: {', '.join(names)}" for why, names in eager.items()))
    return out


def _train(todo: list[PlannedRun], runs_dir: Path, name: str, workers: int | None, progress: bool, threads: int = 1,
           measure: bool = True, log: Sequence[str] = (), cluster: dict | None = None) -> str | None:
    """Train `todo` into runs_dir: first the runs that read no other run, then those that take
    their attention mask from a run beside them (attn_mask_from), once it is finished. Runs that
    share an architecture (an arm's seeds; a grid's cell of learning rates and weight decays)
    train as batched ensembles (trainers/ensemble.py) where that pays (layout.ensemble_rule: on a
    GPU, or a CPU step short enough), sized and ordered by their cost to the cap (costliest
    first), on `workers` processes. Returns how they were grouped (a note), None when there was
    nothing to train. `log`: `--log` specs; each run trained mirrors its rows there. `cluster`:
    where the runs train (`sweeps.make_executor`'s executor, address, gpus_per_run, slurm; default
    this machine); on a cluster with --gpus-per-run the runs count as GPU runs for the ensembles."""
    from groklens.experiments.cost import cost_key, rates_for, run_seconds
    from groklens.experiments.layout import ensemble_rule
    from groklens.sweeps import InlineExecutor, RunSpec, run_sweep

    if not todo:
        return None
    cluster = dict(cluster or {"executor": "local"})
    if cluster["executor"] == "local" and workers == 1:
        cluster["executor"] = InlineExecutor()
    rates = rates_for([r.cfg for r in todo], measure=measure)
    rule = ensemble_rule(lambda cfg: rates[cost_key(cfg)].step_s if rates[cost_key(cfg)].basis == "measured" else None,
                         gpu=bool(cluster.get("gpus_per_run")))
    ensembles, alone = 0, {}
    for wave in ([r for r in todo if not r.cfg.attn_mask_from], [r for r in todo if r.cfg.attn_mask_from]):
        if not wave:
            continue
        rep = run_sweep([RunSpec(r.name, r.cfg) for r in wave], runs_dir, workers=workers, ensemble=rule,
                        progress=progress, threads=threads,
                        cost=lambda cfg: run_seconds(cfg, rates[cost_key(cfg)], cfg.steps), log=log, **cluster)
        if rep.counts["failed"]:
            first = next(iter(rep.failed.items()))
            raise GroklensError(f"{rep.counts['failed']} run(s) of {name} failed, e.g. {first[0]}: {first[1]}")
        if rep.counts["running"]:
            raise GroklensError(f"{rep.counts['running']} run(s) in {runs_dir} are being written by another process; "
                                "wait for it or use another -o")
        ensembles += rep.ensembles
        alone.update(rep.single_fallback)
    return (f"trained {len(todo) - len(alone)} run(s) in {ensembles} batched ensemble(s), {len(alone)} alone"
            + (f" (e.g. {next(iter(alone))}: {next(iter(alone.values()))})" if alone else ""))


def _measure_keys(exp: Experiment, sc: Scale, scale: str) -> list[str]:
    from groklens.analyses.compare import MEASURES

    names = {n for n, _, _ in exp.analyses(sc, scale)}
    return [m.key for m in MEASURES if m.analysis in names]


def select_arms(exp: Experiment, scale: str, patterns: Sequence[str] | None) -> set[str] | None:
    """The variants of `exp` at `scale` whose names match any of `patterns` (fnmatch: *, ?, [..]);
    None: every variant. A pattern that matches none is an error naming the variants."""
    import fnmatch

    if patterns is None:
        return None
    variants = list(exp.plan(exp.scales[scale], scale).variants)
    pats = [p.strip() for p in patterns if p.strip()]
    if not pats:
        raise BadInput("--arms names no arm")
    for p in pats:
        if not fnmatch.filter(variants, p):
            shown = ", ".join(variants[:12]) + (f", ... ({len(variants)} in all)" if len(variants) > 12 else "")
            raise BadInput(f"--arms {p!r} matches no arm of {exp.name} at {scale} (arms: {shown})")
    return {v for v in variants if any(fnmatch.fnmatchcase(v, p) for p in pats)}


def reproduce(name: str, scale: str = "quick", out_dir: str | Path | None = None, seeds: int | None = None, *,
              workers: int | None = None, results_md: str | Path | None = None, ledger_dir: str | Path | None = None,
              train: bool = True, progress: bool = True, echo: Callable[[str], None] = print,
              compile: bool = False, measure: bool = True, arms: Sequence[str] | None = None,
              log: Sequence[str] = (), cluster: dict | None = None) -> Result:
    """Train the runs the ledger lacks, record them, and read every recorded seed; see the module
    docstring. `ledger_dir`: where NAME.SCALE.json is kept (default OUT/ledger); `results_md`: a
    markdown file whose reproduce table gets the rows (none by default). train=False records and
    reads only what is finished (a study that grows run by run): missing runs are listed, not trained.
    compile=True trains each new run that can be compiled with compile=true (`compile_runs`).
    Before training it prints the runs' estimated cost (`estimate_text`; measure=False: from the
    FLOP model, nothing timed). arms: train only the variants matching these patterns
    (`select_arms`); the rows read every arm the ledger holds (a study trained in stages). `log`:
    `--log` specs; each run trained mirrors its rows there. `cluster`: train on Ray or SLURM
    (`sweeps.make_executor`'s executor, address, gpus_per_run, slurm; default this machine): the
    runs train there, then are analyzed and recorded here."""
    from groklens.experiments.ledger import Ledger, ledger_path, summarize_run
    from groklens.trainers.loggers import check_specs

    t0 = time.perf_counter()
    exp = get_experiment(name)
    check_specs(log)  # a missing package or a malformed spec: before anything else
    seeds, out = _check_args(exp, name, scale, seeds, workers, out_dir, results_md)
    chosen = select_arms(exp, scale, arms)
    remote = cluster is not None and cluster["executor"] != "local"
    if remote and not train:
        raise BadInput(f"--executor {cluster['executor']} trains runs; --no-train trains none")
    if cluster is not None and train:
        from groklens.sweeps import make_executor

        make_executor(out_dir=out / "runs", workers=workers, **cluster).check()  # its options, before any work
    if compile and train:
        check_compilers([c for _, _, c in run_configs(exp, scale, seeds)])
    ldir = Path(ledger_dir) if ledger_dir is not None else out / "ledger"
    if ldir.exists() and not ldir.is_dir():
        raise BadInput(f"--ledger {ldir} is not a directory")
    if not ldir.exists() and not ldir.parent.is_dir() and ledger_dir is not None:
        raise BadInput(f"--ledger {ldir}: directory {ldir.parent} does not exist")
    if ldir.is_dir():
        from groklens.fileio import check_writable_dir

        check_writable_dir(ldir, "record runs in the ledger")
    led = Ledger.load(ledger_path(ldir, name, scale), name, scale)
    sc = exp.scales[scale]
    plan = exp.plan(sc, scale)
    out.mkdir(exist_ok=True)
    runs_dir = out / "runs"
    held, ready, todo = _plan_runs(exp, scale, seeds, runs_dir, led)
    outside = [] if chosen is None else [r for r in todo if r.variant not in chosen]
    todo = [r for r in todo if chosen is None or r.variant in chosen]
    cmd = command_text(name, scale, seeds)
    n_workers = workers or (1 if scale == "smoke" else max(1, min(len(todo) or 1, os.cpu_count() or 1)))
    echo(f"{cmd}: {len(held) + len(ready) + len(todo) + len(outside)} runs ({len(plan.variants)} variants x {seeds} "
         f"seed(s)); {len(held)} in the ledger {led.path}, {len(ready)} finished in {runs_dir}, {len(todo)} to train"
         + (f", {len(outside)} outside --arms" if outside else ""))

    # 1. train what neither the ledger nor OUT/runs holds (interrupted runs resumed)
    skipped = [] if train else todo
    if train and todo and scale != "smoke":
        from groklens.experiments.ledger import ledger_entries

        echo(estimate_text(exp, scale, todo, led.entries + ledger_entries(_ledger_dirs(), name, scale), measure))
    if train:
        train_workers, threads = (workers if remote else n_workers), 1
        if todo and workers is None and scale != "smoke" and not remote:  # one run per core, or one on all cores
            from groklens.threads import available_cores

            layout = plan_layout([r.cfg for r in todo], available_cores())
            train_workers, threads = layout.workers, layout.threads
            echo(f"training layout: {layout.why}")
        if compile and todo:
            todo = compile_runs(todo, echo, threads)
        grouped = _train(todo, runs_dir, name, train_workers, progress, threads, measure=measure and scale != "smoke",
                         log=log, cluster=cluster)
    else:
        todo, grouped = [], None
    t_train = time.perf_counter() - t0

    # 2. analyze the new runs and record them in the ledger
    new = ready + todo
    notes = _analyze(exp, sc, scale, [r.path for r in new], n_workers, progress)
    keys = _measure_keys(exp, sc, scale)
    for r in new:
        led.add(summarize_run(r.path, name, r.variant, r.seed, keys,
                              exp.run_values(r.path, sc) if exp.run_values else None,
                              curves=sc.extra.get("ledger_curves", ())))
    if new:
        led.save()
    t_an = time.perf_counter() - t0 - t_train

    # 3. compare and report the files present here (the ledger may hold more seeds than OUT/runs)
    present = {r.variant: [] for r in held + new}
    for r in held + new:
        if r.path.exists():
            present[r.variant].append(r.path)
    all_paths = [p for ps in present.values() for p in ps]
    report = _compare_and_report(out, all_paths, present.get(plan.baseline or "", []), notes)

    # 4. rows (and the experiment's figures) from the ledger: every recorded seed of each variant
    # with the current config
    ctx, apart = ledger_context(exp, scale, seeds, led, out)
    rows, arms = exp.read(ctx), ctx.arms
    if exp.figures is not None:
        notes += [f"figure: {p}" for p in exp.figures(ctx)]
    wall = time.perf_counter() - t0
    notes += apart
    if skipped:
        notes.append(f"not trained (--no-train): {len(skipped)} run(s), {', '.join(r.name for r in skipped)}")
    if grouped:
        notes.append(grouped)
    if outside:
        notes.append(f"not trained (outside --arms): {len(outside)} run(s) of "
                     f"{len({r.variant for r in outside})} arm(s)")
    notes.append(f"time: training {t_train:.0f} s, analyses {t_an:.0f} s, total {wall:.0f} s; "
                 f"{len(todo)} run(s) trained, {len(new)} recorded in {led.path}")
    from groklens.analyses.notes import one_per_kind

    result = Result(name, scale, seeds, out, rows, wall, cmd, all_paths, report, one_per_kind(notes), led.path,
                    _run_wall(arms), len(todo), run_table(arms))
    from groklens.fileio import write_text_atomic

    write_text_atomic(out / "results.json", json.dumps(result.to_json(), indent=1, default=_json_default))
    if results_md is not None:
        update_results_md(results_md, result)
    return result


def ledger_context(exp: Experiment, scale: str, seeds: int, led, out: Path) -> tuple[Context, list[str]]:
    """(the rows' Context, notes on entries of other configs) from the ledger alone: every recorded
    seed of each variant whose config, seed aside, is the current one."""
    from groklens.experiments.ledger import LedgerRun, arm_hash

    sc = exp.scales[scale]
    arms, apart = {}, []
    for variant, cfg in {v: c for v, _, c in run_configs(exp, scale, seeds)}.items():
        ah = arm_hash(cfg.to_dict())
        arms[variant] = [LedgerRun(e) for e in led.current(variant, ah)]
        apart += _apart_note(led, variant, ah, cfg.to_dict())
    return Context(exp.name, scale, sc, exp.plan(sc, scale), arms, out), apart


def ledger_rows(exp: Experiment, scale: str, seeds: int, led, out: Path) -> tuple[list[Any], dict[str, list[Any]],
                                                                              list[str]]:
    """(rows, arms, notes on entries of other configs) read from the ledger alone (`ledger_context`).
    No run file is needed, so docs/RESULTS.md's rows can be recomputed from the committed ledgers
    (tests/test_results_md.py)."""
    ctx, apart = ledger_context(exp, scale, seeds, led, out)
    return exp.read(ctx), ctx.arms, apart


def _compare_and_report(out: Path, paths: list[Path], baseline: list[Path], notes: list[str]) -> Path | None:
    """comparison.txt / .csv and report/ of the runs of the baseline's task; an experiment whose
    runs span several tasks (runs of different tasks are not compared) gets those files again,
    suffixed `-TASK`, for each other task's runs. Returns the main report's index."""
    from groklens.checkpoints import Trajectory

    if not paths:
        notes.append(f"no run files in {out / 'runs'}: every run came from the ledger; no comparison.txt or report")
        return None
    by_task: dict[str, list[Path]] = {}
    for p in paths:
        by_task.setdefault(Trajectory(p).config_dict["task"], []).append(p)
    main = Trajectory(baseline[0]).config_dict["task"] if baseline else next(iter(by_task))
    index = _compare_task(out, "", by_task.pop(main), baseline[:1], notes)
    for task, group in by_task.items():
        notes.append(f"runs of task {task} are compared apart (comparison-{task}.txt, report-{task}/)")
        _compare_task(out, f"-{task}", group, [], notes)
    return index


def _compare_task(out: Path, suffix: str, paths: list[Path], baseline: list[Path], notes: list[str]) -> Path:
    from groklens.analyses.compare import compare
    from groklens.analyses.report import build_report
    from groklens.fileio import write_text_atomic  # whole, and a link there is replaced, never written through

    comp = compare(paths, baseline=baseline[0] if baseline else None, group_by="variant")
    write_text_atomic(out / f"comparison{suffix}.txt", comp.format_table() + "\n")
    write_text_atomic(out / f"comparison{suffix}.csv", comp.to_csv())
    rep = build_report(paths, out / f"report{suffix}", comparison=comp)
    notes += [f"not in the report: {t} ({w})" for t, w in rep.missing if not w.startswith("no run has")]
    return rep.index


def _apart_note(led, variant: str, ah: str, cfg: dict[str, Any]) -> list[str]:
    from groklens.experiments.ledger import config_diff

    other = led.apart(variant, ah)
    if not other:
        return []
    fields = sorted({f for e in other for f in config_diff(e["config"], cfg)})
    return [f"{variant}: {len(other)} ledger entr{'y' if len(other) == 1 else 'ies'} (seeds "
            f"{', '.join(str(e['seed']) for e in other)}) recorded with another config (differs in "
            f"{', '.join(fields) or 'hashed fields'}): not in these rows"]


def _run_wall(arms: dict[str, list[Any]]) -> str:
    walls = [r.wall_s for runs in arms.values() for r in runs if isinstance(r.wall_s, (int, float))]
    devices = sorted({str(r.entry.get("device", "?")).split(" (")[0] for runs in arms.values() for r in runs})
    if not walls:
        return ""
    return (f"{_fmt_duration(sum(walls) / len(walls))} per run (mean of {len(walls)}, max "
            f"{_fmt_duration(max(walls))}; {'/'.join(devices)})")


# an experiment's analysis places (Experiment.analyses) -> analyses/runner.choose_checkpoints
# (other places are checkpoint choices already)
_WHERE = {"end": "end", "phases": "phases", "every": "about:20+phases"}


def _analyze(exp: Experiment, sc: Scale, scale: str, paths: list[Path], workers: int, progress: bool) -> list[str]:
    from groklens.analyses.runner import analyze_runs

    requests = [(name, params, _WHERE.get(where, where)) for name, params, where in exp.analyses(sc, scale)]
    return analyze_runs(paths, requests, workers=workers, progress=progress) if requests else []


def _json_default(x):
    if isinstance(x, Path):
        return str(x)
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


# ---------------------------------------------------------------------- docs/RESULTS.md
_HEAD = ("| command | scale | measure | published (source) | ours | ratio ours/published | verdict | what differs | "
         "wall time |")
_RULE = "|---|---|---|---|---|---|---|---|---|"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def result_lines(result: Result) -> list[str]:
    lines = []
    for r in result.rows:
        ratio = r.ratio_text()
        pub = f"{r.published.text} ({r.published.source})"
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"`{result.command}`", result.scale, r.measure, pub, r.ours_text, ratio, r.verdict or "—", r.differs,
            result.run_wall or f"{_fmt_duration(result.wall_s)} (whole command)")) + " |")
    return lines


RUNS_SECTION = "## The runs behind the rows"


def _runs_markers(name: str, scale: str) -> tuple[str, str]:
    return (f"<!-- runs {name} {scale}: written by `groklens reproduce` from the ledger -->",
            f"<!-- end runs {name} {scale} -->")


def run_table(arms: dict[str, list[Any]]) -> list[str]:
    """One line per ledger run behind the rows: grokking steps, where it ended, collapse."""
    from groklens.analyses.grokking import collapse_text

    lines = ["| arm | seed | memorized @0.95 | grokked @0.95 | grokked @0.99 | last step | final test acc | "
             "after crossing | wall time |", "|---|---|---|---|---|---|---|---|---|"]
    for variant, runs in arms.items():
        for r in sorted(runs, key=lambda r: r.seed):
            e = r.entry
            g99 = e["grokking_step"].get("0.99")
            acc = r.final_test_acc
            lines.append("| " + " | ".join(_cell(c) for c in (
                variant, r.seed, _steps_text(r.memorization), _steps_text(r.grokking), _steps_text(g99),
                f"{e['last_step']:,}", "—" if acc is None else f"{acc:.3f}",
                collapse_text(r.collapse) or ("stayed" if "collapse" in e else "ended above (dips not recorded)"),
                _fmt_duration(r.wall_s) if isinstance(r.wall_s, (int, float)) else "—")) + " |")
    return lines


def _steps_text(step: int | None) -> str:
    return "never" if step is None else f"{step:,}"


def _put_runs_block(text: str, result: Result) -> str:
    begin, end = _runs_markers(result.name, result.scale)
    block = (f"{begin}\n**{result.name}, {result.scale}** (`{result.command}`)\n\n" + "\n".join(result.run_lines)
             + f"\n{end}")
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if RUNS_SECTION not in text:
        text = (text.rstrip("\n") + f"\n\n{RUNS_SECTION}\n\n"
                "Per run, from the ledger (the rows above are computed from these entries).\n")
    return text.rstrip("\n") + f"\n\n{block}\n"


def update_results_md(path: str | Path, result: Result) -> Path:
    """Put `result`'s rows in the reproduce table of `path`, replacing earlier rows of the same
    experiment and scale; create the file (or the table section) when missing."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Reproductions\n"
    if RESULTS_BEGIN not in text:
        text = text.rstrip("\n") + f"\n\n{RESULTS_BEGIN}\n{_HEAD}\n{_RULE}\n{RESULTS_END}\n"
    head, rest = text.split(RESULTS_BEGIN, 1)
    body, tail = rest.split(RESULTS_END, 1) if RESULTS_END in rest else (rest, "\n")
    # rows come from the ledger (every recorded seed): a rerun with any --seeds replaces the
    # experiment's rows at that scale
    key = f"| `{command_text(result.name, result.scale, 0).rsplit(' --seeds', 1)[0]} --seeds "
    new, rows = result_lines(result), []
    for ln in body.strip("\n").splitlines():
        if ln.startswith(key):  # the new rows go where the first old one stood
            rows += new
            new = []
        elif ln.strip() and ln not in (_HEAD, _RULE):
            rows.append(ln)
    lines = [_HEAD, _RULE] + rows + new
    from groklens.fileio import write_text_atomic

    text = f"{head}{RESULTS_BEGIN}\n" + "\n".join(lines) + f"\n{RESULTS_END}{tail}"
    return write_text_atomic(path, _put_runs_block(text, result) if result.run_lines else text)


def format_result(result: Result) -> str:
    lines = [f"{result.command}  ({result.scale}; {_fmt_duration(result.wall_s)}; runs and report in {result.out_dir})"]
    w = max(len(r.measure) for r in result.rows) if result.rows else 10
    w = min(w, 90)
    lines.append(f"{'measure':<{w}}  {'published':<28}  {'ours':<36}  {'ratio':<9}  verdict")
    for r in result.rows:
        pub = f"{r.published.value:g}" if r.published.value is not None else "(claim) " + r.published.text[:20]
        lines.append(f"{r.measure[:w]:<{w}}  {pub[:28]:<28}  {r.ours_text[:36]:<36}  {r.ratio_text():<9}  {r.verdict}")
    lines.append(f"setup: {result.rows[0].differs if result.rows else ''}")
    if result.run_wall:
        lines.append(f"wall time: {result.run_wall} (measured, from the ledger {result.ledger})")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)

