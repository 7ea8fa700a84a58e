"""Flow-control policies, hand-checked against upstream's Go code and tests (llm-d/llm-d-router,
pkg/epp/framework/plugins/flowcontrol): orderings, fairness picks, usage-limit ceilings, eviction.

Queues, bands and items are small fakes satisfying `epick.framework.flowcontrol`'s protocols; every
expected order below is worked out by hand in the comments beside it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from epick.framework import Clock, CycleState, InferenceRequest, PreRequest, Response, ResponseComplete, Usage
from epick.framework.flowcontrol import (
    DEFAULT_FAIRNESS_ID,
    EvictionFilterPolicy,
    EvictionItem,
    EvictionOrderingPolicy,
    FairnessPolicy,
    FlowKey,
    OrderingPolicy,
    UsageLimitPolicy,
)
from epick.framework.results import SchedulingResult
from epick.plugins import in_tree_registry
from epick.plugins.flowcontrol.eviction import PriorityThenTimeEvictionOrder, SheddableEvictionFilter
from epick.plugins.flowcontrol.fairness import (
    GlobalStrictFairnessPolicy,
    IncompatiblePriorityTypeError,
    RoundRobinCursor,
    RoundRobinFairnessPolicy,
)
from epick.plugins.flowcontrol.ordering import (
    EDFOrderingPolicy,
    FCFSOrderingPolicy,
    SLODeadlineOrderingPolicy,
    slo_ttft_ms,
)
from epick.plugins.flowcontrol.program_aware import (
    ProgramAwareFairness,
    ProgramAwareParameters,
    jains_index,
    range_normalize,
    whole_ms,
)
from epick.plugins.flowcontrol.usage_limits import (
    PriorityHoldbackParameters,
    PriorityHoldbackPolicy,
    SoftReflectiveCeilingPolicy,
    StaticUsageLimitPolicy,
    go_round,
)
from epick.plugins.requestheader.agent_identity import AGENT_IDENTITY_KEY
from tests.builders import make_endpoint, make_request

# --- fakes ------------------------------------------------------------------------------------------


@dataclass
class Item:
    name: str
    flow_key: FlowKey = field(default_factory=lambda: FlowKey("f", 0))
    enqueue_time: float = 0.0
    received_time: float = 0.0
    ttl: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    byte_size: int = 0
    request: InferenceRequest = field(init=False)

    def __post_init__(self) -> None:
        self.request = make_request(self.name, headers=self.headers)


@dataclass
class Queue:
    flow_key: FlowKey
    ordering_policy: Any
    items: list[Item] = field(default_factory=list)
    byte_size: int = 0

    def __len__(self) -> int:
        return len(self.items)

    def peek(self) -> Item | None:
        return min(self.items, key=self.ordering_policy.key) if self.items else None

    def pop(self) -> Item:
        head = self.peek()
        assert head is not None
        self.items.remove(head)
        return head


@dataclass
class Band:
    priority: int = 0
    policy_state: Any = None
    flows: dict[str, Queue] = field(default_factory=dict)

    def flow_keys(self) -> list[FlowKey]:
        return [q.flow_key for q in reversed(self.flows.values())]  # reversed: no order promised

    def queue(self, flow_id: str) -> Queue | None:
        return self.flows.get(flow_id)

    def queues(self) -> Iterator[Queue]:
        return (q for q in self.flows.values() if len(q))


def band_of(policy: Any, *queues: Queue, priority: int = 0) -> Band:
    return Band(priority, policy.new_state(), {q.flow_key.id: q for q in queues})


def queue(flow: str, times: list[float], ordering: Any = None, priority: int = 0) -> Queue:
    key = FlowKey(flow, priority)
    items = [Item(f"{flow}@{t}", key, enqueue_time=t) for t in times]
    return Queue(key, ordering or FCFSOrderingPolicy(), items)


def ordered(policy: Any, items: list[Item]) -> list[str]:
    return [i.name for i in sorted(items, key=policy.key)]


def params_of(type_name: str, params: dict[str, Any]) -> Any:
    spec = in_tree_registry().get(type_name)
    assert spec is not None
    return spec.parameters.model_validate(params)


# --- registration -----------------------------------------------------------------------------------

TYPES = {
    "fcfs-ordering-policy": OrderingPolicy,
    "edf-ordering-policy": OrderingPolicy,
    "slo-deadline-ordering-policy": OrderingPolicy,
    "global-strict-fairness-policy": FairnessPolicy,
    "round-robin-fairness-policy": FairnessPolicy,
    "program-aware-fairness": FairnessPolicy,
    "static-usage-limit-policy": UsageLimitPolicy,
    "priority-holdback-policy": UsageLimitPolicy,
    "soft-reflective-ceiling-policy": UsageLimitPolicy,
    "sheddable-eviction-filter": EvictionFilterPolicy,
    "priority-then-time-eviction-order-policy": EvictionOrderingPolicy,
}


class _Handle:
    def plugin(self, name: str) -> Any:
        raise LookupError(name, "")

    def rng(self, name: str) -> Any:
        raise AssertionError("no flow-control policy draws random numbers")

    clock = Clock()  # the config's clock, as the loader's handle gives it
    workers = 1
    plugin_state_staleness = 300.0


@pytest.mark.parametrize(("type_name", "protocol"), TYPES.items())
def test_each_type_is_registered_and_implements_its_protocol(type_name: str, protocol: type) -> None:
    spec = in_tree_registry().get(type_name)
    assert spec is not None and spec.type == type_name and spec.summary
    params = spec.parameters.model_validate(
        {"minCeiling": 0.5} if type_name == "priority-holdback-policy" else {}
    )
    plugin = spec.factory("mine", params, _Handle())
    assert isinstance(plugin, protocol)
    assert (plugin.typed_name.type, plugin.typed_name.name) == (type_name, "mine")


WITH_PARAMETERS = ("program-aware-fairness", "static-usage-limit-policy", "priority-holdback-policy")


@pytest.mark.parametrize("type_name", [t for t in TYPES if t not in WITH_PARAMETERS])
def test_parameterless_types_refuse_any_parameter(type_name: str) -> None:
    params_of(type_name, {})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        params_of(type_name, {"threshold": 0.5})


def test_program_aware_is_also_a_request_control_hook() -> None:
    p = ProgramAwareFairness()
    assert isinstance(p, PreRequest) and isinstance(p, ResponseComplete) and isinstance(p, FairnessPolicy)


# --- ordering ---------------------------------------------------------------------------------------


def test_fcfs_orders_by_enqueue_time() -> None:
    items = [Item("a", enqueue_time=3.0), Item("b", enqueue_time=1.0), Item("c", enqueue_time=2.0)]
    assert ordered(FCFSOrderingPolicy(), items) == ["b", "c", "a"]
    fcfs = FCFSOrderingPolicy()
    assert fcfs.key(items[1]) < fcfs.key(items[2])  # upstream's Less(b, c)
    assert not fcfs.key(items[1]) < fcfs.key(items[1])


def test_edf_orders_by_deadline_then_enqueue_time_and_puts_no_ttl_last() -> None:
    items = [
        Item("A", enqueue_time=10.0, ttl=10.0),  # deadline 20
        Item("B", enqueue_time=11.0, ttl=5.0),  # deadline 16
        Item("C", enqueue_time=5.0, ttl=-1.0),  # no deadline
        Item("D", enqueue_time=9.0, ttl=7.0),  # deadline 16, enqueued before B
        Item("E", enqueue_time=0.0, ttl=0.0),  # no deadline, enqueued before C
    ]
    assert ordered(EDFOrderingPolicy(), items) == ["D", "B", "A", "E", "C"]
    assert EDFOrderingPolicy().key(items[4]) == (math.inf, 0.0)


def slo_item(name: str, received: float, *, enqueue: float = 0.0, **headers: str) -> Item:
    return Item(
        name,
        received_time=received,
        enqueue_time=enqueue,
        headers={k.replace("_", "-"): v for k, v in headers.items()},
    )


def test_slo_deadline_orders_by_received_time_plus_the_ttft_header() -> None:
    items = [
        slo_item("a", 100.0, enqueue=1.0, x_llm_d_slo_ttft_ms="1000"),  # 101.0
        slo_item("b", 100.0, enqueue=2.0, x_llm_d_slo_ttft_ms="500"),  # 100.5, received 100
        slo_item("c", 100.25, enqueue=3.0, x_llm_d_slo_ttft_ms="500"),  # 100.75
        slo_item("d", 99.0, enqueue=4.0),  # no header: last, received 99
        slo_item("e", 99.75, enqueue=5.0, x_llm_d_slo_ttft_ms="750"),  # 100.5, received 99.75: before b
        slo_item("alias", 100.0, enqueue=6.0, x_slo_ttft_ms="250"),  # the deprecated name: 100.25
        slo_item("bad", 98.0, enqueue=7.0, x_llm_d_slo_ttft_ms="soon"),  # unparsable: last, received 98
    ]
    # The enqueue times (1..7) play no part: received time breaks the ties.
    assert ordered(SLODeadlineOrderingPolicy(), items) == ["alias", "e", "b", "c", "a", "bad", "d"]


@pytest.mark.parametrize(
    ("headers", "ms"),
    [
        ({"x-llm-d-slo-ttft-ms": "200"}, 200),
        ({"x-slo-ttft-ms": "150"}, 150),
        ({"x-llm-d-slo-ttft-ms": "200", "x-slo-ttft-ms": "50"}, 200),  # the current name wins
        ({"x-llm-d-slo-ttft-ms": "", "x-slo-ttft-ms": "50"}, None),  # present but empty: no alias fallback
        ({"x-llm-d-slo-ttft-ms": " 300\t"}, 300),  # blanks trimmed
        ({"x-llm-d-slo-ttft-ms": "+300"}, 300),
        ({"x-llm-d-slo-ttft-ms": "0"}, 0),
        ({"x-llm-d-slo-ttft-ms": "-5"}, None),
        ({"x-llm-d-slo-ttft-ms": "1.5"}, None),
        ({"x-llm-d-slo-ttft-ms": "1_000"}, None),  # Go's ParseInt refuses what Python's int takes
        ({"x-llm-d-slo-ttft-ms": "١٢"}, None),  # non-ASCII digits
        ({"x-llm-d-slo-ttft-ms": "9223372036854"}, 9223372036854),  # MaxInt64 // 1e6: still a Duration
        ({"x-llm-d-slo-ttft-ms": "9223372036855"}, None),  # overflows a Duration
        ({"x-llm-d-slo-ttft-ms": str(2**63 - 1)}, None),
        ({"x-some-header": "200"}, None),
        ({}, None),
    ],
)
def test_slo_ttft_header_parsing(headers: dict[str, str], ms: int | None) -> None:
    assert slo_ttft_ms(headers) == ms
    deadline = SLODeadlineOrderingPolicy().key(Item("r", received_time=10.0, headers=headers))[0]
    assert deadline == (math.inf if ms is None else 10.0 + ms / 1000)


# --- global-strict-fairness-policy ------------------------------------------------------------------


def drain(policy: Any, band: Band, now: float = 0.0) -> list[str]:
    """Pick and dispatch the picked queue's head until the policy picks nothing."""
    out = []
    while (q := policy.pick_flow(band, now)) is not None:
        out.append(q.pop().name)
    return out


def test_global_strict_serves_the_best_head_across_all_queues() -> None:
    policy = GlobalStrictFairnessPolicy()
    assert policy.new_state() is None
    band = band_of(policy, queue("q1", [5, 7]), queue("q2", [3, 9]), queue("q3", []), queue("q4", [4]))
    # Heads 5, 3, -, 4: q2; then 5, 9, 4: q4; then 5: q1; then 7 (q1) before 9 (q2).
    assert drain(policy, band) == ["q2@3", "q4@4", "q1@5", "q1@7", "q2@9"]


def test_global_strict_follows_the_queues_ordering_policy() -> None:
    edf = EDFOrderingPolicy()
    policy = GlobalStrictFairnessPolicy()
    a, b = FlowKey("a", 0), FlowKey("b", 0)
    qa = Queue(a, edf, [Item("a1", a, enqueue_time=1.0, ttl=0.0), Item("a2", a, enqueue_time=2.0, ttl=10.0)])
    qb = Queue(b, EDFOrderingPolicy("another-instance"), [Item("b1", b, enqueue_time=3.0, ttl=5.0)])
    # Deadlines: a1 none, a2 12, b1 8 -> b1, a2, a1 (instances of one type compare fine).
    assert drain(policy, band_of(policy, qa, qb)) == ["b1", "a2", "a1"]


def test_global_strict_refuses_to_compare_two_ordering_types() -> None:
    policy = GlobalStrictFairnessPolicy()
    band = band_of(policy, queue("q1", [1]), queue("q2", [2], EDFOrderingPolicy()))
    with pytest.raises(IncompatiblePriorityTypeError) as e:
        policy.pick_flow(band, 0.0)
    assert str(e.value) == (
        "incompatible priority score type for comparison: "
        'expected "fcfs-ordering-policy", got "edf-ordering-policy"'
    )
    assert isinstance(e.value, ValueError)
    # An empty queue is never looked at, so its ordering type does not matter.
    band = band_of(policy, queue("q1", [1]), queue("q2", [], EDFOrderingPolicy()))
    assert policy.pick_flow(band, 0.0) is band.flows["q1"]


def test_global_strict_on_an_empty_band() -> None:
    policy = GlobalStrictFairnessPolicy()
    assert policy.pick_flow(band_of(policy), 0.0) is None
    assert policy.pick_flow(band_of(policy, queue("q", [])), 0.0) is None


# --- round-robin-fairness-policy --------------------------------------------------------------------


def picks(policy: Any, band: Band, n: int) -> list[str | None]:
    out: list[str | None] = []
    for _ in range(n):
        q = policy.pick_flow(band, 0.0)
        out.append(q.flow_key.id if q is not None else None)
    return out


def test_round_robin_cycles_through_the_flows_in_key_order() -> None:
    policy = RoundRobinFairnessPolicy()
    band = band_of(policy, queue("c", [1]), queue("a", [1]), queue("d", [1]), queue("b", [1]))
    assert isinstance(band.policy_state, RoundRobinCursor)
    assert picks(policy, band, 6) == ["a", "b", "c", "d", "a", "b"]
    assert band.policy_state.last_selected == FlowKey("b", 0)


def test_round_robin_skips_empty_queues() -> None:
    policy = RoundRobinFairnessPolicy()
    band = band_of(policy, queue("a", [1]), queue("b", []), queue("c", [1]), queue("d", [1]))
    assert picks(policy, band, 5) == ["a", "c", "d", "a", "c"]


def test_round_robin_when_flows_come_and_go() -> None:
    policy = RoundRobinFairnessPolicy()
    band = band_of(policy, queue("a", [1]), queue("b", [1]))
    assert picks(policy, band, 1) == ["a"]
    band.flows["c"] = queue("c", [1])  # a new flow joins: the cycle continues after a
    assert picks(policy, band, 2) == ["b", "c"]
    assert picks(policy, band, 1) == ["a"]
    assert picks(policy, band, 1) == ["b"]
    del band.flows["b"]  # the flow picked last leaves: the scan starts over at the first flow
    assert picks(policy, band, 3) == ["a", "c", "a"]


def test_round_robin_resets_its_cursor_when_nothing_is_queued() -> None:
    policy = RoundRobinFairnessPolicy()
    band = band_of(policy, queue("a", [1]), queue("b", [1]), queue("c", [1]))
    assert picks(policy, band, 2) == ["a", "b"]
    saved = {k: q.items for k, q in band.flows.items()}
    for q in band.flows.values():
        q.items = []
    assert picks(policy, band, 1) == [None]
    assert band.policy_state.last_selected is None
    for k, q in band.flows.items():
        q.items = saved[k]
    assert picks(policy, band, 1) == ["a"]  # not c: the cursor was cleared
    assert policy.pick_flow(band_of(policy), 0.0) is None  # a band without flows


def test_round_robin_orders_priorities_high_first_within_one_band_state() -> None:
    # FlowKey.sort_key: higher priority first, then id (upstream's FlowKey.Compare).
    assert sorted([FlowKey("b", 1), FlowKey("a", 0), FlowKey("a", 2)], key=FlowKey.sort_key) == [
        FlowKey("a", 2),
        FlowKey("b", 1),
        FlowKey("a", 0),
    ]


def test_round_robin_refuses_a_foreign_state() -> None:
    policy = RoundRobinFairnessPolicy()
    band = band_of(policy, queue("a", [1]))
    band.policy_state = None
    with pytest.raises(TypeError, match="expected RoundRobinCursor, got NoneType"):
        policy.pick_flow(band, 0.0)


@settings(max_examples=60, deadline=None)
@given(
    flows=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), st.booleans(), min_size=1, max_size=8),
    warmup=st.integers(0, 10),
)
def test_round_robin_serves_every_non_empty_flow_once_per_round(flows: dict[str, bool], warmup: int) -> None:
    policy = RoundRobinFairnessPolicy()
    band = band_of(policy, *(queue(f, [1.0] if busy else []) for f, busy in flows.items()))
    busy = sorted(f for f, b in flows.items() if b)
    picks(policy, band, warmup)
    round_ = picks(policy, band, len(busy))
    if not busy:
        assert round_ == []
        assert policy.pick_flow(band, 0.0) is None
    else:
        assert sorted(p for p in round_ if p is not None) == busy  # each exactly once


# --- program-aware-fairness -------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def program_aware(clock: Clock, **params: Any) -> ProgramAwareFairness:
    return ProgramAwareFairness("pa", ProgramAwareParameters.model_validate(params), clock)


RESULT = SchedulingResult(profile_results={}, primary_profile="")
EP = make_endpoint("e")


def complete(p: ProgramAwareFairness, program: str, prompt: int, completion: int) -> None:
    request = make_request("x", headers={"x-llm-d-inference-fairness-id": program})
    p.pre_request(request, RESULT, CycleState())
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion)
    p.response_complete(request, Response(request.request_id, usage=usage), EP)


def test_las_serves_the_program_with_less_attained_service() -> None:
    clock = Clock(0.0)
    p = program_aware(clock)  # weights 0.8 (service) and 0.2 (head wait)
    complete(p, "alpha", 100, 50)  # cost 100 + 2 × 50 = 200
    complete(p, "beta", 10, 0)  # cost 10
    assert p.attained_service("alpha", 0.0) == 200.0 and p.attained_service("beta", 0.0) == 10.0
    band = band_of(p, queue("alpha", [-1.0]), queue("beta", [-0.5]))
    # alpha: 0.8 × (1 - 1) + 0.2 × 1 (waited 1000 ms, the longest) = 0.2
    # beta:  0.8 × (1 - 0) + 0.2 × 0 (waited 500 ms) = 0.8
    assert p.pick_flow(band, 0.0) is band.flows["beta"]


def test_las_head_wait_breaks_the_tie_on_cold_start() -> None:
    p = program_aware(Clock())
    band = band_of(p, queue("alpha", [-0.5]), queue("beta", [-0.05]))
    # No service anywhere: 0.8 × 0.5 each; waits 500 and 50 ms: alpha 0.4 + 0.2, beta 0.4 + 0.
    assert p.pick_flow(band, 0.0) is band.flows["alpha"]


def test_las_head_wait_counts_whole_milliseconds_and_ties_go_to_the_first_flow() -> None:
    p = program_aware(Clock())
    band = band_of(p, queue("b", [-0.0019]), queue("a", [-0.0012]))
    # 1.9 ms and 1.2 ms both truncate to 1 ms: every score is equal and flow "a" (first by key) wins,
    # though b's head has waited longer.
    assert p.pick_flow(band, 0.0) is band.flows["a"]
    assert (whole_ms(0.0019999), whole_ms(-0.0015), whole_ms(0.0), whole_ms(2.0)) == (1, -1, 0, 2000)


def test_attained_service_halves_every_half_life() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, lasHalfLifeSeconds=60)
    complete(p, "alpha", 100, 50)  # 200 at t=0
    assert p.attained_service("alpha", 60.0) == 100.0
    assert p.attained_service("alpha", 120.0) == 50.0
    assert p.attained_service("alpha", 90.0) == 50.0  # time going back does not undo decay
    clock.now = 180.0
    complete(p, "alpha", 10, 0)  # 50 halves to 25 first, then + 10
    assert p.attained_service("alpha", 180.0) == 35.0
    assert p.attained_service("nobody", 180.0) == 0.0


def test_a_zero_half_life_keeps_service_for_ever() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, lasHalfLifeSeconds=0)
    complete(p, "alpha", 200, 0)
    assert p.attained_service("alpha", 3600.0) == 200.0


def test_an_idle_programs_service_decays_without_being_picked() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, lasWeightService=1.0, lasWeightHeadWait=0.0, lasHalfLifeSeconds=60)
    complete(p, "heavy", 1000, 0)  # 1000 at t=0
    clock.now = 600.0
    complete(p, "light", 10, 0)  # 10 at t=600
    band = band_of(p, queue("heavy", [600.0]), queue("light", [600.0]))
    # Ten half-lives later heavy's 1000 is 1000 / 1024 = 0.977 < 10: heavy is served.
    assert p.pick_flow(band, 600.0) is band.flows["heavy"]
    assert p.attained_service("heavy", 600.0) == 1000 / 1024


def test_pick_notes_the_enqueue_time_and_pre_request_records_the_wait() -> None:
    clock = Clock(10.5)
    p = program_aware(clock)
    band = band_of(p, queue("alpha", [10.0, 10.1]))
    picked = p.pick_flow(band, 10.25)
    assert picked is band.flows["alpha"]
    head = picked.pop()
    p.pre_request(head.request, RESULT, CycleState())  # dispatched at 10.5: waited 500 ms
    m = p.metrics("alpha")
    assert m is not None
    assert (m.dispatched, m.in_flight, m.wait_count, m.average_wait_ms) == (1, 1, 1, 500.0)
    # A request flow control did not pick: counted, no wait observed. Its program is its header.
    other = make_request("y", headers={"x-gateway-inference-fairness-id": "alpha"})
    p.pre_request(other, RESULT, CycleState())
    assert (m.dispatched, m.in_flight, m.wait_count, m.average_wait_ms) == (2, 2, 1, 500.0)
    # The next pick: 10.1 has waited 1400 ms by 11.5; the running mean is (500 + 1400) / 2.
    clock.now = 11.5
    second = p.pick_flow(band, 11.0)
    assert second is not None
    p.pre_request(second.pop().request, RESULT, CycleState())
    assert (m.wait_count, m.average_wait_ms) == (2, 950.0)
    clock.now = 12.0
    p.response_complete(head.request, Response(head.request.request_id), EP)
    assert (m.in_flight, m.last_completion) == (2, 12.0)


def test_a_request_counts_under_the_flow_it_queued_in() -> None:
    clock = Clock(1.0)
    p = program_aware(clock)
    q = queue("flow-x", [0.0])
    q.items[0].request = make_request("r", headers={"x-llm-d-inference-fairness-id": "other"})
    band = band_of(p, q)
    item = p.pick_flow(band, 1.0).pop()  # type: ignore[union-attr]
    p.pre_request(item.request, RESULT, CycleState())
    p.response_complete(item.request, Response("r", usage=Usage(5, 5)), EP)
    x = p.metrics("flow-x")
    assert x is not None and (x.dispatched, x.in_flight) == (1, 0)
    assert p.metrics("other") is None
    assert p.attained_service("flow-x", 1.0) == 15.0


def test_a_request_decided_again_is_counted_once() -> None:
    p = program_aware(Clock())
    request = make_request("r", headers={"x-llm-d-inference-fairness-id": "alpha"})
    p.pre_request(request, RESULT, CycleState())
    p.pre_request(request, RESULT, CycleState())  # the proxy's retry on other endpoints
    m = p.metrics("alpha")
    assert m is not None and (m.dispatched, m.in_flight) == (1, 1)
    p.response_complete(request, Response("r"), EP)
    assert m.in_flight == 0


@pytest.mark.parametrize(
    ("headers", "agent", "program"),
    [
        ({"x-llm-d-inference-fairness-id": "new", "x-gateway-inference-fairness-id": "old"}, None, "new"),
        ({"x-gateway-inference-fairness-id": "old"}, "agent", "old"),
        ({"x-llm-d-inference-fairness-id": ""}, "agent", "agent"),
        ({}, None, DEFAULT_FAIRNESS_ID),
    ],
)
def test_the_program_of_a_request_flow_control_did_not_pick(
    headers: dict[str, str], agent: str | None, program: str
) -> None:
    p = program_aware(Clock())
    state = CycleState()
    if agent is not None:
        state.write(AGENT_IDENTITY_KEY, agent)
    request = make_request("r", headers=headers)
    p.pre_request(request, RESULT, state)
    m = p.metrics(program)
    assert m is not None and m.in_flight == 1
    p.response_complete(request, Response("r"), EP)  # counted out of the same program
    assert m.in_flight == 0


def test_jains_fairness_index_over_average_waits() -> None:
    clock = Clock(0.0)
    p = program_aware(clock)
    assert p.jains_fairness_index() == 1.0  # no program
    band = band_of(p, queue("a", [0.0]))
    clock.now = 0.1
    p.pre_request(p.pick_flow(band, 0.0).pop().request, RESULT, CycleState())  # type: ignore[union-attr]
    assert p.jains_fairness_index() == 1.0  # one program
    band = band_of(p, queue("b", [0.0]))
    clock.now = 0.3
    p.pre_request(p.pick_flow(band, 0.0).pop().request, RESULT, CycleState())  # type: ignore[union-attr]
    complete(p, "never-waited", 1, 1)  # no wait observed: not counted
    # Waits 100 and 300 ms: 400² / (2 × (100² + 300²)) = 160000 / 200000.
    assert p.jains_fairness_index() == pytest.approx(0.8)
    assert p.dump_state() == {"totalPrograms": 3, "totalInFlight": 2, "fairnessIndex": pytest.approx(0.8)}
    assert (jains_index([]), jains_index([0.0, 0.0]), jains_index([5.0, 5.0, 5.0])) == (1.0, 1.0, 1.0)
    assert (range_normalize(5, 10, 10), range_normalize(2.5, 0, 10)) == (0.5, 0.25)


def test_idle_programs_are_swept_lazily() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, evictionTtlSeconds=100, evictionSweepSeconds=10)
    complete(p, "idle", 10, 10)  # in flight 0, last completion 0; the first check schedules a sweep at 10
    p.pre_request(make_request("b", headers={"x-llm-d-inference-fairness-id": "busy"}), RESULT, CycleState())
    active = queue("active", [0.0])
    band = band_of(p, active)
    p.pick_flow(band, 50.0)  # sweep: idle for 50 s <= 100: kept; next sweep at 60
    assert p.metrics("idle") is not None and p.metrics("active") is not None
    p.pick_flow(band, 105.0)  # sweep: idle 105 s > 100: gone; busy is in flight; active was first seen at 50
    assert p.metrics("idle") is None and p.attained_service("idle", 105.0) == 0.0
    assert p.metrics("busy") is not None and p.metrics("active") is not None
    del band.flows["active"]
    p.pick_flow(band, 151.0)  # active unseen since 50 (101 s), but the next sweep is due at 115 ... it runs
    assert p.metrics("active") is None
    assert sorted(p.programs()) == ["busy"]


def test_the_sweep_waits_for_its_interval() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, evictionTtlSeconds=5, evictionSweepSeconds=100)
    complete(p, "idle", 1, 1)  # schedules the first sweep at 100
    p.pick_flow(band_of(p), 99.0)  # idle for 99 s > 5, but no sweep is due yet
    assert p.metrics("idle") is not None
    p.pick_flow(band_of(p), 100.0)
    assert p.metrics("idle") is None


def test_a_zero_eviction_ttl_keeps_every_program() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, evictionTtlSeconds=0, evictionSweepSeconds=1)
    complete(p, "idle", 1, 1)
    for t in (10.0, 1e6):
        p.pick_flow(band_of(p), t)
    assert p.metrics("idle") is not None
    p.evict_idle(1e6)  # an explicit sweep with a TTL of 0 forgets everything idle for > 0 s
    assert p.metrics("idle") is None


def test_turn_priority_serves_the_deepest_session_until_waiting_outweighs_depth() -> None:
    """llm-d-router #2116: score = turn number + turnPriorityTimeWeight × head wait (s)."""
    clock = Clock(0.0)
    p = program_aware(clock, strategy="turn-priority")  # weight 0.05: 20 s of waiting is one turn
    for _ in range(3):
        complete(p, "deep", 10, 10)  # turn 4 next
    complete(p, "shallow", 10, 10)  # turn 2 next
    band = band_of(p, queue("deep", [0.0]), queue("shallow", [0.0]))
    assert p.pick_flow(band, 0.0) is band.flows["deep"]  # 4 against 2
    waited = band_of(p, queue("deep", [0.0]), queue("shallow", [-41.0]))
    assert p.pick_flow(waited, 0.0) is waited.flows["shallow"]  # 2 + 0.05 × 41 = 4.05 > 4
    alone = band_of(p, queue("deep", []), queue("new", [0.0]))
    assert p.pick_flow(alone, 0.0) is alone.flows["new"]  # the one waiting flow, unscored
    assert p.attained_service("deep", 0.0) == 0.0  # no service attained under turn-priority


def test_turn_priority_restarts_a_dormant_session_at_turn_one() -> None:
    clock = Clock(0.0)
    p = program_aware(clock, strategy="turn-priority", turnPriorityInactivitySeconds=120)
    for _ in range(5):
        complete(p, "dormant", 1, 1)  # turn 6 next, but idle from t=0
    complete(p, "fresh", 1, 1)
    clock.now = 121.0
    complete(p, "fresh", 1, 1)  # turn 3 next, active
    band = band_of(p, queue("dormant", [121.0]), queue("fresh", [121.0]))
    assert p.pick_flow(band, 121.0) is band.flows["fresh"]  # dormant counts as turn 1
    never = program_aware(Clock(0.0), strategy="turn-priority", turnPriorityInactivitySeconds=0)
    for _ in range(5):
        complete(never, "dormant", 1, 1)
    complete(never, "fresh", 1, 1)
    band = band_of(never, queue("dormant", [1e6]), queue("fresh", [1e6]))
    assert never.pick_flow(band, 1e6) is band.flows["dormant"]  # 0: depth is never reset


def test_program_aware_parameters() -> None:
    d = ProgramAwareParameters()
    assert (
        d.strategy,
        d.las_weight_service,
        d.las_weight_head_wait,
        d.las_half_life_seconds,
        d.eviction_ttl_seconds,
        d.eviction_sweep_seconds,
    ) == ("las", 0.8, 0.2, 60.0, 3600.0, 300.0)
    p = params_of(
        "program-aware-fairness", {"strategy": "", "lasWeightService": 0.7, "lasWeightHeadWait": 0.3}
    )
    assert (p.las_weight_service, p.las_weight_head_wait) == (0.7, 0.3)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"evictionTtlSeconds": -1}, "evictionTtlSeconds must be >= 0, got -1"),
        ({"evictionSweepSeconds": 0}, "evictionSweepSeconds must be > 0, got 0"),
        ({"lasWeightService": -0.1}, "lasWeightService must be >= 0, got -0.1"),
        ({"lasWeightHeadWait": -1}, "lasWeightHeadWait must be >= 0, got -1"),
        ({"lasHalfLifeSeconds": -1}, "lasHalfLifeSeconds must be >= 0, got -1"),
        ({"strategy": "wfq"}, 'unknown scoring strategy "wfq": only "las" and "turn-priority" are supported'),
        ({"turnPriorityTimeWeight": -1}, "turnPriorityTimeWeight must be >= 0, got -1"),
        ({"turnPriorityInactivitySeconds": -5}, "turnPriorityInactivitySeconds must be >= 0, got -5"),
        ({"lasDecayFactor": 0.99}, "Extra inputs are not permitted"),
    ],
)
def test_program_aware_parameter_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        params_of("program-aware-fairness", params)


# --- static-usage-limit-policy ----------------------------------------------------------------------


def limits(policy: Any, saturation: float, priorities: list[int]) -> list[float]:
    ceilings = [1.0] * len(priorities)
    policy.compute_limit(saturation, priorities, ceilings)
    return ceilings


def test_static_usage_limit_fills_every_ceiling() -> None:
    spec = in_tree_registry().get("static-usage-limit-policy")
    assert spec is not None
    default = spec.factory("s", spec.parameters.model_validate({}), _Handle())
    assert limits(default, 0.9, [10, 0, -1]) == [1.0, 1.0, 1.0]
    assert limits(spec.factory("s", params_of(spec.type, {"threshold": 0.8}), _Handle()), 0.0, [1, 0]) == [
        0.8,
        0.8,
    ]
    assert isinstance(default, StaticUsageLimitPolicy)
    assert params_of(spec.type, {"threshold": None}).value() == 1.0
    with pytest.raises(ValidationError):
        params_of(spec.type, {"ceiling": 0.5})


# --- priority-holdback-policy -----------------------------------------------------------------------


def holdback(**params: Any) -> PriorityHoldbackPolicy:
    spec = in_tree_registry().get("priority-holdback-policy")
    assert spec is not None
    plugin = spec.factory("h", spec.parameters.model_validate(params), _Handle())
    assert isinstance(plugin, PriorityHoldbackPolicy)
    return plugin


def test_priority_holdback_rank_domain() -> None:
    # c_i = 1.0 - i × 0.6 / 2
    assert limits(holdback(minCeiling=0.4), 0.5, [10, 5, 0]) == pytest.approx([1.0, 0.7, 0.4])
    # Rank ignores the values: [100, 2, 1] spaces like [10, 5, 0].
    assert limits(holdback(minCeiling=0.5), 0.5, [100, 2, 1]) == pytest.approx([1.0, 0.75, 0.5])
    # c_i = 0.9 - i × 0.6 / 3
    assert limits(holdback(minCeiling=0.3, maxCeiling=0.9), 0.5, [3, 2, 1, 0]) == pytest.approx(
        [0.9, 0.7, 0.5, 0.3]
    )


def test_priority_holdback_value_domain() -> None:
    assert limits(holdback(minCeiling=0.4, domain="value"), 0.5, [10, 5, 0]) == pytest.approx([1.0, 0.7, 0.4])
    # r = [1, 1/99, 0]: c = 0.5 + r × 0.5
    assert limits(holdback(minCeiling=0.5, domain="value"), 0.5, [100, 2, 1]) == pytest.approx(
        [1.0, 0.5 + 0.5 / 99, 0.5]
    )
    assert limits(holdback(minCeiling=0.5, domain="value"), 0.5, [10, 0, 0]) == pytest.approx([1.0, 0.5, 0.5])
    # All values equal: no differentiation, every ceiling is maxCeiling.
    assert limits(holdback(minCeiling=0.2, maxCeiling=0.9, domain="value"), 0.5, [5, 5, 5]) == [0.9, 0.9, 0.9]


def test_priority_holdback_single_and_no_band() -> None:
    assert limits(holdback(minCeiling=0.4, maxCeiling=0.8), 0.5, [7]) == [0.8]
    assert limits(holdback(minCeiling=0.4, domain="value"), 0.5, []) == []


def test_priority_holdback_defaults() -> None:
    p = PriorityHoldbackParameters.model_validate({"minCeiling": 0})
    assert (p.ceiling_min(), p.ceiling_max(), p.domain_name(), p.shape) == (0.0, 1.0, "rank", None)
    assert holdback(minCeiling=0.5, shape="linear").domain == "rank"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "minCeiling is required"),
        ({"minCeiling": None, "domain": "rank"}, "minCeiling is required"),
        ({"shape": "sigmoid", "minCeiling": 0.5}, 'unsupported shape "sigmoid", must be "linear"'),
        (
            {"domain": "unknown", "minCeiling": 0.5},
            'unsupported domain "unknown", must be one of: "rank", "value"',
        ),
        ({"minCeiling": -0.1}, r"minCeiling must be in \[0.0, 1.0\), got -0.100000"),
        ({"minCeiling": 1.0}, r"minCeiling must be in \[0.0, 1.0\), got 1.000000"),
        ({"minCeiling": 0.5, "maxCeiling": 0.0}, r"maxCeiling must be in \(0.0, 1.0\], got 0.000000"),
        ({"minCeiling": 0.5, "maxCeiling": 1.1}, r"maxCeiling must be in \(0.0, 1.0\], got 1.100000"),
        (
            {"minCeiling": 0.5, "maxCeiling": 0.5},
            r"minCeiling \(0.500000\) must be strictly less than maxCeiling \(0.500000\)",
        ),
        ({"minCeiling": 0.8, "maxCeiling": 0.5}, r"minCeiling \(0.800000\) must be strictly less"),
        ({"minCeiling": 0.5, "curve": "linear"}, "Extra inputs are not permitted"),
    ],
)
def test_priority_holdback_parameter_errors(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        params_of("priority-holdback-policy", params)


def test_priority_holdback_reports_every_problem_at_once() -> None:
    with pytest.raises(ValidationError) as e:
        params_of("priority-holdback-policy", {"minCeiling": 1.0, "maxCeiling": 0.0, "shape": "step"})
    text = str(e.value)
    for part in ("unsupported shape", "minCeiling must be in", "maxCeiling must be in", "strictly less"):
        assert part in text


@settings(max_examples=150, deadline=None)
@given(
    bounds=st.tuples(st.floats(0.0, 0.999), st.floats(0.001, 1.0)).filter(lambda b: b[0] < b[1]),
    priorities=st.lists(st.integers(-100, 100), min_size=1, max_size=8),
    domain=st.sampled_from(["rank", "value"]),
)
def test_priority_holdback_ceilings_never_increase(
    bounds: tuple[float, float], priorities: list[int], domain: str
) -> None:
    lo, hi = bounds
    priorities = sorted(priorities, reverse=True)  # the contract: highest first
    ceilings = limits(PriorityHoldbackPolicy("h", lo, hi, domain), 0.5, priorities)  # type: ignore[arg-type]
    assert all(a >= b for a, b in itertools.pairwise(ceilings))
    assert ceilings[0] == pytest.approx(hi)
    assert all(lo - 1e-12 <= c <= hi + 1e-12 for c in ceilings)
    if len(priorities) == 1 or domain == "rank":
        assert ceilings[0] == hi  # exactly: nothing is subtracted from it
    if len(priorities) > 1 and (domain == "rank" or priorities[0] != priorities[-1]):
        assert ceilings[-1] == pytest.approx(lo)


# --- soft-reflective-ceiling-policy -----------------------------------------------------------------


def test_soft_reflective_ceiling_alternates_at_saturation_three_quarters() -> None:
    p = SoftReflectiveCeilingPolicy()
    # N = 3, s = 0.75: reflective ceilings 1 - 0.375 = 0.625 and 1 - 0.75 = 0.25, both reached;
    # period = round(0.75 / 0.25) = 3; the tick goes 1, 2, 3, ...: open on 3 and 6.
    seen = [limits(p, 0.75, [100, 0, -50]) for _ in range(6)]
    closed, opened = [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]
    assert seen == [closed, closed, opened, closed, closed, opened]
    assert p.tick == 6


def test_soft_reflective_ceiling_below_and_at_full_saturation() -> None:
    p = SoftReflectiveCeilingPolicy()
    # s = 0.3: reflective ceilings 0.85 and 0.70 are above it: all open, and the tick stands still.
    assert limits(p, 0.3, [100, 0, -50]) == [1.0, 1.0, 1.0]
    assert p.tick == 0
    # s >= 1: every band but the first is shut, the tick stands still.
    assert limits(p, 1.0, [100, 0, -50]) == [1.0, 0.0, 0.0]
    assert limits(p, 1.5, [100, 0, -50]) == [1.0, 0.0, 0.0]
    assert p.tick == 0
    # A single band is always open; no band: nothing written.
    assert limits(p, 0.99, [3]) == [1.0]
    assert limits(p, 0.99, []) == []


def test_soft_reflective_ceiling_opens_some_bands_fully() -> None:
    p = SoftReflectiveCeilingPolicy()
    # N = 4, s = 0.7: reflective ceilings 0.7667 (open), 0.5333 and 0.3 (alternating);
    # period = round(0.7 / 0.3) = round(2.33) = 2: closed on tick 1, open on tick 2.
    assert limits(p, 0.7, [100, 50, 0, -50]) == [1.0, 1.0, 0.0, 0.0]
    assert limits(p, 0.7, [100, 50, 0, -50]) == [1.0, 1.0, 1.0, 1.0]
    # N = 2, s = 0.5: 0.5 >= 1 - 0.5, period max(1, round(0.999999998)) = 1: always open.
    assert [limits(p, 0.5, [1, 0]) for _ in range(3)] == [[1.0, 1.0]] * 3


def test_soft_reflective_ceiling_rounds_halves_away_from_zero_as_go() -> None:
    # s / (1 - s + 1e-9) is exactly 10.5 here: Go's math.Round gives a period of 11, Python's round 10.
    s = 0.913043479173913
    assert s / (1.0 - s + 1e-9) == 10.5 and round(10.5) == 10
    p = SoftReflectiveCeilingPolicy()
    opened = [i for i in range(1, 23) if limits(p, s, [1, 0])[1] == 1.0]
    assert opened == [11, 22]
    assert (go_round(2.5), go_round(-2.5), go_round(0.5), go_round(0.49999999999999994)) == (
        3.0,
        -3.0,
        1.0,
        0.0,
    )
    assert (go_round(1.4), go_round(-0.4), go_round(7.0)) == (1.0, -0.0, 7.0)


@settings(max_examples=100, deadline=None)
@given(
    calls=st.lists(
        st.tuples(st.floats(0.0, 1.5), st.integers(1, 6)),
        min_size=1,
        max_size=12,
    )
)
def test_soft_reflective_ceilings_never_increase_down_the_bands(calls: list[tuple[float, int]]) -> None:
    # The dispatch loop stops at the first gated band: a lower band open while a higher one is shut
    # would starve. The shared tick keeps every alternating band in step.
    p = SoftReflectiveCeilingPolicy()
    for saturation, n in calls:
        ceilings = limits(p, saturation, list(range(n, 0, -1)))
        assert ceilings[0] == 1.0
        assert all(c in (0.0, 1.0) for c in ceilings)
        assert all(a >= b for a, b in itertools.pairwise(ceilings))


# --- eviction -----------------------------------------------------------------------------------------


def evictable(priority: int, dispatched: float, rid: str = "") -> EvictionItem:
    return EvictionItem(rid or f"{priority}@{dispatched}", priority, dispatched, None)


def test_sheddable_eviction_filter() -> None:
    f = SheddableEvictionFilter()
    assert [f.accept(evictable(p, 0.0)) for p in (-5, -1, 0, 1, 10)] == [True, True, False, False, False]


def test_priority_then_time_eviction_order() -> None:
    o = PriorityThenTimeEvictionOrder()
    items = [evictable(0, 9.0), evictable(-1, 1.0), evictable(-2, 5.0), evictable(-1, 3.0)]

    def cmp(a: EvictionItem, b: EvictionItem) -> int:
        return -1 if o.evicts_before(a, b) else (1 if o.evicts_before(b, a) else 0)

    # Lowest priority first; at -1 the later dispatch (3.0) before the earlier (1.0).
    order = [i.request_id for i in sorted(items, key=functools.cmp_to_key(cmp))]
    assert order == ["-2@5.0", "-1@3.0", "-1@1.0", "0@9.0"]
    assert not o.evicts_before(items[0], items[0])
