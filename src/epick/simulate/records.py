"""What a fleet run takes and gives: its arrivals, its output plan, and per request what the report
needs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from epick.simulate.types import SimRequestSpec

if TYPE_CHECKING:
    from epick.simulate.fleet import Fleet


@dataclass(frozen=True, slots=True)
class Poisson:
    qps: float


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    concurrency: int


Arrivals = Poisson | ClosedLoop


@dataclass(slots=True)
class RequestRecord:
    """What the report needs of one request (not its prompt: a million prompts would not fit)."""

    request_id: str
    server: int  # the (decode) server
    prefill_server: int | None  # where the prompt was computed, when not on `server`
    arrival: float
    first_token: float | None = None
    finish: float | None = None
    cached_tokens: int = 0
    output_tokens: int = 0
    failed: str | None = None
    tenant: str = ""
    priority: int = 0


@dataclass(slots=True)
class FleetResult:
    records: list[RequestRecord]
    makespan: float
    busy_time: list[float]
    prefix_queries: int
    prefix_hits: int
    servers: int
    requests_per_server: list[int] = field(default_factory=list)
    roles: list[str | None] = field(default_factory=list)  # per server, when the fleet has roles
    restarts: int = 0  # servers restarted during the run (`Churn`)


OutputPlan = Callable[[SimRequestSpec], Sequence[int]]


def fleet_result(fleet: Fleet, clock: float) -> FleetResult:
    records = list(fleet._records.values())
    per_server = [0] * len(fleet.engines)  # requests each server decoded or prefilled
    for r in records:
        if r.server >= 0:
            per_server[r.server] += 1
        if r.prefill_server is not None:
            per_server[r.prefill_server] += 1
    return FleetResult(
        records=records,
        makespan=clock,
        busy_time=[e.busy_time + b for e, b in zip(fleet.engines, fleet._earlier_busy, strict=True)],
        prefix_queries=sum(e.scheduler.prefix_queries for e in fleet.engines) + fleet._earlier_prefix[0],
        prefix_hits=sum(e.scheduler.prefix_hits for e in fleet.engines) + fleet._earlier_prefix[1],
        servers=len(fleet.engines),
        requests_per_server=per_server,
        roles=[v.role for v in fleet.views],
        restarts=fleet._restarts,
    )
