"""Scores that depend only on the candidates' metrics, computed once per snapshot.

The data layer hands out the same tuple of endpoints until a scrape changes one (endpoints and their
metrics are immutable), so a scorer that reads nothing but metrics gives the same scores for every
request between two scrapes. `SnapshotMemo` keeps the last tuple and its scores and returns them
while the same tuple (by identity) comes back; a list of candidates or a new tuple is computed.
Scores come back as a tuple: immutable, so the scheduler may in turn reuse what it derived from the
very same tuple (`SchedulerProfile` reuses its weighted sums).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from epick.framework import Endpoint


class SnapshotMemo:
    __slots__ = ("_endpoints", "_scores")

    def __init__(self) -> None:
        self._endpoints: tuple[Endpoint, ...] | None = None
        self._scores: tuple[float, ...] = ()

    def scores(
        self, endpoints: Sequence[Endpoint], compute: Callable[[Sequence[Endpoint]], list[float]]
    ) -> tuple[float, ...]:
        if endpoints is self._endpoints:
            return self._scores
        scores = tuple(compute(endpoints))
        if isinstance(endpoints, tuple):
            self._endpoints, self._scores = endpoints, scores
        return scores
