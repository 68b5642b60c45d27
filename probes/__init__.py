"""groklens.probes: everything that touches a model through hooks (never file paths).

- capture:        activations of any hook sites over a task's inputs (`run_with_cache`, batched)
- interventions:  scoped hooks that never outlive their `with` block; patched forward passes
- grid:           the p x p operand grid of a modular task
- linear:         scikit-learn linear probes on any hook site, held-out accuracy or R^2

Submodules import torch/scikit-learn; import them directly (this package stays light).
"""

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

_EXPORTS = {
    "capture": "capture", "check_sites": "capture", "hook_names": "capture",
    "select_position": "capture", "resolve_position": "capture",
    "scoped_hooks": "interventions", "run_patched": "interventions", "hook_count": "interventions",
    "HookLeak": "interventions",
    "ModularGrid": "grid", "modular_grid": "grid",
    "linear_probe": "linear", "probe_targets": "linear", "fit_probe": "linear", "TARGETS": "linear",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"groklens.probes.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'groklens.probes' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
