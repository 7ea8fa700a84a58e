"""Flow control's metrics, with upstream's names, labels and buckets (llm-d/llm-d-router,
`pkg/epp/metrics`): each as `llm_d_epp_flow_control_*`, and under the deprecated
`inference_extension_flow_control_*` name where upstream still serves one. Queue size and bytes while
requests are held, the time each spent and its outcome, the time admitting it to a queue took,
dispatch cycles, pool saturation by stage, each band's (and all bands') occupancy of its limits, and
the requests leaving, by outcome.

`model_name` and `target_model_name` are both the model served: flow control sees the request after
any rewrite.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from epick.flowcontrol import FlowItem, FlowObserver
from epick.flowcontrol.registry import BandStats
from epick.framework.flowcontrol import FlowKey
from epick.requestcontrol.labels import OTHER, BoundedLabel
from epick.requestcontrol.series import Counters, Gauges, Histograms, View

__all__ = ["CYCLE_BUCKETS", "QUEUE_BUCKETS", "FlowMetrics"]

QUEUE_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
CYCLE_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
NEW = "llm_d_epp_flow_control_"
OLD = "inference_extension_flow_control_"
FLOW = ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name")


def _old(name: str, documentation: str, labels: Sequence[str]) -> list[View]:
    return [View(f"{OLD}{name}", f"Deprecated: use {NEW}{name}. {documentation}", tuple(labels))]


class FlowMetrics(FlowObserver):
    def __init__(
        self, pool: str, registry: CollectorRegistry, *, fairness: BoundedLabel | None = None
    ) -> None:
        self.pool = pool
        self.fairness = fairness if fairness is not None else BoundedLabel(1000)
        r = registry
        doc = "Requests held in the flow-control queues now."
        self._queue_size = Gauges(
            f"{NEW}queue_size", doc, FLOW, registry=r, views=_old("queue_size", doc, FLOW)
        )
        doc = "Bytes of the requests held in the flow-control queues now."
        self._queue_bytes = Gauges(
            f"{NEW}queue_bytes", doc, FLOW, registry=r, views=_old("queue_bytes", doc, FLOW)
        )
        doc = "Seconds requests spent in flow control, from enqueue to their outcome."
        outcomes = ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name")
        self._queue_duration = Histograms(
            f"{NEW}request_queue_duration_seconds", doc, outcomes, buckets=QUEUE_BUCKETS, registry=r,
            views=_old("request_queue_duration_seconds", doc, outcomes),
        )  # fmt: skip
        doc = "Seconds taken to admit a request to a queue."
        enqueue = ("fairness_id", "priority", "outcome")
        self._enqueue_duration = Histograms(
            f"{NEW}request_enqueue_duration_seconds", doc, enqueue, buckets=CYCLE_BUCKETS, registry=r,
            views=_old("request_enqueue_duration_seconds", doc, enqueue),
        )  # fmt: skip
        self._outcomes = Counters(
            f"{NEW}requests", "Requests leaving flow control, by outcome.",
            ("outcome", "priority", "inference_pool"), registry=r,
        )  # fmt: skip
        doc = "Seconds each dispatch cycle took."
        self._cycle = Histograms(
            f"{NEW}dispatch_cycle_duration_seconds", doc, buckets=CYCLE_BUCKETS, registry=r,
            views=_old("dispatch_cycle_duration_seconds", doc, ()),
        )  # fmt: skip
        doc = "Pool saturation by stage (prefill, decode, effective), as dispatch reads it."
        stage = ("inference_pool", "stage")
        self._saturation = Gauges(
            f"{NEW}pool_saturation", doc, stage, registry=r, views=_old("pool_saturation", doc, stage)
        )
        band = ("priority", "inference_pool")
        self._band_requests = Gauges(
            f"{NEW}capacity_utilization_requests",
            "Queued requests over the band's request limit.",
            band,
            registry=r,
        )
        self._band_bytes = Gauges(
            f"{NEW}capacity_utilization_bytes", "Queued bytes over the band's byte limit.", band, registry=r
        )
        self._global_requests = Gauges(
            f"{NEW}global_capacity_utilization_requests", "Queued requests over the global request limit.",
            ("inference_pool",), registry=r,
        )  # fmt: skip
        self._global_bytes = Gauges(
            f"{NEW}global_capacity_utilization_bytes", "Queued bytes over the global byte limit.",
            ("inference_pool",), registry=r,
        )  # fmt: skip

    def _flow_labels(self, item: FlowItem) -> tuple[str, str, str, str, str]:
        key = item.flow_key
        model = item.request.target_model
        return (self.fairness.bound(key.id), str(key.priority), self.pool, model, model)

    def submitted(self, item: FlowItem) -> None:
        labels = self._flow_labels(item)
        self._queue_size.inc(*labels)
        self._queue_bytes.inc(*labels, amount=item.byte_size)

    def finalized(self, item: FlowItem) -> None:
        labels = self._flow_labels(item)
        self._queue_size.inc(*labels, amount=-1)
        self._queue_bytes.inc(*labels, amount=-item.byte_size)
        outcome = item.outcome.value if item.outcome is not None else "NotYetFinalized"
        fairness, priority, pool, model, target = labels
        self._queue_duration.series(fairness, priority, outcome, pool, model, target).observe(item.wait)
        self._outcomes.inc(outcome, priority, pool)

    def enqueued(self, item: FlowItem, seconds: float) -> None:
        outcome = item.outcome.value if item.outcome is not None else "NotYetFinalized"
        key = item.flow_key
        self._enqueue_duration.series(self.fairness.bound(key.id), str(key.priority), outcome).observe(
            seconds
        )

    def saturation(self, stage: str, value: float) -> None:
        self._saturation.set(self.pool, stage, value=value)

    def cycle(self, seconds: float, bands: Sequence[BandStats], stats: tuple[int, int, int, int]) -> None:
        self._cycle.observe(seconds)
        for band in bands:
            priority = str(band.priority)
            if band.max_requests:
                self._band_requests.set(priority, self.pool, value=band.len / band.max_requests)
            if band.max_bytes:
                self._band_bytes.set(priority, self.pool, value=band.byte_size / band.max_bytes)
        length, size, max_requests, max_bytes = stats
        if max_requests:
            self._global_requests.set(self.pool, value=length / max_requests)
        if max_bytes:
            self._global_bytes.set(self.pool, value=size / max_bytes)

    def flows_dropped(self, keys: Sequence[FlowKey]) -> None:
        """A collected flow's series go with it (fairness ids come from clients)."""
        dropped = {(k.id, str(k.priority)) for k in keys if self.fairness.bound(k.id) != OTHER}
        for gauge in (self._queue_size, self._queue_bytes):
            for labels in [labels for labels in gauge.values if labels[:2] in dropped]:
                gauge.drop(*labels)
