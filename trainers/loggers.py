"""Live curves while training: each evaluation row, as the trajectory file gets it, also sent to
TensorBoard or Weights & Biases (`groklens train|sweep|reproduce --log tensorboard:DIR --log
wandb:PROJECT`; a sweep's runs each log under their own name).

The HDF5 file stays the record: a logger only mirrors the rows (every metric of the row, as a
scalar at the row's step) and the run's config. Names nest by what they measure (`tag`):
train_loss and test_loss are `loss/train` and `loss/test`, the accuracies `accuracy/train` and
`accuracy/test`, the rest `stats/NAME` (weight_norm, lr, ...), so each pair shares a section;
TensorBoard also gets a custom-scalars layout that draws each pair on one chart, the config as
hparams (its HPARAMS tab, one row per run, the test accuracy and loss beside) and as text. Both
packages are optional extras
(`pip install 'groklens[tensorboard]'`, `'groklens[wandb]'`), imported when asked for, and a
missing one, or a target that cannot work (check_targets), is a one-line error before the run
file exists; a logger that fails mid-run is dropped with one warning line (Loggers). W&B runs offline unless the
environment says otherwise (WANDB_MODE=online after `wandb login`); `wandb sync DIR` uploads an
offline run later.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from groklens.errors import BadInput
from groklens.fileio import check_writable_dir

KINDS = ("tensorboard", "wandb")
EXTRA = {"tensorboard": "tensorboard", "wandb": "wandb"}


def parse_specs(specs) -> list[tuple[str, str]]:
    """'tensorboard:DIR' / 'wandb:PROJECT' -> [(kind, target)], BadInput for anything else."""
    out = []
    for spec in specs or ():
        kind, sep, target = str(spec).partition(":")
        if kind not in KINDS or not sep or not target.strip():
            raise BadInput(f"--log takes tensorboard:DIR or wandb:PROJECT; got {spec!r}")
        out.append((kind, target.strip()))
    return out


def _require(kind: str) -> None:
    import importlib.util

    module = "tensorboard" if kind == "tensorboard" else "wandb"
    if importlib.util.find_spec(module) is None:
        raise BadInput(f"--log {kind} needs the {module} package: pip install 'groklens[{EXTRA[kind]}]'")


SPLIT_NAMES = {"loss": "loss", "acc": "accuracy"}  # train_X / test_X -> NAME/train, NAME/test
PAIRS = {name: [f"{name}/train", f"{name}/test"] for name in SPLIT_NAMES.values()}


def tag(key: str) -> str:
    """The logged name of a metric: `loss/train` for train_loss, `stats/lr` for lr (see above)."""
    split, _, what = key.partition("_")
    if split in ("train", "test") and what:
        return f"{SPLIT_NAMES.get(what, what)}/{split}"
    return f"stats/{key}"


def hparam_value(value: Any) -> int | float | str | bool:
    """A config value as TensorBoard's hparams take it (a number, a string or a bool)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value)


class TensorBoardLogger:
    def __init__(self, log_dir: str, name: str, config: dict[str, Any]):
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import custom_scalars, hparams

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(Path(log_dir) / name))
        # the config: the HPARAMS tab's row of this run (its metrics read from these tags), and as text
        for summary in hparams({k: hparam_value(v) for k, v in config.items()},
                               {t: None for t in ("accuracy/test", "loss/test")}):
            self.writer.file_writer.add_summary(summary)
        self.writer.add_text("config", "\n".join(f"    {k}: {json.dumps(v)}" for k, v in config.items()))
        self.writer.file_writer.add_summary(custom_scalars(
            {"groklens": {name: ["Multiline", tags] for name, tags in PAIRS.items()}}))

    def log(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        for key, value in row.items():
            if key != "step" and _finite(value):
                self.writer.add_scalar(tag(key), float(value), step)
        self.writer.flush()  # a curve that shows up as it is trained

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, project: str, name: str, config: dict[str, Any]):
        import wandb

        self.run = wandb.init(project=project, name=name, config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")

    def log(self, row: dict[str, Any]) -> None:
        self.run.log({tag(k): float(v) for k, v in row.items() if k != "step" and _finite(v)}, step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class Loggers:
    """The asked loggers of one run; `log(row)` is the training loop's on_eval. A logger that
    fails (a full disk, a lost connection) is dropped with one line to `warn`: the HDF5 file is
    the record, so the run goes on, whole and resumable, without that mirror."""

    def __init__(self, items: list, labels: list[str], warn=None):
        self.items, self.labels, self.warn = list(items), list(labels), warn

    def report(self, label: str, exc: Exception, step: int | None) -> None:
        if self.warn is not None:
            at = f" at step {step}" if step is not None else ""
            why = (str(exc).splitlines() or [""])[0][:200]
            self.warn(f"--log {label} failed{at} ({type(exc).__name__}{': ' + why if why else ''}); it logs no "
                      "more, the run goes on (the HDF5 file is the record)")

    def log(self, row: dict[str, Any]) -> None:
        keep = []
        for item, label in zip(self.items, self.labels):
            try:
                item.log(row)
                keep.append((item, label))
            except Exception as exc:  # noqa: BLE001 - any logger failure: reported, never the run's end
                self.report(label, exc, int(row["step"]))
        self.items, self.labels = [i for i, _ in keep], [lb for _, lb in keep]

    def close(self) -> None:
        for item, label in zip(self.items, self.labels):
            try:
                item.close()
            except Exception as exc:  # noqa: BLE001
                self.report(label, exc, None)


def check_specs(specs) -> list[tuple[str, str]]:
    """Parsed specs, each package checked importable (before anything is trained)."""
    parsed = parse_specs(specs)
    for kind, _ in parsed:
        _require(kind)
    return parsed


WANDB_MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")  # what wandb.init's settings accept
WANDB_PROJECT_BAD = set("/\\#?%:")  # characters wandb refuses in a project name


def check_targets(specs: list[tuple[str, str]], run_path: str | Path) -> None:
    """What the loggers will write to, checked before the run file exists (a logger that could
    not open would otherwise fail at the first evaluation, leaving a run file that blocks a
    retry): a TensorBoard DIR that is a directory this process can create or write, not the run
    file nor inside it; a W&B project name wandb accepts and a WANDB_MODE it knows."""
    run = Path(run_path).absolute()
    for kind, target in specs:
        if kind == "wandb":
            bad = sorted(set(target) & WANDB_PROJECT_BAD)
            if bad or len(target) > 128:
                raise BadInput(f"--log wandb:{target}: a W&B project name has at most 128 characters and none of "
                               f"/ \\ # ? % : (got {''.join(bad) or f'{len(target)} characters'})")
            mode = os.environ.get("WANDB_MODE")
            if mode is not None and mode not in WANDB_MODES:
                raise BadInput(f"WANDB_MODE={mode!r} is not one of {', '.join(WANDB_MODES)} (--log wandb:{target})")
            continue
        d = Path(target).absolute()
        if d == run or run in d.parents:
            raise BadInput(f"--log tensorboard:{target} is the run file {run_path} (or inside it); give a directory")
        name = run.name.removesuffix(".h5")
        here = d
        while not here.exists():  # the nearest existing ancestor: the directories mkdir will make
            if here.is_symlink():
                raise BadInput(f"--log tensorboard:{target}: {here} is a dangling symbolic link")
            here = here.parent
        if not here.is_dir():
            raise BadInput(f"--log tensorboard:{target}: {here} is not a directory")
        check_writable_dir(here, f"write the TensorBoard logs of --log tensorboard:{target} into")
        sub = d / name
        if sub.exists() and not sub.is_dir():
            raise BadInput(f"--log tensorboard:{target}: {sub} (this run's log directory) is not a directory")
        if sub.is_dir():
            check_writable_dir(sub, f"write the TensorBoard logs of --log tensorboard:{target} into")


def open_loggers(specs: list[tuple[str, str]], run_path: str | Path, config: dict[str, Any], warn=None) -> Loggers:
    """The loggers (specs as check_specs gives them) for a run written to `run_path` (its name
    names the TensorBoard subdirectory and the W&B run); `warn(line)` hears of a logger that fails."""
    name = Path(run_path).name.removesuffix(".h5")
    out = Loggers([], [], warn)
    for kind, target in specs:
        label = f"{kind}:{target}"
        try:
            logger = TensorBoardLogger if kind == "tensorboard" else WandbLogger
            item = logger(target, name, config)
        except Exception as exc:  # noqa: BLE001 - what check_targets could not foresee (a lost connection)
            out.report(label, exc, None)
            continue
        out.items.append(item)
        out.labels.append(label)
    return out


class MemberLoggers:
    """The loggers of several runs trained by one process (a sweep's task: a run, or the members
    of an ensemble): `on_eval(member, row)` is the engine's callback, opening each member's
    loggers at its first row (named by its file, its config the member's); `close()` ends them."""

    def __init__(self, specs: list[tuple[str, str]], warn=None):
        self.specs, self.warn, self.open = specs, warn, {}

    def on_eval(self, member, row: dict[str, Any]) -> None:
        self.log(member.path, member.cfg, row)

    def log(self, path: Path, cfg, row: dict[str, Any]) -> None:
        """One evaluation row of the run written to `path` with config `cfg` (a RunConfig)."""
        if path not in self.open:
            self.open[path] = open_loggers(self.specs, path, cfg.to_dict(), self.warn)
        self.open[path].log(row)

    def close(self) -> None:
        for item in self.open.values():
            item.close()
