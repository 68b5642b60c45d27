"""The `groklens` command line: parse, build the config, call one function, print.

Exit status: 0 ok, 1 failure, 2 bad input; errors are one line (`--debug` shows tracebacks).
Heavy modules (torch, transformer_lens) are imported inside commands, so `--help` and
`info` answer fast.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from dataclasses import fields
from pathlib import Path

import click

from groklens import __version__
from groklens.config import CHOICES, PHASE_THRESHOLDS, PRESETS, RunConfig, config_from, field_help
from groklens.errors import BadInput, GroklensError, PluginWarning
from groklens.fileio import check_text_target, strict_json


# ---------------------------------------------------------------------- config options
def _config_options(func):
    """One --kebab-case option per RunConfig field, default None (= not given); the help is the
    field's comment in groklens/config.py."""
    words = field_help()
    for f in reversed(fields(RunConfig)):
        flag = "--" + f.name.replace("_", "-")
        ann = str(f.type)
        default = getattr(RunConfig(), f.name)
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = f"{words.get(f.name) or f.name} [config {f.name}; default {shown!r}]"
        if ann == "bool":
            opt = click.option(f"{flag}/--no-{f.name.replace('_', '-')}", f.name, default=None, help=help_text)
        elif ann.startswith("tuple"):
            opt = click.option(flag, f.name, type=float, nargs=2, default=None, help=help_text)
        else:
            typ = {"int": int, "float": float}.get(ann, str)
            if f.name in CHOICES:
                help_text = help_text[:-1] + f"; one of {', '.join(CHOICES[f.name])}]"
            opt = click.option(flag, f.name, type=typ, default=None, help=help_text)
        func = opt(func)
    return func


def _refused(old: str, hint: str, *, flag: bool = False):
    """A hidden option that only refuses an old spelling: `OLD HINT`, exit 2, before any work."""

    def refuse(ctx, param, value):
        if value is not None and value is not False:  # given, even as an empty string
            raise BadInput(f"{old} {hint}")

    dest = "refused_" + old.lstrip("-").replace("-", "_")  # not the new option's name: click would mix them
    return click.option(old, dest, is_flag=flag, default=None, hidden=True, expose_value=False, callback=refuse)


def _threshold_option(help_text: str):
    """--threshold: accuracy that counts as grokked, by default the config's grok_threshold."""
    return click.option("--threshold", type=float, default=RunConfig.grok_threshold, show_default=True, help=help_text)


def _which_checkpoints(func):
    """--every K | --checkpoints S (analyze, probe); the old --steps is refused."""
    func = _refused("--steps", "was renamed --checkpoints (checkpoint steps; --steps is train's number of "
                               "training steps)")(func)
    func = click.option("--checkpoints", "steps", multiple=True, metavar="S",
                        help="Checkpoint step(s) (repeatable, or comma-separated).")(func)
    return click.option("--every", type=int, default=None,
                        help="Every K-th checkpoint (by index), plus the last and the memorization / grokking "
                             "ones.")(func)


def _log_option(whose: str):
    """--log tensorboard:DIR|wandb:PROJECT (repeatable), for the commands that train."""
    return click.option("--log", "log_to", multiple=True, metavar="tensorboard:DIR|wandb:PROJECT",
                        help=f"Also send each evaluation row{whose} to TensorBoard (event files in DIR) or Weights & "
                             "Biases (PROJECT; offline unless WANDB_MODE says otherwise), with the config; "
                             "repeatable. The HDF5 file stays the record.")


def _cluster_options(f):
    """--executor and its options, shared by the commands that train many runs (sweep, reproduce):
    they reach the command as one dict, `cluster` (executor, address, gpus_per_run, slurm: the
    keyword arguments of `sweeps.make_executor`), with --slurm-option parsed."""
    options = [
        click.option("--executor", type=click.Choice(["local", "ray", "slurm"]), default="local", show_default=True,
                     help="local: process pool; ray: Ray tasks; slurm: submitit job arrays."),
        click.option("--address", default=None,
                     help="ray: address of an existing Ray cluster (default: start one here)."),
        click.option("--gpus-per-run", type=float, default=None,
                     help="GPUs per task where the cluster has GPUs (ray: fractional, default 0.25 per run, 1 per "
                          "ensemble; slurm: rounded up, default none)."),
        click.option("--partition", default=None, help="slurm: partition."),
        click.option("--time-min", type=int, default=24 * 60, show_default=True,
                     help="slurm: time limit per job (minutes)."),
        click.option("--slurm-option", "slurm_options", multiple=True, metavar="KEY=VALUE",
                     help="slurm: any other sbatch parameter submitit knows (e.g. mem=8G, account=lab)."),
        click.option("--submitit-cluster", type=click.Choice(["auto", "slurm", "local", "debug"]), default="auto",
                     show_default=True, help="slurm: submitit's backend; local/debug try it without SLURM."),
    ]

    @functools.wraps(f)
    def command(*args, executor, address, gpus_per_run, partition, time_min, slurm_options, submitit_cluster, **kw):
        extra = {}
        for item in slurm_options:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise BadInput(f"--slurm-option wants KEY=VALUE; got {item!r}")
            extra[key] = value
        slurm = {"partition": partition, "time_min": time_min, "extra": extra,
                 "cluster": None if submitit_cluster == "auto" else submitit_cluster}
        kw["cluster"] = {"executor": executor, "address": address, "gpus_per_run": gpus_per_run, "slurm": slurm}
        return f(*args, **kw)

    for option in reversed(options):
        command = option(command)
    return command


def _threads() -> None:
    """The thread rule of groklens/threads.py for a command that computes (silent; train says more)."""
    from groklens.threads import apply_threads

    apply_threads(None, quiet=True)


# ---------------------------------------------------------------------- the group
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="groklens")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
def cli(debug: bool) -> None:
    """groklens: train grokking models, keep their checkpoint trajectories, measure mechanisms."""


@cli.command()
@click.option("--preset", "preset_name", default=None,
              help=f"Starting config: {', '.join(sorted(PRESETS))} (default nanda).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="YAML file of config fields (unknown keys are an error).")
@click.option("--out", "-o", type=click.Path(), default=None, help="Trajectory file to write (RUN.h5).")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--resume", "resume_path", type=click.Path(), default=None,
              help="Continue an interrupted run from its last checkpoint.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, no busy-machine note.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--threads", type=int, default=None, metavar="N",
              help="torch threads (default: $GROKLENS_THREADS, else $OMP_NUM_THREADS, else the cores shared "
                   "with other groklens processes, 1 on a busy machine; docs/CLI.md, Threads).")
@_log_option("")
@_config_options
def train(preset_name, config_file, out, force, resume_path, quiet, as_json, threads, log_to, **overrides) -> None:
    """Train a model and write its checkpoint trajectory to one HDF5 file.

    Every config field below is a flag and a YAML key (--config); the defaults are Nanda et al.'s
    canonical p=113 run."""
    from groklens.threads import apply_threads

    choice = apply_threads(threads, quiet=True)  # before torch loads; the note once training starts
    from groklens.trainers import loggers, train as training

    specs = loggers.check_specs(log_to)
    if resume_path is not None:
        if force:
            raise BadInput("--resume continues a run and --force starts one afresh; give one of them")
        extend_to = overrides.pop("steps")  # --resume RUN --steps N raises a censored run's cap
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given or config_file or preset_name or out:
            extra = ", ".join(["--" + g.replace("_", "-") for g in given] +
                              [o for o, v in (("--config", config_file), ("--preset", preset_name), ("--out", out))
                               if v])
            raise BadInput(f"--resume continues the stored config; do not also give {extra}")
        target, cfg = Path(resume_path), None
    else:
        extend_to = None
        if out is None:
            raise BadInput("missing --out RUN.h5 (where to write the trajectory)")
        cfg = config_from(preset_name, config_file, overrides)
        target = Path(out)
    loggers.check_targets(specs, target)  # before the run file exists
    note = None if quiet or as_json or not choice.note else f"groklens: {choice.note}"
    result = _train_or_resume(training, loggers, specs, cfg, target, force, not quiet, note, extend_to)
    from groklens.analyses.grokking import censored_text, first_crossing_text, run_summary
    from groklens.checkpoints import Trajectory

    run = Trajectory(result.path)
    thr = run.config.grok_threshold  # the run's own threshold (--grok-threshold), beside PHASE_THRESHOLDS
    summary = run_summary(run, thresholds=tuple(sorted({*PHASE_THRESHOLDS, thr})))
    if as_json:
        click.echo(strict_json(summary))
    else:
        g = summary["grokking_step"][f"{thr:g}"]
        mstep = summary["memorization_step"][f"{thr:g}"]
        click.echo(
            f"{result.path}: {result.status} at step {result.last_step}, {summary['n_checkpoints']} checkpoints; "
            f"memorized at {censored_text(mstep, summary)}, grokked at {censored_text(g, summary)} (threshold {thr:g}, "
            f"{summary['grok_evals']} consecutive evaluations)"
            + first_crossing_text(summary["first_crossing"][f"{thr:g}"], g)
        )


def _train_or_resume(training, loggers, specs, cfg, target: Path, force: bool, progress: bool, note: str | None,
                     extend_to: int | None = None):
    """training.train (cfg given) or training.resume, with the --log loggers fed each evaluation row and
    the busy-machine note said once training starts; Ctrl-C says how to continue."""
    from groklens.checkpoints import Trajectory

    from tqdm.auto import tqdm

    opened: list = []

    def warn(line: str) -> None:
        tqdm.write(f"groklens: warning: {_one_line(line)}", file=sys.stderr)  # above the progress bar

    def first_row() -> None:
        if note:
            tqdm.write(note, file=sys.stderr)  # above the progress bar, not through it
        if specs:
            config = cfg.to_dict() if cfg is not None else Trajectory(target).config_dict
            opened.append(loggers.open_loggers(specs, target, config, warn))

    def on_eval(row: dict) -> None:
        if first:
            first.pop()()
        for item in opened:
            item.log(row)

    first = [first_row]
    try:
        if cfg is None:
            return training.resume(target, progress=progress, on_eval=on_eval, steps=extend_to)
        return training.train(cfg, target, force=force, progress=progress, on_eval=on_eval)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_resume_hint(target)) from None
    finally:
        for item in opened:
            item.close()


def _resume_hint(path: Path) -> str:
    """What Ctrl-C of `train` leaves, and the command that continues it."""
    from groklens.checkpoints import Trajectory

    try:
        steps = Trajectory(path).steps
    except (GroklensError, OSError):
        steps = []
    if not len(steps):
        return f"no checkpoint was committed to {path}; train again to start over"
    return f"{path} is kept up to step {int(steps[-1])}; `groklens train --resume {path}` continues it"


@cli.command()
@click.argument("run", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(run: str, as_json: bool) -> None:
    """Config, checkpoints, last metrics, memorization and grokking steps of RUN.h5."""
    from groklens.analyses.grokking import run_summary
    from groklens.checkpoints import Trajectory
    from groklens.checkpoints.validate import InvalidTrajectory

    try:
        traj = Trajectory(run)
        # the run's own threshold beside PHASE_THRESHOLDS, as train's summary line reads it
        summary = run_summary(traj, thresholds=tuple(sorted({*PHASE_THRESHOLDS, traj.config.grok_threshold})))
    except InvalidTrajectory as exc:
        if as_json:  # what is wrong, all of it, then exit 2 like any bad input
            click.echo(strict_json({"path": exc.path, "valid": False, "problems": exc.problems}))
        raise
    summary = {**summary, "valid": True, "problems": []}
    if as_json:
        click.echo(strict_json(summary))
        return
    from groklens.analyses.grokking import format_summary

    click.echo(format_summary(summary))


class _MetricOption(click.Option):
    """--metric's help lists the registry's analyses when help is shown (not at every start)."""

    def get_help_record(self, ctx):
        from groklens.analyses.registry import default_names, names

        every, default = names(), default_names()
        rest = [n for n in every if n not in default]
        self.help = (f"Analysis to compute (repeatable): {', '.join(every)}. Default: {', '.join(default)} "
                     f"(all but {', '.join(rest)}), skipping those that do not apply.")
        return super().get_help_record(ctx)


@cli.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--metric", "metrics", multiple=True, metavar="NAME", cls=_MetricOption)
@_which_checkpoints
@click.option("--param", "params", multiple=True, metavar="METRIC.KEY=VALUE",
              help="An analysis parameter, VALUE as JSON (e.g. sharpness.top_k=3); see docs/ANALYSES.md.")
@click.option("--recompute", is_flag=True, help="Recompute even where stored results exist.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: metric -> {steps, values...}; with several runs, run path -> that object.")
@click.option("--summary", is_flag=True,
              help="One line per measure (compare's columns): its value at the first analyzed checkpoint, at "
                   "memorization, at grokking and at the last, instead of the table of every step.")
@click.option("--copy", "copy", type=int, default=None, metavar="M",
              help="Copy M of a routed run (routing_copies > 1; default copy 0); its results go to "
                   "RUN.copyM.analyses.h5.")
def analyze(runs, metrics, every, steps, params, recompute, quiet, as_json, summary, copy) -> None:
    """Measure mechanisms at the checkpoints of RUN.h5 (one or more runs, one after the other);
    results are kept in each RUN.analyses.h5."""
    if summary and as_json:
        raise BadInput("--summary prints lines, --json the whole object; give one of them")
    _threads()
    from groklens.analyses.notes import one_per_kind
    from groklens.analyses.runner import analyze_run, format_results, summary_lines
    from groklens.checkpoints import Trajectory

    runs = list(dict.fromkeys(runs))
    for run in runs:  # every file opens before anything is computed: a bad one is refused first
        Trajectory(run, copy=copy)
    several = len(runs) > 1
    outputs, notes = {}, []
    for run in runs:
        results, said = analyze_run(run, metrics=metrics, steps=steps or None, every=every, params=params,
                                    recompute=recompute, progress=not quiet, copy=copy)
        notes += [f"{Path(run).name}: {n}" if several else n for n in said]
        outputs[run] = results
    for note in one_per_kind(notes):  # a note that holds for several runs: one line naming them
        click.echo(f"groklens: {note}", err=True)
    if as_json:
        click.echo(strict_json(outputs if several else outputs[runs[0]]))
        return
    for run, results in outputs.items():
        if several:
            click.echo(f"=== {run}")
        click.echo("\n".join(summary_lines(run, results, copy)) if summary else format_results(results))


@cli.command("llc-calibrate")
@click.argument("run", type=click.Path())
@click.option("--checkpoints", "steps", multiple=True, metavar="S",
              help="Checkpoint step(s) to calibrate at (repeatable or comma-separated; default: the memorization "
                   "checkpoint and the last one).")
@click.option("--lr", "lrs", multiple=True, metavar="X",
              help="SGLD step sizes (default 3e-7,3e-6,...,3e-1 by decades).")
@click.option("--nbeta", "nbetas", multiple=True, metavar="X",
              help="Inverse temperatures n*beta (default 0.01,0.1,1,10 x n/log n).")
@click.option("--localization", "localizations", multiple=True, metavar="X",
              help="Localizations gamma (default 1,10,100,1e3,1e4,1e5).")
@click.option("--chains", type=int, default=4, show_default=True, help="Chains per setting.")
@click.option("--draws", type=int, default=200, show_default=True, help="Draws per chain after burn-in.")
@click.option("--burnin", type=int, default=100, show_default=True, help="Burn-in steps per chain.")
@click.option("--minibatch", type=int, default=32, show_default=True, help="Inputs per SGLD step.")
@click.option("--seed", type=int, default=0, show_default=True, help="Chain noise and minibatch seed.")
@click.option("--eval-set", default="train", show_default=True, help="train | test | all: the inputs of L_n.")
@click.option("--out", "-o", "out_dir", type=click.Path(), default=None,
              help="Directory for calibration.json and one loss-trace figure per checkpoint.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as JSON.")
def llc_calibrate(run, steps, lrs, nbetas, localizations, chains, draws, burnin, minibatch, seed, eval_set, out_dir,
                  quiet, as_json) -> None:
    """Sweep the LLC's SGLD step size x nbeta x localization at checkpoints of RUN.h5, devinterp's
    way: per setting the estimate, convergence, chain agreement, loss excursion, lr stability and
    ordering, and a recommended setting (docs/ANALYSES.md, "llc")."""
    from groklens.analyses.llc_calibrate import calibrate_run, format_calibration, parse_floats
    from groklens.analyses.runner import parse_steps

    cal, written = calibrate_run(
        run, parse_steps(steps), lrs=parse_floats(lrs, "--lr"), nbetas=parse_floats(nbetas, "--nbeta"),
        localizations=parse_floats(localizations, "--localization"), chains=chains, burnin=burnin, draws=draws,
        minibatch=minibatch, seed=seed, eval_set=eval_set, out_dir=out_dir,
        progress=None if quiet else (lambda line: click.echo(f"groklens: {line}", err=True)))
    click.echo(strict_json(cal.to_json()) if as_json else format_calibration(cal))
    for path in written:
        click.echo(f"groklens: wrote {path}", err=True)


@cli.command()
@click.argument("run", type=click.Path())
@click.option("--site", required=True, metavar="HOOK", help="Hook site, e.g. blocks.0.hook_resid_post.")
@click.option("--target", required=True, metavar="NAME", help="a, b, answer or fourier.")
@click.option("--position", default=None, metavar="POS", help="readout (default), all, or a position index.")
@click.option("--freq", "frequencies", type=int, multiple=True,
              help="Frequency k for target fourier (repeatable; default: the checkpoint's key frequencies).")
@click.option("--split", default=None, help="random (default; --train-frac of inputs) or run (the run's split).")
@click.option("--train-frac", type=float, default=None, help="Probe training share for --split random (0.5).")
@_which_checkpoints
@click.option("--recompute", is_flag=True, help="Recompute even where stored results exist.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--copy", "copy", type=int, default=None, metavar="M", help="Copy M of a routed run (default copy 0).")
def probe(run, site, target, position, frequencies, split, train_frac, every, steps, recompute, quiet, as_json,
          copy) -> None:
    """Linear probe of TARGET from a hook site at the checkpoints of RUN.h5 (held-out accuracy or R^2)."""
    _threads()
    from groklens.analyses.runner import format_results, probe_run

    pos = int(position) if position is not None and position.lstrip("-").isdigit() else position
    results = probe_run(run, site=site, target=target, position=pos, frequencies=list(frequencies) or None,
                        split=split, train_frac=train_frac, steps=steps or None, every=every,
                        recompute=recompute, progress=not quiet, copy=copy)
    click.echo(strict_json(results) if as_json else format_results(results))


@cli.command()
@click.argument("grid", type=click.Path(dir_okay=False), required=False)
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the sweep's trajectory files (created if missing).")
@click.option("--status", "status_dir", type=click.Path(file_okay=False), default=None,
              help="Print the state of the runs in this sweep directory and exit.")
@_cluster_options
@click.option("--workers", type=int, default=None,
              help="Tasks at once (local: processes, default all cores; ray: default the cluster's CPUs; "
                   "slurm: array parallelism, default unlimited).")
@click.option("--threads", type=int, default=1, show_default=True,
              help="torch threads per task (more only for few, large runs).")
@click.option("--ensemble", is_flag=True, help="Train runs that share an architecture as batched ensembles.")
@click.option("--ensemble-size", type=int, default=64, show_default=True, help="Most members per ensemble.")
@click.option("--retry-failed", is_flag=True, help="Run failed runs again (their error files are replaced).")
@click.option("--dry-run", is_flag=True, help="List the runs and what would happen to each; train nothing.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_log_option(" of every run trained (each under its run's name)")
def sweep(grid, out_dir, status_dir, cluster, workers, threads, ensemble, ensemble_size, retry_failed, dry_run, quiet,
          as_json, log_to) -> None:
    """Train every run of the grid GRID.yaml into DIR; again to resume; --status DIR to look."""
    from groklens.experiments.cost import cap_cost
    from groklens import sweeps

    if status_dir is not None:
        if grid is not None or out_dir is not None:
            raise BadInput("--status DIR takes no GRID and no --out")
        status = sweeps.sweep_status(status_dir)
        if as_json:
            click.echo(strict_json(status))
            return
        c = status["counts"]
        click.echo(f"{status['dir']}: {status['total']} runs: {c['done']} done, {c['running']} running, "
                   f"{c['interrupted']} interrupted, {c['pending']} pending, {c['failed']} failed"
                   + (f", {c['blocked']} blocked (a file in the way)" if c["blocked"] else ""))
        for name, error in status["failed"].items():
            kind = status["runs"][name]["state"]
            click.echo(f"{kind:<8} {name}: {error}")
        return
    if grid is None:
        raise BadInput("missing GRID.yaml (or --status DIR)")
    if out_dir is None:
        raise BadInput("missing --out DIR (where the runs' trajectory files go)")
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be >= 1; got {workers}")
    spec = sweeps.load_sweep(grid)
    sweeps.check_threads(threads, cluster["executor"])
    if ensemble:  # the ensembles are sized by the runs' step times, measured once they are known to build
        sweeps.check_buildable(spec.runs())
    cost = cap_cost([r.config for r in spec.runs()], None if quiet or as_json else
                    lambda s: click.echo(f"groklens: {s}", err=True)) if ensemble else None
    if dry_run:
        # the executor's options too (a bad --time-min, --gpus-per-run or --address), as a real sweep would
        ex = sweeps.make_executor(out_dir=Path(out_dir), workers=workers, **cluster)
        ex.check()
        runs = spec.runs()
        sweeps.check_buildable(runs)  # what training would refuse, refused now
        states = {r.name: sweeps.run_state(Path(out_dir), r.name) if Path(out_dir).is_dir() else ("pending", "")
                  for r in runs}
        plan = [{"name": r.name, "state": states[r.name][0], "detail": states[r.name][1]} for r in runs]
        n_workers = getattr(ex, "workers", None) or workers or os.cpu_count() or 1
        groups = sweeps.dry_run_tasks(runs, states, Path(out_dir), ensemble_size=ensemble_size, workers=n_workers,
                                      threads=threads, cost=cost) if ensemble else None
        wall = sweeps.dry_run_wall(groups, n_workers) if groups else None
        if as_json:
            click.echo(strict_json(plan if groups is None else {"runs": plan, "tasks": groups, "workers": n_workers,
                                                                "expected_wall_s": wall}))
            return
        click.echo("\n".join(
            f"{p['state']:<12} {p['name']}" + (f": {p['detail']}" if p["state"] == "blocked" else "") for p in plan))
        for i, t in enumerate(groups or []):
            what = f"ensemble of {len(t['runs'])}" if t["ensemble"] else "single run"
            click.echo(f"task {i + 1:<3} {what}, ~{t['cost']:.3g} s: {', '.join(t['runs'])}")
        if wall is not None:
            click.echo(f"expected: ~{wall:.3g} s of wall time on {n_workers} worker(s), each taking the next task as "
                       "it frees (step times measured here, runs to their caps: runs that stop after grokking end "
                       "sooner)")
        return
    report = sweeps.run_sweep(spec, out_dir, workers=workers, ensemble=ensemble, ensemble_size=ensemble_size,
                              retry_failed=retry_failed, threads=threads, progress=not quiet, cost=cost, **cluster,
                              log=log_to)
    c = report.counts
    if as_json:
        click.echo(strict_json(report.to_dict()))
    else:
        click.echo(f"{report.out_dir}: {c['total']} runs: {c['done']} done, {c['running']} running elsewhere, "
                   f"{c['failed']} failed" + (f" ({report.ensembles} ensembles)" if ensemble else ""))
        fallback = list(report.single_fallback.items())
        for name, why in fallback[:5]:
            click.echo(f"single   {name}: {why}")
        if len(fallback) > 5:
            click.echo(f"single   ... and {len(fallback) - 5} more runs trained alone (see --json)")
        for name, error in report.failed.items():
            skipped = " (failed before; --retry-failed runs it again)" if name in report.skipped_failed else ""
            click.echo(f"failed   {name}: {error}{skipped}")
    if c["failed"]:
        raise GroklensError(f"{c['failed']} of {c['total']} runs failed; `groklens sweep --status {report.out_dir}` "
                            "lists them")


@cli.command("scaling-law")
@click.argument("directory", type=click.Path())
@click.option("--vars", "variables", default="width,train_frac,lr,weight_decay", show_default=True,
              help="Comma-separated: width (the model's hidden width), n_train, or numeric config fields.")
@_threshold_option("Test accuracy that counts as grokked.")
@click.option("--interactions", is_flag=True, help="Also print the fit with pairwise interaction terms.")
@click.option("--censored", is_flag=True,
              help="Fit censored runs too (Tobit maximum likelihood); default: exclude them.")
@click.option("--phase", default=None, metavar="X,Y", help="The two variables of the phase diagram.")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
def scaling_law_cmd(directory, variables, threshold, interactions, censored, phase, as_json) -> None:
    """Fit log grokking time against log width, data, lr and weight decay over the runs in DIRECTORY."""
    from groklens.analyses.scaling import format_result, scaling_law

    names = [v.strip() for v in variables.split(",") if v.strip()]
    phase_vars = [v.strip() for v in phase.split(",")] if phase else None
    if phase_vars is not None and (len(phase_vars) != 2 or not set(phase_vars) <= set(names)):
        raise BadInput(f"--phase wants two of the --vars, X,Y; got {phase!r}")
    result = scaling_law(directory, names, threshold=threshold, interactions=interactions, censored=censored,
                         phase=phase_vars)
    if as_json:
        click.echo(strict_json(result))
    else:
        click.echo("\n".join(format_result(result)))


_GROUP_BY_HELP = ("'run': one row per run; 'variant': one row per group of runs whose configs differ only in "
                  "seed/data_seed (mean ± std over seeds); or config field(s) FIELD[,FIELD]: one row per value.")


@cli.command("compare")
@click.argument("runs", nargs=-1, type=click.Path())
@click.option("--baseline", type=click.Path(), default=None,
              help="Run that speed-ups are measured against (its group, when grouping); added to RUNS if missing.")
@click.option("--group-by", "group_by", default="run", show_default=True, metavar="run|variant|FIELD[,FIELD]",
              help=_GROUP_BY_HELP)
@_threshold_option("Train / test accuracy that counts as memorized / grokked.")
@click.option("--analyze", is_flag=True,
              help="Compute analyses missing at the memorization, grokking and last checkpoints (kept in each "
                   "run's sidecar); otherwise they are shown as missing.")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="With --analyze: fourier, attention, sharpness, rank, radial or llc (repeatable; default: all that "
                   "apply but llc).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
def compare_cmd(runs, baseline, group_by, threshold, analyze, metrics, fmt, quiet) -> None:
    """Compare RUN.h5 files: memorization and grokking steps, gap, speed-up, stored analyses."""
    _threads()
    from groklens.analyses.compare import compare

    result = compare(runs, baseline=baseline, group_by=group_by, threshold=threshold, analyze=analyze,
                     metrics=list(metrics) or None, progress=not quiet)
    click.echo(result.format(fmt))


@cli.command()
@click.argument("runs", nargs=-1, type=click.Path())
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Directory for index.html and the figures (created if missing; other files there are kept).")
@click.option("--format", "fmt", type=click.Choice(["png", "pdf", "svg"]), default="png", show_default=True,
              help="Figure file format (with pdf the page shows PNG previews linked to the PDFs).")
@click.option("--baseline", type=click.Path(), default=None, help="Run that speed-ups are measured against.")
@click.option("--group-by", "group_by", default="variant", show_default=True, metavar="run|variant|FIELD[,FIELD]",
              help=_GROUP_BY_HELP)
@_threshold_option("Train / test accuracy that counts as memorized / grokked.")
@click.option("--analyze", is_flag=True,
              help="First compute fourier, attention, rank and radial along each run's checkpoints (kept in the "
                   "sidecars); fourier also on the last checkpoint's key set, which the progress-measures figure "
                   "reads (unless --param fourier.key_frequencies=... says otherwise).")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="With --analyze: the analyses to compute instead (repeatable; e.g. sharpness).")
@click.option("--every", type=int, default=None,
              help="With --analyze: every K-th checkpoint (plus the last and the phase checkpoints).")
@click.option("--param", "params", multiple=True, metavar="METRIC.KEY=VALUE",
              help="With --analyze: an analysis parameter, as in analyze (e.g. fourier.key_frequencies=last: "
                   "the last checkpoint's key set at every checkpoint, for the progress-measures figure).")
@click.option("--checkpoints", "steps", multiple=True, metavar="S",
              help="Checkpoint step(s) of the Fourier spectrum and neuron-cluster figures (repeatable, or "
                   "comma-separated; default: start, memorization, grokking, end).")
@_refused("--checkpoint", "was renamed --checkpoints (checkpoint steps, as in analyze)")
@click.option("--figures", default=None, metavar="NAME[,NAME...]",
              help="Only these figures (e.g. curves,fourier_fve,progress_measures; docs/CLI.md lists the names).")
@click.option("--style", type=click.Choice(["screen", "paper"]), default="screen", show_default=True,
              help="paper: each figure --width inches wide, its text at --font-size points, 300 dpi, "
                   "TrueType fonts in PDF.")
@click.option("--width", "width_in", type=float, default=None, metavar="IN",
              help="With --style paper: figure width in inches, 1 to 20 (default 5.5, a one-column paper's text "
                   "width).")
@click.option("--font-size", "font_pt", type=float, default=None, metavar="PT",
              help="With --style paper: text size in points, 4 to 36 (default 8).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def report(runs, out_dir, fmt, baseline, group_by, threshold, analyze, metrics, every, params, steps, figures,
           style, width_in, font_pt, quiet, as_json) -> None:
    """Write figures, an index.html with the comparison table of RUN.h5 files and explorer.html (a checkpoint
    slider over the curves, attention, Fourier spectrum, neuron clusters and clock/pizza label) into --out DIR."""
    _threads()
    from groklens.analyses.report import build_report
    from groklens.analyses.runner import parse_steps

    opts = {k: v for k, v in (("width_in", width_in), ("font_pt", font_pt)) if v is not None}
    if opts and style != "paper":
        raise BadInput("--width and --font-size size the figures of --style paper; give --style paper too")
    result = build_report(runs, out_dir, fmt=fmt, baseline=baseline, group_by=group_by, threshold=threshold,
                          analyze=analyze, metrics=list(metrics) or None, every=every, steps=parse_steps(steps),
                          progress=not quiet, params=params, style=style, style_opts=opts, figures=figures)
    if as_json:
        click.echo(strict_json({"index": str(result.index), "explorer": str(result.explorer),
                               "figures": [str(p) for p in result.figures],
                               "missing": [{"figure": t, "why": w} for t, w in result.missing],
                               "notes": result.notes}))
        return
    for note in result.notes:  # the analyses' notes (skipped analyses, eps warnings), after the progress bar
        click.echo(f"groklens: {note}", err=True)
    for title, why in result.missing:
        click.echo(f"missing  {title}: {why}")
    click.echo(f"wrote {len(result.figures)} figure file(s), {result.index} and {result.explorer}")


@cli.command()
@click.argument("name", required=False)
@click.option("--list", "list_", is_flag=True,
              help="List the experiments: runs, their cost here (steps timed on this machine, to the expected stop "
                   "and to the cap), the measured (ledger) time per run, fits this CPU?")
@click.option("--scale", default="quick", show_default=True, metavar="smoke|quick|paper",
              help="smoke: tiny pipeline check; quick: a 2-core CPU (smaller p / model); paper: the published setup "
                   "(GPU).")
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Directory for runs/, report/ and results (default ./reproduce-NAME-SCALE); rerun to resume.")
@click.option("--seeds", type=int, default=None, help="Seeds per variant (default: smoke 1, quick 2, paper 10).")
@click.option("--workers", type=int, default=None,
              help="Training processes (default: the CPU cores; smoke: 1); ray/slurm: tasks at once, as for sweep.")
@click.option("--results-md", "results_md", type=click.Path(dir_okay=False), default=None,
              help="Markdown file whose reproduce table gets the rows (e.g. docs/RESULTS.md); none by default.")
@click.option("--ledger", "ledger_dir", type=click.Path(file_okay=False), default=None,
              help="Directory of the results ledger NAME.SCALE.json (the committed one: docs/results; default "
                   "OUT/ledger).")
@click.option("--no-train", is_flag=True,
              help="Train nothing: record the finished runs in OUT/runs and read every recorded seed.")
@_refused("--results", "is now --results-md FILE (rows are written only where asked)")
@_refused("--no-results", "is gone: rows go to a markdown file only with --results-md FILE", flag=True)
@click.option("--compile", "compile_", is_flag=True,
              help="Train each new run with compile=true (torch.compile; CPU: a C++ compiler) where it applies and the "
                   "layout gives it one thread: 0.8x the step at paper scale after 3-20 s of compiling "
                   "(docs/PERFORMANCE.md); the same ledger rows.")
@click.option("--no-measure", is_flag=True,
              help="Cost runs (--list, and the estimate before training) by the FLOP model instead of timing a few "
                   "steps of each config here.")
@click.option("--arms", default=None, metavar="PATTERNS",
              help="Train only the arms (variants) whose names match these comma-separated patterns (* and ?, "
                   "e.g. '*_base,*_t16_always': a study trained in stages); the rows read every arm the ledger holds.")
@_cluster_options
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (or the list) as JSON.")
@_log_option(" of every run trained (each under its run's name)")
def reproduce(name, list_, scale, out_dir, seeds, workers, results_md, ledger_dir, no_train, compile_, no_measure,
              arms, cluster, quiet, as_json, log_to) -> None:
    """Run experiment NAME of REFERENCES.md; print the published numbers beside ours and their ratio."""
    _threads()
    from groklens import experiments as E

    if list_:
        if name is not None or arms is not None or cluster["executor"] != "local":
            raise BadInput("--list takes no experiment NAME, no --arms and no --executor")
        from groklens.experiments.cost import echo_stderr

        items = E.listing(ledger_dir, measure=not no_measure, echo=None if quiet else echo_stderr)
        click.echo(strict_json(items) if as_json else E.format_listing(items))
        return
    if name is None:
        raise BadInput(f"missing experiment NAME (one of {', '.join(E.EXPERIMENTS)}), or --list")
    E.get_experiment(name)
    if scale not in E.SCALES:
        raise BadInput(f"--scale must be one of {', '.join(E.SCALES)}; got {scale!r}")
    if results_md is not None:
        check_text_target(Path(results_md))  # before hours of training, not after
    result = E.reproduce(name, scale, out_dir, seeds, workers=workers, results_md=results_md, ledger_dir=ledger_dir,
                         train=not no_train, progress=not quiet, echo=(lambda _m: None) if as_json else click.echo,
                         compile=compile_, measure=not no_measure, arms=None if arms is None else arms.split(","),
                         log=log_to, cluster=cluster)
    click.echo(strict_json(result.to_json(), default=str) if as_json else E.format_result(result))


@cli.command()
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False), default="demo-out", show_default=True,
              help="Directory for the runs (OUT/runs) and the report (OUT/report).")
@click.option("--scale", metavar="quick|paper|smoke", default="quick", show_default=True,
              help="quick: small task on CPU, minutes; paper: the canonical p=113 setup (for a GPU); "
                   "smoke: a tiny pipeline check (CI). The names of `reproduce --scale`.")
@click.option("--force", is_flag=True, help="Train again over demo runs already in OUT/runs.")
@click.option("--workers", type=int, default=None, help="Runs trained / analyzed at once (default: the CPU cores).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def demo(out_dir, scale, force, workers, quiet) -> None:
    """Train standard, bounded-sphere, uniform-attention and activation-norm models; compare; report."""
    _threads()
    from groklens.experiments.demo import run_demo

    run_demo(out_dir, scale=scale, force=force, workers=workers, progress=not quiet, echo=click.echo)


# ---------------------------------------------------------------------- entry point
def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    if issubclass(category, PluginWarning):  # one line, as the errors are
        click.echo(f"groklens: warning: {_one_line(str(message))}", err=True)
    else:
        _default(message, category, filename, lineno, file, line)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    warnings.showwarning = _show_warning
    try:
        from groklens.fileio import check_utf8_args

        check_utf8_args(argv)  # a file name in another encoding: refused, not half-handled
        rv = cli.main(args=argv, prog_name="groklens", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except SystemExit as exc:  # groklens never calls sys.exit inside a command: a plugin's code did
        if debug:
            raise
        click.echo(f"groklens: failed: sys.exit({exc.code!r}) was called inside the command (a plugin's code?); "
                   "rerun with --debug for the traceback", err=True)
        code = 1
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:  # Abort: click's form of Ctrl-C (and of EOF at a prompt)
        cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc  # click wraps the interrupt
        hint = str(cause) if isinstance(cause, KeyboardInterrupt) else ""
        click.echo("groklens: interrupted" + (f"; {hint}" if hint else ""), err=True)
        code = 130
    except (click.ClickException, GroklensError) as exc:  # usage errors (unknown option, ...) and ours
        if debug:
            raise
        text = _unknown_option(exc) if isinstance(exc, click.NoSuchOption) else \
            exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        click.echo(f"groklens: error: {_one_line(text)}", err=True)
        code = exc.exit_code
    except OSError as exc:  # the file system refused (read-only, full, immutable): one line, a failed run
        if debug:
            raise
        where = f" {exc.filename}" if exc.filename else ""
        click.echo(f"groklens: error: cannot write or read{where} ({exc.strerror or _one_line(str(exc))})", err=True)
        code = 1
    except Exception as exc:  # an unexpected failure: still one line, the traceback with --debug
        if debug:
            raise
        click.echo(f"groklens: failed: {type(exc).__name__}: {_one_line(str(exc))} (rerun with --debug for details)",
                   err=True)
        code = 1
    if getattr(sys.modules.get("groklens.checkpoints.writer"), "WRITE_FAILED", False):
        sys.stdout.flush()  # HDF5 would fail (or crash) closing a file whose write failed:
        sys.stderr.flush()  # leave it as a killed writer would, which readers handle
        os._exit(code)
    sys.exit(code)


def _unknown_option(exc: click.NoSuchOption) -> str:
    """An unknown option with the suggestion of the config keys' rule (config.closest_name: a near
    spelling, or the option its words' initials spell, --learning-rate -> --lr), not click's own
    near spellings (it offered --attention-rate and --n-informative for --learning-rate)."""
    from groklens.config import closest_name

    name = exc.option_name
    command = exc.ctx.command if exc.ctx is not None else None
    longs = [o for p in (command.params if command is not None else []) for o in (*p.opts, *p.secondary_opts)
             if o.startswith("--")]
    known = {o[2:].replace("-", "_"): o for o in longs}
    guess = closest_name(name.lstrip("-").replace("-", "_"), known) if name.startswith("--") else None
    return f"No such option: {name}" + (f" (did you mean {known[guess]}?)" if guess else "")


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":  # pragma: no cover
    main()
