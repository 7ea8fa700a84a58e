"""The least-request baseline, and the least-in-flight choice the other policies fall back to."""

from __future__ import annotations

import random
from collections.abc import Sequence

from epick.simulate.types import ServerView, SimRequestSpec


def _least_in_flight(servers: Sequence[ServerView], rng: random.Random) -> int:
    """The index of the server with the fewest router-counted in-flight requests; ties at random."""
    best = servers[0].in_flight
    ties = [servers[0].index]
    for s in servers[1:]:
        n = s.in_flight
        if n < best:
            best = n
            ties = [s.index]
        elif n == best:
            ties.append(s.index)
    return ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]


class LeastRequest:
    """Least request: the server with the fewest in-flight requests this router sent, ties at random.

    The classic least-outstanding-requests balancer (NGINX `least_conn`; Envoy `LEAST_REQUEST` with
    every host compared rather than its default two-choice sample), the `shortest queue` half of
    SGLang's router, and llm-d's load-only baseline in spirit. The count is the router's own
    (`ServerView.in_flight`), so it is always fresh: no scrape is involved. Deviation: none beyond
    comparing all servers.
    """

    name = "least-request"
    reads_metrics = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(0)

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        return _least_in_flight(servers, self._rng)

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        pass
