"""State that `epick serve --workers N` keeps equal in every worker process.

A plugin whose decisions depend on what earlier decisions recorded (a prefix index) implements
`Replicated`: each worker's instance publishes what it records, and applies what the other workers'
instances recorded, so every worker decides on the same state, give or take the few hundred
microseconds an update takes to travel. A worker that starts (or restarts) loads a `snapshot` of a
running one. Updates and snapshots are plain data (lists, strings, integers): they cross processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from epick.framework.plugin import Plugin

Publish = Callable[[object], None]


@runtime_checkable
class Replicated(Plugin, Protocol):
    def replicate(self, publish: Publish | None) -> None:
        """From now on, hand each update this instance records to `publish` (None: stop)."""
        ...

    def apply_update(self, update: object) -> None:
        """Record what another worker's instance published (without publishing it again)."""
        ...

    def snapshot(self) -> object:
        """The state, for a worker that starts."""
        ...

    def restore(self, snapshot: object) -> None:
        """Merge another worker's `snapshot` into this state."""
        ...
