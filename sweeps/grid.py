"""The grid of a sweep: the sweep file's {base, axes, zip, seeds}, checked, and the runs it names.

The runs are the product of the axes, the zip entries (variants taken together, not crossed
with each other) and the seeds; each run's name is derived from its axis and zip values and
seed only (docs/SWEEPS.md), so the same grid always names the same runs.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from groklens.config import RunConfig, field_names, safe_yaml
from groklens.errors import BadInput

SWEEP_KEYS = ("base", "axes", "zip", "seeds")
LOGSPACE_DIGITS = 6  # logspace values are rounded to 6 significant digits (clean names and YAML)
MAX_RUNS = 10_000  # a grid larger than this is refused up front (exit 2), never materialized
NAME_MAX = 200  # longer run names get a stable hash (file names: 255 bytes, minus suffixes)


@dataclass
class RunSpec:
    name: str
    config: RunConfig


@dataclass
class Sweep:
    base: dict[str, Any]
    axes: dict[str, list[Any]]  # field -> typed values (logspace expanded)
    seeds: list[int]
    zipped: list[dict[str, Any]] = field(default_factory=list)  # the zip entries: field -> typed value each
    _runs: list[RunSpec] | None = field(default=None, repr=False, compare=False)

    def runs(self) -> list[RunSpec]:
        """The product of the axes, the zip entries and the seeds, in grid order (axes as written,
        then the zip entries, seeds innermost)."""
        if self._runs is None:
            self._runs = self._product()
        return list(self._runs)

    def _product(self) -> list[RunSpec]:
        fields_ = list(self.axes)
        out: list[RunSpec] = []
        for values in itertools.product(*(self.axes[f] for f in fields_)):
            for entry in self.zipped or [{}]:
                point = {**dict(zip(fields_, values)), **entry}
                for seed in self.seeds:
                    cfg = _make_config(self.base, {**point, "seed": seed})
                    out.append(RunSpec(run_name(point, seed), cfg))
        names = [r.name for r in out]
        if len(set(names)) != len(names):  # only reachable through string values that sanitize alike
            dup = next(n for n in names if names.count(n) > 1)
            raise BadInput(f"two runs of the grid get the same name {dup!r}; make the axis values distinct")
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"base": self.base, "axes": {k: [_plain(v) for v in vs] for k, vs in self.axes.items()},
               "seeds": self.seeds}
        if self.zipped:
            out["zip"] = [{k: _plain(v) for k, v in e.items()} for e in self.zipped]
        return out


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (yaml.safe_load: data only)."""

    path = Path(path)
    if not path.is_file():
        raise BadInput(f"sweep file {path} does not exist or is not a file")

    data = safe_yaml(path, what="sweep file")
    return parse_sweep(data, source=str(path))


def parse_sweep(data: Any, source: str = "sweep") -> Sweep:
    """Check a sweep mapping {base, axes, seeds}; every problem is one BadInput line."""
    if not isinstance(data, dict):
        raise BadInput(f"{source}: a sweep must be a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = sorted(str(k) for k in set(data) - set(SWEEP_KEYS))
    if unknown:
        raise BadInput(f"{source}: unknown sweep key(s) {', '.join(unknown)} (known: {', '.join(SWEEP_KEYS)})")
    base = data.get("base") or {}
    if not isinstance(base, dict):
        raise BadInput(f"{source}: 'base' must be a mapping of config field -> value")
    base_cfg = RunConfig.from_dict(base)  # unknown fields and bad values are BadInput here
    axes_raw = data.get("axes") or {}
    if not isinstance(axes_raw, dict):
        raise BadInput(f"{source}: 'axes' must be a mapping of config field -> list or {{logspace: [lo, hi, n]}}")
    known = set(field_names())
    axes: dict[str, list[Any]] = {}
    for name, spec in axes_raw.items():
        if name not in known:
            raise BadInput(f"{source}: axis {name!r} is not a config field")
        if name == "seed":
            raise BadInput(f"{source}: give seeds with the 'seeds' key, not as an axis")
        axes[name] = _axis_values(name, spec, base, source)
    zipped = _zip_entries(data.get("zip"), axes, known, base, source)
    seeds_raw = data.get("seeds", [base_cfg.seed])
    if isinstance(seeds_raw, int) and not isinstance(seeds_raw, bool):
        seeds_raw = [seeds_raw]
    if (not isinstance(seeds_raw, list) or not seeds_raw
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds_raw)):
        raise BadInput(f"{source}: 'seeds' must be a non-empty list of integers; got {_short(seeds_raw)}")
    if len(seeds_raw) > MAX_RUNS:
        raise BadInput(f"{source}: 'seeds' has {len(seeds_raw)} values; a sweep holds at most {MAX_RUNS} runs")
    if len(set(seeds_raw)) != len(seeds_raw):
        raise BadInput(f"{source}: 'seeds' repeats a seed: {_short(seeds_raw)}")
    total = math.prod(len(v) for v in axes.values()) * max(len(zipped), 1) * len(seeds_raw)
    if total > MAX_RUNS:  # refused before the product is built: --dry-run answers at once
        raise BadInput(f"{source}: the grid has {total} runs; a sweep holds at most {MAX_RUNS} (split it)")
    sweep = Sweep(base=dict(base), axes=axes, seeds=list(seeds_raw), zipped=zipped)
    sweep.runs()  # every combination must be a valid config: fail now, not after hours
    return sweep


def _axis_values(name: str, spec: Any, base: dict, source: str) -> list[Any]:
    if isinstance(spec, dict):
        if set(spec) != {"logspace"}:
            raise BadInput(f"{source}: axis {name!r}: a mapping must be {{logspace: [lo, hi, n]}}; got keys "
                           f"{sorted(spec)}")
        lohi = spec["logspace"]
        if not (isinstance(lohi, list) and len(lohi) == 3):
            raise BadInput(f"{source}: axis {name!r}: logspace needs [lo, hi, n]; got {lohi!r}")
        try:
            lo, hi = float(lohi[0]), float(lohi[1])
        except (TypeError, ValueError):
            raise BadInput(f"{source}: axis {name!r}: logspace bounds must be numbers; got {lohi[:2]!r}") from None
        n = lohi[2]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_RUNS:
            raise BadInput(f"{source}: axis {name!r}: logspace count must be an integer in 1..{MAX_RUNS}; got {n!r}")
        if not (lo > 0 and hi > 0 and math.isfinite(lo) and math.isfinite(hi)):
            raise BadInput(f"{source}: axis {name!r}: logspace bounds must be positive numbers; got {lo}, {hi}")
        raw = [float(f"{v:.{LOGSPACE_DIGITS}g}") for v in np.geomspace(lo, hi, n)]
        kind = str(_field_type(name))
        if kind == "int":
            raw = [round(v) for v in raw]
        elif kind != "float":
            raise BadInput(f"{source}: axis {name!r}: logspace needs a numeric field; {name} is {kind}")
    elif isinstance(spec, list):
        if len(spec) > MAX_RUNS:
            raise BadInput(f"{source}: axis {name!r} has {len(spec)} values; a sweep holds at most {MAX_RUNS} runs")
        raw = spec
    else:
        raise BadInput(f"{source}: axis {name!r} must be a list of values or {{logspace: [lo, hi, n]}}; "
                       f"got {_short(spec)}")
    if not raw:
        raise BadInput(f"{source}: axis {name!r} has no values")
    values = []
    for v in raw:
        typed = getattr(_make_config(base, {name: v}), name)
        values.append(tuple(typed) if isinstance(typed, list) else typed)
    for v in values:
        if values.count(v) > 1:
            raise BadInput(f"{source}: axis {name!r} repeats the value {_plain(v)!r}")
    return values


def _zip_entries(raw: Any, axes: dict, known: set, base: dict, source: str) -> list[dict[str, Any]]:
    """The zip key: a list of mappings (one variant each) or a mapping of equal-length lists
    (entry i takes the i-th value of each), as typed values; [] when absent."""
    if raw is None:
        return []
    if isinstance(raw, dict):
        lengths = {k: len(v) for k, v in raw.items() if isinstance(v, list)}
        if len(lengths) != len(raw) or len(set(lengths.values())) != 1:
            raise BadInput(f"{source}: 'zip' as a mapping needs lists of one length (field -> [v1, v2, ...]); "
                           f"got lengths {_short(lengths)}")
        raw = [dict(zip(raw, vals)) for vals in zip(*raw.values())]
    if not isinstance(raw, list) or not raw or not all(isinstance(e, dict) and e for e in raw):
        raise BadInput(f"{source}: 'zip' must be a non-empty list of mappings (field: value) or a mapping of "
                       f"equal-length lists; got {_short(raw)}")
    if len(raw) > MAX_RUNS:
        raise BadInput(f"{source}: 'zip' has {len(raw)} entries; a sweep holds at most {MAX_RUNS} runs")
    entries, configs = [], []
    for e in raw:
        for name in e:
            if name not in known:
                raise BadInput(f"{source}: zip field {name!r} is not a config field")
            if name == "seed" or name in axes:
                raise BadInput(f"{source}: zip field {name!r} is also " + ("given by 'seeds'" if name == "seed"
                                                                            else "an axis") + "; give it once")
        cfg = _make_config(base, e)
        entries.append({k: tuple(getattr(cfg, k)) if isinstance(getattr(cfg, k), list) else getattr(cfg, k)
                        for k in e})
        configs.append(cfg.to_dict())
    # compared as whole configs, defaults filled in: {norm: ln} and {norm: ln, attention: softmax}
    # (the default written out) are one run, which would train twice and count twice in compare
    for i, c in enumerate(configs):
        if c in configs[:i]:
            first = _short({k: _plain(v) for k, v in entries[configs.index(c)].items()})
            again = _short({k: _plain(v) for k, v in entries[i].items()})
            raise BadInput(f"{source}: zip repeats the entry {first}" if first == again else
                           f"{source}: zip entries {first} and {again} are the same config (the rest is the base "
                           "or the defaults); give it once")
    return entries


def _field_type(name: str):
    from dataclasses import fields

    return next(f.type for f in fields(RunConfig) if f.name == name)


def _make_config(base: dict, point: dict) -> RunConfig:
    values = {**base, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in point.items()}}
    return RunConfig.from_dict(values)


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, float):
        text = repr(v)  # shortest round-trip form: 0.001, 1e-05, 0.3
    elif isinstance(v, (tuple, list)):
        text = "_".join(_format_value(x) for x in v)
    else:
        text = str(v)
    return re.sub(r"[^A-Za-z0-9.+_-]", "-", text)


def run_name(point: dict[str, Any], seed: int) -> str:
    """`field=value` for each axis in sorted field order, then the seed, joined by '__'."""
    parts = [f"{k}={_format_value(point[k])}" for k in sorted(point)]
    name = "__".join(parts + [f"seed={seed}"])
    if len(name.encode()) <= NAME_MAX:
        return name
    # too long for a file name: a stable prefix and hash (sweep.json keeps the full config)
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: NAME_MAX - 40]}__h{digest}__seed={seed}"


def _short(value: Any) -> str:
    import reprlib

    return reprlib.repr(value)
