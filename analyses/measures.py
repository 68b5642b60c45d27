"""What the comparison reads from the sidecars: the measures (one number per checkpoint from a
stored analysis), which stored variant of an analysis stands for a run, and the values of a run's
measures at its memorization, grokking and last checkpoints (analyses/phases.py)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from groklens.analyses.phases import PHASES
from groklens.analyses.registry import Measure, canonical_params, get, measures, params_json


# the comparison's columns: the measures each analysis declares (@analysis(..., measures=...)),
# in the registry's column order
MEASURES: tuple[Measure, ...] = measures()
ANALYSES_USED = tuple(dict.fromkeys(m.analysis for m in MEASURES))
# analyses without a column that a report figure draws (analyses/report_figures.py): read as well
FIGURE_ANALYSES = ("clock_pizza", "hessian_density")


def stored_analysis(run_path: Path, config: dict, name: str, copy: int = 0, params: dict | None = None):
    """The stored results of analysis `name` for this run (copy `copy` of a routed run): those of
    `params` (the defaults filled in) when given, else the default parameter set when it is
    stored, else the most recently updated one; only results of this run's config. None if none."""
    from groklens.analyses.store import Sidecar, variant_id

    sidecar = Sidecar(run_path, copy)
    variants = stored_params(run_path, config, name, copy)
    if not variants:
        return None
    wanted = variant_id(params_json(canonical_params(get(name), params or {})))
    if wanted in variants:
        chosen = wanted
    elif params is not None:
        return None
    else:
        chosen = max(variants, key=lambda v: variants[v][1])
    return sidecar.read(name, chosen)


def stored_params(run_path: Path, config: dict, name: str, copy: int = 0) -> dict[str, tuple[dict, str]]:
    """variant id -> (parameters, when updated) of every parameter set of analysis `name` stored
    for this run's config."""
    from groklens.analyses.store import Sidecar, config_sha

    sha = config_sha(json.dumps(config, sort_keys=True))
    return {v: (json.loads(_text(a.get("params", "{}"))), _text(a.get("updated", "")))
            for v, a in Sidecar(run_path, copy).variants(name) if _text(a.get("run_config_sha256")) == sha}


def _text(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


def hidden_site(keys: Sequence[str], prefix: str) -> str | None:
    """The site of the last hidden representation among `prefix@SITE` value names: the highest
    blocks.{l}.hook_resid_post, else the highest layers.{i}.hook_post, else the first site."""
    sites = [k[len(prefix) + 1:] for k in keys if k.startswith(prefix + "@")]
    if not sites:
        return None
    for pattern in (r"blocks\.(\d+)\.hook_resid_post", r"layers\.(\d+)\.hook_post"):
        hits = [(int(m.group(1)), s) for s in sites if (m := re.fullmatch(pattern, s))]
        if hits:
            return max(hits)[1]
    return sites[0]


def measure_key(measure: Measure, keys: Sequence[str]) -> str | None:
    if "{site}" not in measure.value:
        return measure.value if measure.value in keys else None
    prefix = measure.value.split("@", 1)[0]
    site = hidden_site(keys, prefix)
    return None if site is None else measure.value.format(site=site)


def reduce_value(value: Any, how: str) -> float | None:
    a = np.asarray(value, dtype=float)
    if a.size == 0:
        return None
    v = float(a.reshape(-1)[0]) if how == "first" else float(a.mean()) if how == "mean" else float(a.reshape(-1)[0])
    return v if math.isfinite(v) else None


def read_measures(run) -> None:
    """Fill run.values (a compare.RunSummary) from the sidecar (missing stays None) and say what the sidecar holds."""
    for name in (*ANALYSES_USED, *FIGURE_ANALYSES):
        stored = stored_analysis(run.path, run.config, name)
        if stored is None:
            run.analysis_state[name] = "not stored"
        else:
            run.stored[name] = stored
            run.analysis_state[name] = f"stored at {len(stored.steps)} checkpoint(s)"
    for m in MEASURES:
        run.values[m.key] = {ph: None for ph in PHASES}
        stored = run.stored.get(m.analysis)
        if stored is None:
            continue
        key = measure_key(m, list(stored.values))
        if key is None:
            continue
        run.value_keys[m.key] = key
        where = {s: i for i, s in enumerate(stored.steps)}
        flag = eps_key(key, list(stored.values))
        for ph in PHASES:
            s = run.phase_steps[ph]
            if s is not None and s in where:
                run.values[m.key][ph] = reduce_value(stored.values[key][where[s]], m.reduce)
                if flag is not None and np.any(np.asarray(stored.values[flag][where[s]]) == 1):
                    run.eps_dependent.setdefault(m.key, set()).add(ph)
                if any(np.any(np.asarray(stored.values[k][where[s]]) == 1)
                       for k in LLC_FLAGS if m.analysis == "llc" and k in stored.values):
                    run.llc_flagged.setdefault(m.key, set()).add(ph)


LLC_FLAGS = ("negative", "pinned")  # the llc analysis' flags (analyses/llc.py)


def eps_key(value_key: str, keys: Sequence[str]) -> str | None:
    """The stored flag saying whether `value_key` is set by a scale-invariant norm's eps
    (radial: eps_dependent@SITE, sharpness: eps_dependent); None when the analysis has none, and
    for rho's isotropic baseline 1/d, which no eps sets."""
    if value_key.startswith("rho_baseline"):
        return None
    site = value_key.partition("@")[2]
    for k in ([f"eps_dependent@{site}"] if site else []) + ["eps_dependent"]:
        if k in keys:
            return k
    return None
