"""TransformerLens' hook machinery without the cost of its package `__init__`.

Every groklens model is a TransformerLens `HookedRootModule` built of `HookPoint`s, and
`run_with_cache` returns a real `transformer_lens.ActivationCache`. But `import transformer_lens`
(4.x) runs an eager `__init__` that imports transformers, datasets, pandas and pytest (through
`transformer_lens.utilities`, `conversion_utils`, `evals`, `patching`, ...): about twice the
time of `import torch`, before the first training step of a run that attaches no hook at all.
The three modules our models need - `hook_points.py`, `HookedRootModule.py` and
`ActivationCache.py` - themselves import only torch, numpy, einops and jaxtyping, plus four
small names from `transformer_lens.utilities`.

`defer_package_inits()` registers `transformer_lens` and the subpackages those modules go
through in `sys.modules` as modules created from their real import specs but *not yet
executed*. Importing one of the leaf modules through them costs only the leaf's own imports.
A few names resolve to their defining leaf module (`_LEAVES`); the first access to any other
attribute (`transformer_lens.TransformerBridge`, `utils.get_act_name` inside an
ActivationCache helper, `from transformer_lens import *`, `dir()`) executes the package's own
`__init__` in place, exactly as a normal import would have, and from then on the module is the
ordinary, fully imported package. Nothing of TransformerLens is copied or changed.

Robust by construction: if `transformer_lens` is already imported, is not a package, or a
subpackage is missing (another layout), nothing is deferred and the normal import happens; if a
leaf in `_LEAVES` has moved, the lookup falls back to running the package `__init__`. The worst
case is the old, slow, correct import.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import threading
import types

_PACKAGES = ("transformer_lens", "transformer_lens.utilities", "transformer_lens.conversion_utils",
             "transformer_lens.conversion_utils.conversion_steps")
# name -> leaf module defining it, per deferred package (TransformerLens 4.x layout)
_LEAVES: dict[str, dict[str, str]] = {
    "transformer_lens": {"HookedRootModule": "HookedRootModule", "ActivationCache": "ActivationCache"},
    "transformer_lens.utilities": {"Slice": "slice", "SliceInput": "slice", "remove_batch_dim": "tensors",
                                   "warn_if_mps": "devices"},
}
_LOCK = threading.RLock()


def defer_package_inits() -> bool:
    """Register TransformerLens' packages unexecuted (see the module docstring); True if done.
    Cheap (no import of torch or TransformerLens code); call it before the first TL import."""
    with _LOCK:
        if any(name in sys.modules for name in _PACKAGES):
            return False  # imported already (fully, or deferred by an earlier call)
        specs: dict[str, importlib.machinery.ModuleSpec] = {}
        try:
            for name in _PACKAGES:
                parent = name.rpartition(".")[0]
                spec = (importlib.machinery.PathFinder.find_spec(name, specs[parent].submodule_search_locations)
                        if parent else importlib.util.find_spec(name))
                if spec is None or spec.submodule_search_locations is None or spec.loader is None:
                    return False  # not installed here, or not the package layout we know
                specs[name] = spec
        except (ImportError, ValueError, AttributeError):
            return False
        for name, spec in specs.items():
            module = importlib.util.module_from_spec(spec)
            module.__getattr__, module.__dir__ = _completer(module, spec)  # type: ignore[attr-defined]
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)
        return True


def _completer(module: types.ModuleType, spec):
    """The deferred package's module `__getattr__` and `__dir__` (PEP 562): a known name from
    its leaf module, anything else after running the package's real `__init__` into the module."""
    running = threading.local()

    def complete() -> None:
        with _LOCK:
            if module.__dict__.get("__getattr__") is not __getattr__ or getattr(running, "on", False):
                return  # done already, or a circular import inside the __init__ (as a normal import)
            running.on = True
            try:
                spec.loader.exec_module(module)
            finally:
                running.on = False
                for key, ours in (("__getattr__", __getattr__), ("__dir__", __dir__)):
                    if module.__dict__.get(key) is ours:
                        del module.__dict__[key]  # the package defines none of its own

    def __getattr__(name: str):
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)  # probes like __wrapped__, __warningregistry__: not worth a full import
        leaf = _LEAVES.get(spec.name, {}).get(name)
        if leaf is not None:
            try:
                value = getattr(importlib.import_module(f"{spec.name}.{leaf}"), name)
                setattr(module, name, value)  # replaces the submodule the import bound under its name
                return value
            except (ImportError, AttributeError):
                pass  # another layout: the package's own __init__ knows
        complete()
        if name in module.__dict__:
            return module.__dict__[name]
        if module.__dict__.get("__getattr__") not in (None, __getattr__):
            return module.__dict__["__getattr__"](name)  # the package's own (TL 4.x: removed names)
        raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")

    def __dir__():
        complete()
        own = module.__dict__.get("__dir__")
        return own() if own not in (None, __dir__) else sorted(module.__dict__)

    return __getattr__, __dir__
