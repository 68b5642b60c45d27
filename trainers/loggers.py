"""Live curves while training: each evaluation row, as the trajectory file gets it, also sent to
TensorBoard or Weights & Biases (`groklens train --log tensorboard:DIR --log wandb:PROJECT`).

The HDF5 file stays the record: a logger only mirrors the rows (every metric of the row, as a
scalar named like its metric, at the row's step). Both packages are optional extras
(`pip install 'groklens[tensorboard]'`, `'groklens[wandb]'`), imported when asked for, and a
missing one is a one-line error before anything is trained. W&B runs offline unless the
environment says otherwise (WANDB_MODE=online after `wandb login`); `wandb sync DIR` uploads an
offline run later.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from groklens.errors import BadInput

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


class TensorBoardLogger:
    def __init__(self, log_dir: str, name: str):
        from torch.utils.tensorboard import SummaryWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(Path(log_dir) / name))

    def log(self, row: dict[str, Any]) -> None:
        step = int(row["step"])
        for key, value in row.items():
            if key != "step" and _finite(value):
                self.writer.add_scalar(key, float(value), step)
        self.writer.flush()  # a curve that shows up as it is trained

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, project: str, name: str, config: dict[str, Any]):
        import wandb

        self.run = wandb.init(project=project, name=name, config=config,
                              mode=os.environ.get("WANDB_MODE", "offline"), reinit="create_new")

    def log(self, row: dict[str, Any]) -> None:
        self.run.log({k: float(v) for k, v in row.items() if k != "step" and _finite(v)}, step=int(row["step"]))

    def close(self) -> None:
        self.run.finish()


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


class Loggers:
    """The asked loggers of one run; `log(row)` is the training loop's on_eval."""

    def __init__(self, items: list):
        self.items = items

    def log(self, row: dict[str, Any]) -> None:
        for item in self.items:
            item.log(row)

    def close(self) -> None:
        for item in self.items:
            item.close()


def check_specs(specs) -> list[tuple[str, str]]:
    """Parsed specs, each package checked importable (before anything is trained)."""
    parsed = parse_specs(specs)
    for kind, _ in parsed:
        _require(kind)
    return parsed


def open_loggers(specs: list[tuple[str, str]], run_path: str | Path, config: dict[str, Any]) -> Loggers:
    """The loggers (specs as check_specs gives them) for a run written to `run_path` (its name
    names the TensorBoard subdirectory and the W&B run)."""
    name = Path(run_path).name.removesuffix(".h5")
    made = []
    for kind, target in specs:
        made.append(TensorBoardLogger(target, name) if kind == "tensorboard" else WandbLogger(target, name, config))
    return Loggers(made)

