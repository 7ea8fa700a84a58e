"""`epick simulate --plot`: TTFT p90 and output throughput against load, one line per policy (and per
workload, fleet size and engine when those vary), each point its mean over the seeds with its 95%
interval drawn as an error bar."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from epick.simulate.sweep.show import varying

_AXIS = {
    "qps": "offered load (requests/s)",
    "concurrency": "concurrency",
    "trace": "(a trace: its own arrival times)",
}


def _series(row: dict[str, Any], axes: list[str]) -> str:
    return " ".join([row["policy"], *(str(row[f]) for f in axes)])


def _errors(rows: list[dict[str, Any]], figure: str) -> list[list[float]] | None:
    """Below and above each mean, for matplotlib; None when no point has an interval."""
    if all(r["figures"][figure]["ci95"] is None for r in rows):
        return None
    low, high = [], []
    for r in rows:
        entry = r["figures"][figure]
        if entry["ci95"] is None or entry["mean"] is None:
            low.append(0.0)
            high.append(0.0)
        else:
            low.append(entry["mean"] - entry["ci95"][0])
            high.append(entry["ci95"][1] - entry["mean"])
    return [low, high]


def _mean(r: dict[str, Any], figure: str) -> float:
    value = r["figures"][figure]["mean"]
    return math.nan if value is None else float(value)


def plot(stats: Sequence[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = varying(stats)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(_series(r, axes) for r in stats):
        mine = sorted((r for r in stats if _series(r, axes) == name), key=lambda r: r["qps"] or 0.0)
        xs = [r["qps"] or 0.0 for r in mine]  # a trace's runs (no load level) at 0
        for ax, figure in ((ax1, "ttft_p90"), (ax2, "output_tokens_per_s")):
            ys = [_mean(r, figure) for r in mine]
            ax.errorbar(xs, ys, yerr=_errors(mine, figure), marker="o", capsize=3, label=name)
    kind = stats[0]["load_kind"] if stats else "qps"
    for ax, title in ((ax1, "TTFT p90 (s)"), (ax2, "output tokens/s")):
        ax.set_xlabel(_AXIS.get(kind, kind))
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
