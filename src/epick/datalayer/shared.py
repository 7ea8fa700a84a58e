"""Endpoint metrics shared between `epick serve --workers`' processes: one view, the freshest.

The workers take turns scraping core metrics (epick.datalayer.scraper), and each publishes the
outcome of its scrapes as they land: the core metrics, or that the scrape failed. A worker takes
another's metrics for an endpoint when they are newer than its own (`Metrics.update_time`), and counts
another's scrape towards the endpoint's health as its own (a success makes it healthy, `unhealthy_after`
failures in a row unhealthy). So every worker schedules on the latest scrape any worker made, and
the model servers are scraped as often as by one process. Data-layer attributes stay each worker's.
Implements `epick.framework.replication.Replicated`, as the plugins that share state do.
"""

from __future__ import annotations

from collections.abc import Callable

from epick.datalayer.datastore import Datastore
from epick.datalayer.scraper import ScraperPool
from epick.framework import Metrics, TypedName

NAME = "@endpoint-metrics"  # its name on the hub: no plugin's (config names do not start with @)
FAILED = "failed"  # an update [FAILED, endpoint]: a scrape of its core metrics failed


def _encoded(name: str, m: Metrics) -> list[object]:
    return [name, m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent,
            sorted(m.active_models), sorted(m.waiting_models), m.max_active_models, m.cache_block_size,
            m.cache_num_blocks, m.update_time]  # fmt: skip


def _decoded(update: object) -> tuple[str, Metrics] | None:
    """(endpoint, metrics) from what `_encoded` wrote; None for anything else."""
    if not isinstance(update, list | tuple) or len(update) != 10:
        return None
    name, waiting, running, kv, active, pending, max_active, block, blocks, when = update
    try:
        return str(name), Metrics(
            waiting_queue_size=int(waiting),
            running_requests_size=int(running),
            kv_cache_usage_percent=float(kv),
            active_models=frozenset(map(str, active)),
            waiting_models=frozenset(map(str, pending)),
            max_active_models=int(max_active),
            cache_block_size=int(block),
            cache_num_blocks=int(blocks),
            update_time=None if when is None else float(when),
        )
    except (TypeError, ValueError):
        return None


class SharedMetrics:
    """The datastore's endpoint metrics, published as scraped and taken from others when newer; with
    the scrapers, each scrape's outcome counted towards health in every worker."""

    typed_name = TypedName("endpoint-metrics", NAME)

    def __init__(self, datastore: Datastore, scrapers: ScraperPool | None = None) -> None:
        self.datastore = datastore
        self.scrapers = scrapers
        self.taken = 0  # other workers' metrics that were newer than this worker's own

    def replicate(self, publish: Callable[[object], None] | None, worker: int) -> None:
        if publish is None:
            self.datastore.on_metrics = None
            if self.scrapers is not None:
                self.scrapers.on_failure = None
            return

        def published(name: str, metrics: Metrics) -> None:
            if metrics.update_time is not None:
                publish(_encoded(name, metrics))

        self.datastore.on_metrics = published
        if self.scrapers is not None:
            self.scrapers.on_failure = lambda name: publish([FAILED, name])

    def apply_update(self, update: object, worker: int) -> None:
        if isinstance(update, list | tuple) and len(update) == 2 and update[0] == FAILED:
            if self.scrapers is not None:
                self.scrapers.outcome(str(update[1]), ok=False)
            return
        decoded = _decoded(update)
        if decoded is None:
            return
        if self.datastore.offer_metrics(*decoded):
            self.taken += 1
        if self.scrapers is not None:
            self.scrapers.outcome(decoded[0], ok=True)

    def snapshot(self) -> object:
        endpoints = (self.datastore.get(spec.name) for spec in self.datastore.specs())
        return [
            _encoded(ep.name, ep.metrics) for ep in endpoints if ep is not None and ep.metrics.update_time
        ]

    def restore(self, state: object) -> None:
        for update in state if isinstance(state, list) else []:
            decoded = _decoded(update)
            if decoded is not None and self.datastore.offer_metrics(*decoded):
                self.taken += 1

    def worker_left(self, worker: int) -> None:
        """Nothing: metrics stay good until newer ones come, whoever scraped them."""
