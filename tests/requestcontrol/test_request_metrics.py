"""The request families' values: running requests back to 0 however a request ends, TTFT, gaps between
chunks, TPOT and response sizes, on a clock the test moves; and the cap on client-given label values."""

from __future__ import annotations

import json

import pytest

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.framework import Metrics, Response, Usage
from epick.requestcontrol.director import Director
from epick.requestcontrol.metrics import LABEL_VALUES, EppMetrics
from tests.requestcontrol.test_metrics import Scrape

LABELS = {"model_name": "m", "target_model_name": "m", "fairness_id": "default-flow", "priority": "0"}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup() -> tuple[Director, EppMetrics, Clock]:
    ds = Datastore()
    for i in range(2):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i}", 8000, {}))
        ds.update_metrics(f"ep{i}", Metrics(waiting_queue_size=i))
    clock = Clock()
    holder: list[Director] = []
    metrics = EppMetrics("pool", ds, lambda: holder[0].config)
    director = Director(load_default_config(seed=1), ds.snapshot, observer=metrics, clock=clock)
    holder.append(director)
    return director, metrics, clock


def body(stream: bool, **extra: object) -> bytes:
    return json.dumps({"model": "m", "prompt": "hello", "stream": stream, **extra}).encode()


def test_a_streamed_response_records_ttft_gaps_tpot_size_and_running() -> None:
    d, metrics, clock = setup()
    cycle = d.decide(body(True), {}, "/v1/completions")
    ep = cycle.targets[0]
    assert Scrape(metrics).value("llm_d_epp_request_running", **LABELS) == 1
    clock.now += 0.5
    cycle.received(Response(cycle.request.request_id, status=200, streaming=True), ep)
    for gap, chunk in ((0.25, b"data: a\n\n"), (0.1, b"data: bb\n\n"), (0.1, b"data: ccc\n\n")):
        clock.now += gap
        cycle.streamed(Response(cycle.request.request_id, streaming=True, chunk=chunk), ep)
    clock.now += 0.05
    cycle.completed(Response(cycle.request.request_id, end_of_stream=True, usage=Usage(5, 3)), ep)
    s = Scrape(metrics)
    assert s.value("llm_d_epp_request_running", **LABELS) == 0
    assert s.value("llm_d_epp_request_ttft_seconds_sum", **LABELS, streaming="true") == pytest.approx(0.75)
    assert s.value("llm_d_epp_request_streaming_itl_seconds_count", **LABELS) == 2
    assert s.value("llm_d_epp_request_streaming_itl_seconds_sum", **LABELS) == pytest.approx(0.2)
    assert s.value("llm_d_epp_request_duration_seconds_sum", **LABELS) == pytest.approx(1.0)
    assert s.value("llm_d_epp_request_streaming_tpot_seconds_sum", **LABELS) == pytest.approx(0.25 / 2)
    assert s.value("llm_d_epp_response_size_bytes_sum", **LABELS) == len(
        b"data: a\n\ndata: bb\n\ndata: ccc\n\n"
    )


def test_a_response_whose_body_was_never_seen_records_no_size_nor_ttft() -> None:
    d, metrics, clock = setup()
    cycle = d.decide(body(False), {}, "/v1/completions")
    ep = cycle.targets[0]
    cycle.received(Response(cycle.request.request_id, status=200), ep)
    clock.now += 1
    cycle.completed(Response(cycle.request.request_id, end_of_stream=True), ep)
    s = Scrape(metrics)
    assert s.value("llm_d_epp_request_duration_seconds_count", **LABELS) == 1
    assert s.value("llm_d_epp_response_size_bytes_count", **LABELS) == 0
    assert s.value("llm_d_epp_request_ttft_seconds_count", **LABELS, streaming="false") == 0


def test_running_returns_to_zero_however_the_request_ends() -> None:
    d, metrics, _ = setup()
    ended = d.decide(body(False), {}, "/v1/completions")
    ended.end("client left")  # every attempt failed, or the client went away
    retried = d.decide(body(False), {}, "/v1/completions")
    retried.reschedule(frozenset({retried.targets[0].name}))  # decided again: counted once
    retried.completed(Response(retried.request.request_id, status=0, error="broke off"), retried.targets[0])
    s = Scrape(metrics)
    assert s.value("llm_d_epp_request_running", **LABELS) == 0
    assert s.value("llm_d_epp_request_total", **LABELS) == 2


def test_client_given_label_values_are_capped() -> None:
    d, metrics, _ = setup()
    for i in range(LABEL_VALUES + 20):
        d.decide(body(False), {"x-gateway-inference-fairness-id": f"tenant-{i}"}, "/v1/completions")
    s = Scrape(metrics)
    ids = {ls["fairness_id"] for ls in s.labelsets("llm_d_epp_request_total")}
    assert len(ids) == LABEL_VALUES + 1 and "other" in ids
    assert s.value("llm_d_epp_request_total", fairness_id="other") == 20


def test_latencies_count_from_when_the_request_arrived() -> None:
    """A front end passes when the headers came: the body's upload and parsing count in the TTFT."""
    d, metrics, clock = setup()
    arrived = clock.now
    clock.now += 0.4  # the body took this long to arrive and be read
    cycle = d.decide(body(True), {}, "/v1/completions", arrived=arrived)
    ep = cycle.targets[0]
    clock.now += 0.1
    cycle.streamed(Response(cycle.request.request_id, streaming=True, chunk=b"data: a\n\n"), ep)
    cycle.completed(Response(cycle.request.request_id, end_of_stream=True), ep)
    s = Scrape(metrics)
    assert s.value("llm_d_epp_request_ttft_seconds_sum", **LABELS, streaming="true") == pytest.approx(0.5)
