"""groklens.trainers: regularizers, the optimizer, the training step and loop, and the entry points
(train, resume). The models and their losses are a room of their own (groklens.models), as are the
sweeps (groklens.sweeps); the tasks are the front door's (groklens/tasks.py).

The names these had before issue 44 still import, as the very module objects of their new rooms
(`groklens.trainers.models.transformer is groklens.models.transformer`, so a monkeypatch or an
isinstance check holds under either name): a finder on sys.meta_path answers an old name with the
module of its new one, imported on first use. It names the new rooms as strings, so the trainers
import nothing above them (the import contracts in pyproject.toml)."""

import importlib
import importlib.abc
import importlib.util
import sys

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

# old name -> new name; a submodule of an old name moved with it (groklens.trainers.models.mlp)
MOVED = {
    "groklens.trainers.models": "groklens.models",
    "groklens.trainers.losses": "groklens.models.losses",
    "groklens.trainers.sweeps": "groklens.sweeps",
    "groklens.trainers.sweep_executors": "groklens.sweeps.executors",
    "groklens.trainers.sweep_files": "groklens.sweeps.files",
    "groklens.trainers.sweep_grid": "groklens.sweeps.grid",
    "groklens.trainers.sweep_tasks": "groklens.sweeps.tasks",
}


def moved_name(name: str) -> str | None:
    """The new name of an old module name, or None where the name did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old name as the module of its new name (one module object under two names)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if moved_name(name) else None

    def create_module(self, spec):
        module = importlib.import_module(moved_name(spec.name))
        spec.loader_state = module.__spec__  # the import system sets __spec__ to this spec; restored below
        return module  # its __name__, __file__ and __path__ stay its own

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # run already, under its new name


if not any(isinstance(f, MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, MovedModules())  # before the path finder, which would load a second copy


def __getattr__(name: str):
    """groklens.trainers.models etc. as attributes, as they were once imported."""
    if moved_name(f"{__name__}.{name}"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
