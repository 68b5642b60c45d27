"""groklens.analyses: metrics over probed data and trajectories, comparisons, figures.

Each measure is a plain function of (model, task data, **params) -> named numbers, usable in a
notebook on any HookedRootModule of ours; `compute(trajectory, name, steps=..., **params)` runs
one along a run's checkpoints and keeps the results in the run's sidecar file.

  fourier_analysis   Fourier FVE (embedding, neuron, least squares), restricted/excluded loss
  attention_mass     attention of the readout query on informative tokens
  hessian_sharpness  top Hessian eigenvalues (eigsh LA) and Hutchinson trace
  effective_rank     Roy-Vetterli, RankMe, participation ratio of hook sites and weights
  radial_statistics  activation radius and radial gradient energy rho
  induced_regularization  the activation-norm penalty's induced weight regularization (Proposition i)
  weight_norms       weight norms and distance from initialisation
  grokking_times     memorization and grokking steps with censoring
  probe_checkpoint   a linear probe (groklens.probes.linear) as an analysis
The functions live in the submodules fourier, attention, sharpness, rank, radial, induced,
norms, grokking and probing; `runner` runs them along trajectories, `store` keeps the sidecar file.
Submodules are imported on first use, so `import groklens.analyses` stays light.
"""

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

def to_pandas(trajectory, analysis: str | None = None, params: dict | None = None):
    """A pandas DataFrame of a run (a Trajectory or a path): its metrics, or with `analysis` a stored analysis ('all':
    every one) by checkpoint step, with `params` the parameter set stored with them (e.g.
    to_pandas(run, "fourier", {"key_frequencies": "last"})); see tables.to_pandas."""
    from groklens.analyses.tables import to_pandas as _to_pandas

    return _to_pandas(trajectory, analysis, params)


def compute(trajectory, name: str, **kwargs):
    """Analysis `name` along `trajectory` (a Trajectory or a path); see runner.compute."""
    from groklens.analyses.runner import compute as _compute

    return _compute(trajectory, name, **kwargs)


# helpers that are not analyses; each analysis function is exported under the name its
# @analysis(export=...) gives it (fourier_analysis, hessian_sharpness, ...)
_EXPORTS = {
    "compute_many": ("runner", "compute_many"),
    "AnalysisResult": ("runner", "AnalysisResult"),
    "get_analysis": ("registry", "get"),
    "analysis_names": ("registry", "names"),
    "fourier_basis": ("fourier", "fourier_basis"),
    "grokking_times": ("grokking", "grokking_times"),
    "first_crossing": ("grokking", "first_crossing"),
}


def _exported() -> dict:
    from groklens.analyses.registry import in_order

    return {a.export: a.func for a in in_order() if a.export}


def __getattr__(name):
    if name == "ANALYSES":  # the registry, with the built-in analyses registered
        from groklens.analyses.registry import ANALYSES, names

        names()
        return ANALYSES
    if name == "__all__":
        return sorted([*_EXPORTS, *_exported(), "compute", "ANALYSES"])
    if name in _EXPORTS:
        import importlib

        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f"groklens.analyses.{module}"), attr)
    if not name.startswith("__") and name in (exported := _exported()):
        return exported[name]
    raise AttributeError(f"module 'groklens.analyses' has no attribute {name!r}")
