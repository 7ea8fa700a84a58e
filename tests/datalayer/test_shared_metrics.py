"""Endpoint metrics shared between workers: published as scraped, the freshest taken."""

from __future__ import annotations

import itertools

import pytest

from epick.config.datalayer import DataLayerPlan, PolledSource
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.scraper import Scraper, ScraperPool
from epick.datalayer.shared import SharedMetrics
from epick.framework import Metrics
from epick.framework.replication import Replicated
from epick.plugins.datalayer.core_metrics import CoreMetricsExtractor
from epick.plugins.datalayer.engines import MetricSpec
from epick.plugins.datalayer.http_source import PortOverrideParameters
from epick.plugins.datalayer.metrics_source import MetricsDataSource
from tests.datalayer.pages import core_plan, core_polled


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


# --- the workers' turns at scraping, and health from any worker's scrapes ---------------------------


def pools(workers: int = 2) -> list[tuple[Datastore, ScraperPool, SharedMetrics]]:
    """`workers` workers' datastores and scraper pools (not started), each publishing into all others."""
    made = []
    for k in range(workers):
        ds = store()
        pool = ScraperPool(ds, interval=0.05, plan=core_plan())
        pool.share = (k, workers)
        made.append((ds, pool, SharedMetrics(ds, pool)))
    for k, (_, _, shared) in enumerate(made):
        others = [s for j, (_, _, s) in enumerate(made) if j != k]
        shared.replicate(lambda update, others=others, k=k: [o.apply_update(update, k) for o in others], k)
    return made


def scraper(ds: Datastore, pool: ScraperPool, name: str = "ep0") -> Scraper:
    """The pool's core-metrics scraper of `name`, built as the pool builds it and held by the pool
    (not started: the tests scrape by hand)."""
    spec = ds.spec(name)
    assert spec is not None
    pool.scrapers[name] = pool.build(spec)
    found = pool.scraper(name)
    assert found is not None
    return found


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_workers_take_turns_so_the_server_is_scraped_once_per_interval(workers: int) -> None:
    interval = 0.05
    starts = []
    for k in range(workers):
        s = Scraper(
            EndpointSpec("ep0", "10.0.0.1", 8000, {}),
            Datastore(),
            interval=interval,
            share=(k, workers),
            polled=core_polled(),
        )
        now = 1_000_000.0
        for _ in range(5):  # each scrape starts at its turn and takes 3 ms
            now += s.until_turn(now)
            starts.append(now)
            now += 0.003
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) == 5 * workers
    assert all(abs(gap - interval) < 1e-6 for gap in gaps), gaps


def test_a_turn_just_taken_is_not_taken_twice() -> None:
    s = Scraper(
        EndpointSpec("ep0", "10.0.0.1", 8000, {}),
        Datastore(),
        interval=0.05,
        share=(1, 2),
        polled=core_polled(),
    )
    now = 5_000.0
    turn = now + s.until_turn(now)
    # The sleep ended a millisecond early and the scrape took half of one: that was this turn, and
    # the next is a round (two intervals) after it.
    assert abs(s.until_turn(turn - 0.0005) - (0.1 + 0.0005)) < 1e-9
    assert abs(s.until_turn(turn + 0.003) - (0.1 - 0.003)) < 1e-9


def test_another_workers_failed_scrapes_count_towards_health() -> None:
    (a, pool_a, _), (b, pool_b, _) = pools()
    scraper_a, scraper_b = scraper(a, pool_a), scraper(b, pool_b)
    assert scraper_a.share == (0, 2) and scraper_b.share == (1, 2)
    scraper_a.failed()  # worker a's own failure, then b's two (heard through on_failure)
    pool_b._failed("ep0")
    assert a.is_healthy("ep0")
    pool_b._failed("ep0")
    assert not a.is_healthy("ep0")  # unhealthy after three in a row, whoever scraped
    b.update_metrics("ep0", Metrics(waiting_queue_size=1, update_time=10.0))  # b's scrape succeeds
    assert a.is_healthy("ep0") and metrics_of(a).waiting_queue_size == 1


async def test_a_failed_scrape_is_published() -> None:
    (a, pool_a, _), (b, pool_b, _) = pools()
    s = scraper(a, pool_a)
    scraper(b, pool_b)
    s.client = None
    s.setup_error = "cannot reach it"
    for _ in range(3):
        await s.scrape_once()
    assert not a.is_healthy("ep0") and not b.is_healthy("ep0")
    assert pool_b.scraper("ep0").consecutive_failures == 3  # type: ignore[union-attr]


def test_failures_of_unknown_endpoints_and_garbage_are_ignored() -> None:
    (a, pool_a, shared_a), _ = pools()
    scraper(a, pool_a)
    for update in (["failed"], ["failed", "gone"], ["failed", None, 1]):
        shared_a.apply_update(update, 1)
    assert a.is_healthy("ep0") and pool_a.scraper("ep0").consecutive_failures == 0  # type: ignore[union-attr]


def test_only_sources_of_core_metrics_alone_are_scraped_in_turns() -> None:
    core = PolledSource(MetricsDataSource(None, PortOverrideParameters()), (CoreMetricsExtractor(),))
    custom = CoreMetricsExtractor(custom={"vllm": (("gpu", MetricSpec("vllm:gpu_utilization")),)})
    with_custom = PolledSource(core.source, (custom,))
    ds = store()
    pool = ScraperPool(ds, interval=0.05, plan=DataLayerPlan((core, with_custom)))
    pool.share = (1, 4)
    spec = ds.spec("ep0")
    assert spec is not None
    assert [s.share for s in pool.build(spec)] == [(1, 4), None]
