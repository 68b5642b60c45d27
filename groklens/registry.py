"""A small name -> object registry; tasks, models, regularizers and analyses each keep one."""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from groklens.errors import BadInput

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@TASKS.register("add")`. A duplicate name is a programming error."""

        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"duplicate {self.kind} name {name!r}")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise BadInput(f"unknown {self.kind} {name!r} (known: {known})") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
