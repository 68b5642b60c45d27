"""pandas DataFrames of a run's metrics, its stored analyses and a comparison.

pandas is an optional extra (`pip install 'groklens[pandas]'`), imported on first use; without
it each function raises one ImportError line saying so. Nothing is computed here: the frames
are what the trajectory file, its sidecar and the comparison hold.

- `metrics_frame(run)`: one row per evaluation; columns `step` and every logged metric.
- `analysis_frame(run, name, params)`: one row per checkpoint the analysis is stored at; columns
  `step` and each stored value (a float where the value is one number, else a numpy array per
  cell). The parameter set: `params` (e.g. {"key_frequencies": "last"}, the other parameters at
  their defaults, as `analyze --param` stored it), else the one `compare` reads (the default
  set, else the latest).
- `analyses_frame(run)`: every stored analysis side by side on the checkpoint steps, columns
  `ANALYSIS.VALUE`.
- `comparison_frame(comp)`: `compare --format csv`'s table, numbers unrounded.

`Trajectory.to_pandas()` is the metrics frame; `groklens.analyses.to_pandas(run, analysis)` and
`Comparison.to_pandas()` call these.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from groklens.errors import BadInput, require_pandas
from groklens.analyses.measures import stored_analysis, stored_params
from groklens.analyses.registry import get, ANALYSES
from groklens.analyses.compare_format import table_rows


def metrics_frame(run):
    """The metrics of `run` (a Trajectory): what Trajectory.to_pandas() gives."""
    return run.to_pandas()


def _column(rows: list) -> Any:
    arrays = [np.asarray(r) for r in rows]
    if all(a.size == 1 for a in arrays):
        kind = "i" if all(np.issubdtype(a.dtype, np.integer) for a in arrays) else "f"
        return np.array([a.reshape(-1)[0] for a in arrays], dtype=np.int64 if kind == "i" else float)
    out = np.empty(len(arrays), dtype=object)
    out[:] = arrays
    return out


def stored(run, name: str, params: dict | None = None):
    """The stored results (store.Stored) of analysis `name` of `run` (a Trajectory), those of
    `params` when given, or None."""
    a = get(name)  # an unknown name is BadInput
    if params is not None and a.resolve:  # as the runner stored them (fourier's "last": the key list)
        params = a.resolve(run, dict(params))
    return stored_analysis(run.path, run.config_dict, name, copy=run.copy or 0, params=params)


def analysis_frame(run, name: str, params: dict | None = None):
    pd = require_pandas()
    if params is not None and not isinstance(params, dict):
        raise BadInput(f"to_pandas(run, {name!r}, params): params is a dict of {name}'s parameters; got {params!r}")
    st = stored(run, name, params)
    if st is None and params is not None and (sets := stored_params(run.path, run.config_dict, name, run.copy or 0)):
        given = ", ".join(f"{k}={json.dumps(v)}" for k, v in params.items())
        have = "; ".join(", ".join(f"{k}={json.dumps(v)}" for k, v in ps.items()) for ps, _ in sets.values())
        raise BadInput(f"{run.path}: no '{name}' stored with {given}; stored parameter sets: {have}")
    if st is None:
        hint = "".join(f" --param {name}.{k}={json.dumps(v)}" for k, v in (params or {}).items())
        raise BadInput(f"{run.path}: no stored '{name}' analysis; `groklens analyze {run.path} --metric {name}{hint}` "
                       "computes it")
    cols: dict[str, Any] = {"step": np.asarray(st.steps, dtype=np.int64)}
    cols.update({k: _column(v) for k, v in st.values.items()})
    return pd.DataFrame(cols)


def analyses_frame(run):
    pd = require_pandas()
    frames = []
    for name in ANALYSES.names():
        st = stored(run, name)
        if st is None or not st.steps:
            continue
        f = analysis_frame(run, name).set_index("step")
        frames.append(f.rename(columns={c: f"{name}.{c}" for c in f.columns}))
    if not frames:
        return pd.DataFrame({"step": np.zeros(0, dtype=np.int64)})
    out = frames[0]
    for f in frames[1:]:
        out = out.join(f, how="outer")
    return out.reset_index()


def to_pandas(run, analysis: str | None = None, params: dict | None = None):
    """metrics_frame (analysis None), analyses_frame ('all') or analysis_frame(run, analysis,
    params); `run` a Trajectory or a path to one, as for compute."""
    from groklens.checkpoints import Trajectory

    run = run if isinstance(run, Trajectory) else Trajectory(run)
    if analysis is not None and not isinstance(analysis, str):
        raise BadInput(f"to_pandas(run, analysis): an analysis name or 'all'; got {analysis!r}")
    if params is not None and analysis in (None, "all"):
        raise BadInput("to_pandas(run, analysis, params): params pick one analysis's stored parameter set; "
                       "name the analysis")
    if analysis is None:
        return metrics_frame(run)
    if analysis == "all":
        return analyses_frame(run)
    return analysis_frame(run, analysis, params)


def comparison_frame(comp):
    pd = require_pandas()
    head, rows = table_rows(comp)
    return pd.DataFrame([[None if c == "" else c for c in r] for r in rows], columns=head)


__all__ = ["analyses_frame", "analysis_frame", "comparison_frame", "metrics_frame", "to_pandas"]
