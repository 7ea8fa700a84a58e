"""The datastore: endpoints by name, immutable snapshots, health, listeners."""

from __future__ import annotations

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.framework import Endpoint, Metrics


def spec(name: str, port: int = 8000, **labels: str) -> EndpointSpec:
    return EndpointSpec(name, f"10.0.0.{len(name)}", port, labels)


def names(endpoints: list[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


def test_upsert_adds_endpoints_with_empty_metrics() -> None:
    ds = Datastore()
    ds.upsert(spec("a", gpu="h100"))
    ds.upsert(spec("bb"))
    assert len(ds) == 2
    assert names(ds.snapshot()) == ["a", "bb"]
    a = ds.get("a")
    assert a is not None
    assert (a.address, a.port, dict(a.labels), a.metrics) == ("10.0.0.1", 8000, {"gpu": "h100"}, Metrics())
    assert ds.spec("a") == spec("a", gpu="h100")
    assert ds.specs() == [spec("a", gpu="h100"), spec("bb")]
    assert ds.get("zz") is None and ds.spec("zz") is None


def test_upsert_changed_spec_keeps_metrics_and_replaces_endpoint() -> None:
    ds = Datastore()
    ds.upsert(spec("a"))
    m = Metrics(waiting_queue_size=3, update_time=1.0)
    ds.update_metrics("a", m)
    before = ds.get("a")
    ds.upsert(spec("a", port=9000, role="decode"))
    after = ds.get("a")
    assert after is not before
    assert after is not None and after.port == 9000 and after.labels == {"role": "decode"}
    assert after.metrics is m


def test_spec_labels_are_copied_into_the_endpoint() -> None:
    labels = {"gpu": "h100"}
    ds = Datastore()
    ds.upsert(EndpointSpec("a", "h", 1, labels))
    labels["gpu"] = "changed"
    ep = ds.get("a")
    assert ep is not None and ep.labels == {"gpu": "h100"}


def test_remove() -> None:
    ds = Datastore()
    ds.upsert(spec("a"))
    ds.upsert(spec("bb"))
    ds.remove("a")
    ds.remove("a")  # twice: no error
    ds.remove("never")
    assert names(ds.snapshot()) == ["bb"] and len(ds) == 1
    assert ds.get("a") is None and not ds.is_healthy("a")


def test_replace_all() -> None:
    ds = Datastore()
    ds.replace_all([spec("a"), spec("bb"), spec("ccc")])
    ds.update_metrics("bb", Metrics(waiting_queue_size=1))
    kept = ds.get("bb")
    ds.replace_all([spec("bb"), spec("dddd")])
    assert names(ds.snapshot()) == ["bb", "dddd"]
    assert ds.get("bb") is kept  # unchanged spec: the same endpoint, metrics and all
    ds.replace_all([])
    assert len(ds) == 0 and ds.snapshot().endpoints == ()


def test_snapshot_is_the_same_object_until_a_change() -> None:
    ds = Datastore()
    ds.replace_all([spec("a"), spec("bb")])
    first = ds.snapshot()
    assert ds.snapshot() is first
    ds.upsert(spec("a"))  # same spec: no change
    ds.set_healthy("a", True)  # already healthy: no change
    assert ds.snapshot() is first
    ds.upsert(spec("ccc"))
    second = ds.snapshot()
    assert second is not first
    assert names(first) == ["a", "bb"]  # the old snapshot is untouched
    assert names(second) == ["a", "bb", "ccc"]
    ds.remove("a")
    assert ds.snapshot() is not second and names(second) == ["a", "bb", "ccc"]


def test_update_metrics_replaces_the_endpoint_object() -> None:
    ds = Datastore()
    ds.replace_all([spec("a"), spec("bb")])
    old_snapshot = ds.snapshot()
    old_a = old_snapshot[0]
    m = Metrics(waiting_queue_size=4, running_requests_size=2, kv_cache_usage_percent=0.5, update_time=9.0)
    ds.update_metrics("a", m)
    new_a = ds.get("a")
    assert new_a is not old_a
    assert new_a is not None and new_a.metrics is m
    assert (new_a.name, new_a.address, new_a.port, new_a.labels) == (
        old_a.name,
        old_a.address,
        old_a.port,
        old_a.labels,
    )
    # The old snapshot and the endpoint in it never change.
    assert old_snapshot[0] is old_a and old_a.metrics == Metrics()
    new_snapshot = ds.snapshot()
    assert new_snapshot is not old_snapshot
    assert new_snapshot[0] is new_a and new_snapshot[1] is old_snapshot[1]


def test_update_metrics_of_an_unknown_endpoint_is_ignored() -> None:
    ds = Datastore()
    ds.upsert(spec("a"))
    snap = ds.snapshot()
    ds.update_metrics("gone", Metrics(waiting_queue_size=1))
    assert ds.get("gone") is None and ds.snapshot() is snap


def test_set_healthy_excludes_from_snapshot() -> None:
    ds = Datastore()
    ds.replace_all([spec("a"), spec("bb"), spec("ccc")])
    ds.set_healthy("bb", False)
    assert names(ds.snapshot()) == ["a", "ccc"]
    assert not ds.is_healthy("bb") and ds.is_healthy("a")
    assert names(ds.all_endpoints()) == ["a", "bb", "ccc"]
    # Metrics still land while unhealthy, and show once healthy again.
    ds.update_metrics("bb", Metrics(waiting_queue_size=2))
    assert names(ds.snapshot()) == ["a", "ccc"]
    ds.set_healthy("bb", True)
    assert names(ds.snapshot()) == ["a", "bb", "ccc"]
    assert ds.snapshot()[1].metrics.waiting_queue_size == 2
    ds.set_healthy("unknown", False)
    assert not ds.is_healthy("unknown") and len(ds.snapshot()) == 3


def test_removed_and_readded_endpoint_is_healthy() -> None:
    ds = Datastore()
    ds.upsert(spec("a"))
    ds.set_healthy("a", False)
    ds.remove("a")
    ds.upsert(spec("a"))
    assert ds.is_healthy("a") and names(ds.snapshot()) == ["a"]


def test_listeners() -> None:
    ds = Datastore()
    seen: list[tuple[str, EndpointSpec | None]] = []
    also: list[str] = []
    ds.subscribe(lambda name, s: seen.append((name, s)))
    ds.subscribe(lambda name, s: also.append(name))
    ds.upsert(spec("a"))
    ds.upsert(spec("a"))  # unchanged: no call
    ds.upsert(spec("a", port=1))
    ds.update_metrics("a", Metrics(waiting_queue_size=1))  # metrics are not a spec change
    ds.set_healthy("a", False)
    ds.replace_all([spec("bb")])
    ds.remove("bb")
    ds.remove("bb")
    assert seen == [
        ("a", spec("a")),
        ("a", spec("a", port=1)),
        ("a", None),
        ("bb", spec("bb")),
        ("bb", None),
    ]
    assert also == ["a", "a", "a", "bb", "bb"]


def test_a_refresh_keeps_metrics_fresh_without_blocking_an_earlier_scrape_from_elsewhere() -> None:
    """Quiet scraping restamps an idle endpoint's metrics (`refresh_metrics`); another worker's scrape
    that began before the restamp but after the last real scrape still replaces them."""
    ds = Datastore()
    ds.upsert(spec("a"))
    ds.update_metrics("a", Metrics(update_time=100.0))  # scraped idle here at 100
    ds.refresh_metrics("a", 100.2)  # quiet ticks since
    assert ds.get("a").metrics.update_time == 100.2  # type: ignore[union-attr]
    assert ds.scraped_at("a") == 100.0  # still the scrape's
    busy = Metrics(waiting_queue_size=3, running_requests_size=2, update_time=100.1)
    assert ds.offer_metrics("a", busy)  # begun at 100.1 by another worker: newer than the last scrape
    assert ds.get("a").metrics.running_requests_size == 2  # type: ignore[union-attr]
    assert ds.scraped_at("a") == 100.1
    assert not ds.offer_metrics("a", Metrics(update_time=100.05))  # older than what is held: dropped
    ds.remove("a")
    assert ds.scraped_at("a") is None


def test_a_scrape_that_began_before_a_failure_does_not_bring_the_endpoint_back() -> None:
    ds = Datastore()
    ds.upsert(EndpointSpec("a", "10.0.0.1", 8000, {}))
    began = ds.health_marks  # a scrape goes out
    ds.set_healthy("a", False)  # meanwhile a request finds the endpoint unreachable
    ds.set_healthy("a", True, seen_after=began)  # the scrape's answer, read before it failed
    assert not ds.is_healthy("a")
    later = ds.health_marks  # the next scrape, begun after the failure
    ds.set_healthy("a", True, seen_after=later)
    assert ds.is_healthy("a")
    ds.set_healthy("a", False)
    ds.set_healthy("a", True)  # evidence without a time (another worker's scrape) counts as before
    assert ds.is_healthy("a")
