"""What `epick simulate` prints and writes without a grid or seeds: the table; and the JSON's numbers
(the sweep's failures, statistics and plot are in epick.simulate.sweep)."""

from __future__ import annotations

import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table


def finite(value: Any) -> Any:
    """NaN (a percentile of nothing) becomes null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def print_table(runs: list[dict[str, Any]]) -> None:
    table = Table(title="epick simulate (virtual time; latencies in seconds)")
    columns = ["policy", "load", "TTFT p50", "p90", "p99", "TPOT p50", "p99", "e2e p50", "out tok/s", "req/s"]
    columns += ["hit rate", "load CoV", "goodput/s", "done", "failed", "scrapes/s per server"]
    for col in columns:
        table.add_column(col, justify="right")
    for r in runs:
        scrapes = r.get("scrapes_per_server_s")
        table.add_row(
            r["policy"],
            f"{r['qps']:g}" if r["qps"] is not None else "trace",
            *(f"{r['ttft_s'][k]:.3f}" for k in ("p50", "p90", "p99")),
            *(f"{r['tpot_s'][k]:.4f}" for k in ("p50", "p99")),
            f"{r['e2e_s']['p50']:.2f}",
            f"{r['output_tokens_per_s']:,.0f}",
            f"{r['requests_per_s']:.2f}",
            f"{r['prefix_cache_hit_rate']:.1%}",
            f"{r['load_cov']:.2f}",
            f"{r['goodput']:.2f}",
            str(r["completed"]),
            str(r["failed"]),
            "per decision" if scrapes is None else f"{scrapes:.1f}",
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
