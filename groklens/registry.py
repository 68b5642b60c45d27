"""A small name -> object registry; tasks, models, regularizers and analyses each keep one.

A registry with an entry-point group (`Registry("model", entry_points="groklens.models")`) also
holds what installed packages add: on the first name it does not hold, it imports the modules
their entry points of that group name (importlib.metadata), which register themselves
(docs/EXTENDING.md). Each entry point loads in isolation: one that fails to import, reuses a
registered name or calls sys.exit is left out (with whatever it registered) and named in one
PluginWarning; the other plugins and the command go on.

Names become file names, HDF5 groups and option values (an analysis's name is its group in the
run's sidecar file), so a name is checked where it is registered (NAME)."""

from __future__ import annotations

import re
import warnings
from typing import Callable, Generic, Iterator, TypeVar

from groklens.errors import BadInput, PluginWarning

T = TypeVar("T")

# a letter, then letters, digits, _ or -: never a path ("../../evil"), an HDF5 path or an empty name
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_points: str | None = None):
        self.kind = kind
        self.entry_points = entry_points
        self._items: dict[str, T] = {}
        self._origins: dict[str, str] = {}  # name -> who registered it (a duplicate names both)
        self._loading: str | None = None  # the entry point being loaded
        self._plugins_loaded = entry_points is None

    def load_plugins(self) -> None:
        """Import every module that the entry points of this registry's group name (once), each
        in isolation (the module docstring)."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.entry_points):
            dist = getattr(getattr(ep, "dist", None), "name", None)
            origin = f"plugin {ep.name} = {ep.value}" + (f" (package {dist})" if dist else "")
            before = set(self._items)
            self._loading = origin
            try:
                ep.load()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a plugin cannot break or end the command
                for name in set(self._items) - before:
                    del self._items[name], self._origins[name]
                if isinstance(exc, SystemExit):
                    why = f"it called sys.exit({exc.code!r})"
                else:
                    why = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
                warnings.warn(f"{self.kind} {origin} left out: {why}", PluginWarning, stacklevel=2)
            finally:
                self._loading = None

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@TASKS.register("add")`. A bad or duplicate name is a programming error
        (ValueError): a plugin's is caught by load_plugins, which leaves the plugin out."""
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{self.kind} name {name!r}: a name is a letter, then up to 63 letters, digits, _ or - "
                             "(it names files, HDF5 groups and options)")

        def add(obj: T) -> T:
            origin = self._loading or f"module {getattr(getattr(obj, 'func', obj), '__module__', '?')}"
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}: registered by {self._origins[name]}, "
                                 f"again by {origin}")
            self._items[name] = obj
            self._origins[name] = origin
            return obj

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            self.load_plugins()
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise BadInput(f"unknown {self.kind} {name!r} (known: {known})") from None

    def replace(self, name: str, obj: T) -> None:
        """Put `obj` in place of the registered `name` (a decorator that completes an entry)."""
        self.get(name)
        self._items[name] = obj

    def in_order(self) -> list[T]:
        """The registered objects in registration order."""
        return list(self._items.values())

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
