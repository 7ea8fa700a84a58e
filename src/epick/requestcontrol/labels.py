"""Label values that come from clients (model names, fairness ids), bounded: the first `limit`
distinct values are kept as they are, later ones share the value "other" (upstream's cardinality
caps, llm-d-router pkg/epp/metrics/cardinality.go; `epp --fairness-id-metric-label-limit`)."""

from __future__ import annotations

OTHER = "other"


class BoundedLabel:
    """One label's values, at most `limit` distinct ones kept (0: every value is OTHER)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def bound(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value
