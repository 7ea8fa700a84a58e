"""`--tracing`: the OpenTelemetry SDK set up as the Go EPP sets it up
(llm-d-router `pkg/common/observability/tracing/telemetry.go`), from the environment its charts set.

- Exporter: `OTEL_TRACES_EXPORTER=otlp` sends spans over OTLP/gRPC, to `OTEL_EXPORTER_OTLP_ENDPOINT`
  (and the SDK's other `OTEL_EXPORTER_OTLP_*` variables), or to `localhost:4317` in plaintext when none
  of the endpoint, insecure and certificate variables is set. Anything else writes them to stdout as
  JSON (upstream's default "console").
- Sampler: `OTEL_TRACES_SAMPLER` `parentbased_traceidratio` (the only one upstream takes; another is
  logged and replaced by it) with `OTEL_TRACES_SAMPLER_ARG`, 0.1 by default or when unreadable.
- Resource: `service.name` "llm-d-epp" and `service.version`, under `OTEL_SERVICE_NAME` and
  `OTEL_RESOURCE_ATTRIBUTES`.
- Propagation: W3C trace context and baggage (the SDK's default propagators).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from epick import __version__
from epick.requestcontrol.tracing import RequestTracing

__all__ = ["TracingSetup", "tracing_from_environment"]

log = logging.getLogger(__name__)

SERVICE_NAME = "llm-d-epp"
DEFAULT_RATIO = 0.1
_LOCAL_COLLECTOR_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
)


class TracingSetup:
    """The provider and what the director uses; `shutdown()` flushes the spans still queued."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracing = RequestTracing(provider.get_tracer("llm-d-router", __version__))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _sampler(environ: Mapping[str, str]) -> ParentBased:
    kind = environ.get("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    if kind != "parentbased_traceidratio":
        log.error("unsupported sampler type: %s, fallback to parentbased_traceidratio with 0.1 Ratio", kind)
        return ParentBased(TraceIdRatioBased(DEFAULT_RATIO))
    try:
        ratio = float(environ.get("OTEL_TRACES_SAMPLER_ARG", DEFAULT_RATIO))
    except ValueError:
        ratio = DEFAULT_RATIO
    return ParentBased(TraceIdRatioBased(ratio))


def _exporter(environ: Mapping[str, str]) -> SpanExporter:
    if environ.get("OTEL_TRACES_EXPORTER") != "otlp":
        return ConsoleSpanExporter(out=sys.stdout)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if not any(environ.get(name) for name in _LOCAL_COLLECTOR_VARIABLES):
        return OTLPSpanExporter(endpoint="localhost:4317", insecure=True)
    return OTLPSpanExporter()


def tracing_from_environment(
    environ: Mapping[str, str] | None = None, exporter: SpanExporter | None = None
) -> TracingSetup:
    """The tracing the environment asks for (`exporter` replaces the one it names: tests)."""
    env = os.environ if environ is None else environ
    resource = Resource.create({"service.name": SERVICE_NAME, "service.version": __version__})
    provider = TracerProvider(resource=resource, sampler=_sampler(env))
    provider.add_span_processor(BatchSpanProcessor(exporter or _exporter(env)))
    return TracingSetup(provider)
