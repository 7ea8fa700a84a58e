"""Which endpoint probably holds which prompt blocks: a per-endpoint LRU plus a reverse map.

Built only from the router's own decisions (no feedback from the servers), hence "approximate".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

from epick.framework.replication import Publish
from epick.plugins.debug_state import MAX_LISTED, capped


class PrefixIndex:
    def __init__(self, capacity_per_endpoint: int) -> None:
        self.capacity = capacity_per_endpoint
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}
        self.publish: Publish | None = None  # `epick serve --workers`: where each add goes

    def add(self, endpoint: str, hashes: Iterable[int]) -> None:
        """Record that `endpoint` now holds these blocks (most recent last)."""
        if self.publish is not None:
            hashes = list(hashes)
            self.publish([endpoint, hashes])
        self._add(endpoint, hashes)

    def apply_update(self, update: Any) -> None:
        """Another worker's `add` (an [endpoint, hashes] pair)."""
        endpoint, hashes = update
        self._add(str(endpoint), hashes)

    def snapshot(self) -> dict[str, list[int]]:
        """Each endpoint's blocks, least recent first."""
        return {endpoint: list(lru) for endpoint, lru in self._lru.items()}

    def restore(self, snapshot: Any) -> None:
        """Merge a snapshot: its blocks are added before (older than) what this index holds."""
        for endpoint, hashes in dict(snapshot).items():
            mine = self._lru.get(str(endpoint))
            kept = list(mine) if mine is not None else []
            self._add(str(endpoint), hashes)
            self._add(str(endpoint), kept)

    def _add(self, endpoint: str, hashes: Iterable[int]) -> None:
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
        holders = self._holders
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            holder = holders.get(h)
            if holder is None:
                holders[h] = {endpoint}
            else:
                holder.add(endpoint)
        while len(lru) > self.capacity:
            old, _ = lru.popitem(last=False)
            holder = holders[old]
            holder.discard(endpoint)
            if not holder:
                del holders[old]

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Blocks matched per endpoint, walking the chain until a block nobody holds.

        As the Go EPP counts: an endpoint gains one for every block it holds before the first block
        no endpoint holds (not necessarily a contiguous run of its own).
        """
        counts: dict[str, int] = {}
        get = self._holders.get
        previous: set[str] | None = None
        run = 0
        # Consecutive blocks are usually held by the same endpoints: count runs, not blocks.
        for h in hashes:
            holder = get(h)
            if not holder:
                break
            if holder == previous:
                run += 1
                continue
            if previous:
                for name in previous:
                    counts[name] = counts.get(name, 0) + run
            previous, run = holder, 1
        if previous:
            for name in previous:
                counts[name] = counts.get(name, 0) + run
        return counts

    def remove_endpoint(self, endpoint: str) -> None:
        lru = self._lru.pop(endpoint, None)
        if lru is None:
            return
        for h in lru:
            holder = self._holders.get(h)
            if holder is not None:
                holder.discard(endpoint)
                if not holder:
                    del self._holders[h]

    def endpoints(self) -> list[str]:
        return list(self._lru)

    def blocks(self, endpoint: str) -> int:
        lru = self._lru.get(endpoint)
        return 0 if lru is None else len(lru)

    def __len__(self) -> int:
        """Distinct block hashes held by any endpoint."""
        return len(self._holders)


class SharedIndex:
    """`epick.framework.replication.Replicated` for a plugin whose state is its `index`: the prefix
    index is what `epick serve --workers` shares between workers."""

    index: PrefixIndex

    def replicate(self, publish: Publish | None, worker: int) -> None:
        self.index.publish = publish

    def apply_update(self, update: object, worker: int) -> None:
        self.index.apply_update(update)

    def snapshot(self) -> object:
        return self.index.snapshot()

    def restore(self, snapshot: object) -> None:
        self.index.restore(snapshot)

    def dump_state(self) -> object:
        """Blocks indexed per endpoint (`/debug/plugins/state`), as upstream's approximate producer."""
        endpoints = self.index.endpoints()
        return {
            "pods": [{"pod": e, "blocks": self.index.blocks(e)} for e in capped(endpoints)],
            "totalPods": len(endpoints),
            "maxPods": MAX_LISTED,
        }

    def worker_left(self, worker: int) -> None:
        """What a worker recorded stays: the blocks are on the endpoints, not in the worker."""
