"""A request's OpenTelemetry spans, named as the Go EPP names them (llm-d-router
`pkg/epp/handlers/server.go`, `requestcontrol/director.go`, `scheduling/scheduler_profile.go`):

- `gateway.request` (server): the request from its arrival to the end of its response, a child of the
  W3C trace context its headers carry (`traceparent`, `tracestate`, `baggage`);
- `gateway.request_orchestration` (server): admission and the decision, with `target_model` and
  `request_prio`;
- one span per plugin call of the decision, made from the scheduler's timings: `filter_endpoints`,
  `llm_d.epp.scorer.<type>` and `pick_endpoints`, each with the plugin's type and name (upstream makes one
  filter span per profile and a `llm_d.epp.scoring` span around its scorers; epick times each call);

and the decision's trace context goes on to the model server in the forwarded request's headers.
Nothing here runs without a tracer (`--tracing`): the director holds None then.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from epick.framework import InferenceRequest, Plugin

__all__ = ["RequestTracing"]

_PLUGIN_SPANS = {"Filter": "filter_endpoints", "Picker": "pick_endpoints"}


class RequestTracing:
    """Spans for requests, from a tracer of the service's provider."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    def request_span(self, request: InferenceRequest) -> trace.Span:
        """`gateway.request`, a child of the trace context the request's headers carry."""
        parent = propagate.extract(dict(request.headers))
        span = self.tracer.start_span("gateway.request", context=parent, kind=SpanKind.SERVER)
        if span.is_recording():
            span.set_attribute("gen_ai.request.id", request.request_id)
            span.set_attribute("gen_ai.request.model", request.target_model)
        return span

    @contextmanager
    def orchestration(self, parent: trace.Span, request: InferenceRequest) -> Iterator[trace.Span]:
        """`gateway.request_orchestration` under `parent`, current while the decision runs (the plugin
        spans hang from it)."""
        with self.tracer.start_as_current_span(
            "gateway.request_orchestration",
            context=trace.set_span_in_context(parent),
            kind=SpanKind.SERVER,
            attributes={"target_model": request.target_model, "request_prio": request.priority},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    def plugin_call(self, extension_point: str, plugin: Plugin, seconds: float) -> None:
        """A plugin call that took `seconds` and just ended, as a span of the current decision."""
        current = trace.get_current_span()
        if not current.is_recording():
            return
        kind = plugin.typed_name.type
        name = _PLUGIN_SPANS.get(extension_point) or (
            f"llm_d.epp.scorer.{kind}"
            if extension_point == "Scorer"
            else f"llm_d.epp.{extension_point.lower()}.{kind}"
        )
        end = time.time_ns()
        span = self.tracer.start_span(
            name,
            start_time=end - int(seconds * 1e9),
            attributes={"llm_d.epp.plugin.type": kind, "llm_d.epp.plugin.name": plugin.typed_name.name},
        )
        span.end(end_time=end)

    @staticmethod
    def inject(span: trace.Span, headers: dict[str, str]) -> None:
        """The span's trace context into `headers` (what the model server gets)."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span, otel_context.Context()))
        headers.update(carrier)

    @staticmethod
    def end(span: trace.Span, error: str | None, status: int = 0) -> None:
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        elif status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        span.end()

    @staticmethod
    def refused(span: trace.Span, code: str, message: str) -> None:
        span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"))


class TracedTimer:
    """The scheduler's plugin timer that also makes each call a span (beside the metrics' timer)."""

    def __init__(self, timer: Any, tracing: RequestTracing) -> None:
        self.timer = timer
        self.tracing = tracing

    def observe(self, extension_point: str, plugin: Plugin, seconds: float) -> None:
        self.timer.observe(extension_point, plugin, seconds)
        self.tracing.plugin_call(extension_point, plugin, seconds)
