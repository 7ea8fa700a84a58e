"""State that `epick serve --workers N` keeps equal in every worker process.

A plugin whose decisions depend on what earlier decisions recorded (a prefix index, the requests in
flight) implements `Replicated`: each worker's instance publishes what it records, and applies what
the other workers' instances recorded, so every worker decides on the same state, give or take the
few hundred microseconds an update takes to travel. A worker that starts (or restarts) loads a
`snapshot` of a running one. Updates and snapshots are plain data (lists, strings, integers): they
cross processes.

A plugin whose updates are each worker's own absolute value for one key (the update's first item:
an endpoint), rather than events, says so with a class attribute `replicates_state = True` (the
requests in flight): across hosts (`--shared-state`) such values are rewritten periodically rather
than sent once, so a lost one is repaired by the next.

Workers are told apart by their index (0 .. N-1; a restarted worker keeps its index). State that
lives only as long as the worker that recorded it (its requests in flight) is kept per worker and
dropped at `worker_left`; state that outlives it (the blocks its endpoints cached) is not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from epick.framework.plugin import Plugin
from epick.framework.reads import Reads, reads_of

Publish = Callable[[object], None]


@runtime_checkable
class Replicated(Plugin, Protocol):
    def replicate(self, publish: Publish | None, worker: int) -> None:
        """From now on, hand each update this instance records to `publish` (None: stop); this
        instance runs in worker `worker`."""
        ...

    def apply_update(self, update: object, worker: int) -> None:
        """Record what worker `worker`'s instance published (without publishing it again)."""
        ...

    def snapshot(self) -> object:
        """The state, for a worker that starts."""
        ...

    def restore(self, snapshot: object) -> None:
        """Merge another worker's `snapshot` into this state."""
        ...

    def worker_left(self, worker: int) -> None:
        """Worker `worker` exited: what it alone held (its requests in flight) is gone."""
        ...


def unshared_state(plugin: object, declared: str | None) -> str:
    """What `plugin` remembers of earlier requests that the workers do not share, in words ("" for
    nothing): a `Replicated` plugin shares its state; another says what it keeps on its spec
    (`declared`: "" when it keeps nothing, a random draw or a turn aside); one that declares neither
    but reads `Reads.HISTORY` is taken to keep some."""
    if isinstance(plugin, Replicated):
        return ""
    if declared is not None:
        return declared
    return "state it does not declare" if Reads.HISTORY in reads_of(plugin) else ""
