"""The reproduce pipeline: configs and cost, `--list`, training what the ledger lacks, the rows, RESULTS.md."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groklens.errors import BadInput, GroklensError
from groklens.experiments.layout import plan_layout, step_flops
from groklens.experiments.core import (
    Context, EXPERIMENTS, Experiment, LEDGER_DIR, RESULTS_BEGIN, RESULTS_END, Result, SCALES, Scale)

# Step-time model of the cost estimates (`--list`): seconds per training step =
# STEP_OVERHEAD_S + FLOPs / CPU_FLOPS, evaluation forward passes included. Calibrated with
# benchmarks/train_throughput.py and tiny runs on the 2-core development machine while it was
# shared with other jobs (OMP_NUM_THREADS=1); estimates, not promises.
# Measured 2026-11-30 with two training processes on the 2 cores (load average ~3): the
# canonical p=113 step took 0.41 s (14.6 GFLOP by this model, which ignores that the trainer
# computes the last block at the readout position only), a p=23 d_model-64 step (0.24 GFLOP)
# ~25 ms in `reproduce bounded-sphere --scale quick`. With --workers W the wall time is about
# the estimate / W.
CPU_FLOPS = 3.0e10  # sustained float32 FLOP/s of one shared core
STEP_OVERHEAD_S = 1.5e-2  # per-step overhead (Python, autograd, optimizer, time slicing) of a small model


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
    """(variant, run name, RunConfig) of every run of `exp` at `scale` with seeds 1..seeds."""
    from groklens.config import config_from

    sc = exp.scales[scale]
    plan = exp.plan(sc, scale)
    base = dict(sc.base)
    preset_name = base.pop("preset", None)  # a scale may start from a named preset
    out = []
    for variant, over in plan.variants.items():
        for seed in range(1, seeds + 1):
            cfg = config_from(preset_name, overrides={**base, **over, "seed": seed})
            out.append((variant, f"{variant}_s{seed}", cfg))
    return out


def estimate_seconds(cfgs: list[Any]) -> float:
    """CPU seconds of training `cfgs` (every run to its step limit: an upper bound when runs stop
    after grokking), from the step-time model above."""
    total = 0.0
    for cfg in cfgs:
        train_f, eval_f = step_flops(cfg)
        n_eval = cfg.steps // cfg.eval_every + 1
        total += cfg.steps * (STEP_OVERHEAD_S + train_f / CPU_FLOPS) + n_eval * (STEP_OVERHEAD_S + eval_f / CPU_FLOPS)
    return total


FITS_RUN_S = 4 * 3600  # a scale fits this CPU when no run takes longer on one core ...
FITS_TOTAL_S = 72 * 3600  # ... and all its runs (default seeds) take at most this wall time on this CPU's cores


def _ledger_dirs(extra: str | Path | None = None) -> list[Path]:
    dirs = [LEDGER_DIR] if LEDGER_DIR.is_dir() else []
    return dirs + ([Path(extra)] if extra is not None else [])


def listing(ledger_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Every experiment with its runs, its estimated cost, the wall time per run measured where one
    ran (the ledgers: docs/results/ of a checkout, and `ledger_dir`), and whether it fits this CPU."""
    from groklens.experiments.ledger import measured_wall

    dirs = _ledger_dirs(ledger_dir)
    cores = os.cpu_count() or 1
    out = []
    for name in EXPERIMENTS:
        e = EXPERIMENTS.get(name)
        item = {"name": e.name, "summary": e.summary, "scales": {}}
        for scale in SCALES:
            n = e.seeds_default(scale)
            cfgs = [c for _, _, c in run_configs(e, scale, n)]
            secs = estimate_seconds(cfgs)
            measured = measured_wall(dirs, e.name, scale)
            cpu_measured = measured is not None and all(d.startswith("cpu") for d in measured["devices"])
            per_run = measured["max_s"] if cpu_measured else max(estimate_seconds([c]) for c in cfgs)
            total = measured["mean_s"] * len(cfgs) if cpu_measured else secs
            item["scales"][scale] = {
                "runs": len(cfgs), "seeds": n, "max_steps": max(c.steps for c in cfgs),
                "cpu_seconds_estimate": secs, "measured": measured,
                # the estimate runs every run to its step limit: an upper bound where runs stop after grokking
                "estimate_is_upper_bound": any(c.stop_after_grok > 0 for c in cfgs),
                "fits_cpu": per_run <= FITS_RUN_S and total / cores <= FITS_TOTAL_S,
                "fits_basis": "measured" if cpu_measured else "estimate",
                "wall_seconds_here": total / cores,  # what "fits" judged: all runs on this CPU's cores
                "note": e.scales[scale].note}
        out.append(item)
    return out


def format_listing(items: list[dict[str, Any]]) -> str:
    cores = os.cpu_count() or 1
    lines = [f"experiment             scale  runs  {f'fits this CPU ({cores} cores)? all runs here':<40}  "
             f"{'measured per run (ledger)':<36}  estimate (CPU-core time, every run to its step limit)"]
    for it in items:
        for scale in SCALES:
            s = it["scales"][scale]
            m = s["measured"]
            meas = (f"{_fmt_duration(m['mean_s'])} mean, {_fmt_duration(m['max_s'])} max (n={m['n']}, "
                    f"{'/'.join(m['devices'])})") if m else "not run yet"
            here = s["wall_seconds_here"]
            bound = "<= " if s["estimate_is_upper_bound"] else ""
            fits = (("yes" if s["fits_cpu"] else "no") + f": {'' if s['fits_basis'] == 'measured' else bound}"
                    f"{_fmt_duration(here)} ({s['fits_basis']})")
            lines.append(f"{it['name'] if scale == 'smoke' else '':<22} {scale:<6} {s['runs']:>4}  {fits:<40}  "
                         f"{meas:<36}  {bound}{_fmt_duration(s['cpu_seconds_estimate'])}")
        lines.append(f"{'':<22} {it['summary']}")
        lines.append(f"{'':<22} quick: {it['scales']['quick']['note']}")
    lines.append(f"Fits this CPU: no run over {FITS_RUN_S / 3600:g} h on one core and all runs (default seeds) within "
                 f"{FITS_TOTAL_S / 3600:g} h on the {cores} cores; the time shown is that of all runs on the {cores} "
                 "cores: from the ledger's measured wall times where runs were recorded on a CPU (mean x runs / "
                 "cores), else from the estimate / cores. The estimate runs every run to its step limit: "
                 "'<=' marks experiments whose runs stop after grokking, where it is an upper bound (the demo: "
                 "<= 23 min of CPU-core time; measured 4.5 min on 2 cores, docs/CLI.md).")
    lines.append(f"Estimates: seconds/step = {STEP_OVERHEAD_S:.0e} s + FLOPs / {CPU_FLOPS:.0e} FLOP/s, calibrated on the "
                 "shared 2-core development machine (benchmarks/train_throughput.py).")
    return "\n".join(lines)


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
    out = Path(out_dir if out_dir is not None else f"reproduce-{name}-{scale}")
    if out.exists() and not out.is_dir():
        raise BadInput(f"{out} exists and is not a directory")
    if not out.exists() and not out.parent.is_dir():
        raise BadInput(f"directory {out.parent} does not exist")
    from groklens.fileio import check_writable_dir

    check_writable_dir(out if out.exists() else out.parent)  # a read-only place: before any work
    if results_md is not None and not Path(results_md).parent.is_dir():
        raise BadInput(f"--results-md {results_md}: directory {Path(results_md).parent} does not exist")
    return seeds, out


def _plan_runs(exp: Experiment, scale: str, seeds: int, runs_dir: Path, led) -> tuple[list[PlannedRun], list[PlannedRun],
                                                                                       list[PlannedRun]]:
    """(runs the ledger holds, finished files to record, runs to train) of seeds 1..seeds."""
    from groklens.checkpoints import Trajectory
    from groklens.experiments.ledger import config_hash
    from groklens.trainers.sweeps import run_path, run_state

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


def _train(todo: list[PlannedRun], runs_dir: Path, name: str, workers: int, progress: bool, threads: int = 1) -> None:
    from groklens.trainers.sweeps import InlineExecutor, RunSpec, run_sweep

    if not todo:
        return
    specs = [RunSpec(r.name, r.cfg) for r in todo]
    executor = InlineExecutor() if workers == 1 else "local"
    rep = run_sweep(specs, runs_dir, executor=executor, workers=workers, ensemble=True, progress=progress,
                    threads=threads)
    if rep.counts["failed"]:
        first = next(iter(rep.failed.items()))
        raise GroklensError(f"{rep.counts['failed']} run(s) of {name} failed, e.g. {first[0]}: {first[1]}")
    if rep.counts["running"]:
        raise GroklensError(f"{rep.counts['running']} run(s) in {runs_dir} are being written by another process; "
                            "wait for it or use another -o")


def _measure_keys(exp: Experiment, sc: Scale, scale: str) -> list[str]:
    from groklens.analyses.compare import MEASURES

    names = {n for n, _, _ in exp.analyses(sc, scale)}
    return [m.key for m in MEASURES if m.analysis in names]


def reproduce(name: str, scale: str = "quick", out_dir: str | Path | None = None, seeds: int | None = None, *,
              workers: int | None = None, results_md: str | Path | None = None, ledger_dir: str | Path | None = None,
              train: bool = True, progress: bool = True, echo: Callable[[str], None] = print,
              compile: bool = False) -> Result:
    """Train the runs the ledger lacks, record them, and read every recorded seed; see the module
    docstring. `ledger_dir`: where NAME.SCALE.json is kept (default OUT/ledger); `results_md`: a
    markdown file whose reproduce table gets the rows (none by default). train=False records and
    reads only what is finished (a study that grows run by run): missing runs are listed, not trained.
    compile=True trains each new run that can be compiled with compile=true (`compile_runs`)."""
    from groklens.experiments.ledger import Ledger, ledger_path, summarize_run

    t0 = time.perf_counter()
    exp = get_experiment(name)
    seeds, out = _check_args(exp, name, scale, seeds, workers, out_dir, results_md)
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
    cmd = command_text(name, scale, seeds)
    n_workers = workers or (1 if scale == "smoke" else max(1, min(len(todo) or 1, os.cpu_count() or 1)))
    echo(f"{cmd}: {len(held) + len(ready) + len(todo)} runs ({len(plan.variants)} variants x {seeds} seed(s)); "
         f"{len(held)} in the ledger {led.path}, {len(ready)} finished in {runs_dir}, {len(todo)} to train")

    # 1. train what neither the ledger nor OUT/runs holds (interrupted runs resumed)
    skipped = [] if train else todo
    if train:
        train_workers, threads = n_workers, 1
        if todo and workers is None and scale != "smoke":  # one run per core, or one run on all cores
            from groklens.threads import available_cores

            layout = plan_layout([r.cfg for r in todo], available_cores())
            train_workers, threads = layout.workers, layout.threads
            echo(f"training layout: {layout.why}")
        if compile and todo:
            todo = compile_runs(todo, echo, threads)
        _train(todo, runs_dir, name, train_workers, progress, threads)
    else:
        todo = []
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

    # 4. rows from the ledger: every recorded seed of each variant with the current config
    rows, arms, apart = ledger_rows(exp, scale, seeds, led, out)
    wall = time.perf_counter() - t0
    notes += apart
    if skipped:
        notes.append(f"not trained (--no-train): {len(skipped)} run(s), {', '.join(r.name for r in skipped)}")
    notes.append(f"time: training {t_train:.0f} s, analyses {t_an:.0f} s, total {wall:.0f} s; "
                 f"{len(todo)} run(s) trained, {len(new)} recorded in {led.path}")
    result = Result(name, scale, seeds, out, rows, wall, cmd, all_paths, report, notes, led.path,
                    _run_wall(arms), len(todo), run_table(arms))
    from groklens.fileio import write_text_atomic

    write_text_atomic(out / "results.json", json.dumps(result.to_json(), indent=1, default=_json_default))
    if results_md is not None:
        update_results_md(results_md, result)
    return result


def ledger_rows(exp: Experiment, scale: str, seeds: int, led, out: Path) -> tuple[list[Any], dict[str, list[Any]],
                                                                              list[str]]:
    """(rows, arms, notes on entries of other configs) read from the ledger alone: every recorded
    seed of each variant whose config, seed aside, is the current one. No run file is needed, so
    docs/RESULTS.md's rows can be recomputed from the committed ledgers (tests/test_results_md.py)."""
    from groklens.experiments.ledger import LedgerRun, arm_hash

    sc = exp.scales[scale]
    arms, apart = {}, []
    for variant, cfg in {v: c for v, _, c in run_configs(exp, scale, seeds)}.items():
        ah = arm_hash(cfg.to_dict())
        arms[variant] = [LedgerRun(e) for e in led.current(variant, ah)]
        apart += _apart_note(led, variant, ah, cfg.to_dict())
    return exp.read(Context(exp.name, scale, sc, exp.plan(sc, scale), arms, out)), arms, apart


def _compare_and_report(out: Path, paths: list[Path], baseline: list[Path], notes: list[str]) -> Path | None:
    from groklens.analyses.compare import compare
    from groklens.analyses.report import build_report

    if not paths:
        notes.append(f"no run files in {out / 'runs'}: every run came from the ledger; no comparison.txt or report")
        return None
    comp = compare(paths, baseline=baseline[0] if baseline else None, group_by="variant")
    from groklens.fileio import write_text_atomic  # whole, and a link there is replaced, never written through

    write_text_atomic(out / "comparison.txt", comp.format_table() + "\n")
    write_text_atomic(out / "comparison.csv", comp.to_csv())
    rep = build_report(paths, out / "report", comparison=comp)
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
    return f"<!-- runs {name} {scale}: written by `groklens reproduce` from the ledger -->", f"<!-- end runs {name} {scale} -->"


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
                f"{e['last_step']:,}", "—" if acc is None else f"{acc:.3f}", collapse_text(r.collapse) or ("stayed" if "collapse" in e else "ended above (dips not recorded)"),
                _fmt_duration(r.wall_s) if isinstance(r.wall_s, (int, float)) else "—")) + " |")
    return lines


def _steps_text(step: int | None) -> str:
    return "never" if step is None else f"{step:,}"


def _put_runs_block(text: str, result: Result) -> str:
    begin, end = _runs_markers(result.name, result.scale)
    block = f"{begin}\n**{result.name}, {result.scale}** (`{result.command}`)\n\n" + "\n".join(result.run_lines) + f"\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        return head + block + rest.split(end, 1)[1]
    if RUNS_SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{RUNS_SECTION}\n\nPer run, from the ledger (the rows above are computed from these entries).\n"
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

