"""ext_proc stream metrics (`--enable-grpc-stream-metrics`), as upstream's
(`pkg/epp/metrics/grpc_stream_metrics.go`): streams open now, each stream's lifetime, and streams by
the gRPC status they ended with (its Go name: OK, Canceled, ResourceExhausted, ...)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from epick.framework.metrics import HistogramCounts
from epick.wire.h2 import Status

__all__ = ["StreamMetrics", "code_name"]

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600)


def code_name(status: Status | int) -> str:
    """A gRPC status as Go's `codes.Code.String()` writes it."""
    try:
        name = Status(status).name
    except ValueError:
        return f"Code({int(status)})"
    if name == "CANCELLED":
        return "Canceled"
    return "".join(part.capitalize() for part in name.split("_")).replace("Ok", "OK")


class StreamMetrics(Collector):
    def __init__(self) -> None:
        self.open = 0
        self.durations = HistogramCounts(DURATION_BUCKETS)
        self.ended: dict[str, int] = {}

    def opened(self) -> float:
        self.open += 1
        return time.monotonic()

    def closed(self, since: float, status: Status | int) -> None:
        self.open -= 1
        self.durations.observe(time.monotonic() - since)
        code = code_name(status)
        self.ended[code] = self.ended.get(code, 0) + 1

    def collect(self) -> Iterator[Metric]:
        inflight = GaugeMetricFamily("llm_d_epp_extproc_streams_inflight", "ext_proc streams open now.")
        inflight.add_metric([], float(self.open))
        yield inflight
        duration = HistogramMetricFamily(
            "llm_d_epp_extproc_stream_duration_seconds", "Seconds each ext_proc stream was open."
        )
        sample = self.durations.sample("", "")
        edges = ["+Inf" if b == float("inf") else floatToGoString(b) for b, _ in sample.buckets]  # type: ignore[no-untyped-call]
        duration.add_metric([], list(zip(edges, [c for _, c in sample.buckets], strict=True)), sample.value)
        yield duration
        total = CounterMetricFamily(
            "llm_d_epp_extproc_streams", "ext_proc streams by the status they ended with.", labels=["code"]
        )
        for code, count in self.ended.items():
            total.add_metric([code], float(count))
        yield total
