"""Endpoint metrics shared between workers: published as scraped, the freshest taken."""

from __future__ import annotations

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.shared import SharedMetrics
from epick.framework import Metrics
from epick.framework.replication import Replicated


def store() -> Datastore:
    ds = Datastore()
    for i in range(2):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i + 1}", 8000, {}))
    return ds


def linked() -> tuple[Datastore, Datastore, SharedMetrics, SharedMetrics]:
    """Two workers' datastores, each publishing straight into the other."""
    a, b = store(), store()
    shared_a, shared_b = SharedMetrics(a), SharedMetrics(b)
    shared_a.replicate(lambda update: shared_b.apply_update(update, 0), 0)
    shared_b.replicate(lambda update: shared_a.apply_update(update, 1), 1)
    return a, b, shared_a, shared_b


def metrics_of(ds: Datastore, name: str = "ep0") -> Metrics:
    endpoint = ds.get(name)
    assert endpoint is not None
    return endpoint.metrics


def test_a_scrape_in_one_worker_is_every_workers_view() -> None:
    a, b, _, shared_b = linked()
    assert isinstance(shared_b, Replicated)
    scraped = Metrics(waiting_queue_size=3, kv_cache_usage_percent=0.5, active_models=frozenset({"lora-a"}),
                      max_active_models=2, update_time=100.0)  # fmt: skip
    a.update_metrics("ep0", scraped)
    assert metrics_of(b) == scraped and shared_b.taken == 1
    b.update_metrics("ep0", Metrics(waiting_queue_size=1, update_time=101.0))  # newer, from b
    assert metrics_of(a).waiting_queue_size == 1


def test_older_metrics_than_a_workers_own_are_dropped() -> None:
    a, b, _, shared_b = linked()
    shared_b.replicate(None, 1)  # b publishes nothing: each keeps its own scrape
    b.update_metrics("ep0", Metrics(waiting_queue_size=9, update_time=200.0))
    a.update_metrics("ep0", Metrics(waiting_queue_size=1, update_time=150.0))  # older than b's
    assert metrics_of(b).waiting_queue_size == 9 and shared_b.taken == 0
    a.update_metrics("ep0", Metrics(waiting_queue_size=2, update_time=None))  # not timed: not shared
    assert metrics_of(b).waiting_queue_size == 9


def test_garbage_and_unknown_endpoints_are_dropped() -> None:
    ds = store()
    shared = SharedMetrics(ds)
    for update in (None, "x", [1, 2], ["ep0", "many", 0, 0.0, [], [], 0, 0, 0, 1.0],
                   ["gone", 1, 0, 0.0, [], [], 0, 0, 0, 1.0]):  # fmt: skip
        shared.apply_update(update, 0)
    assert metrics_of(ds) == Metrics() and shared.taken == 0


def test_a_starting_worker_loads_the_freshest_metrics_from_a_snapshot() -> None:
    running, starting = store(), store()
    running.update_metrics("ep0", Metrics(waiting_queue_size=4, update_time=10.0))
    running.update_metrics("ep1", Metrics(running_requests_size=7, update_time=11.0))
    starting.update_metrics("ep1", Metrics(running_requests_size=1, update_time=12.0))  # its own, newer
    SharedMetrics(starting).restore(SharedMetrics(running).snapshot())
    assert metrics_of(starting).waiting_queue_size == 4
    assert metrics_of(starting, "ep1").running_requests_size == 1
