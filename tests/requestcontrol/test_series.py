"""The request path's counters and histograms expose exactly what prometheus_client's would."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from epick.requestcontrol.metrics import SCHEDULER_BUCKETS, TOKEN_BUCKETS
from epick.requestcontrol.series import Counters, Histograms


def exposition(registry: CollectorRegistry) -> list[str]:
    """The text lines, less prometheus_client's `_created` series."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize("buckets", [SCHEDULER_BUCKETS, TOKEN_BUCKETS], ids=["seconds", "tokens"])
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 2e6)), max_size=60))
def test_histograms_expose_what_prometheus_client_does(
    buckets: tuple[float, ...], observations: list[tuple[str, float]]
) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = Histograms("epick_test_seconds", "doc", ["model"], buckets=buckets, registry=ours)
    reference = Histogram("epick_test_seconds", "doc", ["model"], buckets=buckets, registry=theirs)
    for label, value in observations:
        fast.series(label).observe(value)
        reference.labels(label).observe(value)
    assert exposition(ours) == exposition(theirs)


def test_bucket_edges_count_as_prometheus_counts_them() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = Histograms("edges", "doc", buckets=(1, 2, 4), registry=ours)
    reference = Histogram("edges", "doc", buckets=(1, 2, 4), registry=theirs)
    for value in (0, 1, 1.0000001, 2, 4, 4.5, float("inf")):
        fast.observe(value)
        reference.observe(value)
    assert exposition(ours) == exposition(theirs)


def test_counters_expose_what_prometheus_client_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    fast = Counters("epick_test_requests", "doc", ["model", "code"], registry=ours)
    reference = Counter("epick_test_requests", "doc", ["model", "code"], registry=theirs)
    rng = random.Random(3)
    for _ in range(200):
        labels = (rng.choice(["m1", "m2"]), rng.choice(["ok", "429"]))
        fast.inc(*labels)
        reference.labels(*labels).inc()
    assert exposition(ours) == exposition(theirs)


def test_wrong_label_counts_and_bad_buckets_are_refused() -> None:
    registry = CollectorRegistry()
    h = Histograms("h", "doc", ["a", "b"], buckets=(1, 2), registry=registry)
    with pytest.raises(ValueError, match="label values"):
        h.series("only-one")
    with pytest.raises(ValueError, match="increasing"):
        Histograms("bad", "doc", buckets=(2, 1), registry=registry)
