"""In-flight eviction, hand-checked: who may go (sheddable only), in which order (lowest priority,
then the newest), how many per decision (the deficit over the mean footprint, at most 2), and the
stop-and-wait pacing (no new decision until every eviction is confirmed and a grace has passed)."""

from __future__ import annotations

import dataclasses

from epick.flowcontrol import FlowController, Outcome
from epick.flowcontrol.eviction import InFlight, Reclamation
from epick.framework.flowcontrol import EvictionItem
from epick.plugins.flowcontrol.eviction import PriorityThenTimeEvictionOrder, SheddableEvictionFilter
from tests.builders import make_request
from tests.flowcontrol.test_controller import POOL, Clock, Dial, settings_for


def in_flight() -> tuple[InFlight, list[str]]:
    ended: list[str] = []
    tracked = InFlight(PriorityThenTimeEvictionOrder(), SheddableEvictionFilter())
    return tracked, ended


def track(tracked: InFlight, ended: list[str], key: int, priority: int, dispatched: float) -> None:
    item = EvictionItem(f"r{key}", priority, dispatched, None)
    tracked.track(key, item, lambda: ended.append(item.request_id) or True)


def test_only_sheddable_requests_are_evictable_lowest_priority_then_newest_first() -> None:
    tracked, ended = in_flight()
    for key, priority, at in [(1, 0, 1.0), (2, -1, 1.0), (3, -5, 2.0), (4, -5, 3.0), (5, 10, 4.0)]:
        track(tracked, ended, key, priority, at)
    assert (tracked.in_flight, tracked.evictable, tracked.victim_priority()) == (5, 3, -5)
    assert tracked.evict(2, priority_bound=0) == [4, 3]  # -5 dispatched at 3.0 before -5 at 2.0
    assert ended == ["r4", "r3"]
    assert tracked.evict(5, priority_bound=-1) == []  # -1 is not strictly below the bound
    assert tracked.evict(5, priority_bound=0) == [2]
    assert tracked.evictable == 0 and tracked.victim_priority() is None


def test_an_ended_request_is_no_victim() -> None:
    tracked, ended = in_flight()
    track(tracked, ended, 1, -5, 1.0)
    track(tracked, ended, 2, -5, 2.0)
    assert tracked.untrack(2) and not tracked.untrack(2)
    assert tracked.evictable == 1 and tracked.evict(2, 0) == [1]


def test_sizing_is_the_deficit_over_the_mean_footprint_capped_at_two() -> None:
    tracked, ended = in_flight()
    for key in range(10):
        track(tracked, ended, key, -1, float(key))
    r = Reclamation(tracked)
    # saturation 1.0 over 10 in flight: each is worth 0.1; ceiling 0.95 leaves 0.05 → one eviction.
    assert r.reclaim(1.0, 0.95, 0, now=0.0) == [9]
    r2 = Reclamation(tracked)
    assert len(r2.reclaim(1.0, 0.5, 0, now=0.0)) == 2  # 0.5 / 0.1 = 5, capped at 2


def test_pacing_waits_for_confirmation_and_grace_or_the_timeout() -> None:
    tracked, ended = in_flight()
    for key in range(4):
        track(tracked, ended, key, -1, float(key))
    r = Reclamation(tracked, confirmation_grace=0.5, confirmation_timeout=10.0)
    assert r.gate_open(0.0)
    (first,) = r.reclaim(1.0, 0.9, 0, now=0.0)
    assert not r.gate_open(1.0)  # outstanding
    r.confirm(first, now=1.0)
    assert not r.gate_open(1.2)  # cooling for the grace
    assert r.gate_open(1.5) and r.pending == 0.0
    assert len(r.reclaim(1.0, 0.9, 0, now=2.0)) == 1
    assert not r.gate_open(11.9)
    assert not r.gate_open(12.0)  # timed out: treated as confirmed, then cools
    assert r.timed_out == 1 and r.gate_open(12.5)


def test_the_controller_evicts_for_a_blocked_higher_band() -> None:
    clock, dial = Clock(), Dial(1.0)
    settings = dataclasses.replace(
        settings_for(10, -5),
        enable_eviction=True,
        eviction_filter=SheddableEvictionFilter(),
        eviction_ordering=PriorityThenTimeEvictionOrder(),
    )
    fc = FlowController(settings, dial, clock=clock, eviction_grace=0.25)
    ended: list[int] = []
    for key in (1, 2, 3, 4):
        priority = -5 if key < 4 else 0
        clock.now += 1
        fc.track(key, EvictionItem(f"r{key}", priority, clock(), None), lambda k=key: ended.append(k) or True)
    blocked = dataclasses.replace(make_request(request_id="urgent"), priority=10)
    item = fc.submit(blocked, fairness_id="t")
    assert fc.dispatch_once(POOL) is None  # saturated: band 10 is blocked, so one sheddable one goes
    assert ended == [3]  # the newest of the lowest priority
    assert fc.dispatch_once(POOL) is None and ended == [3]  # paced: nothing until it is confirmed
    fc.finished(3)
    clock.now += 0.25
    dial.value = 0.5  # the freed capacity shows
    assert fc.dispatch_once(POOL) is item and item.outcome is Outcome.DISPATCHED
    assert fc.reclamation is not None and fc.reclamation.issued == 1


def test_no_eviction_for_demand_at_or_below_the_victims_priority() -> None:
    clock, dial = Clock(), Dial(1.0)
    settings = dataclasses.replace(
        settings_for(-5),
        enable_eviction=True,
        eviction_filter=SheddableEvictionFilter(),
        eviction_ordering=PriorityThenTimeEvictionOrder(),
    )
    fc = FlowController(settings, dial, clock=clock)
    ended: list[int] = []
    fc.track(1, EvictionItem("r1", -5, clock(), None), lambda: ended.append(1) or True)
    fc.submit(dataclasses.replace(make_request(), priority=-5), fairness_id="t")
    fc.dispatch_once(POOL)
    assert ended == []
