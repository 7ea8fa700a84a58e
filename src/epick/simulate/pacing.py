"""How requests start: open-loop arrivals at a rate (`Poisson`), or a fixed number in flight
(`ClosedLoop`); a session's later turn starts when its earlier one finished, after its think time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epick.simulate.events import ARRIVE
from epick.simulate.records import ClosedLoop, Poisson
from epick.simulate.types import SimRequestSpec

if TYPE_CHECKING:
    from epick.simulate.fleet import Fleet


def next_first(fleet: Fleet) -> tuple[SimRequestSpec, float] | None:
    """The next request that waits for no other, or a later turn whose earlier turn is done
    already, with the time it may start (a later turn: the earlier one's finish plus its think
    time). A later turn whose earlier turn is still to finish is set aside for it."""
    for spec in fleet._source:
        if spec.after is None:
            return spec, 0.0
        earlier = fleet._records.get(spec.after)
        if earlier is not None and earlier.finish is not None:
            return spec, earlier.finish + spec.think_time
        fleet._followers.setdefault(spec.after, []).append(spec)
    return None


def schedule_next_first(fleet: Fleet, now: float) -> None:
    assert isinstance(fleet._arrivals, Poisson)
    while (item := next_first(fleet)) is not None:
        spec, release = item
        if spec.after is not None:  # a released later turn: it does not pace the arrivals
            fleet.push(max(release, now), ARRIVE, spec)
            continue
        at = spec.arrival if spec.arrival is not None else now + fleet._rng.expovariate(fleet._arrivals.qps)
        fleet.push(max(at, now), ARRIVE, spec)
        return


def refill(fleet: Fleet, now: float) -> None:
    assert isinstance(fleet._arrivals, ClosedLoop)
    while fleet._occupied < fleet._arrivals.concurrency:
        item = next_first(fleet)
        if item is None:
            return
        spec, release = item
        fleet._occupied += 1  # a session's later turns keep its place
        start = release if spec.after is not None else (spec.arrival or 0.0)
        fleet.push(max(now, start), ARRIVE, spec)
