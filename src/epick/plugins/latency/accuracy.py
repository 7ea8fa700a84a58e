"""How a predictor's predictions compared with what the responses showed, per target (TTFT, TPOT),
as the producer reports it to /metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from epick.framework.metrics import LLMD_SUBSYSTEM, HistogramCounts, MetricSample


@dataclass(slots=True)
class Accuracy:
    """How one target's predictions compared with what the responses showed (for the metrics)."""

    responses: int = 0  # responses observed
    predicted: int = 0  # of them, those a prediction was made for (predictInProduce)
    actual_ms: float = 0.0  # sum of observed latencies
    predicted_ms: float = 0.0  # sum of the predictions made for them
    absolute_error_ms: float = 0.0  # sum of |predicted − observed|
    objective_misses: int = 0  # responses slower than the request's objective (when it set one)

    def add(self, actual: float, predicted: float | None, objective: float) -> None:
        self.responses += 1
        self.actual_ms += actual
        if predicted is not None:
            self.predicted += 1
            self.predicted_ms += predicted
            self.absolute_error_ms += abs(predicted - actual)
        if objective > 0 and actual > objective:
            self.objective_misses += 1


# The accuracy counters, per target (ttft, tpot): name, documentation, value.
ACCURACY_COUNTERS: tuple[tuple[str, str, Callable[[Accuracy], float]], ...] = (
    ("responses", "Responses the predictor learned from", lambda a: a.responses),
    ("predicted_responses", "Of them, those a prediction was made for", lambda a: a.predicted),
    ("actual_milliseconds", "Sum of the observed latencies", lambda a: a.actual_ms),
    ("predicted_milliseconds", "Sum of the latencies predicted for them", lambda a: a.predicted_ms),
    ("absolute_error_milliseconds", "Sum of |predicted - observed|", lambda a: a.absolute_error_ms),
    (
        "objective_misses",
        "Responses slower than the request's latency objective",
        lambda a: a.objective_misses,
    ),
)


# Upstream's predicted-latency families (predictedlatency/metrics.go): their buckets.
LATENCY_BUCKETS = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20,
                   30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)  # fmt: skip
TPOT_BUCKETS = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4,
                0.5, 0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270,
                360)  # fmt: skip


class LatencyFamilies:
    """Per model, what the responses showed and what was predicted for them, as upstream's
    predicted-latency producer reports it: the observed TTFT and TPOT (`inference_objective_request_
    {ttft,tpot}_seconds`), the predictions (`..._predicted_{ttft,tpot}_seconds`, also under
    `llm_d_epp_request_predicted_*` with the plugin's labels) and objectives missed
    (`..._slo_violation_total` by type). epick knows the model served, so `model_name` and
    `target_model_name` are both that."""

    def __init__(self) -> None:
        self.actual: dict[tuple[str, str], HistogramCounts] = {}
        self.predicted: dict[tuple[str, str], HistogramCounts] = {}
        self.violations: dict[tuple[str, str], int] = {}

    def observe(
        self, model: str, what: str, actual_ms: float, predicted_ms: float | None, objective_ms: float
    ) -> None:
        buckets = LATENCY_BUCKETS if what == "ttft" else TPOT_BUCKETS
        key = (model, what)
        self.actual.setdefault(key, HistogramCounts(buckets)).observe(actual_ms / 1000.0)
        if predicted_ms is not None:
            self.predicted.setdefault(key, HistogramCounts(buckets)).observe(predicted_ms / 1000.0)
        if objective_ms > 0 and actual_ms > objective_ms:
            self.violations[key] = self.violations.get(key, 0) + 1

    def samples(self) -> Iterator[MetricSample]:
        for (model, what), counts in self.actual.items():
            labels = (("model_name", model), ("target_model_name", model))
            doc = f"Observed {what.upper()} of the responses, in seconds."
            yield counts.sample(
                f"inference_objective_request_{what}_seconds", doc, labels, plugin_labels=False
            )
        for (model, what), counts in self.predicted.items():
            labels = (("model_name", model), ("target_model_name", model))
            doc = f"Predicted {what.upper()} of the requests dispatched, in seconds."
            yield counts.sample(f"{LLMD_SUBSYSTEM}_request_predicted_{what}_seconds", doc, labels)
            yield counts.sample(
                f"inference_objective_request_predicted_{what}_seconds", doc, labels, plugin_labels=False
            )
        for (model, what), count in self.violations.items():
            typed = (("model_name", model), ("target_model_name", model), ("type", what))
            doc = "Responses slower than the request's objective."
            yield MetricSample(f"{LLMD_SUBSYSTEM}_request_slo_violation", doc, "counter", float(count), typed)
            yield MetricSample(
                "inference_objective_request_slo_violation",
                doc,
                "counter",
                float(count),
                typed,
                plugin_labels=False,
            )
