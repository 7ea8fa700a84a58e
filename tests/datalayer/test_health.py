"""Outlier detection and unreachable endpoints, on a fake clock: who is ejected, for how long, and
how many at once."""

from __future__ import annotations

import pytest

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.health import EndpointHealth, OutlierPolicy


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool(n: int, clock: Clock) -> Datastore:
    ds = Datastore(clock=clock)
    ds.replace_all(EndpointSpec(f"e{i}", "10.0.0.1", 8000 + i, {}) for i in range(n))
    return ds


def candidates(ds: Datastore) -> list[str]:
    return [ep.name for ep in ds.snapshot()]


def test_consecutive_failures_eject_for_a_growing_time_and_successes_reset_the_run() -> None:
    clock = Clock()
    ds = pool(10, clock)
    health = EndpointHealth(
        ds, OutlierPolicy(consecutive_failures=3, base_ejection_s=10, max_ejection_s=25), clock
    )
    health.failed("e0", "answered 503")
    health.failed("e0", "answered 503")
    health.answered("e0", 200)  # the run is broken
    health.answered("e0", 503)
    health.answered("e0", 502)
    assert "e0" in candidates(ds)
    health.answered("e0", 504)  # three in a row
    assert "e0" not in candidates(ds) and ds.is_ejected("e0")
    clock.now += 9.9
    assert "e0" not in candidates(ds)
    clock.now += 0.2  # 10 s: back
    assert "e0" in candidates(ds)
    for _ in range(3):
        health.failed("e0", "no response within 1s")
    clock.now += 19.9
    assert "e0" not in candidates(ds)  # the second ejection in a row lasts 2 x 10 s
    clock.now += 0.2
    assert "e0" in candidates(ds)
    for _ in range(3):
        health.failed("e0", "answered 503")
    clock.now += 24.9
    assert "e0" not in candidates(ds)  # 3 x 10 s, capped at 25 s
    clock.now += 0.2
    assert "e0" in candidates(ds)


def test_clean_time_brings_the_ejection_time_back_down() -> None:
    clock = Clock()
    ds = pool(10, clock)
    health = EndpointHealth(
        ds, OutlierPolicy(consecutive_failures=1, base_ejection_s=10, max_ejection_s=100), clock
    )
    health.failed("e1", "answered 503")
    health.failed("e1", "answered 503")  # ejected twice: 10 s, then 20 s
    clock.now += 10 + 20 + 20  # back for 20 s (two base periods) and answering well
    health.succeeded("e1")
    health.failed("e1", "answered 503")
    clock.now += 10.1  # the count went 2 -> 0, so this ejection is 10 s again
    assert "e1" in candidates(ds)


def test_at_most_the_allowed_share_is_ejected_but_always_one() -> None:
    clock = Clock()
    health_of = lambda ds: EndpointHealth(ds, OutlierPolicy(consecutive_failures=1), clock)  # noqa: E731
    small = pool(3, clock)
    health = health_of(small)
    for name in ("e0", "e1"):
        health.failed(name, "answered 503")
    assert candidates(small) == ["e1", "e2"]  # 10% of 3 rounds to 0, but one may always go
    big = pool(20, clock)
    health = health_of(big)
    for i in range(5):
        health.failed(f"e{i}", "answered 503")
    assert len(candidates(big)) == 18  # 10% of 20


def test_an_unreachable_endpoint_leaves_until_its_metrics_answer() -> None:
    clock = Clock()
    ds = pool(2, clock)
    EndpointHealth(ds, clock=clock).unreachable("e1", "cannot connect")
    assert candidates(ds) == ["e0"]
    ds.set_healthy("e1", True)  # what the scraper does when a scrape succeeds
    assert candidates(ds) == ["e0", "e1"]


def test_a_removed_endpoint_takes_its_ejection_along() -> None:
    clock = Clock()
    ds = pool(2, clock)
    EndpointHealth(ds, OutlierPolicy(consecutive_failures=1), clock).failed("e1", "answered 503")
    ds.remove("e1")
    ds.upsert(EndpointSpec("e1", "10.0.0.1", 8001, {}))
    assert candidates(ds) == ["e0", "e1"] and ds.ejected_count() == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"consecutive_failures": -1}, {"base_ejection_s": 0}, {"base_ejection_s": 50, "max_ejection_s": 10},
     {"max_ejection_percent": 101}],
)  # fmt: skip
def test_bad_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        OutlierPolicy(**kwargs)  # type: ignore[arg-type]


def test_zero_consecutive_failures_turns_outlier_detection_off() -> None:
    clock = Clock()
    ds = pool(2, clock)
    health = EndpointHealth(ds, OutlierPolicy(consecutive_failures=0), clock)
    for _ in range(20):
        health.answered("e0", 503)
        health.failed("e0", "no first byte")
    assert ds.ejected_count() == 0 and candidates(ds) == ["e0", "e1"]


def test_answers_the_request_may_have_caused_never_eject() -> None:
    """A 500 (a body that is not what its Content-Encoding says, a prompt too long) is the request's
    doing as often as the server's: any number of them ejects nothing, and breaks a run of gateway
    failures."""
    clock = Clock()
    ds = pool(10, clock)
    health = EndpointHealth(ds, OutlierPolicy(consecutive_failures=3), clock)
    for status in (500, 500, 500, 500, 400, 413, 500, 501):
        health.answered("e0", status)
    assert "e0" in candidates(ds) and not ds.is_ejected("e0")
    health.answered("e0", 503)
    health.answered("e0", 503)
    health.answered("e0", 500)
    health.answered("e0", 503)
    assert "e0" in candidates(ds)
