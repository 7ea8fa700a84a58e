"""Data that plugins pass to each other inside one `Scheduler.schedule` call."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class CycleState:
    """A per-call scratch space for plugins; request data does not live here.

    Keys are namespaced by the writing plugin (`state_key(plugin)`), so two instances of one
    plugin type never clash. Values are read back through `read`, which checks their type.
    """

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[str, object] = {}

    def write(self, key: str, value: object) -> None:
        self._data[key] = value

    def read(self, key: str, kind: type[T]) -> T | None:
        """The value under `key` if it is a `kind`, else None."""
        value = self._data.get(key)
        return value if isinstance(value, kind) else None

    def keys(self) -> list[str]:
        return list(self._data)
