"""Run configuration: one flat, typed dataclass whose fields are the CLI flags and YAML keys.

Defaults reproduce Nanda et al. (2023)'s canonical modular-addition run (REFERENCES.md).
Every trajectory file stores `RunConfig.to_dict()` as JSON, so any checkpoint rebuilds its
model and data from the file alone. Fields are snake_case; their flags are --kebab-case.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from groklens.errors import BadInput

CHOICES: dict[str, tuple[str, ...]] = {
    "model": ("transformer", "mlp"),
    "act_fn": ("relu", "gelu"),
    "norm": ("none", "ln", "rms"),
    "attention": ("softmax",),
    "unembed": ("linear",),
    "init": ("default",),
    "device": ("auto", "cpu", "cuda"),
}


@dataclass
class RunConfig:
    # --- task and data split
    task: str = "add"
    p: int = 113
    train_frac: float = 0.3
    data_seed: int = 598  # Nanda's DATA_SEED; the split is drawn from it, not from `seed`
    # --- model
    seed: int = 999  # model init and mini-batch order
    model: str = "transformer"
    n_layers: int = 1
    d_model: int = 128
    n_heads: int = 4
    d_head: int = 32
    d_mlp: int = 512
    act_fn: str = "relu"
    norm: str = "none"
    attention: str = "softmax"
    unembed: str = "linear"
    init: str = "default"
    causal: bool = True  # Nanda's TransformerLens model is causal; the sphere paper's is not
    mlp_bias: bool = False  # Nanda's demo froze every bias at zero
    # --- optimizer (AdamW, decoupled weight decay)
    lr: float = 1e-3
    weight_decay: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 10
    batch_size: int = 0  # 0 = full batch
    # --- schedule of the run
    steps: int = 40_000
    eval_every: int = 100
    checkpoint_every: int = 100
    log_checkpoints: int = 0  # extra log-spaced checkpoints before the first regular one
    grok_threshold: float = 0.95
    stop_after_grok: int = 0  # >0: stop this many evaluations after test acc >= grok_threshold
    device: str = "auto"

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: "RunConfig | None" = None) -> "RunConfig":
        """Build from a plain mapping; unknown keys and wrong types are a BadInput."""
        if not isinstance(data, dict):
            raise BadInput(f"config must be a mapping of field -> value, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise BadInput(f"unknown config key(s): {', '.join(map(str, unknown))}")
        values = (base or cls()).to_dict()
        for key, raw in data.items():
            values[key] = _coerce(key, known[key].type, raw)
        cfg = cls(**values)
        cfg.betas = tuple(cfg.betas)  # type: ignore[assignment]
        cfg.validate()
        return cfg

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.from_dict(json.loads(text))

    def replace(self, **changes: Any) -> "RunConfig":
        return RunConfig.from_dict({**self.to_dict(), **changes})

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise BadInput(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        _check(0.0 < self.train_frac < 1.0, f"train_frac must be in (0, 1); got {self.train_frac}")
        _check(math.isfinite(self.lr) and self.lr > 0, f"lr must be a positive number; got {self.lr}")
        _check(
            math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            f"weight_decay must be >= 0; got {self.weight_decay}",
        )
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
               f"betas must be two numbers in [0, 1); got {list(self.betas)}")
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "steps",
                     "eval_every", "checkpoint_every"):
            _check(getattr(self, name) >= 1, f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("warmup_steps", "batch_size", "log_checkpoints", "stop_after_grok"):
            _check(getattr(self, name) >= 0, f"{name} must be >= 0; got {getattr(self, name)}")
        _check(self.checkpoint_every <= self.steps,
               f"checkpoint_every ({self.checkpoint_every}) is larger than the run (steps={self.steps})")
        _check(self.eval_every <= self.steps,
               f"eval_every ({self.eval_every}) is larger than the run (steps={self.steps})")
        _check(0.0 < self.grok_threshold <= 1.0,
               f"grok_threshold must be in (0, 1]; got {self.grok_threshold}")
        # task-specific checks (p prime for division, ...) live with the task
        from groklens.trainers.tasks import TASKS

        TASKS.get(self.task).validate(self)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise BadInput(message)


def _coerce(key: str, annotation: Any, raw: Any) -> Any:
    """Convert a YAML/JSON/CLI value to the field's type, refusing what does not fit."""
    ann = str(annotation)
    try:
        if ann == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
                return raw.lower() in ("true", "1", "yes")
            raise ValueError
        if ann == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if ann == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if ann == "str":
            if not isinstance(raw, str):
                raise ValueError
            return raw
        if ann.startswith("tuple"):
            if isinstance(raw, str):
                raw = [x for x in raw.replace(",", " ").split()]
            return tuple(float(x) for x in raw)
    except (TypeError, ValueError):
        pass
    else:
        return raw
    raise BadInput(f"config key {key!r}: {raw!r} is not a valid {ann}")


# Named starting points; `nanda` is the default. Later issues add the published variants.
PRESETS: dict[str, dict[str, Any]] = {
    "nanda": {},
}


def preset(name: str) -> RunConfig:
    if name not in PRESETS:
        raise BadInput(f"unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    return RunConfig.from_dict(PRESETS[name])


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) config file as data only (safe_load: no code from files)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise BadInput(f"config file {path} does not exist or is not a file")
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"config file {path} is not valid YAML: {first}") from None
    if data is None:
        raise BadInput(f"config file {path} is empty")
    if not isinstance(data, dict):
        raise BadInput(f"config file {path} must hold a mapping of field: value")
    return data


def field_names() -> list[str]:
    return [f.name for f in fields(RunConfig)]


__all__ = ["RunConfig", "PRESETS", "preset", "load_config_file", "field_names", "CHOICES"]
