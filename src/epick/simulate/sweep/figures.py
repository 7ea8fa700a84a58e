"""The figures a sweep compares policies on: where each sits in a run's summary, and which way is
better."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Figure:
    path: tuple[str, ...]  # keys into a run's summary (`epick.simulate.report.summarize`)
    higher_is_better: bool
    label: str  # a table header
    digits: int  # decimals in the table
    percent: bool = False

    def of(self, run: Mapping[str, Any]) -> float:
        value: Any = run
        for key in self.path:
            value = value[key]
        return math.nan if value is None else float(value)

    def text(self, value: float) -> str:
        if math.isnan(value):
            return "–"
        if self.percent:
            return f"{value:.{self.digits}%}"
        return f"{value:,.{self.digits}f}"


FIGURES: dict[str, Figure] = {
    "ttft_p50": Figure(("ttft_s", "p50"), False, "TTFT p50", 3),
    "ttft_p90": Figure(("ttft_s", "p90"), False, "TTFT p90", 3),
    "ttft_p99": Figure(("ttft_s", "p99"), False, "TTFT p99", 3),
    "tpot_p50": Figure(("tpot_s", "p50"), False, "TPOT p50", 4),
    "tpot_p99": Figure(("tpot_s", "p99"), False, "TPOT p99", 4),
    "e2e_p50": Figure(("e2e_s", "p50"), False, "e2e p50", 2),
    "e2e_p99": Figure(("e2e_s", "p99"), False, "e2e p99", 2),
    "output_tokens_per_s": Figure(("output_tokens_per_s",), True, "out tok/s", 0),
    "requests_per_s": Figure(("requests_per_s",), True, "req/s", 2),
    "prefix_cache_hit_rate": Figure(("prefix_cache_hit_rate",), True, "hit rate", 1, percent=True),
    "load_cov": Figure(("load_cov",), False, "load CoV", 2),
    "goodput": Figure(("goodput",), True, "goodput/s", 2),
    "goodput_share": Figure(("goodput_share",), True, "goodput share", 1, percent=True),
    "failed": Figure(("failed",), False, "failed", 1),
}
DEFAULT_METRIC = "ttft_p90"
# The columns of a table with intervals (the rest are in the JSON).
TABLE_FIGURES = (
    "ttft_p50",
    "ttft_p90",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "e2e_p50",
    "output_tokens_per_s",
    "prefix_cache_hit_rate",
    "goodput",
    "failed",
)


def better(name: str, a: float, b: float) -> bool:
    """Whether `a` is strictly better than `b` on figure `name` (NaN is worse than any number)."""
    if math.isnan(a):
        return False
    if math.isnan(b):
        return True
    return a > b if FIGURES[name].higher_is_better else a < b
