"""`--tracing`: each request's spans as the Go EPP names them, their parents, the trace context in and
out, and the sampler and exporter chosen from the OTEL_* environment."""

from __future__ import annotations

import json

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.framework import Metrics, Response
from epick.requestcontrol.director import Director
from epick.requestcontrol.tracing import TracedTimer
from epick.service.tracing import _exporter, _sampler, tracing_from_environment

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ALWAYS = {"OTEL_TRACES_SAMPLER_ARG": "1"}


def traced(endpoints: int = 2) -> tuple[Director, InMemorySpanExporter, object]:
    exporter = InMemorySpanExporter()
    setup = tracing_from_environment(ALWAYS, exporter=exporter)
    ds = Datastore()
    for i in range(endpoints):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i}", 8000, {}))
        ds.update_metrics(f"ep{i}", Metrics(waiting_queue_size=i))
    config = load_default_config(seed=1)

    class NoTimer:
        def observe(self, *args: object) -> None:
            pass

    config.scheduler.timer = TracedTimer(NoTimer(), setup.tracing)
    director = Director(config, ds.snapshot)
    director.tracing = setup.tracing
    return director, exporter, setup


def test_a_request_makes_upstreams_spans_under_the_callers_trace() -> None:
    director, exporter, setup = traced()
    body = json.dumps({"model": "m", "prompt": "hello"}).encode()
    cycle = director.decide(body, {"traceparent": PARENT}, "/v1/completions")
    endpoint = cycle.targets[0]
    cycle.received(Response(cycle.request.request_id, status=200), endpoint)
    cycle.completed(Response(cycle.request.request_id, end_of_stream=True), endpoint)
    setup.provider.force_flush()  # type: ignore[attr-defined]
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert {"gateway.request", "gateway.request_orchestration", "pick_endpoints"} <= set(spans)
    assert any(name.startswith("llm_d.epp.scorer.") for name in spans)
    request = spans["gateway.request"]
    assert format(request.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"  # the caller's
    orchestration = spans["gateway.request_orchestration"]
    assert orchestration.parent is not None and orchestration.parent.span_id == request.context.span_id
    assert orchestration.attributes["target_model"] == "m"
    assert spans["pick_endpoints"].parent.span_id == orchestration.context.span_id  # type: ignore[union-attr]
    # the model server's request carries the trace on
    carried = cycle.result.forwarded_headers["traceparent"]
    assert carried.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"


def test_a_refused_request_ends_its_span_as_an_error() -> None:
    director, exporter, setup = traced()
    body = json.dumps({"model": "m", "prompt": "x"}).encode()
    director.candidates = lambda: director.candidates.__self__ if False else Datastore().snapshot()  # type: ignore[method-assign]
    try:
        director.decide(body, {}, "/v1/completions")
    except Exception as e:
        assert "no" in str(e)
    setup.provider.force_flush()  # type: ignore[attr-defined]
    [request] = [s for s in exporter.get_finished_spans() if s.name == "gateway.request"]
    assert not request.status.is_ok


def test_the_environment_chooses_the_sampler_and_exporter() -> None:
    assert "TraceIdRatioBased{0.1}" in _sampler({}).get_description()
    assert "TraceIdRatioBased{0.5}" in _sampler({"OTEL_TRACES_SAMPLER_ARG": "0.5"}).get_description()
    assert "TraceIdRatioBased{0.1}" in _sampler({"OTEL_TRACES_SAMPLER": "always_on"}).get_description()
    assert type(_exporter({})).__name__ == "ConsoleSpanExporter"
    assert type(_exporter({"OTEL_TRACES_EXPORTER": "otlp"})).__name__ == "OTLPSpanExporter"
