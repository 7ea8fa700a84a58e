"""Plugin state a request leaves behind when its end is never reported: how it is let go once older
than the staleness (`Handle.plugin_state_staleness`, default `registry.DEFAULT_STALENESS`; upstream
reaps plugin state the same way, `epp --plugin-state-staleness-threshold`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def pop_stale(entries: dict[K, V], cutoff: float, started: Callable[[V], float]) -> Iterator[tuple[K, V]]:
    """Remove from `entries`, kept in the order their requests started, those that started before
    `cutoff`, and yield each as it goes: the stale ones are at the front, so this looks at one entry
    past them."""
    while entries:
        key, value = next(iter(entries.items()))
        if started(value) >= cutoff:
            return
        del entries[key]
        yield key, value
