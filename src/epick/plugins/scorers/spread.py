"""The min-max normalisation the Go EPP's load scorers share."""

from __future__ import annotations

from collections.abc import Sequence


def lower_is_better(values: Sequence[float]) -> list[float]:
    """(max - v) / (max - min) for each value; 1 for all when they are all equal."""
    if not values:
        return []
    hi = max(values)
    lo = min(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
