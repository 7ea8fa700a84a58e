"""Endpoint metrics shared between `epick serve --workers`' processes: one view, the freshest.

Every worker scrapes (its health checks and data-layer attributes stay its own), and publishes the
core metrics of each scrape as it lands; a worker takes another's metrics for an endpoint when they
are newer than its own (`Metrics.update_time`). So every worker schedules on the latest scrape any
worker made, and the workers' scrapes, at their own phases, make that view fresher than one
process's. Implements `epick.framework.replication.Replicated`, as the plugins that share state do.
"""

from __future__ import annotations

from collections.abc import Callable

from epick.datalayer.datastore import Datastore
from epick.framework import Metrics, TypedName

NAME = "@endpoint-metrics"  # its name on the hub: no plugin's (config names do not start with @)


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
    """The datastore's endpoint metrics, published as scraped and taken from others when newer."""

    typed_name = TypedName("endpoint-metrics", NAME)

    def __init__(self, datastore: Datastore) -> None:
        self.datastore = datastore
        self.taken = 0  # other workers' metrics that were newer than this worker's own

    def replicate(self, publish: Callable[[object], None] | None, worker: int) -> None:
        if publish is None:
            self.datastore.on_metrics = None
            return

        def published(name: str, metrics: Metrics) -> None:
            if metrics.update_time is not None:
                publish(_encoded(name, metrics))

        self.datastore.on_metrics = published

    def apply_update(self, update: object, worker: int) -> None:
        decoded = _decoded(update)
        if decoded is not None and self.datastore.offer_metrics(*decoded):
            self.taken += 1

    def snapshot(self) -> object:
        endpoints = (self.datastore.get(spec.name) for spec in self.datastore.specs())
        return [
            _encoded(ep.name, ep.metrics) for ep in endpoints if ep is not None and ep.metrics.update_time
        ]

    def restore(self, state: object) -> None:
        for update in state if isinstance(state, list) else []:
            self.apply_update(update, -1)

    def worker_left(self, worker: int) -> None:
        """Nothing: metrics stay good until newer ones come, whoever scraped them."""
