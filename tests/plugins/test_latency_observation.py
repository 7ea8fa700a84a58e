"""`latency-observer-producer-hub` and `latency-observation-scorer-hub` (llm-d-router PR #2371 at
f60405d8, merged onto ebab687 as a415a8aa: latencyobserver and latencyobservation): the percentile
and band formulas, the short window and the floor history on each endpoint's recompute grid, the
hooks and the reaping of what never completes, the curve and the scores (cold endpoints included),
the parameter rules, and both plugins from upstream's example config through the director."""

from __future__ import annotations

import json
import random
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from epick.config import ConfigError, LoadedConfig, LoadOptions, load_config_text
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.framework import (
    Clock,
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileRunResult,
    Response,
    SchedulingResult,
)
from epick.plugins import in_tree_registry
from epick.plugins.latency import observation_scorer, observer
from epick.plugins.latency.observation_scorer import (
    Calibration,
    LatencyObservationScorer,
    ObservationScorerParameters,
    calibration,
    predict,
)
from epick.plugins.latency.observer import (
    COLD,
    LatencyObserver,
    Observation,
    ObserverParameters,
    TTFTPercentiles,
    band_inflight,
    percentile,
)
from epick.plugins.load.inflight import InFlightLoad, InFlightLoadProducer
from epick.plugins.registry import ParameterError
from epick.requestcontrol.cycle import RequestCycle
from epick.requestcontrol.director import Director
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
T0 = 1000.0


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def load(body: str, clock: FakeClock | None = None, staleness: float = 300.0) -> LoadedConfig:
    options = LoadOptions(clock=Clock(clock) if clock else None, plugin_state_staleness=staleness)
    return load_config_text(
        HEADER + textwrap.dedent(body), seed=0, registry=in_tree_registry(), options=options, source="t.yaml"
    )


def make_observer(
    clock: FakeClock, inflight: InFlightLoadProducer | None = None, **params: Any
) -> LatencyObserver:
    return LatencyObserver(params=ObserverParameters(**params), inflight=inflight, clock=clock)


def approx(snapshot: TTFTPercentiles, **expected: float) -> None:
    for field, value in expected.items():
        assert getattr(snapshot, field) == pytest.approx(value), field


# --- the formulas ---------------------------------------------------------------------------------


def test_percentile_interpolates_at_p_times_n_minus_one() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([7.0], 0.1) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.25) == 2.0  # index 1
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5  # index 1.5
    assert percentile([0.0, 10.0], 0.1) == pytest.approx(1.0)  # index 0.1
    assert percentile([1.0, 2.0, 3.0], 1.0) == 3.0  # the last index


def test_band_inflight_averages_the_band_around_the_percentile() -> None:
    obs = [Observation(0.1 * (i + 1), i, T0) for i in range(11)]  # in TTFT order, inflight 0..10
    assert band_inflight([], 0.25) == 0.0
    assert band_inflight(obs, 0.25) == 2.0  # indices int(0.15 × 10) = 1 .. int(0.35 × 10) = 3
    assert band_inflight(obs, 0.5) == 5.0  # indices 4 .. 6
    assert band_inflight(obs, 0.05) == 0.5  # int(-0.5) = 0 .. int(1.5) = 1, clamped at 0
    assert band_inflight(obs, 0.95) == 9.0  # int(8.5) = 8 .. int(10.5) = 10 (the last index)
    assert band_inflight(obs[:1], 0.5) == 0.0


def test_floor_is_cold_below_the_calibration_threshold() -> None:
    assert COLD.floor() == 0.0
    m = TTFTPercentiles(floor_ttft=0.2, window_floor_ttft=0.1, observations=9, calibration_threshold=10)
    assert m.floor() == 0.0
    assert (
        TTFTPercentiles(
            floor_ttft=0.2, window_floor_ttft=0.1, observations=10, calibration_threshold=10
        ).floor()
        == 0.2
    )
    assert TTFTPercentiles(window_floor_ttft=0.1, observations=10, calibration_threshold=10).floor() == 0.1


# --- the observer's snapshots ---------------------------------------------------------------------


def test_the_short_window_anchors_are_published_at_the_next_recompute() -> None:
    clock = FakeClock()
    o = make_observer(clock)
    empty = TTFTPercentiles(calibration_threshold=10)
    assert o.percentiles("a") == empty  # first seen at T0: the grid starts with a recompute there
    for i in range(11):  # TTFT 0.1 .. 1.1 s with 0 .. 10 in flight
        clock.now = T0 + 0.05 * (i + 1)
        o.record("a", 0.1 * (i + 1), i, clock.now)
    clock.now = T0 + 0.999
    assert o.percentiles("a") == empty  # not recomputed yet
    clock.now = T0 + 1.0
    approx(
        o.percentiles("a"),
        floor_ttft=0.0,
        window_floor_ttft=0.2,  # P10: index 1
        low_load_ttft=0.35,  # P25: index 2.5
        typical_load_ttft=0.6,  # P50: index 5
        inflight_at_low_load=2.0,
        inflight_at_typical_load=5.0,
    )
    m = o.percentiles("a")
    assert (m.recent_request_count, m.observations, m.calibration_threshold) == (11, 11, 10)
    assert m.floor() == pytest.approx(0.2)  # the short window's P10 until a bucket closes


def test_the_short_window_is_capped_by_count_and_by_age() -> None:
    clock = FakeClock()
    o = make_observer(clock, windowSize=5, maxRequests=3, maxObservationAge="10s", minRequests=1)
    o.percentiles("a")
    for i, ttft in enumerate([0.9, 0.8, 0.7, 0.3, 0.2, 0.1]):  # the ring keeps the last 5
        clock.now = T0 + 0.1 * (i + 1)
        o.record("a", ttft, 0, clock.now)
    clock.now = T0 + 1
    m = o.percentiles("a")
    assert m.recent_request_count == 3  # the newest 3: 0.3, 0.2, 0.1
    assert m.typical_load_ttft == pytest.approx(0.2)
    assert m.observations == 6
    clock.now = T0 + 5.5
    o.record("a", 2.0, 0, clock.now)
    clock.now = T0 + 10.6  # tick 10 at T0 + 10: all are within 10 s
    assert o.percentiles("a").recent_request_count == 3  # 2.0, 0.1, 0.2 (newest three)
    clock.now = T0 + 11.0  # tick 11: everything before T0 + 1 is too old
    m = o.percentiles("a")
    assert (m.recent_request_count, m.typical_load_ttft) == (1, 2.0)
    clock.now = T0 + 16.0  # the last one too
    m = o.percentiles("a")
    assert (m.recent_request_count, m.typical_load_ttft, m.observations) == (0, 0.0, 7)


def test_the_floor_is_the_p10_of_the_bucket_p10s_dropping_the_slowest() -> None:
    clock = FakeClock()
    o = make_observer(clock, bucketDuration="2s", bucketHistorySize=2, minRequests=1)
    o.percentiles("a")  # tick 0 at T0 opens the first bucket

    def bucket(at: float, *ttfts: float) -> None:
        clock.now = at
        for ttft in ttfts:
            o.record("a", ttft, 0, at)

    bucket(T0 + 0.5, 0.5, 0.7)
    clock.now = T0 + 1.0
    assert o.percentiles("a").floor_ttft == 0.0  # the bucket is open until T0 + 2
    clock.now = T0 + 2.0
    assert o.percentiles("a").floor_ttft == pytest.approx(0.52)  # history [0.52]
    bucket(T0 + 3.5, 0.3, 0.9)
    clock.now = T0 + 4.0
    assert o.percentiles("a").floor_ttft == pytest.approx(0.376)  # [0.36, 0.52]: 0.36 + 0.1 × 0.16
    bucket(T0 + 5.5, 1.0)
    clock.now = T0 + 6.0
    assert o.percentiles("a").floor_ttft == pytest.approx(0.376)  # 1.0 was the slowest: dropped
    bucket(T0 + 7.5, 0.1)
    clock.now = T0 + 8.0
    m = o.percentiles("a")
    assert m.floor_ttft == pytest.approx(0.126)  # [0.1, 0.36]: 0.52 dropped
    assert m.floor() == pytest.approx(0.126)  # the history's floor before the window's


def test_buckets_stay_on_the_grid_across_an_idle_spell() -> None:
    clock = FakeClock()
    o = make_observer(clock, bucketDuration="2s", minRequests=1)
    o.percentiles("a")
    clock.now = T0 + 0.5
    o.record("a", 0.4, 0, clock.now)
    clock.now = T0 + 100.5  # 50 buckets closed meanwhile; only the first held anything
    o.record("a", 0.2, 0, clock.now)
    assert o.percentiles("a").floor_ttft == pytest.approx(0.4)
    clock.now = T0 + 101.0
    assert o.percentiles("a").floor_ttft == pytest.approx(0.4)  # the bucket closes at T0 + 102
    clock.now = T0 + 102.0
    assert o.percentiles("a").floor_ttft == pytest.approx(0.22)  # [0.2, 0.4]: 0.2 + 0.1 × 0.2


def test_each_endpoint_recomputes_on_its_own_grid_and_a_read_between_ticks_sees_the_last_one() -> None:
    clock = FakeClock()
    o = make_observer(clock, minRequests=1)
    o.percentiles("a")  # a's grid: T0 + k s
    clock.now = T0 + 0.4
    o.record("a", 0.5, 0, clock.now)
    clock.now = T0 + 0.7
    o.percentiles("b")  # b's grid: T0 + 0.7 + k s
    clock.now = T0 + 0.8
    o.record("b", 0.2, 0, clock.now)
    clock.now = T0 + 1.6
    assert o.percentiles("a").typical_load_ttft == 0.5  # a's tick at T0 + 1
    assert o.percentiles("b").recent_request_count == 0  # b's first tick after it is at T0 + 1.7
    clock.now = T0 + 1.7
    assert o.percentiles("b").typical_load_ttft == 0.2
    o.record("a", 0.1, 0, clock.now)
    clock.now = T0 + 1.99
    m = o.percentiles("a")
    assert (m.recent_request_count, m.typical_load_ttft, m.observations) == (1, 0.5, 1)  # as at T0 + 1
    clock.now = T0 + 2.0
    m = o.percentiles("a")
    assert (m.recent_request_count, m.typical_load_ttft, m.observations) == (2, pytest.approx(0.3), 2)
    assert m.window_floor_ttft == pytest.approx(0.14)  # P10 of [0.1, 0.5]: 0.1 + 0.1 × 0.4


def test_a_bucket_spans_the_last_bucket_duration_and_rounds_up_to_whole_recomputes() -> None:
    clock = FakeClock()
    o = make_observer(clock, intervalDuration="2s", bucketDuration="3s", minRequests=1)
    o.percentiles("a")
    clock.now = T0 + 0.5
    o.record("a", 0.9, 0, clock.now)  # before T0 + 4 - 3: not in the first bucket
    clock.now = T0 + 1.5
    o.record("a", 0.3, 0, clock.now)
    clock.now = T0 + 2.0
    assert o.percentiles("a").floor_ttft == 0.0  # 2 s < 3 s: still open
    clock.now = T0 + 4.0
    assert o.percentiles("a").floor_ttft == pytest.approx(0.3)


# --- the observer's hooks -------------------------------------------------------------------------


def decided(target: Endpoint, profile: str = "default") -> SchedulingResult:
    return SchedulingResult({profile: ProfileRunResult((target,))}, profile)


def dispatch(
    o: LatencyObserver,
    inflight: InFlightLoadProducer,
    request: InferenceRequest,
    target: Endpoint,
    candidates: Sequence[Endpoint],
) -> None:
    state = CycleState()
    inflight.produce(request, state, candidates)
    o.produce(request, state, candidates)
    result = decided(target)
    inflight.pre_request(request, result, state)
    o.pre_request(request, result, state)


def chunk(o: LatencyObserver, request: InferenceRequest, target: Endpoint, **fields: Any) -> None:
    fields.setdefault("streaming", True)
    o.response_streaming(request, Response(request.request_id, chunk=b"data", **fields), target)


def entry(o: LatencyObserver, name: str) -> dict[str, Any]:
    state = o.dump_state()
    assert isinstance(state, dict)
    found = [e for e in state["endpoints"] if e["endpoint"] == name]
    return dict(found[0]) if found else {}


def test_the_first_chunk_gives_the_ttft_with_the_load_pinned_before_the_decision() -> None:
    clock = FakeClock()
    inflight = InFlightLoadProducer()
    o = make_observer(clock, inflight)
    a, b = make_endpoint("a"), make_endpoint("b")
    requests = [make_request(request_id=f"r{i}") for i in range(3)]
    for request in requests:  # three in flight on a: pinned 0, 1, 2
        dispatch(o, inflight, request, a, (a, b))
    clock.now = T0 + 0.25
    chunk(o, requests[2], a)
    assert (entry(o, "a")["lastTtftSeconds"], entry(o, "a")["lastInflightAtDispatch"]) == (0.25, 2)
    clock.now = T0 + 0.5
    chunk(o, requests[2], a)  # a later chunk: nothing more
    assert entry(o, "a")["observations"] == 1
    for request in requests:
        o.response_complete(request, Response(request.request_id, end_of_stream=True), a)
        inflight.response_complete(request, Response(request.request_id, end_of_stream=True), a)
    chunk(o, requests[0], a)  # after the end: forgotten
    assert entry(o, "a")["observations"] == 1
    assert entry(o, "b")["observations"] == 0  # seen as a candidate
    state = o.dump_state()
    assert isinstance(state, dict)
    assert state["trackedRequests"] == 0


@pytest.mark.parametrize(
    "fields",
    [
        {"end_of_stream": True},  # the first chunk is the last: end-to-end latency
        {"streaming": False},  # the request did not ask to stream
        {"status": 500},
        {"error": "connection lost"},
    ],
)
def test_what_is_not_a_first_token_is_not_observed(fields: dict[str, Any]) -> None:
    clock = FakeClock()
    inflight = InFlightLoadProducer()
    o = make_observer(clock, inflight)
    a = make_endpoint("a")
    request = make_request()
    dispatch(o, inflight, request, a, (a,))
    clock.now = T0 + 1
    chunk(o, request, a, **fields)
    chunk(o, request, a)  # nor the chunk after it
    assert entry(o, "a")["observations"] == 0


def test_a_request_decided_again_is_observed_on_its_new_target() -> None:
    clock = FakeClock()
    inflight = InFlightLoadProducer()
    o = make_observer(clock, inflight)
    a, b = make_endpoint("a"), make_endpoint("b")
    request = make_request()
    dispatch(o, inflight, request, a, (a, b))
    clock.now = T0 + 2
    dispatch(o, inflight, request, b, (b,))
    clock.now = T0 + 2.5
    chunk(o, request, b)
    assert entry(o, "b")["lastTtftSeconds"] == 0.5
    assert entry(o, "a")["observations"] == 0


def test_a_dispatch_never_answered_is_forgotten_after_the_staleness() -> None:
    clock = FakeClock()
    o = LatencyObserver(clock=clock, stale_after=10.0)
    inflight = InFlightLoadProducer()
    a = make_endpoint("a")
    old, recent = make_request(request_id="old"), make_request(request_id="recent")
    dispatch(o, inflight, old, a, (a,))
    clock.now = T0 + 8
    dispatch(o, inflight, recent, a, (a,))
    assert tracked(o) == 2
    clock.now = T0 + 10.5
    o.produce(make_request(), CycleState(), (a,))  # a later request reaps what is 10 s old
    assert tracked(o) == 1
    chunk(o, old, a)
    assert entry(o, "a")["observations"] == 0
    chunk(o, recent, a)  # 2.5 s old: still waited for
    assert (entry(o, "a")["observations"], entry(o, "a")["lastTtftSeconds"]) == (1, 2.5)


def tracked(o: LatencyObserver) -> int:
    state = o.dump_state()
    assert isinstance(state, dict)
    return int(state["trackedRequests"])


def test_without_an_inflight_producer_the_pinned_load_is_zero_and_a_removed_endpoint_is_forgotten() -> None:
    clock = FakeClock()
    o = make_observer(clock)
    a = make_endpoint("a")
    request = make_request()
    dispatch(o, InFlightLoadProducer(), request, a, (a,))
    clock.now = T0 + 0.1
    chunk(o, request, a)
    assert entry(o, "a")["lastInflightAtDispatch"] == 0
    o.endpoint_removed("a")
    assert entry(o, "a") == {}


def test_dump_state_lists_the_most_observed_first_up_to_100() -> None:
    clock = FakeClock()
    o = make_observer(clock, minRequests=1)
    for i in range(102):
        o.record(f"ep{i:03d}", 0.1, 1, clock.now)
    o.record("ep101", 0.3, 4, clock.now)
    clock.now = T0 + 1
    state = o.dump_state()
    assert isinstance(state, dict)
    assert (state["totalEndpoints"], state["maxEndpoints"], state["truncated"]) == (102, 100, True)
    assert len(state["endpoints"]) == 100
    first = state["endpoints"][0]
    assert first == {
        "endpoint": "ep101",
        "lastTtftSeconds": 0.3,
        "lastInflightAtDispatch": 4,
        "observations": 2,
        "floorSeconds": pytest.approx(0.12),
        "recentN": 2,
        "lowTtftSeconds": pytest.approx(0.15),
        "highTtftSeconds": pytest.approx(0.2),
        "inflightAtLow": 1.0,  # band int(0.15) = 0 .. int(0.35) = 0
        "inflightAtHigh": 1.0,  # band int(0.4) = 0 .. int(0.6) = 0
    }
    assert [e["endpoint"] for e in state["endpoints"][1:3]] == ["ep000", "ep001"]


# --- the scorer -----------------------------------------------------------------------------------

# Low-load anchor (2 in flight, 0.3 s), typical-load anchor (6 in flight, 0.5 s), floor 0.1 s.
CURVE = TTFTPercentiles(
    floor_ttft=0.1,
    window_floor_ttft=0.05,
    low_load_ttft=0.3,
    typical_load_ttft=0.5,
    inflight_at_low_load=2.0,
    inflight_at_typical_load=6.0,
    recent_request_count=10,
    observations=50,
    calibration_threshold=10,
)


@pytest.mark.parametrize(
    ("cur", "gap", "expected"),
    [
        (0, 2.0, 0.1),  # at the floor
        (1, 2.0, 0.2),  # A -> B: 0.1 + 1 × 0.2 / 2
        (2, 2.0, 0.3),  # at B
        (4, 2.0, 0.4),  # B -> C: 0.3 + 2 × 0.2 / 4
        (10, 2.0, 0.7),  # past C, on B -> C extended
        (3, 5.0, 0.3),  # B too close to C in load: the chord A -> C, 0.1 + 3 × 0.4 / 6
        (12, 5.0, 0.9),
    ],
)
def test_the_curve_through_the_floor_and_the_two_anchors(cur: int, gap: float, expected: float) -> None:
    assert predict(CURVE, 0.1, cur, gap) == pytest.approx(expected)


def test_the_low_anchor_is_used_only_when_admissible() -> None:
    def chord(**changes: float) -> float:
        return predict(_with(CURVE, **changes), 0.1, 1, 2.0)

    on_chord = 0.1 + 1 * (0.5 - 0.1) / 6
    assert chord() == pytest.approx(0.2)
    assert chord(low_load_ttft=0.5) == pytest.approx(on_chord)  # not below the typical TTFT
    assert chord(low_load_ttft=0.1) == pytest.approx(on_chord)  # not above the floor
    assert chord(inflight_at_low_load=0.0, inflight_at_typical_load=2.0) == pytest.approx(0.1 + 0.4 / 2)
    assert predict(_with(CURVE, low_load_ttft=0.05, typical_load_ttft=0.08), 0.1, 1, 2.0) == 0.1  # clamped


def _with(m: TTFTPercentiles, **changes: Any) -> TTFTPercentiles:
    return replace(m, **changes)


def test_calibration_needs_a_floor_recent_requests_load_and_a_rise() -> None:
    assert calibration(CURVE) == Calibration(0.1, True, True)
    assert calibration(COLD) == Calibration(0.0, False, False)
    assert calibration(_with(CURVE, recent_request_count=9)) == Calibration(0.1, True, False)
    assert calibration(_with(CURVE, inflight_at_typical_load=0.0)) == Calibration(0.1, True, False)
    assert calibration(_with(CURVE, typical_load_ttft=0.1)) == Calibration(0.1, True, False)
    assert calibration(_with(CURVE, observations=9)) == Calibration(0.0, False, False)


class FixedObserver(LatencyObserver):
    def __init__(self, snapshots: dict[str, TTFTPercentiles]) -> None:
        super().__init__()
        self.snapshots = snapshots

    def percentiles_of(self, endpoints: Sequence[str]) -> list[TTFTPercentiles]:
        return [self.snapshots.get(name, COLD) for name in endpoints]


class FixedInflight(InFlightLoadProducer):
    def __init__(self, requests: dict[str, int]) -> None:
        super().__init__()
        self.requests = requests

    def load(self, endpoint: str) -> InFlightLoad:
        return InFlightLoad(self.requests.get(endpoint, 0), 0)


ENDPOINTS = [make_endpoint(n) for n in "abcd"]
SEED = _with(CURVE, floor_ttft=0.25, recent_request_count=3)  # a floor, too few recent requests
SNAPSHOTS = {"a": CURVE, "b": CURVE, "c": SEED}  # d: cold


def scorer(
    snapshots: dict[str, TTFTPercentiles] | None = None,
    inflight: dict[str, int] | None = None,
    rng: random.Random | None = None,
    *,
    with_inflight: bool = True,
    **params: Any,
) -> LatencyObservationScorer:
    return LatencyObservationScorer(
        params=ObservationScorerParameters(**params),
        observer=FixedObserver(SNAPSHOTS if snapshots is None else snapshots),
        inflight=FixedInflight({"a": 4, "b": 1} if inflight is None else inflight) if with_inflight else None,
        rng=rng or random.Random(0),
    )


def scores(s: LatencyObservationScorer, endpoints: Sequence[Endpoint] = ENDPOINTS) -> list[float]:
    return list(s.score(make_request(), CycleState(), endpoints))


def test_scores_are_min_max_normalised_with_cold_endpoints_seeded_at_the_best() -> None:
    # a: 0.4 on B -> C at 4 in flight, b: 0.2 on A -> B at 1, c: its floor 0.25, d: cold
    assert scores(scorer(explorationRate=0)) == pytest.approx([0.0, 1.0, 0.75, 1.0])


def test_exploration_probes_or_suppresses_each_endpoint_without_a_baseline() -> None:
    assert scores(scorer(explorationRate=1.0)) == pytest.approx([0.0, 1.0, 1.0, 1.0])
    draws = random.Random(1)
    expected_c, expected_d = (1.0 if draws.random() < 0.5 else 0.0 for _ in range(2))
    got = scores(scorer(rng=random.Random(1), explorationRate=0.5))
    assert got == pytest.approx([0.0, 1.0, expected_c, expected_d])
    assert 0.0 in got[2:] and 1.0 in got[2:]  # the seed gives one of each


def test_without_a_baseline_anywhere_exploration_only_probes() -> None:
    seeds = {"a": SEED, "b": _with(SEED, floor_ttft=0.5)}
    rng = random.Random(1)
    draws = random.Random(1)
    got = scores(scorer(seeds, rng=rng, explorationRate=0.5), ENDPOINTS[:3])
    normalised = [1.0, 0.0, 1.0]  # a 0.25, b 0.5, c cold at 0.25
    assert got == pytest.approx([1.0 if draws.random() < 0.5 else n for n in normalised])


def test_all_cold_scores_one_without_drawing() -> None:
    rng = random.Random(3)
    before = rng.getstate()
    assert scores(scorer({}, rng=rng)) == [1.0] * 4
    assert rng.getstate() == before
    bare = LatencyObservationScorer(rng=random.Random(0))  # no observer at all
    assert scores(bare) == [1.0] * 4


def test_equal_predictions_all_score_one() -> None:
    assert scores(scorer({"a": CURVE, "b": CURVE}, {"a": 1, "b": 1}, explorationRate=0), ENDPOINTS[:2]) == [
        1.0,
        1.0,
    ]


def test_an_unreadable_inflight_count_demotes_the_baseline() -> None:
    # a and b predict their floor 0.1, c 0.25, d cold (seeded at 0.1)
    assert scores(scorer(with_inflight=False, explorationRate=0)) == pytest.approx([1.0, 1.0, 0.0, 1.0])


def test_predictions_round_half_away_from_zero() -> None:
    snapshots = {"a": CURVE, "b": CURVE, "c": _with(SEED, floor_ttft=0.125)}
    s = scorer(snapshots, roundTTFTStep=0.25, explorationRate=0)
    preds = [p for p, _ in s.predictions(ENDPOINTS[:3])]
    assert preds == [0.5, 0.25, 0.25]  # 0.4 -> 0.5, 0.2 -> 0.25, 0.125 -> 0.25 (Go's Round)
    assert scores(s, ENDPOINTS[:3]) == [0.0, 1.0, 1.0]


class Draws(random.Random):
    """A random source whose draws are given."""

    def __init__(self, *draws: float) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


def test_an_endpoint_observed_fewer_than_min_requests_times_is_cold() -> None:
    clock = FakeClock()
    o = make_observer(clock, minRequests=3)
    a, b, c, d = (make_endpoint(n) for n in "abcd")
    for e in (a, b, c, d):
        o.percentiles(e.name)
    clock.now = T0 + 0.5
    for k, ttft in enumerate((0.2, 0.4, 0.6, 0.8)):  # a slows with load
        o.record("a", ttft, k, clock.now)
    for _ in range(2):  # b looks fast, but twice is too few
        o.record("b", 0.1, 0, clock.now)
    for k in range(4):  # d is flat: a floor, no baseline
        o.record("d", 0.3, k, clock.now)
    clock.now = T0 + 1.0
    m = o.percentiles("a")
    # sorted [0.2, 0.4, 0.6, 0.8]: P10 at index 0.3, P25 at 0.75, P50 at 1.5; bands 0..1 and 1..1
    approx(m, window_floor_ttft=0.26, low_load_ttft=0.35, typical_load_ttft=0.5)
    approx(m, inflight_at_low_load=0.5, inflight_at_typical_load=1.0)
    assert o.percentiles("b").window_floor_ttft == pytest.approx(0.1)
    assert o.percentiles("b").floor() == 0.0  # 2 observations < 3

    def rank(rng: random.Random, rate: float) -> list[float]:
        s = LatencyObservationScorer(
            params=ObservationScorerParameters(explorationRate=rate),
            observer=o,
            inflight=FixedInflight({"a": 2}),
            rng=rng,
        )
        return list(s.score(make_request(), CycleState(), (a, b, c, d)))

    # a on the chord (B is 0.5 from C, under the gap): 0.26 + 2 × (0.5 − 0.26) / 1 = 0.74; d its
    # floor 0.3; b and c cold, seeded at the best, 0.3
    assert rank(random.Random(0), 0.0) == pytest.approx([0.0, 1.0, 1.0, 1.0])
    # b, c and d have no baseline: each draws, in order; one under the rate probes (1), the others
    # are suppressed (0) because a has a baseline
    assert rank(Draws(0.05, 0.5, 0.5), 0.1) == [0.0, 1.0, 0.0, 0.0]
    assert rank(Draws(0.5, 0.5, 0.05), 0.1) == [0.0, 0.0, 0.0, 1.0]
    clock.now = T0 + 1.5
    o.record("b", 0.1, 0, clock.now)  # the third: b's floor counts from the next tick
    assert o.percentiles("b").floor() == 0.0
    clock.now = T0 + 2.0
    assert o.percentiles("b").floor() == pytest.approx(0.1)
    # b is no longer cold: it predicts its floor, the best; c, still cold, is seeded there too
    assert rank(random.Random(0), 0.0) == pytest.approx([0.0, 1.0, 1.0, (0.74 - 0.3) / (0.74 - 0.1)])


# --- parameters -----------------------------------------------------------------------------------


def test_the_defaults_are_upstreams() -> None:
    p = ObserverParameters()
    assert (p.interval_duration, p.window_size, p.max_observation_age, p.max_requests) == (
        1.0,
        5000,
        180.0,
        100,
    )
    assert (p.min_requests, p.low_percentile, p.typical_percentile) == (10, 25, 50)
    assert (p.bucket_duration, p.bucket_history_size, p.in_flight_load_producer_name) == (60.0, 1000, "")
    s = ObservationScorerParameters()
    assert (s.exploration_rate, s.min_inflight_gap, s.round_ttft_step) == (0.1, 2.0, 0.0)
    assert (s.ttft_percentiles_producer_name, s.in_flight_load_producer_name) == ("", "")
    assert ObservationScorerParameters.model_validate({"roundTTFTStep": 0.01}).round_ttft_step == 0.01
    assert LatencyObservationScorer.category == "Distribution"
    assert observer.SPEC.worker_state and observation_scorer.SPEC.worker_state == ""


def config_error(plugin_type: str, parameters: str) -> tuple[str, str]:
    """The one issue a config with `plugin_type` given `parameters` fails with: (path, message)."""
    with pytest.raises(ConfigError) as e:
        load(f"plugins:\n- type: {plugin_type}\n  parameters: {parameters}\n- type: random-picker\n")
    (issue,) = e.value.issues
    return issue.path, issue.message


@pytest.mark.parametrize(
    ("parameters", "field", "message"),
    [
        ("{intervalDuration: 0s}", "intervalDuration", "intervalDuration must be > 0, got 0s"),
        ("{maxObservationAge: 0}", "maxObservationAge", "maxObservationAge must be > 0, got 0s"),
        ("{maxObservationAge: -1}", "maxObservationAge", "a duration cannot be negative"),
        ("{bucketDuration: 0.1ns}", "bucketDuration", "bucketDuration must be > 0, got 1e-10s"),
        ("{bucketDuration: soon}", "bucketDuration", "'soon' is not a duration"),
        ("{windowSize: 0}", "windowSize", "windowSize must be > 0, got 0"),
        ("{maxRequests: 0}", "maxRequests", "maxRequests must be > 0, got 0"),
        ("{maxRequests: 11, windowSize: 10}", "maxRequests", "maxRequests (11) must be <= windowSize (10)"),
        ("{minRequests: 0}", "minRequests", "minRequests must be > 0, got 0"),
        ("{bucketHistorySize: 1}", "bucketHistorySize", "bucketHistorySize must be >= 2, got 1"),
        (
            "{lowPercentile: 0}",
            "lowPercentile",
            "percentiles must satisfy 0 < lowPercentile (0) < typicalPercentile (50) < 100",
        ),
        ("{typicalPercentile: 100}", "typicalPercentile", "lowPercentile (25) < typicalPercentile (100)"),
        ("{lowPercentile: 50}", "typicalPercentile", "lowPercentile (50) < typicalPercentile (50)"),
        (
            "{inFlightLoadProducerName: nowhere}",
            "inFlightLoadProducerName",
            "no in-flight load producer named 'nowhere'",
        ),
        ("{unknown: 1}", "unknown", "unknown field 'unknown'"),
    ],
)
def test_observer_parameter_errors(parameters: str, field: str, message: str) -> None:
    path, said = config_error("latency-observer-producer-hub", parameters)
    assert path == f"plugins[0].parameters.{field}"
    assert message in said, said


@pytest.mark.parametrize(
    ("parameters", "field", "message"),
    [
        ("{explorationRate: 1.5}", "explorationRate", "explorationRate must be in [0, 1], got 1.5"),
        ("{explorationRate: -0.1}", "explorationRate", "explorationRate must be in [0, 1], got -0.1"),
        ("{explorationRate: .nan}", "explorationRate", "explorationRate must be in [0, 1], got nan"),
        ("{minInflightGap: 0}", "minInflightGap", "minInflightGap must be > 0, got 0"),
        ("{roundTTFTStep: -0.01}", "roundTTFTStep", "roundTTFTStep must be >= 0, got -0.01"),
        (
            "{ttftPercentilesProducerName: nowhere}",
            "ttftPercentilesProducerName",
            "no latency observer named 'nowhere'",
        ),
        (
            "{ttftPercentilesProducerName: random-picker}",
            "ttftPercentilesProducerName",
            "plugin 'random-picker' (random-picker) does not produce TTFT percentiles",
        ),
        ("{roundTtftStep: 1}", "roundTtftStep", "unknown field 'roundTtftStep'"),  # upstream's spelling only
    ],
)
def test_scorer_parameter_errors(parameters: str, field: str, message: str) -> None:
    path, said = config_error("latency-observation-scorer-hub", parameters)
    assert path == f"plugins[0].parameters.{field}"
    assert message in said, said


def test_parameter_errors_outside_a_config() -> None:
    with pytest.raises(ParameterError) as e:
        LatencyObserver(params=ObserverParameters(low_percentile=60))
    assert e.value.parameter == "typicalPercentile"
    with pytest.raises(ParameterError) as e:
        LatencyObservationScorer(params=ObservationScorerParameters(min_inflight_gap=-1))
    assert (e.value.parameter, str(e.value)) == ("minInflightGap", "minInflightGap must be > 0, got -1.0")
    assert ObservationScorerParameters(exploration_rate=0).exploration_rate == 0  # an explicit 0 holds


# --- through a config -----------------------------------------------------------------------------

UPSTREAM_EXAMPLE = """\
plugins:
  - type: latency-observer-producer-hub
    name: ttft-observer
    parameters:
      intervalDuration: 1s
      minRequests: 4
      bucketDuration: 1m
      bucketHistorySize: 1000
  - type: latency-observation-scorer-hub
    name: ttft
    parameters:
      explorationRate: 0
      minInflightGap: 2.0
      ttftPercentilesProducerName: ttft-observer
  - type: max-score-picker
  - type: single-profile-handler
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: ttft
      - pluginRef: max-score-picker
dataLayer:
  sources:
    - pluginRef: ttft-observer
"""


def test_the_scorer_alone_gets_both_default_producers() -> None:
    clock = FakeClock()
    config = load("plugins:\n- type: latency-observation-scorer-hub\n- type: max-score-picker\n", clock, 42.0)
    o = config.plugins["latency-observer-producer-hub"]
    s = config.plugins["latency-observation-scorer-hub"]
    inflight = config.plugins["inflight-load-producer"]
    assert isinstance(o, LatencyObserver) and isinstance(s, LatencyObservationScorer)
    assert s.observer is o and s.inflight is inflight and o.inflight is inflight
    assert o.stale_after == 42.0  # --plugin-state-staleness-threshold reaps its dispatches
    o.record("x", 0.5, 0, clock.now)
    clock.now = T0 + 1
    assert o.percentiles("x").typical_load_ttft == 0.5  # on the config's clock
    assert any("'latency-observer-producer-hub' added with default parameters" in w for w in config.warnings)
    assert o in config.hooks.producers and o in config.hooks.pre_request
    assert o in config.hooks.response_streaming and o in config.hooks.response_complete
    assert config.worker_states["latency-observer-producer-hub"] == observer.WORKER_STATE
    assert config.worker_states["latency-observation-scorer-hub"] == ""
    # Unlisted under dataLayer.sources it still works (lazily): no "not used" warning says otherwise.
    assert not any("is not used" in w for w in config.warnings), config.warnings


def test_upstreams_example_loads_with_the_observer_listed_as_a_source() -> None:
    config = load(UPSTREAM_EXAMPLE)
    o = config.plugins["ttft-observer"]
    assert isinstance(o, LatencyObserver)
    assert o.params.min_requests == 4
    assert "latency-observer-producer-hub" not in config.plugins  # named: no default one
    assert not any("is not used" in w for w in config.warnings), config.warnings


def test_a_named_inflight_producer_is_read() -> None:
    config = load(
        """\
        plugins:
        - type: inflight-load-producer
          name: load
        - type: latency-observer-producer-hub
          parameters: {inFlightLoadProducerName: load}
        - type: latency-observation-scorer-hub
          parameters: {inFlightLoadProducerName: load}
        - type: max-score-picker
        """
    )
    assert "inflight-load-producer" not in config.plugins
    s = config.plugins["latency-observation-scorer-hub"]
    assert isinstance(s, LatencyObservationScorer) and s.inflight is config.plugins["load"]


def test_through_the_director_the_observed_ttft_steers_the_decision() -> None:
    """Upstream's example config, requests parsed, decided and answered through the director: the
    observer times the streamed responses' first chunks and the scorer routes on what it saw."""
    clock = FakeClock()
    config = load(UPSTREAM_EXAMPLE, clock)
    store = Datastore()
    for i, name in enumerate("ab"):
        store.upsert(EndpointSpec(name, f"10.0.0.{i + 1}", 8000, {}))
    director = Director(config, store.snapshot)
    only_a, only_b = frozenset({"10.0.0.1"}), frozenset({"10.0.0.2"})
    o, s = config.plugins["ttft-observer"], config.plugins["ttft"]
    assert isinstance(o, LatencyObserver) and isinstance(s, LatencyObservationScorer)

    def send(subset: frozenset[str] | None = None, *, stream: bool = True) -> tuple[RequestCycle, str]:
        payload = json.dumps({"model": "m", "prompt": "hello", "stream": stream}).encode()
        cycle = director.decide(payload, {}, "/v1/completions", subset)
        return cycle, cycle.targets[0].name

    def first_chunk(cycle: RequestCycle) -> Response:
        target = cycle.targets[0]
        response = Response(cycle.request.request_id, streaming=cycle.request.body.stream)
        cycle.received(response, target)
        response.chunk = b'data: {"choices": [{"text": "hi"}]}\n\n'
        cycle.streamed(response, target)
        return response

    def complete(cycle: RequestCycle, response: Response) -> None:
        response.chunk, response.end_of_stream = b"", True
        cycle.completed(response, cycle.targets[0])

    # a: four at once (0, 1, 2, 3 in flight when each was decided), TTFT 0.1 .. 0.4 s: it slows
    to_a = [send(only_a) for _ in range(4)]
    assert [name for _, name in to_a] == ["a"] * 4
    answered = []
    for i, (cycle, _) in enumerate(to_a):
        clock.now = T0 + 0.1 * (i + 1)
        answered.append((cycle, first_chunk(cycle)))
    # b: four at once, 0.3 s each: flat
    clock.now = T0 + 0.5
    to_b = [send(only_b) for _ in range(4)]
    clock.now = T0 + 0.8
    answered += [(cycle, first_chunk(cycle)) for cycle, _ in to_b]
    # a request that did not ask to stream: its first chunk is no TTFT
    whole, _ = send(only_a, stream=False)
    clock.now = T0 + 0.9
    answered.append((whole, first_chunk(whole)))
    for cycle, response in answered:
        complete(cycle, response)
    dumped = o.dump_state()
    assert isinstance(dumped, dict) and dumped["trackedRequests"] == 0
    assert [(e["endpoint"], e["observations"]) for e in dumped["endpoints"]] == [("a", 4), ("b", 4)]

    clock.now = T0 + 2.0  # a's and b's snapshots recomputed at T0 + 1 and T0 + 2
    # a sorted [0.1 .. 0.4] pinned [0 .. 3]: P10 at index 0.3, P50 at 1.5; bands 0..1 and 1..1
    approx(
        o.percentiles("a"),
        window_floor_ttft=0.13,
        typical_load_ttft=0.25,
        inflight_at_low_load=0.5,
        inflight_at_typical_load=1.0,
    )
    approx(o.percentiles("b"), window_floor_ttft=0.3, typical_load_ttft=0.3)
    a, b = store.snapshot().endpoints
    # idle, a is predicted at its floor 0.13 s, b at its floor 0.3 s (no rise with load: no baseline)
    assert [p for p, _ in s.predictions((a, b))] == pytest.approx([0.13, 0.3])
    first, name = send()
    assert name == "a"
    # with two in flight on a (that one and one more): 0.13 + 2 × (0.25 − 0.13) / 1 = 0.37 s > 0.3 s
    second, name = send(only_a)
    assert [p for p, _ in s.predictions((a, b))] == pytest.approx([0.37, 0.3])
    assert send()[1] == "b"
    complete(first, first_chunk(first))
    complete(second, first_chunk(second))
    assert [p for p, _ in s.predictions((a, b))] == pytest.approx([0.13, 0.3])  # a drained
