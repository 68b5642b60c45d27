"""The analyses registry: name -> a plain function and the parameters it accepts.

A per-checkpoint analysis is `func(model, data, **params) -> {value name: number or array}`;
a run-level one (grokking times) is `func(metrics, **params)`. `defaults` lists every accepted
parameter with its default; anything else is a BadInput. `check(model, data, params)` validates
parameters and applicability cheaply (hook sites exist, the task is modular, ...) so that
`groklens analyze` refuses bad input before it computes or writes anything.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from groklens.errors import BadInput
from groklens.registry import Registry

MODULAR_TASKS = ("add", "sub", "mul", "x2y2")  # tasks on the full Z_p x Z_p grid


@dataclass(frozen=True)
class Measure:
    """One number per checkpoint taken from a stored analysis (a column of `compare`), declared
    by the analysis that stores it (`@analysis(..., measures=...)`)."""

    key: str  # column name in CSV / JSON
    analysis: str  # registry name of the analysis that stores it
    value: str  # stored value name; '{site}' is filled with the last hidden-representation site
    label: str  # column label in the table
    reduce: str = "scalar"  # scalar | first (value[0]) | mean (mean over layers)


# Which default sets an analysis is in (the one rule, `default_names`): a command asks for a tier
# and gets every analysis at that tier or a cheaper one.
#   default   analyze, report, demo and compare --analyze compute it unasked
#   extended  compare --analyze too (the comparison's columns; minutes per run at most)
#   named     only when named (--metric): never by any default (hyperparameters to calibrate
#             per model, or no column of the comparison)
TIERS = ("default", "extended", "named")


@dataclass(frozen=True)
class Analysis:
    name: str
    func: Callable[..., dict]
    defaults: dict[str, Any]
    description: str
    kind: str = "step"  # "step": per checkpoint; "run": once per run from its metrics
    check: Callable[..., Any] | None = None
    needs_init: bool = False  # func takes init_params= (the step-0 checkpoint)
    needs_step: bool = False  # func takes step= (the checkpoint's step, e.g. to seed its probes)
    tier: str = "default"  # the default sets it is in (TIERS)
    tasks: tuple[str, ...] | None = None  # the tasks it applies to (None: all)
    # overrides of `defaults` for a cheap first look (`groklens demo`), where the default costs
    # much more than it tells there
    cheap_params: dict[str, Any] = field(default_factory=dict)
    # (trajectory, params) -> params: a parameter value that names something of the run
    # (fourier's key_frequencies="last") made concrete before the parameters are checked and stored
    resolve: Callable[..., dict] | None = None
    # batch_func(models, data, **params) -> one result per model: the same values as func at each
    # checkpoint, computed together (the runner gives it the checkpoints it lacks, in chunks)
    batch_func: Callable[..., list[dict]] | None = None
    measures: tuple[Measure, ...] = ()  # the comparison's columns read from its stored values
    # the function's name in groklens.analyses (`from groklens.analyses import fourier_analysis`):
    # the module's own name is the submodule's there
    export: str | None = None
    # its place among the analyses (lower first; ties: by module, then as registered): the order of
    # the comparison's columns (measures) and of in_order
    order: int = 1000


# keyword arguments of an analysis function that are plumbing, not parameters of the measure
NOT_PARAMETERS = ("data", "batch_size", "init_params", "step")


def signature_defaults(func: Callable[..., dict]) -> dict[str, Any]:
    """The measure's parameters and defaults, read from its signature (the one place they are
    written): every argument with a default except the plumbing in NOT_PARAMETERS."""
    out = {}
    for name, prm in inspect.signature(func).parameters.items():
        if prm.default is not inspect.Parameter.empty and name not in NOT_PARAMETERS:
            d = prm.default
            out[name] = list(d) if isinstance(d, tuple) else d
    return out


ENTRY_POINTS = "groklens.analyses"
ANALYSES: Registry[Analysis] = Registry("analysis", entry_points=ENTRY_POINTS)

# Where analyses are found (the one rule, `_load_builtins`): the modules that register them, imported when
# the registry is first read: groklens' own, every module of this package with an `@analysis(`
# decorator at its top level (found from its source, so the others, figures and reports, are not
# imported for it), and an installed package's, the modules its entry points of the group
# ENTRY_POINTS name (docs/EXTENDING.md). Their order is each analysis's own (`order=`).
DECLARES_ANALYSIS = re.compile(r"^@analysis\(", re.M)


def builtin_modules() -> tuple[str, ...]:
    """The modules of groklens.analyses that register analyses (DECLARES_ANALYSIS), by name."""
    here = Path(__file__).parent
    return tuple(sorted(p.stem for p in here.glob("*.py") if DECLARES_ANALYSIS.search(p.read_text(encoding="utf-8"))))


BUILTIN_MODULES = builtin_modules()
_loaded = False


def analysis(name: str, description: str, *, tier: str = "default", measures: Iterable[tuple] = (),
             **options: Any) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Decorator registering a measure function as analysis `name`: its parameters are the
    signature's (signature_defaults); `tier` the default sets it is in (TIERS); `measures`
    (key, value, label[, reduce]) the comparison's columns read from its stored values; the
    other options are Analysis fields (kind, check, needs_init, needs_step, tasks, cheap_params,
    resolve, batch_func, export, order)."""
    if tier not in TIERS:
        raise ValueError(f"analysis {name!r}: tier {tier!r} is not one of {TIERS}")

    def add(func: Callable[..., dict]) -> Callable[..., dict]:
        cols = tuple(Measure(m[0], name, *m[1:]) for m in measures)
        ANALYSES.register(name)(Analysis(name, func, signature_defaults(func), description, tier=tier,
                                         measures=cols, **options))
        return func

    return add


def batch_of(name: str) -> Callable[[Callable[..., list[dict]]], Callable[..., list[dict]]]:
    """Decorator: the function computes analysis `name` at many checkpoints together (its
    batch_func); it follows the analysis in its module."""

    def add(func: Callable[..., list[dict]]) -> Callable[..., list[dict]]:
        a = ANALYSES.get(name)
        ANALYSES.replace(name, replace(a, batch_func=func))
        return func

    return add


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    for module in BUILTIN_MODULES:
        importlib.import_module(f"groklens.analyses.{module}")
    ANALYSES.load_plugins()


def _rank(a: Analysis) -> tuple[int, str]:
    """An analysis's place: its declared order, then its module (registration order within one)."""
    return a.order, a.func.__module__


def get(name: str) -> Analysis:
    _load_builtins()
    return ANALYSES.get(name)


def names() -> list[str]:
    _load_builtins()
    return ANALYSES.names()


def in_order() -> list[Analysis]:
    """Every analysis, by its declared order (then by module; as registered within one)."""
    _load_builtins()
    return sorted(ANALYSES.in_order(), key=_rank)


def measures() -> tuple[Measure, ...]:
    """Every analysis's measures, in column order (in_order)."""
    return tuple(m for a in in_order() for m in a.measures)


def default_names(among: Iterable[str] | None = None, tier: str = "default") -> list[str]:
    """The default analysis set, by name (the one rule: every analysis whose tier is `tier` or
    cheaper, TIERS); `among`: only those a caller can use (e.g. what the comparison shows)."""
    _load_builtins()
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r} is not one of {TIERS}")
    keep = None if among is None else set(among)
    upto = TIERS.index(tier)
    return [n for n in ANALYSES.names()
            if TIERS.index(ANALYSES.get(n).tier) <= upto and (keep is None or n in keep)]


def default_requests(among: Iterable[str] | None = None, *, cheap: bool = False,
                     tier: str = "default") -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters) of the default set (see default_names): the default parameters, or with
    `cheap` each analysis's cheap_params."""
    return [(n, dict(get(n).cheap_params) if cheap else {}) for n in default_names(among, tier)]


def _plain(value: Any, where: str) -> Any:
    """JSON-able plain value (tuples -> lists, numpy scalars -> Python), or BadInput."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v, where) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise BadInput(f"parameter {where}: {value!r} is not a number, string, list or null")


def canonical_params(analysis: Analysis, params: dict[str, Any] | None) -> dict[str, Any]:
    """The defaults overridden by `params`, as plain JSON values; unknown names are a BadInput."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(analysis.defaults))
    if unknown:
        known = ", ".join(sorted(analysis.defaults)) or "none"
        raise BadInput(f"unknown parameter(s) {', '.join(unknown)} for analysis {analysis.name!r} (known: {known})")
    out = {}
    for key, default in analysis.defaults.items():
        value = _plain(params.get(key, default), f"{analysis.name}.{key}")
        # a float parameter given as an integer (1 for 1.0) is the same parameter
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        out[key] = value
    return out


def params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))
