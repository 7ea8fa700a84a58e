"""What a run measured: latency percentiles, throughput, cache hits, balance, goodput."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from epick.simulate.fleet import FleetResult

_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def cov(values: list[float]) -> float:
    """Coefficient of variation: standard deviation / mean (0 for one value or a zero mean)."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean else 0.0


def summarize(policy: str, load: float | None, result: FleetResult, slo: SLO) -> dict[str, Any]:
    done = [
        r for r in result.records if r.failed is None and r.finish is not None and r.first_token is not None
    ]
    ttft = [r.first_token - r.arrival for r in done if r.first_token is not None]
    tpot = [
        (r.finish - r.first_token) / (r.output_tokens - 1)
        for r in done
        if r.finish is not None and r.first_token is not None and r.output_tokens > 1
    ]
    e2e = [r.finish - r.arrival for r in done if r.finish is not None]
    makespan = result.makespan or float("nan")
    output_tokens = sum(r.output_tokens for r in done)
    good = 0
    for r in done:
        assert r.first_token is not None and r.finish is not None
        per_token = (r.finish - r.first_token) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
        if r.first_token - r.arrival <= slo.ttft_s and per_token <= slo.tpot_s:
            good += 1
    return {
        "policy": policy,
        "qps": load,
        "ttft_s": {"p50": percentile(ttft, 50), "p90": percentile(ttft, 90), "p99": percentile(ttft, 99)},
        "tpot_s": {"p50": percentile(tpot, 50), "p99": percentile(tpot, 99)},
        "e2e_s": {"p50": percentile(e2e, 50), "p99": percentile(e2e, 99)},
        "output_tokens_per_s": output_tokens / makespan,
        "requests_per_s": len(done) / makespan,
        "prefix_cache_hit_rate": result.prefix_hits / result.prefix_queries if result.prefix_queries else 0.0,
        "load_cov": _by_role(cov, [float(n) for n in result.requests_per_server], result.roles),
        "busy_cov": _by_role(cov, result.busy_time, result.roles),
        "goodput": good / makespan,
        "goodput_share": good / len(result.records) if result.records else 0.0,
        "completed": len(done),
        "failed": len(result.records) - len(done),
        "failure_reasons": failure_reasons(result),
        "makespan_s": result.makespan,
        "restarts": result.restarts,
        **tenancy(result),
    }


def jain(values: list[float]) -> float:
    """Jain's fairness index: (Σx)² / (n·Σx²), 1 when all are equal, 1/n when one has everything."""
    square = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square) if square else 1.0


def tenancy(result: FleetResult) -> dict[str, Any]:
    """With tenants or priorities: each priority's latency and completion, each tenant's share of the
    output tokens served, and Jain's index over those shares."""
    records = result.records
    if not any(r.tenant or r.priority for r in records):
        return {}
    by_priority: dict[str, Any] = {}
    for priority in sorted({r.priority for r in records}, reverse=True):
        mine = [r for r in records if r.priority == priority]
        done = [r for r in mine if r.failed is None and r.first_token is not None and r.finish is not None]
        ttft = [r.first_token - r.arrival for r in done if r.first_token is not None]
        by_priority[str(priority)] = {
            "requests": len(mine),
            "completed": len(done),
            "completion": len(done) / len(mine),
            "ttft_s": {"p50": percentile(ttft, 50), "p90": percentile(ttft, 90), "p99": percentile(ttft, 99)},
            "last_finish_s": max((r.finish for r in done if r.finish is not None), default=float("nan")),
        }
    served: dict[str, int] = {}
    for r in records:
        served.setdefault(r.tenant, 0)
        if r.failed is None and r.finish is not None:
            served[r.tenant] += r.output_tokens
    total = sum(served.values())
    shares = {t: (n / total if total else 0.0) for t, n in sorted(served.items())}
    return {"by_priority": by_priority, "tenant_share": shares, "fairness_jain": jain(list(shares.values()))}


def failure_reasons(result: FleetResult) -> list[dict[str, Any]]:
    """Failed requests grouped by reason (numbers aside), most frequent first: one example message
    and the count of each."""
    groups: dict[str, list[Any]] = {}
    for r in result.records:
        if r.failed is not None:
            group = groups.setdefault(_DIGITS.sub("N", r.failed), [r.failed, 0])
            group[1] += 1
    ordered = sorted(groups.values(), key=lambda g: -g[1])
    return [{"reason": example, "count": count} for example, count in ordered]


def _by_role(measure: Callable[[list[float]], float], values: list[float], roles: list[str | None]) -> float:
    """`measure` over the servers; with roles, over each role's servers (prefill servers are not
    compared with decode servers), averaged weighted by how many servers each role has."""
    if not roles or len(set(roles)) < 2:
        return measure(values)
    groups: dict[str | None, list[float]] = {}
    for value, role in zip(values, roles, strict=True):
        groups.setdefault(role, []).append(value)
    return sum(measure(g) * len(g) for g in groups.values()) / len(values)
