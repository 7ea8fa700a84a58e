"""What `epick simulate` prints and writes: the table, why requests failed, the JSON and the plot."""

from __future__ import annotations

import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table


def print_failures(runs: list[dict[str, Any]]) -> None:
    """Why requests failed, per run: the three most frequent reasons."""
    for r in runs:
        reasons = r.get("failure_reasons") or []
        if not reasons:
            continue
        load = f" @ {r['qps']:g}" if r["qps"] is not None else ""
        print(f"{r['policy']}{load}: {r['failed']} failed")
        for reason in reasons[:3]:
            print(f"  {reason['count']} × {reason['reason']}")
        if len(reasons) > 3:
            rest = sum(x["count"] for x in reasons[3:])
            print(f"  … and {rest} more, for other reasons (--json has them all)")


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
    columns += ["hit rate", "load CoV", "goodput/s", "done", "failed"]
    for col in columns:
        table.add_column(col, justify="right")
    for r in runs:
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
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)


_AXIS = {
    "qps": "offered load (requests/s)",
    "concurrency": "concurrency",
    "trace": "(a trace: its own arrival times)",
}


def plot(runs: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r["policy"] for r in runs):
        mine = sorted((r for r in runs if r["policy"] == name), key=lambda r: r["qps"] or 0.0)
        xs = [r["qps"] or 0.0 for r in mine]  # a trace's runs (no load level) at 0
        ax1.plot(xs, [r["ttft_s"]["p90"] for r in mine], marker="o", label=name)
        ax2.plot(xs, [r["output_tokens_per_s"] for r in mine], marker="o", label=name)
    kind = runs[0].get("load_kind", "qps") if runs else "qps"
    for ax, title in ((ax1, "TTFT p90 (s)"), (ax2, "output tokens/s")):
        ax.set_xlabel(_AXIS.get(kind, kind))
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
