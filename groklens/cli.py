"""The `groklens` command line: parse, build the config, call one function, print.

Exit status: 0 ok, 1 failure, 2 bad input; errors are one line (`--debug` shows tracebacks).
Heavy modules (torch, transformer_lens) are imported inside commands, so `--help` and
`info` answer fast.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from groklens import __version__
from groklens.config import CHOICES, PRESETS, RunConfig, load_config_file
from groklens.errors import BadInput, GroklensError


# ---------------------------------------------------------------------- config options
def _config_options(func):
    """One --kebab-case option per RunConfig field, default None (= not given)."""
    for f in reversed(fields(RunConfig)):
        flag = "--" + f.name.replace("_", "-")
        ann = str(f.type)
        help_text = f"[config] {f.name} (default {getattr(RunConfig(), f.name)!r})"
        if ann == "bool":
            opt = click.option(f"{flag}/--no-{f.name.replace('_', '-')}", f.name, default=None, help=help_text)
        elif ann.startswith("tuple"):
            opt = click.option(flag, f.name, type=float, nargs=2, default=None, help=help_text)
        else:
            typ = {"int": int, "float": float}.get(ann, str)
            if f.name in CHOICES:
                help_text += f"; one of {', '.join(CHOICES[f.name])}"
            opt = click.option(flag, f.name, type=typ, default=None, help=help_text)
        func = opt(func)
    return func


def build_config(preset_name: str | None, config_file: str | None, overrides: dict[str, Any]) -> RunConfig:
    """preset < config file < flags; unknown keys and bad values are BadInput."""
    if preset_name is not None and preset_name not in PRESETS:
        raise BadInput(f"unknown preset {preset_name!r} (known: {', '.join(sorted(PRESETS))})")
    values: dict[str, Any] = dict(PRESETS[preset_name or "nanda"])
    if config_file:
        values.update(load_config_file(config_file))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RunConfig.from_dict(values)


# ---------------------------------------------------------------------- the group
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="groklens")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
def cli(debug: bool) -> None:
    """groklens: train grokking models, keep their checkpoint trajectories, measure mechanisms."""


@cli.command()
@click.option("--preset", "preset_name", default=None, help=f"Starting config: {', '.join(sorted(PRESETS))} (default nanda).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="YAML file of config fields (unknown keys are an error).")
@click.option("--out", "-o", type=click.Path(), default=None, help="Trajectory file to write (RUN.h5).")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--resume", "resume_path", type=click.Path(), default=None,
              help="Continue an interrupted run from its last checkpoint.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_config_options
def train(preset_name, config_file, out, force, resume_path, quiet, as_json, **overrides) -> None:
    """Train a model and write its checkpoint trajectory to one HDF5 file."""
    from groklens.trainers import loop

    if resume_path is not None:
        given = sorted(k for k, v in overrides.items() if v is not None)
        if given or config_file or preset_name or out:
            extra = ", ".join(["--" + g.replace("_", "-") for g in given] +
                              [o for o, v in (("--config", config_file), ("--preset", preset_name), ("--out", out)) if v])
            raise BadInput(f"--resume continues the stored config; do not also give {extra}")
        result = loop.resume(resume_path, progress=not quiet)
    else:
        if out is None:
            raise BadInput("missing --out RUN.h5 (where to write the trajectory)")
        cfg = build_config(preset_name, config_file, overrides)
        result = loop.train(cfg, out, force=force, progress=not quiet)
    from groklens.checkpoints import Trajectory

    summary = Trajectory(result.path).summary()
    if as_json:
        click.echo(json.dumps(summary))
    else:
        g = summary["grokking_step"]["0.95"]
        mstep = summary["memorization_step"]["0.95"]
        click.echo(
            f"{result.path}: {result.status} at step {result.last_step}, {summary['n_checkpoints']} checkpoints; "
            f"memorized at {_censored(mstep, summary)}, grokked at {_censored(g, summary)} (threshold 0.95)"
        )


@cli.command()
@click.argument("run", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(run: str, as_json: bool) -> None:
    """Config, checkpoints, last metrics, memorization and grokking steps of RUN.h5."""
    from groklens.checkpoints import Trajectory

    summary = Trajectory(run).summary()
    if as_json:
        click.echo(json.dumps(summary))
        return
    cfg = summary["config"]
    steps = summary["checkpoint_steps"]
    click.echo(f"run      {summary['path']}  ({summary['status']})")
    click.echo(f"task     {cfg['task']} p={cfg['p']} train_frac={cfg['train_frac']} data_seed={cfg['data_seed']}")
    click.echo(
        f"model    {cfg['model']} L={cfg['n_layers']} d_model={cfg['d_model']} heads={cfg['n_heads']} "
        f"d_mlp={cfg['d_mlp']} norm={cfg['norm']} attention={cfg['attention']} seed={cfg['seed']}"
    )
    click.echo(f"optim    AdamW lr={cfg['lr']} wd={cfg['weight_decay']} betas={cfg['betas']} steps={cfg['steps']}")
    span = f"{steps[0]}..{steps[-1]}" if steps else "none"
    click.echo(f"ckpts    {len(steps)} checkpoints, steps {span}; {summary['n_evaluations']} evaluations")
    last = summary["last"]
    if last:
        click.echo(
            f"last     step {last['step']}: train loss {last['train_loss']:.4g} acc {last['train_acc']:.4f} | "
            f"test loss {last['test_loss']:.4g} acc {last['test_acc']:.4f}"
        )
    for key in summary["grokking_step"]:
        click.echo(
            f"@{key:<7} memorized {_censored(summary['memorization_step'][key], summary)}, "
            f"grokked {_censored(summary['grokking_step'][key], summary)}"
        )


def _censored(step, summary) -> str:
    if step is not None:
        return f"step {step}"
    last = summary["censored_at"]
    return f"> {last} (censored)" if last is not None else "n/a"


@cli.command()
def demo() -> None:
    """Placeholder: the laptop demo (issue 'Compare trajectories, make the report, and a demo')."""
    raise GroklensError("`groklens demo` is not built yet; see the README tour for a training run to try")


# ---------------------------------------------------------------------- entry point
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    try:
        rv = cli.main(args=argv, prog_name="groklens", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.exceptions.Abort:
        click.echo("groklens: aborted", err=True)
        code = 1
    except click.ClickException as exc:  # usage errors: unknown option, bad value, ...
        if debug:
            raise
        click.echo(f"groklens: error: {_one_line(exc.format_message())}", err=True)
        code = exc.exit_code
    except GroklensError as exc:
        if debug:
            raise
        click.echo(f"groklens: error: {_one_line(str(exc))}", err=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        click.echo("groklens: interrupted", err=True)
        code = 130
    except Exception as exc:  # an unexpected failure: still one line, the traceback with --debug
        if debug:
            raise
        click.echo(f"groklens: failed: {type(exc).__name__}: {_one_line(str(exc))} (rerun with --debug for details)", err=True)
        code = 1
    sys.exit(code)


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":  # pragma: no cover
    main()
