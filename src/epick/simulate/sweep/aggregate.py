"""A sweep's runs summed up: each policy's figures at each point of the grid, as means with 95%
intervals over the seeds; the best policy at each point; and where along an axis the best changes.

A point is a cell without its policy and seed: (workload, servers, engine profile, load). Policies at
a point ran on the same seeds, so they are compared seed by seed (`stats.within_noise`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from epick.simulate.sweep.figures import FIGURES, better
from epick.simulate.sweep.stats import Estimate, estimate, within_noise

Point = tuple[Any, ...]
POINT_FIELDS = ("workload", "servers", "engine_profile", "load_kind", "qps")
# The axes along which a ranking may flip, each with the point fields that make its value.
AXES = {
    "workload": ("workload",),
    "servers": ("servers",),
    "engine_profile": ("engine_profile",),
    "load": ("load_kind", "qps"),
}


def point_of(run: dict[str, Any]) -> Point:
    return tuple(run[f] for f in POINT_FIELDS)


def group(runs: Sequence[dict[str, Any]]) -> dict[Point, dict[str, list[dict[str, Any]]]]:
    """Runs by point, then by policy, each in the order first met; a policy's runs in seed order."""
    out: dict[Point, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        out.setdefault(point_of(run), {}).setdefault(run["policy"], []).append(run)
    for policies in out.values():
        for mine in policies.values():
            mine.sort(key=lambda r: r["seed"])
    return out


def _values(runs: list[dict[str, Any]], figure: str) -> list[float]:
    return [FIGURES[figure].of(r) for r in runs]


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]], figure: str) -> bool | None:
    if [r["seed"] for r in a] != [r["seed"] for r in b]:
        return None
    return within_noise(_values(a, figure), _values(b, figure))


def _best(policies: dict[str, list[dict[str, Any]]], figure: str) -> str:
    means = {name: estimate(_values(mine, figure)).mean for name, mine in policies.items()}
    best = next(iter(means))
    for name, mean in means.items():
        if better(figure, mean, means[best]):
            best = name
    return best


def ranking(policies: dict[str, list[dict[str, Any]]], figure: str) -> list[str]:
    """Policies best first by their mean; ties keep the order given, NaN comes last."""
    means = {name: estimate(_values(mine, figure)).mean for name, mine in policies.items()}
    ordered: list[str] = []
    for name, mean in means.items():
        at = len(ordered)
        while at > 0 and better(figure, mean, means[ordered[at - 1]]):
            at -= 1
        ordered.insert(at, name)
    return ordered


def _estimate_json(e: Estimate) -> dict[str, Any]:
    return {"mean": e.mean, "ci95": list(e.interval) if e.interval is not None else None}


def stats(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per point and policy: the seeds, and for every figure its mean, its 95% interval (null for one
    seed) and how it compares with the best policy's at that point: "best", "within noise" (the
    interval of the per-seed differences contains 0), "worse", or null (one seed: cannot tell)."""
    out = []
    for point, policies in group(runs).items():
        best = {figure: _best(policies, figure) for figure in FIGURES}
        for name, mine in policies.items():
            figures: dict[str, Any] = {}
            for figure in FIGURES:
                entry = _estimate_json(estimate(_values(mine, figure)))
                if name == best[figure]:
                    entry["vs_best"] = "best"
                else:
                    noise = _paired(mine, policies[best[figure]], figure)
                    entry["vs_best"] = None if noise is None else ("within noise" if noise else "worse")
                figures[figure] = entry
            out.append(
                {
                    **dict(zip(POINT_FIELDS, point, strict=True)),
                    "policy": name,
                    "seeds": [r["seed"] for r in mine],
                    "figures": figures,
                }
            )
    return out


def summary(runs: Sequence[dict[str, Any]], metric: str) -> dict[str, Any]:
    """The best policy at each point by `metric` (a name in FIGURES), and the flips: neighbouring points
    along one axis, every other axis the same, whose best policies differ."""
    grouped = group(runs)
    points = []
    best: dict[Point, str] = {}
    for point, policies in grouped.items():
        order = ranking(policies, metric)
        best[point] = order[0]
        ties = [name for name in order[1:] if _paired(policies[name], policies[order[0]], metric)]
        points.append(
            {
                **dict(zip(POINT_FIELDS, point, strict=True)),
                "best": order[0],
                metric: _estimate_json(estimate(_values(policies[order[0]], metric))),
                "ranking": order,
                "within_noise_of_best": ties,
            }
        )
    return {
        "metric": metric,
        "higher_is_better": FIGURES[metric].higher_is_better,
        "points": points,
        "flips": flips(grouped, best, metric),
    }


def flips(
    grouped: dict[Point, dict[str, list[dict[str, Any]]]], best: dict[Point, str], metric: str
) -> list[dict[str, Any]]:
    out = []
    for axis, fields in AXES.items():
        at = [POINT_FIELDS.index(f) for f in fields]
        lines: dict[Point, list[Point]] = {}
        for point in grouped:
            rest = tuple(v for i, v in enumerate(point) if i not in at)
            lines.setdefault(rest, []).append(point)
        for line in lines.values():
            for before, after in itertools.pairwise(line):
                if best[before] == best[after]:
                    continue
                policies = grouped[after]
                old = policies.get(best[before])
                out.append(
                    {
                        "axis": axis,
                        "from": before[at[-1]],
                        "to": after[at[-1]],
                        "where": {
                            f: v
                            for i, (f, v) in enumerate(zip(POINT_FIELDS, after, strict=True))
                            if i not in at
                        },
                        "best_before": best[before],
                        "best_after": best[after],
                        # Whether, after the flip, the old best is within the noise of the new one.
                        "within_noise": None if old is None else _paired(old, policies[best[after]], metric),
                    }
                )
    return out
