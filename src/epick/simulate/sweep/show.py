"""What a sweep prints: each policy's figures at each point with their 95% intervals, the best policy
per point and where it changes, and why requests failed."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from epick.simulate.sweep.aggregate import POINT_FIELDS, group
from epick.simulate.sweep.figures import FIGURES, TABLE_FIGURES

_MARKS = {"best": " *", "within noise": " ≈"}
LEGEND = (
    "mean ± half-width of the 95% interval over the seeds; * best at its point; "
    "≈ within the noise of the best (the interval of the per-seed differences holds 0)"
)


def _load(row: dict[str, Any]) -> str:
    if row["qps"] is None:
        return "trace"
    return f"{row['qps']:g}" + (" conc" if row["load_kind"] == "concurrency" else "")


_AXIS_COLUMNS = {"workload": "workload", "servers": "servers", "engine_profile": "engine"}


def varying(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The point fields that take more than one value (the load is always shown)."""
    return [f for f in ("workload", "servers", "engine_profile") if len({r[f] for r in rows}) > 1]


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else 200)


def print_stats(stats: Sequence[dict[str, Any]]) -> None:
    """One row per point and policy; each figure its mean, and under it ± the interval's half-width."""
    axes = varying(stats)
    table = Table(title="epick simulate (virtual time; latencies in seconds)")
    for f in axes:
        table.add_column(_AXIS_COLUMNS[f])
    table.add_column("load", justify="right")
    table.add_column("policy")
    for name in TABLE_FIGURES:
        table.add_column(FIGURES[name].label, justify="right")
    seeds = max((len(s["seeds"]) for s in stats), default=1)
    for row in stats:
        cells = []
        for name in TABLE_FIGURES:
            entry = row["figures"][name]
            figure = FIGURES[name]
            text = figure.text(_nan(entry["mean"]))
            if entry["ci95"] is not None:
                text += "\n±" + figure.text((entry["ci95"][1] - entry["ci95"][0]) / 2)
            elif seeds > 1:
                text += "\nn/a"
            cells.append(text + _MARKS.get(entry["vs_best"] or "", ""))
        table.add_row(*(str(row[f]) for f in axes), _load(row), row["policy"], *cells)
    console = _console()
    console.print(table)
    if seeds > 1:
        console.print(f"{seeds} seeds per cell: " + LEGEND, highlight=False)
    else:
        console.print(
            "1 seed per cell: no intervals (n/a; --seeds 2 or more); * best at its point", highlight=False
        )


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def print_summary(summary: dict[str, Any]) -> None:
    """The best policy at each point, by the summary's metric, and the flips."""
    metric = summary["metric"]
    figure = FIGURES[metric]
    points = summary["points"]
    axes = varying(points)
    table = Table(
        title=f"best policy per point, by {metric} "
        f"({'higher' if figure.higher_is_better else 'lower'} is better)"
    )
    for f in axes:
        table.add_column(_AXIS_COLUMNS[f])
    table.add_column("load", justify="right")
    for col in ("best", metric, "within the noise of the best"):
        table.add_column(col, justify="right" if col == metric else "left")
    for p in points:
        estimate = p[metric]
        text = figure.text(_nan(estimate["mean"]))
        if estimate["ci95"] is not None:
            text += " ± " + figure.text((estimate["ci95"][1] - estimate["ci95"][0]) / 2)
        table.add_row(
            *(str(p[f]) for f in axes),
            _load(p),
            p["best"],
            text,
            ", ".join(p["within_noise_of_best"]) or "–",
        )
    console = _console()
    console.print(table)
    flips = summary["flips"]
    noise = [f for f in flips if f["within_noise"]]
    for flip in flips:
        if flip in noise:
            continue
        where = ", ".join(
            f"{'load' if k == 'qps' else k} {_value(v)}"
            for k, v in flip["where"].items()
            if k != "load_kind" and _shown(k, points)
        )
        console.print(
            f"flip along {flip['axis']}: {_value(flip['from'])} → {_value(flip['to'])}"
            + (f" ({where})" if where else "")
            + f": {flip['best_before']} → {flip['best_after']}"
            + (" (one seed: the noise is unknown)" if flip["within_noise"] is None else ""),
            highlight=False,
        )
    if noise:
        console.print(
            f"{len(noise)} flip{'s' * (len(noise) > 1)} within the noise, not listed: there the old best "
            "is within the noise of the new (--json lists them)",
            highlight=False,
        )
    if not flips:
        console.print("the best policy is the same at every point", highlight=False)


def _value(v: Any) -> str:
    return "–" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _shown(field: str, points: Sequence[dict[str, Any]]) -> bool:
    return len({p[field] for p in points}) > 1


def print_failures(runs: Sequence[dict[str, Any]]) -> None:
    """Why requests failed, per point and policy over its seeds: the three most frequent reasons."""
    for point, policies in group(runs).items():
        fields = dict(zip(POINT_FIELDS, point, strict=True))
        for policy, mine in policies.items():
            reasons: dict[str, int] = {}
            for r in mine:
                for reason in r.get("failure_reasons") or []:
                    reasons[reason["reason"]] = reasons.get(reason["reason"], 0) + reason["count"]
            if not reasons:
                continue
            ordered = sorted(reasons.items(), key=lambda item: -item[1])
            where = " ".join(str(fields[f]) for f in varying(runs))
            load = f" @ {fields['qps']:g}" if fields["qps"] is not None else ""
            seeds = f" over {len(mine)} seeds" if len(mine) > 1 else ""
            failed = sum(r["failed"] for r in mine)
            print(f"{policy}{load}{' ' + where if where else ''}: {failed} failed{seeds}")
            for reason, count in ordered[:3]:
                print(f"  {count} × {reason}")
            if len(ordered) > 3:
                rest = sum(count for _, count in ordered[3:])
                print(f"  … and {rest} more, for other reasons (--json has them all)")
