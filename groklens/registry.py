"""A small name -> object registry; tasks, models, regularizers and analyses each keep one.

A registry with an entry-point group (`Registry("model", entry_points="groklens.models")`) also
holds what installed packages add: on the first name it does not hold, it imports the modules
their entry points of that group name (importlib.metadata), which register themselves
(docs/EXTENDING.md)."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from groklens.errors import BadInput

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, entry_points: str | None = None):
        self.kind = kind
        self.entry_points = entry_points
        self._items: dict[str, T] = {}
        self._plugins_loaded = entry_points is None

    def load_plugins(self) -> None:
        """Import every module that the entry points of this registry's group name (once)."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.entry_points):
            ep.load()

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@TASKS.register("add")`. A duplicate name is a programming error."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}")
            self._items[name] = obj
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
