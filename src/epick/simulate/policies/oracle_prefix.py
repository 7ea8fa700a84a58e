"""The oracle: epick's default config scoring with the engines' exact cache contents, the upper
bound of cache-aware routing."""

from __future__ import annotations

import random
from collections.abc import Sequence

from epick.simulate.policies.least_request import _least_in_flight
from epick.simulate.types import ServerView, SimRequestSpec


class OraclePrefix:
    """The upper bound of cache-aware routing: epick's default config, given exact cache contents.

    Score of server i (the Go EPP default weights prefix 3 : queue 2 : kv-cache 2, the cache hit
    made exact):

        score_i = 3 * hit_i + load_weight * (2 * queue_i + 2 * (1 - kv_usage_i))

        hit_i   = cached_tokens_i / len(tokens)   (0 for an empty prompt), where cached_tokens_i is
                  `ServerView.cached_tokens(request)`: the prefix-cache hit the engine would give now
        queue_i = (max_w - waiting_i) / (max_w - min_w) over the servers (1 when all are equal), the
                  `queue-scorer`; waiting and kv_usage are from the last scrape, as epick sees them

    The highest score wins; exact ties go to the fewest router-counted in-flight requests (fresher
    than the scrape, so a burst of cold requests between scrapes spreads), then at random with the
    seeded generator. `load_weight=1` (the default) is exactly the default config with a perfect
    prefix scorer; larger values trade cache hits for balance, 0 is pure cache affinity. The load
    terms are what stop a hot prefix piling onto one server: a full hit (3 points) loses once that
    server's queue and KV usage cost it more than 3 points against a cold, idle server, e.g. the
    longest queue (queue 0 vs 1: -2) and KV 0.9 vs 0.1 (-1.6), 3.2 < 3.8.
    """

    name = "oracle-prefix"
    reads_metrics = True

    def __init__(self, rng: random.Random | None = None, *, load_weight: float = 1.0) -> None:
        if load_weight < 0:
            raise ValueError("load_weight must be >= 0")
        self._rng = rng if rng is not None else random.Random(0)
        self.load_weight = load_weight

    def scores(self, request: SimRequestSpec, servers: Sequence[ServerView]) -> list[float]:
        tokens = request.tokens
        n = len(tokens)
        waits = [s.waiting for s in servers]
        hi = max(waits)
        lo = min(waits)
        span = hi - lo
        lw2 = 2.0 * self.load_weight
        out = []
        for s in servers:
            hit = s.cached_tokens(request) / n if n else 0.0
            queue = (hi - s.waiting) / span if span else 1.0
            out.append(3.0 * hit + lw2 * (queue + 1.0 - s.kv_usage))
        return out

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        scores = self.scores(request, servers)
        best = max(scores)
        ties = [s for s, v in zip(servers, scores, strict=True) if v == best]
        if len(ties) == 1:
            return ties[0].index
        return _least_in_flight(ties, self._rng)

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        pass
