"""The flow controller on a controllable clock and a saturation dial: limits, strict priority,
head-of-line blocking, fairness between flows, exact expiry, disconnects, and (as a property) that
whatever the interleaving every request gets exactly one outcome."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from epick.flowcontrol import BandSettings, FlowController, FlowControlSettings, FlowItem, Outcome
from epick.framework import Endpoint, NamedPlugin
from epick.framework.flowcontrol import TTL_HEADER, FlowQueue, PriorityBand, QueueItem, requested_ttl
from tests.builders import make_endpoint, make_request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Dial(NamedPlugin):
    """A saturation detector whose reading the test sets."""

    plugin_type = "dial"

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.value = value
        self.seen: list[int] = []

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        self.seen.append(len(endpoints))
        return self.value if endpoints else 1.0


class Fcfs(NamedPlugin):
    plugin_type = "test-fcfs"

    def key(self, item: QueueItem) -> Any:
        return item.enqueue_time


class Strict(NamedPlugin):
    """Global strict: the flow whose head comes first."""

    plugin_type = "test-strict"

    def new_state(self) -> Any:
        return None

    def pick_flow(self, band: PriorityBand, now: float) -> FlowQueue | None:
        best = None
        for q in band.queues():
            head = q.peek()
            if head is not None and (best is None or q.ordering_policy.key(head) < best[0]):
                best = (q.ordering_policy.key(head), q)
        return best[1] if best else None


class RoundRobin(NamedPlugin):
    plugin_type = "test-rr"

    def new_state(self) -> Any:
        return {"last": None}

    def pick_flow(self, band: PriorityBand, now: float) -> FlowQueue | None:
        keys = sorted(band.flow_keys(), key=lambda k: k.sort_key())
        state = band.policy_state
        start = keys.index(state["last"]) + 1 if state["last"] in keys else 0
        for i in range(len(keys)):
            key = keys[(start + i) % len(keys)]
            q = band.queue(key.id)
            if q is not None and len(q):
                state["last"] = key
                return q
        return None


class Static(NamedPlugin):
    plugin_type = "test-static"

    def __init__(self, ceilings: dict[int, float] | None = None) -> None:
        super().__init__()
        self.ceilings = ceilings or {}

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        for i, p in enumerate(priorities):
            ceilings[i] = self.ceilings.get(p, 1.0)


POOL = [make_endpoint("a"), make_endpoint("b")]


def settings_for(*bands: int, fairness: Any = None, usage: Any = None, **kwargs: Any) -> FlowControlSettings:
    """Bands 0 and `bands`; `band_<priority>_<field>=value` sets a band's field (`m` for a minus
    sign), the rest go to the settings."""
    ordering, fair = Fcfs(), fairness or Strict()
    configured = {p: BandSettings(p, ordering, fair) for p in (0, *bands)}
    for key in [k for k in kwargs if k.startswith("band_") and k != "band_gc_timeout"]:
        _, named, field = key.split("_", 2)
        priority = int(named.replace("m", "-"))  # band_m10_...: priority -10
        configured[priority] = dataclasses.replace(configured[priority], **{field: kwargs.pop(key)})
    return FlowControlSettings(
        bands=configured,
        default_band=BandSettings(0, ordering, fair),
        usage_limit=usage or Static(),
        **kwargs,
    )


class Harness:
    def __init__(self, settings: FlowControlSettings, saturation: float = 1.0) -> None:
        self.clock = Clock()
        self.dial = Dial(saturation)
        self.fc = FlowController(settings, self.dial, clock=self.clock)
        self.outcomes: list[tuple[str, Outcome]] = []

    def submit(
        self, rid: str, priority: int = 0, flow: str = "t", size: int = 10, ttl_header: str | None = None
    ) -> FlowItem:
        headers = {TTL_HEADER: ttl_header} if ttl_header is not None else {}
        request = dataclasses.replace(
            make_request(request_id=rid, headers=headers), priority=priority, size=size
        )

        def done(item: FlowItem) -> None:
            assert item.outcome is not None
            self.outcomes.append((item.request.request_id, item.outcome))

        return self.fc.submit(request, fairness_id=flow, on_finalize=done)

    def drain(self, pool: Sequence[Endpoint] = POOL) -> list[str]:
        """Open the pool and dispatch everything: the dispatch order."""
        self.dial.value = 0.0
        order = []
        while (item := self.fc.dispatch_once(pool)) is not None:
            order.append(item.request.request_id)
        return order


def test_saturated_pool_holds_requests_until_capacity_frees() -> None:
    h = Harness(settings_for())
    h.submit("r1")
    assert h.fc.dispatch_once(POOL) is None
    assert h.fc.queued == 1 and h.outcomes == []
    assert h.drain() == ["r1"]
    assert h.outcomes == [("r1", Outcome.DISPATCHED)]


def test_strict_priority_between_bands_then_fcfs_within() -> None:
    h = Harness(settings_for(10, -5))
    for rid, prio in [("low1", -5), ("mid1", 0), ("high1", 10), ("low2", -5), ("high2", 10), ("mid2", 0)]:
        h.submit(rid, prio)
        h.clock.now += 1
    assert h.drain() == ["high1", "high2", "mid1", "mid2", "low1", "low2"]


def test_round_robin_between_flows_of_a_band() -> None:
    h = Harness(settings_for(fairness=RoundRobin()))
    for rid, flow in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("c1", "c"), ("c2", "c")]:
        h.submit(rid, flow=flow)
        h.clock.now += 1
    assert h.drain() == ["a1", "b1", "c1", "a2", "c2", "a3"]


def test_a_gated_band_blocks_every_lower_band() -> None:
    """Head-of-line blocking: at saturation 0.5, band 0's ceiling 0.4 stops the cycle there, so the
    -5 band (ceiling 1.0) is not served before it."""
    h = Harness(settings_for(-5, usage=Static({0: 0.4})), saturation=0.5)
    h.submit("zero", 0)
    h.submit("sheddable", -5)
    assert h.fc.dispatch_once(POOL) is None
    h.dial.value = 0.3
    h.fc.dispatch_once(POOL)
    h.fc.dispatch_once(POOL)
    assert [rid for rid, _ in h.outcomes] == ["zero", "sheddable"]


def test_band_and_global_request_limits_reject_at_once() -> None:
    h = Harness(settings_for(band_0_max_requests=2))
    h.submit("r1")
    h.submit("r2")
    third = h.submit("r3")
    assert third.outcome is Outcome.REJECTED_CAPACITY
    assert "band 0 holds 2/2 requests" in third.reason
    g = Harness(settings_for(5, max_requests=2))
    g.submit("a", 0)
    g.submit("b", 5)
    assert g.submit("c", 5).outcome is Outcome.REJECTED_CAPACITY


def test_byte_limits() -> None:
    h = Harness(settings_for(band_0_max_bytes=100))
    assert h.submit("big", size=60).outcome is None
    assert h.submit("bigger", size=50).outcome is Outcome.REJECTED_CAPACITY
    assert h.submit("fits", size=40).outcome is None
    g = Harness(settings_for(max_bytes=30))
    assert g.submit("x", size=31).outcome is Outcome.REJECTED_CAPACITY


def test_capacity_rejection_without_endpoints_is_no_endpoints() -> None:
    h = Harness(settings_for(band_0_max_requests=1))
    h.submit("r1")
    h.fc.dispatch_once([])  # the cycle observes an empty pool
    assert h.submit("r2").outcome is Outcome.REJECTED_NO_ENDPOINTS


def test_ttl_expiry_is_exact_and_oldest_first() -> None:
    h = Harness(settings_for(default_request_ttl=5.0, no_endpoint_request_ttl=5.0))
    h.submit("r1")
    h.clock.now += 2
    h.submit("r2")
    assert h.fc.sweep() == 1005.0  # r1's deadline
    h.clock.now = 1004.999
    h.fc.sweep()
    assert h.outcomes == []
    h.clock.now = 1005.0
    assert h.fc.sweep() == 1007.0
    assert h.outcomes == [("r1", Outcome.EVICTED_TTL)]
    h.clock.now = 1100.0
    assert h.fc.sweep() is None
    assert [o for _, o in h.outcomes] == [Outcome.EVICTED_TTL] * 2
    assert h.fc.queued == 0


def test_a_bands_ttl_replaces_the_global_one_and_the_header_only_shortens() -> None:
    """llm-d-router #2649: band `defaultRequestTTL` replaces the global value (0s: unbounded); a
    positive `x-llm-d-inference-ttl` shortens the bound, and sets one where the band has none."""
    h = Harness(
        settings_for(
            10,
            -10,
            default_request_ttl=60.0,
            band_10_default_request_ttl=5.0,
            band_m10_default_request_ttl=0.0,
        )
    )
    h.fc.dispatch_once(POOL)  # endpoints, saturated
    assert h.submit("fast", priority=10).ttl == 5.0
    assert h.submit("patient", priority=-10).ttl == 0.0
    assert h.submit("global").ttl == 60.0
    assert h.submit("asks-less", ttl_header="2s").ttl == 2.0
    assert h.submit("asks-more", priority=10, ttl_header="30s").ttl == 5.0  # cannot extend
    assert h.submit("bounded", priority=-10, ttl_header="1500ms").ttl == 1.5
    for ignored in ("5", "-1s", "0s", "soon", ""):
        assert h.submit(f"ignored {ignored!r}", ttl_header=ignored).ttl == 60.0
    h.clock.now += 1.5
    h.fc.sweep()
    assert h.outcomes == [("bounded", Outcome.EVICTED_TTL)]
    h.clock.now += 3.5
    h.fc.sweep()
    assert sorted(r for r, _ in h.outcomes) == ["asks-less", "asks-more", "bounded", "fast"]
    h.clock.now += 1e5
    h.fc.sweep()
    assert h.fc.queued == 1 and "patient" not in {r for r, _ in h.outcomes}


def test_the_header_does_not_shorten_the_wait_for_endpoints() -> None:
    h = Harness(settings_for(default_request_ttl=60.0, no_endpoint_request_ttl=30.0))
    h.fc.dispatch_once([])  # no endpoints: noEndpointRequestTTL governs
    h.submit("r1", ttl_header="2s")
    h.clock.now += 10
    h.fc.sweep()
    assert h.outcomes == []
    h.fc.dispatch_once(POOL)  # endpoints appear: its own 2 s bound, from now
    assert h.fc.sweep() == h.clock.now + 2.0


def test_the_ttl_header_is_a_go_duration() -> None:
    assert requested_ttl({TTL_HEADER: " 2s "}) == 2.0
    assert requested_ttl({TTL_HEADER: "1m30s"}) == 90.0
    assert requested_ttl({TTL_HEADER: "+250ms"}) == 0.25
    for bad in ("2", "2 s", "s", "-2s", "0", "0s", "2sec", ""):
        assert requested_ttl({TTL_HEADER: bad}) is None, bad
    assert requested_ttl({}) is None


def test_zero_ttl_never_expires() -> None:
    h = Harness(settings_for(default_request_ttl=0.0, no_endpoint_request_ttl=0.0))
    h.submit("r1")
    h.clock.now += 1e6
    assert h.fc.sweep() is None
    assert h.fc.queued == 1


def test_no_endpoint_budget_and_a_fresh_budget_when_endpoints_appear() -> None:
    h = Harness(settings_for(default_request_ttl=2.0, no_endpoint_request_ttl=30.0))
    h.submit("r1")
    h.fc.dispatch_once([])  # the pool is empty: the 30 s budget applies
    h.clock.now += 10
    h.fc.sweep()
    assert h.outcomes == []
    h.fc.dispatch_once(POOL)  # endpoints appear (still saturated): a fresh 2 s budget from now
    assert h.fc.sweep() == h.clock.now + 2.0
    h.clock.now += 2.0
    h.fc.sweep()
    assert h.outcomes == [("r1", Outcome.EVICTED_TTL)]
    e = Harness(settings_for(default_request_ttl=2.0, no_endpoint_request_ttl=3.0))
    e.submit("r")
    e.fc.dispatch_once([])
    e.clock.now += 3.0
    e.fc.sweep()
    assert e.outcomes == [("r", Outcome.EVICTED_NO_ENDPOINTS)]


def test_cancel_removes_at_once_and_frees_capacity() -> None:
    h = Harness(settings_for(band_0_max_requests=1))
    first = h.submit("r1")
    assert h.submit("r2").outcome is Outcome.REJECTED_CAPACITY
    assert h.fc.cancel(first)
    assert first.outcome is Outcome.EVICTED_CONTEXT_CANCELLED and h.fc.queued == 0
    assert not h.fc.cancel(first)  # a second cancel is a no-op
    assert h.submit("r3").outcome is None
    assert h.drain() == ["r3"]


def test_shutdown_evicts_everything_and_refuses_more() -> None:
    h = Harness(settings_for())
    h.submit("r1")
    h.fc.shutdown()
    assert h.outcomes == [("r1", Outcome.EVICTED_OTHER)]
    assert h.submit("r2").outcome is Outcome.REJECTED_OTHER


def test_unconfigured_priority_falls_back_to_band_zero_and_desired_bands_exist() -> None:
    h = Harness(settings_for())
    item = h.submit("r", priority=7)
    assert item.flow_key.priority == 0
    h.fc.set_desired_priorities([7])
    assert h.submit("s", priority=7).flow_key.priority == 7
    assert h.fc.registry.priorities == [7, 0]


def test_saturation_is_the_worse_of_prefill_and_decode() -> None:
    readings = {frozenset({"p"}): 0.9, frozenset({"d", "both"}): 0.2}

    class ByStage(Dial):
        def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
            return readings.get(frozenset(ep.name for ep in endpoints), 0.0)

    fc = FlowController(settings_for(), ByStage())
    pool = [
        make_endpoint("p", role="prefill"),
        make_endpoint("d", role="decode"),
        make_endpoint("both", role="both"),
    ]
    readings[frozenset({"p", "both"})] = 0.9
    assert fc.saturation(pool) == 0.9
    encode_only = [make_endpoint("e", role="encode")]
    assert fc.saturation(encode_only) == 0.0  # no stage: the detector over the whole pool


def test_idle_flows_are_collected() -> None:
    h = Harness(settings_for(flow_gc_timeout=10.0, band_gc_timeout=20.0))
    h.submit("r", flow="tenant")
    h.drain()
    assert "tenant" in h.fc.registry.bands[0].flows
    h.clock.now += 10.0
    h.fc.sweep()  # the GC is due: the flow has been idle 10 s
    h.clock.now += 10.0
    h.fc.sweep()
    assert "tenant" not in h.fc.registry.bands[0].flows


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[str, int]]:
    ops = st.sampled_from(["submit", "dispatch", "cancel", "tick", "open", "close", "sweep"])
    return draw(st.lists(st.tuples(ops, st.integers(0, 40)), max_size=120))


@settings(max_examples=150, deadline=None)
@given(script=scripts())
def test_every_request_ends_exactly_once_whatever_the_interleaving(script: list[tuple[str, int]]) -> None:
    h = Harness(
        settings_for(
            5,
            -5,
            fairness=RoundRobin(),
            band_0_max_requests=6,
            max_requests=10,
            default_request_ttl=3.0,
            no_endpoint_request_ttl=5.0,
        )
    )
    items: list[FlowItem] = []
    pool: list[Endpoint] = POOL
    for op, n in script:
        if op == "submit":
            items.append(h.submit(f"r{len(items)}", priority=(5, 0, -5)[n % 3], flow=f"f{n % 4}"))
        elif op == "dispatch":
            h.fc.dispatch_once(pool)
        elif op == "cancel" and items:
            h.fc.cancel(items[n % len(items)])
        elif op == "tick":
            h.clock.now += n / 10
        elif op == "open":
            h.dial.value, pool = 0.0, POOL
        elif op == "close":
            h.dial.value, pool = 1.0, ([] if n % 2 else POOL)
        else:
            h.fc.sweep()
        for band in h.fc.registry.bands.values():  # the kept head order agrees with a full scan
            first, scanned = band.first_queue(), Strict().pick_flow(band, 0.0)
            assert (first and first.peek()) is (scanned and scanned.peek()) or (
                first is not None
                and scanned is not None
                and first.peek().enqueue_time == scanned.peek().enqueue_time  # type: ignore[union-attr]
            )
        queued = [i for i in items if i.outcome is None]
        assert (
            h.fc.queued
            == len(queued)
            == sum(len(q) for b in h.fc.registry.bands.values() for q in b.flows.values())
        )
        assert h.fc.registry.byte_size == sum(i.byte_size for i in queued)
    h.drain()
    ids = [rid for rid, _ in h.outcomes]
    assert sorted(ids) == sorted(i.request.request_id for i in items)  # each exactly once
    assert all(i.outcome is not None for i in items)


class StagedDial(NamedPlugin):
    """A detector answering per stage, recording what it was asked."""

    plugin_type = "staged-dial"

    def __init__(self, values: dict[str, float]) -> None:
        super().__init__()
        self.values = values
        self.asked: list[tuple[str, int]] = []

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        raise AssertionError("a staged detector is asked per stage")

    def stage_saturation(self, stage: str, endpoints: Sequence[Endpoint]) -> float:
        self.asked.append((stage, len(endpoints)))
        return self.values.get(stage, 0.0)


def test_a_staged_detector_is_asked_per_stage_and_the_max_wins() -> None:
    from epick.plugins.flowcontrol.max_saturation import MaxSaturationDetector

    staged = StagedDial({"prefill": 0.3, "decode": 0.9, "": 0.5})
    fc = FlowController(settings_for(), staged, clock=Clock())
    pool = [make_endpoint("p", role="prefill"), make_endpoint("d", role="decode")]
    assert fc.saturation(pool) == 0.9
    assert staged.asked == [("prefill", 1), ("decode", 1)]
    assert fc.saturation([make_endpoint("x")]) == 0.9 and staged.asked[-1] == ("decode", 1)  # no role
    assert fc.saturation([make_endpoint("e", role="encode")]) == 0.5 and staged.asked[-1] == ("", 1)
    # the composite: the highest of its detectors, a detector limited to decode skipped for prefill
    low, high = Dial(0.2), Dial(0.8)
    both = MaxSaturationDetector("both", [("low", low), ("high", high)], {"high": ["decode"]})
    assert both.stage_saturation("prefill", pool) == 0.2
    assert both.stage_saturation("decode", pool) == 0.8
    assert both.stage_saturation("", pool) == 0.8  # no stage: every detector
    samples = {(dict(s.labels)["detector"], dict(s.labels)["stage"]): s.value for s in both.metric_samples()}
    assert samples[("high", "decode")] == 0.8 and samples[("low", "prefill")] == 0.2
    assert (
        MaxSaturationDetector("none", [("high", high)], {"high": ["decode"]}).stage_saturation(
            "prefill", pool
        )
        == 0.0
    )


def test_a_band_selection_policy_orders_the_cycle() -> None:
    class LowestFirst(NamedPlugin):
        plugin_type = "lowest-first"

        def rank(
            self, saturation: float, priorities: Sequence[int], ceilings: Sequence[float], order: list[int]
        ) -> None:
            order.reverse()

    h = Harness(dataclasses.replace(settings_for(5), band_selection=LowestFirst()), saturation=0.0)
    h.submit("high", priority=5)
    h.submit("low", priority=0)
    assert h.drain() == ["low", "high"]
