"""How a predictor's predictions compared with what the responses showed, per target (TTFT, TPOT),
as the producer reports it to /metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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
