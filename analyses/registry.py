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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from groklens.errors import BadInput
from groklens.registry import Registry

MODULAR_TASKS = ("add", "sub", "mul", "x2y2")  # tasks on the full Z_p x Z_p grid


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
    in_default_set: bool = True  # in the default set (default_names()): what analyze, report and demo compute
    # computed only when named (--metric), never by any default, compare --analyze's included:
    # minutes per run, with hyperparameters to calibrate per model
    only_when_named: bool = False
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


ANALYSES: Registry[Analysis] = Registry("analysis")
_loaded = False


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib

    def mod(name):
        return importlib.import_module(f"groklens.analyses.{name}")

    attention, fourier, grokking, norms = mod("attention"), mod("fourier"), mod("grokking"), mod("norms")
    probing, radial, rank, sharpness = mod("probing"), mod("radial"), mod("rank"), mod("sharpness")

    ANALYSES.register("fourier")(Analysis(
        "fourier", fourier.fourier, signature_defaults(fourier.fourier),
        "Fourier circuit: Nanda's key frequencies, neuron/embedding/least-squares FVE, restricted/excluded loss",
        check=fourier.check, tasks=MODULAR_TASKS, resolve=fourier.resolve_params))
    ANALYSES.register("attention")(Analysis(
        "attention", attention.attention_mass, signature_defaults(attention.attention_mass),
        "attention mass of the readout query on informative tokens, per layer and head",
        check=attention.check))
    ANALYSES.register("sharpness")(Analysis(
        "sharpness", sharpness.sharpness, signature_defaults(sharpness.sharpness),
        "top Hessian eigenvalues (eigsh LA) and Hutchinson trace of the float64 training loss",
        check=sharpness.check, in_default_set=False, needs_step=True))
    ANALYSES.register("rank")(Analysis(
        "rank", rank.effective_rank, signature_defaults(rank.effective_rank),
        "effective rank (Roy-Vetterli, RankMe, participation ratio) of hook sites and weights",
        # an SVD of every weight matrix at every checkpoint: the demo's figures show the sites only
        check=rank.check, cheap_params={"weights": []}))
    ANALYSES.register("radial")(Analysis(
        "radial", radial.radial, signature_defaults(radial.radial),
        "activation radius ||h||/sqrt(d) and radial gradient energy rho vs the 1/d baseline",
        check=radial.check))
    ANALYSES.register("norms")(Analysis(
        "norms", norms.norms, signature_defaults(norms.norms),
        "global and per-parameter weight norms, distance from initialisation", needs_init=True))
    ANALYSES.register("grokking")(Analysis(
        "grokking", grokking.grokking_table, signature_defaults(grokking.grokking_table),
        "memorization and grokking steps per accuracy threshold (test accuracy >= threshold), with censoring",
        kind="run"))
    ablation = mod("ablation")
    ANALYSES.register("freq_ablation")(Analysis(
        "freq_ablation", ablation.frequency_ablation, signature_defaults(ablation.frequency_ablation),
        "loss and accuracy with Fourier frequencies removed from the embedding or a hook site (through a hook)",
        check=ablation.check, tasks=MODULAR_TASKS, in_default_set=False))
    llc = mod("llc")
    ANALYSES.register("llc")(Analysis(
        "llc", llc.llc, signature_defaults(llc.llc),
        "local learning coefficient by devinterp's SGLD, with per-chain spread and loss-trace diagnostics",
        check=llc.check, in_default_set=False, only_when_named=True, batch_func=llc.llc_many))
    ANALYSES.register("probe")(Analysis(
        "probe", probing.probe, signature_defaults(probing.probe),
        "linear probe (scikit-learn) of a target from a hook site, held-out accuracy or R^2",
        check=probing.check, in_default_set=False))


def get(name: str) -> Analysis:
    _load_builtins()
    return ANALYSES.get(name)


def names() -> list[str]:
    _load_builtins()
    return ANALYSES.names()


def default_names(among: Iterable[str] | None = None) -> list[str]:
    """The default analysis set (the one place it is decided: `in_default_set`), by name;
    `among`: only those a caller can use (e.g. what the comparison and the report show)."""
    _load_builtins()
    keep = None if among is None else set(among)
    return [n for n in ANALYSES.names() if ANALYSES.get(n).in_default_set and (keep is None or n in keep)]


def default_requests(among: Iterable[str] | None = None, *, cheap: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters) of the default set (see default_names): the default parameters, or with
    `cheap` each analysis's cheap_params."""
    return [(n, dict(get(n).cheap_params) if cheap else {}) for n in default_names(among)]


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
