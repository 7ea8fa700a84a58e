"""Scorers: queue, running requests, KV cache, LoRA affinity, load-aware, active requests, token load,
session affinity. (The prefix-cache scorer is in test_prefix.py.)"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileRunResult,
    Response,
    ScheduleTrace,
    SchedulingResult,
    depends_on_metrics_alone,
)
from epick.plugins.scorers.active_request import ActiveRequestParameters, ActiveRequestScorer
from epick.plugins.scorers.kv_cache import KVCacheUtilizationScorer
from epick.plugins.scorers.load_aware import LoadAwareParameters, LoadAwareScorer
from epick.plugins.scorers.lora_affinity import LoraAffinityScorer
from epick.plugins.scorers.queue import QueueScorer
from epick.plugins.scorers.running_requests import RunningRequestsSizeScorer
from epick.plugins.scorers.session_affinity import SESSION_HEADER, SessionAffinityScorer, session_token
from epick.plugins.scorers.token_load import TokenLoadParameters, TokenLoadScorer
from tests.builders import make_endpoint, make_profile, make_request, make_scheduler


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def eps(*names: str) -> list[Endpoint]:
    return [make_endpoint(n) for n in names]


def result_of(*profiles: tuple[str, Sequence[Endpoint]]) -> SchedulingResult:
    """A SchedulingResult with one profile per (name, targets); the first is primary."""
    return SchedulingResult({name: ProfileRunResult(tuple(t)) for name, t in profiles}, profiles[0][0])


def score(
    scorer: object, endpoints: Sequence[Endpoint], request: InferenceRequest | None = None
) -> list[float]:
    return list(scorer.score(request or make_request(), CycleState(), endpoints))  # type: ignore[attr-defined]


# --- queue-scorer and running-requests-size-scorer --------------------------------------------

SPREAD_CASES = [
    # (10-0)/(10-0) = 1; (10-5)/(10-0) = 0.5; (10-10)/(10-0) = 0
    ([0, 5, 10], [1.0, 0.5, 0.0]),
    # (8-2)/(8-2) = 1; (8-4)/6 = 2/3; (8-8)/6 = 0
    ([2, 4, 8], [1.0, 2 / 3, 0.0]),
    # all equal: 1 each (no spread to divide by)
    ([3, 3, 3], [1.0, 1.0, 1.0]),
    ([0, 0], [1.0, 1.0]),
    # a single endpoint: 1
    ([7], [1.0]),
    # order follows the endpoints: (4-4)/4 = 0, (4-0)/4 = 1, (4-1)/4 = 0.75
    ([4, 0, 1], [0.0, 1.0, 0.75]),
    # no endpoints, no scores
    ([], []),
]


@pytest.mark.parametrize(("queues", "expected"), SPREAD_CASES)
def test_queue_scorer(queues: list[int], expected: list[float]) -> None:
    endpoints = [make_endpoint(f"e{i}", queue=q) for i, q in enumerate(queues)]
    assert score(QueueScorer(), endpoints) == pytest.approx(expected)


@pytest.mark.parametrize(("running", "expected"), SPREAD_CASES)
def test_running_requests_size_scorer(running: list[int], expected: list[float]) -> None:
    endpoints = [make_endpoint(f"e{i}", running=r) for i, r in enumerate(running)]
    assert score(RunningRequestsSizeScorer(), endpoints) == pytest.approx(expected)


def test_queue_scorer_reads_the_waiting_queue_not_running_requests() -> None:
    endpoints = [make_endpoint("a", queue=0, running=9), make_endpoint("b", queue=4, running=0)]
    # queue: a (4-0)/4 = 1, b 0; running is the other way round
    assert score(QueueScorer(), endpoints) == [1.0, 0.0]
    assert score(RunningRequestsSizeScorer(), endpoints) == [0.0, 1.0]


@pytest.mark.parametrize("make", [QueueScorer, RunningRequestsSizeScorer, KVCacheUtilizationScorer])
def test_metrics_only_scorers_declare_it_and_score_what_they_are_given(make: type[QueueScorer]) -> None:
    """They declare Reads.METRICS (so the runtime reuses their scores per snapshot version) and keep
    nothing themselves: the same endpoints with new metrics are scored afresh."""
    scorer = make()
    assert depends_on_metrics_alone(scorer)
    request = make_request()
    busy_b = (make_endpoint("a", queue=1, running=1, kv=0.2), make_endpoint("b", queue=5, running=5, kv=0.5))
    busy_a = (make_endpoint("a", queue=9, running=9, kv=0.9), make_endpoint("b", queue=0, running=0, kv=0.0))
    assert scorer.score(request, CycleState(), busy_b) == pytest.approx(
        [1.0, 0.0] if make is not KVCacheUtilizationScorer else [0.8, 0.5]
    )
    assert scorer.score(request, CycleState(), busy_a) == pytest.approx(
        [0.0, 1.0] if make is not KVCacheUtilizationScorer else [0.1, 1.0]
    )


# --- kv-cache-utilization-scorer --------------------------------------------------------------


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (0.0, 1.0),  # 1 - 0
        (0.25, 0.75),  # 1 - 0.25
        (0.9, 0.1),  # 1 - 0.9
        (1.0, 0.0),  # 1 - 1
    ],
)
def test_kv_cache_utilization_scorer(usage: float, expected: float) -> None:
    assert score(KVCacheUtilizationScorer(), [make_endpoint(kv=usage)]) == pytest.approx([expected])


def test_kv_cache_scores_each_endpoint_on_its_own() -> None:
    endpoints = [make_endpoint("a", kv=0.5), make_endpoint("b", kv=0.2)]
    # not normalised over candidates: 1-0.5, 1-0.2
    assert score(KVCacheUtilizationScorer(), endpoints) == pytest.approx([0.5, 0.8])


# --- lora-affinity-scorer ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("active", "waiting", "max_models", "expected"),
    [
        # the adapter is active: 1
        ({"m"}, set(), 4, 1.0),
        ({"m", "x", "y"}, set(), 3, 1.0),
        # not there, room to load: active + waiting = 1 + 0 < 2 -> 0.8
        ({"x"}, set(), 2, 0.8),
        ({"x"}, {"y"}, 3, 0.8),  # 1 + 1 < 3
        # waiting and room: the room rule comes first, 0 + 1 < 2 -> 0.8
        (set(), {"m"}, 2, 0.8),
        # waiting, no room: 1 + 1 = 2, not < 2 -> 0.6
        ({"x"}, {"m"}, 2, 0.6),
        # neither active nor waiting, no room: 2 + 0 = 2 -> 0
        ({"x", "y"}, set(), 2, 0.0),
        ({"x"}, {"y"}, 2, 0.0),
        # max_active_models 0 (LoRA off or unknown): 0 + 0 < 0 is false, never "room"
        (set(), set(), 0, 0.0),
        ({"m"}, set(), 0, 1.0),  # still active -> 1
        (set(), {"m"}, 0, 0.6),  # still waiting -> 0.6
    ],
)
def test_lora_affinity_scorer(active: set[str], waiting: set[str], max_models: int, expected: float) -> None:
    endpoint = make_endpoint(active=sorted(active), waiting=sorted(waiting), max_models=max_models)
    assert score(LoraAffinityScorer(), [endpoint], make_request(model="m")) == [expected]


def test_lora_affinity_uses_the_request_target_model() -> None:
    endpoint = make_endpoint(active=["lora-a"], max_models=1)
    scorer = LoraAffinityScorer()
    assert score(scorer, [endpoint], make_request(model="lora-a")) == [1.0]
    # lora-b: not active, 1 + 0 = 1 not < 1, not waiting -> 0
    assert score(scorer, [endpoint], make_request(model="lora-b")) == [0.0]


# --- load-aware-scorer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("threshold", "queue", "expected"),
    [
        (128, 0, 0.5),  # empty queue: 0.5, not 1
        (128, 1, 0.5 * (1 - 1 / 128)),  # 0.49609375
        (128, 64, 0.25),  # 0.5 * (1 - 64/128)
        (128, 96, 0.125),  # 0.5 * (1 - 96/128)
        (128, 128, 0.0),  # at the threshold
        (128, 1000, 0.0),  # min(1000, 128) = 128 -> 0
        (10, 5, 0.25),  # custom threshold: 0.5 * (1 - 5/10)
        (10, 10, 0.0),
        (10, 20, 0.0),
        (10, 0, 0.5),
    ],
)
def test_load_aware_scorer(threshold: int, queue: int, expected: float) -> None:
    scorer = LoadAwareScorer(threshold=threshold)
    assert score(scorer, [make_endpoint(queue=queue)]) == pytest.approx([expected])


def test_load_aware_threshold_defaults_to_128() -> None:
    assert LoadAwareScorer().threshold == 128
    assert LoadAwareParameters().threshold == 128
    # 0.5 * (1 - 64/128) = 0.25 with the default
    assert score(LoadAwareScorer(), [make_endpoint(queue=64)]) == [0.25]


@pytest.mark.parametrize("bad", [0, -5])
def test_load_aware_threshold_must_be_positive(bad: int) -> None:
    with pytest.raises(ValidationError):
        LoadAwareParameters.model_validate({"threshold": bad})


# --- active-request-scorer --------------------------------------------------------------------


def test_active_request_scores_one_when_nothing_is_in_flight() -> None:
    assert score(ActiveRequestScorer(), eps("a", "b")) == [1.0, 1.0]


def test_active_request_counts_and_scores_relative_to_the_busiest() -> None:
    a, b, c = eps("a", "b", "c")
    scorer = ActiveRequestScorer(clock=FakeClock())
    for rid, target in [("r1", a), ("r2", a), ("r3", b)]:
        scorer.pre_request(make_request(request_id=rid), result_of(("default", [target])), CycleState())
    # counts a=2, b=1, c=0; max 2: a (2-2)/2 = 0, b (2-1)/2 = 0.5, c (2-0)/2 = 1
    assert score(scorer, [a, b, c]) == [0.0, 0.5, 1.0]


def test_active_request_max_is_over_every_tracked_endpoint_not_just_candidates() -> None:
    a, b, c = eps("a", "b", "c")
    scorer = ActiveRequestScorer(clock=FakeClock())
    for rid, target in [("r1", a), ("r2", a), ("r3", a), ("r4", a), ("r5", b)]:
        scorer.pre_request(make_request(request_id=rid), result_of(("default", [target])), CycleState())
    # counts a=4, b=1; a is not a candidate, the max is still 4: b (4-1)/4 = 0.75, c (4-0)/4 = 1
    assert score(scorer, [b, c]) == [0.75, 1.0]


def test_active_request_counts_the_first_target_of_every_profile_result() -> None:
    d1, d2, p1, p2 = eps("d1", "d2", "p1", "p2")
    scorer = ActiveRequestScorer(clock=FakeClock())
    pd = result_of(("decode", [d1, d2]), ("prefill", [p1, p2]))
    scorer.pre_request(make_request(request_id="r1"), pd, CycleState())
    # d1 and p1 count 1 each; the fallbacks d2, p2 do not: max 1 -> d1 0, p1 0, d2 1, p2 1
    assert score(scorer, [d1, d2, p1, p2]) == [0.0, 1.0, 0.0, 1.0]


def test_active_request_ignores_a_failed_profile_result() -> None:
    a, b = eps("a", "b")
    scorer = ActiveRequestScorer(clock=FakeClock())
    result = SchedulingResult({"decode": ProfileRunResult((a,)), "prefill": None}, "decode")
    scorer.pre_request(make_request(request_id="r1"), result, CycleState())
    assert score(scorer, [a, b]) == [0.0, 1.0]


def test_active_request_response_complete_decrements() -> None:
    a, b = eps("a", "b")
    scorer = ActiveRequestScorer(clock=FakeClock())
    r1, r2, r3 = (make_request(request_id=f"r{i}") for i in (1, 2, 3))
    scorer.pre_request(r1, result_of(("default", [a])), CycleState())
    scorer.pre_request(r2, result_of(("default", [a])), CycleState())
    scorer.pre_request(r3, result_of(("default", [b])), CycleState())
    # a=2, b=1 -> a 0, b (2-1)/2 = 0.5
    assert score(scorer, [a, b]) == [0.0, 0.5]
    scorer.response_complete(r1, Response("r1"), a)
    # a=1, b=1 -> both (1-1)/1 = 0
    assert score(scorer, [a, b]) == [0.0, 0.0]
    scorer.response_complete(r1, Response("r1"), a)  # a second completion of r1 changes nothing
    assert score(scorer, [a, b]) == [0.0, 0.0]
    scorer.response_complete(r3, Response("r3"), b)
    # a=1 -> a 0, b 1
    assert score(scorer, [a, b]) == [0.0, 1.0]
    scorer.response_complete(r2, Response("r2"), a)
    assert score(scorer, [a, b]) == [1.0, 1.0]


def test_active_request_same_request_twice_counts_once() -> None:
    a, b = eps("a", "b")
    scorer = ActiveRequestScorer(clock=FakeClock())
    scorer.pre_request(make_request(request_id="r1"), result_of(("default", [a])), CycleState())
    scorer.pre_request(make_request(request_id="r1"), result_of(("default", [b])), CycleState())
    # r1 moved to b: a=0, b=1
    assert score(scorer, [a, b]) == [1.0, 0.0]
    assert scorer.in_flight.counts == {"b": 1.0}


def test_active_request_entries_expire_after_the_timeout() -> None:
    a, b = eps("a", "b")
    clock = FakeClock(100.0)
    scorer = ActiveRequestScorer(request_timeout=10.0, clock=clock)
    scorer.pre_request(
        make_request(request_id="r1"), result_of(("default", [a])), CycleState()
    )  # expires at 110
    clock.now = 105.0
    scorer.pre_request(
        make_request(request_id="r2"), result_of(("default", [b])), CycleState()
    )  # expires at 115
    scorer.pre_request(make_request(request_id="r3"), result_of(("default", [b])), CycleState())
    clock.now = 109.999
    # a=1, b=2: a (2-1)/2 = 0.5, b 0
    assert score(scorer, [a, b]) == [0.5, 0.0]
    clock.now = 110.0
    # r1 expired (deadline <= now): a=0, b=2
    assert score(scorer, [a, b]) == [1.0, 0.0]
    clock.now = 115.0
    assert score(scorer, [a, b]) == [1.0, 1.0]
    assert scorer.in_flight.counts == {}


def test_active_request_timeout_parameter() -> None:
    assert ActiveRequestParameters().request_timeout == 120.0
    assert ActiveRequestParameters.model_validate({"requestTimeout": "2m30s"}).request_timeout == 150.0
    assert ActiveRequestParameters.model_validate({"requestTimeout": "500ms"}).request_timeout == 0.5


# --- token-load-scorer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        # 400 chars // 4 = 100 prompt tokens + max_tokens 50 = 150
        ({"prompt": "x" * 400, "max_tokens": 50}, 150),
        # 7 // 4 = 1, no max_tokens
        ({"prompt": "x" * 7}, 1),
        # max_completion_tokens wins over max_tokens: 40 // 4 + 30 = 40
        ({"prompt": "y" * 40, "max_tokens": 999, "max_completion_tokens": 30}, 40),
        # chat: the messages' compact JSON [{"role":"user","content":"hi"}] is 32 chars -> 8
        ({"messages": [{"role": "user", "content": "hi"}]}, 8),
    ],
)
def test_token_load_counts_prompt_tokens_plus_max_tokens(body: dict[str, object], tokens: int) -> None:
    a, b = eps("a", "b")
    scorer = TokenLoadScorer(queue_threshold_tokens=1000, clock=FakeClock())
    request = InferenceRequest.from_openai({"model": "m", **body}, request_id="r1")
    scorer.pre_request(request, result_of(("default", [a])), CycleState())
    assert scorer.in_flight.counts == {"a": float(tokens)}
    # a: 1 - tokens/1000; b has none in flight: 1
    assert score(scorer, [a, b]) == pytest.approx([1 - tokens / 1000, 1.0])


def test_token_load_threshold_caps_the_load() -> None:
    a, b, c = eps("a", "b", "c")
    scorer = TokenLoadScorer(queue_threshold_tokens=100, clock=FakeClock())
    scorer.pre_request(
        make_request("x" * 200, request_id="r1"), result_of(("default", [a])), CycleState()
    )  # 50
    scorer.pre_request(
        make_request("x" * 600, request_id="r2"), result_of(("default", [b])), CycleState()
    )  # 150
    # a 1 - 50/100 = 0.5; b 1 - min(150, 100)/100 = 0; c 1
    assert score(scorer, [a, b, c]) == [0.5, 0.0, 1.0]


def test_token_load_sums_requests_and_counts_every_profile_first_target() -> None:
    d, p, f = eps("d", "p", "fallback")
    scorer = TokenLoadScorer(queue_threshold_tokens=1000, clock=FakeClock())
    scorer.pre_request(
        make_request("x" * 400, request_id="r1"),
        result_of(("decode", [d, f]), ("prefill", [p])),
        CycleState(),
    )
    scorer.pre_request(make_request("x" * 800, request_id="r2"), result_of(("decode", [d])), CycleState())
    # d: 100 + 200 = 300 -> 0.7; p: 100 -> 0.9; fallback not counted -> 1
    assert score(scorer, [d, p, f]) == pytest.approx([0.7, 0.9, 1.0])


def test_token_load_response_complete_and_expiry() -> None:
    a, b = eps("a", "b")
    clock = FakeClock(0.0)
    scorer = TokenLoadScorer(queue_threshold_tokens=1000, request_timeout=30.0, clock=clock)
    r1 = make_request("x" * 400, request_id="r1")  # 100 tokens
    r2 = make_request("x" * 800, request_id="r2")  # 200 tokens
    scorer.pre_request(r1, result_of(("default", [a])), CycleState())
    clock.now = 10.0
    scorer.pre_request(r2, result_of(("default", [b])), CycleState())
    assert score(scorer, [a, b]) == pytest.approx([0.9, 0.8])
    scorer.response_complete(r1, Response("r1"), a)
    assert score(scorer, [a, b]) == pytest.approx([1.0, 0.8])
    clock.now = 39.9
    assert score(scorer, [a, b]) == pytest.approx([1.0, 0.8])
    clock.now = 40.0  # r2 was added at 10 with timeout 30
    assert score(scorer, [a, b]) == [1.0, 1.0]


def test_token_load_parameters() -> None:
    defaults = TokenLoadParameters()
    assert defaults.queue_threshold_tokens == 4_194_304
    assert defaults.request_timeout == 120.0
    with pytest.raises(ValidationError):
        TokenLoadParameters.model_validate({"queueThresholdTokens": 0})


# --- session-affinity-scorer ------------------------------------------------------------------


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # the token names b: b 1, others 0
        ({SESSION_HEADER: b64("b")}, [0.0, 1.0, 0.0]),
        ({SESSION_HEADER: b64("pod-c")}, [0.0, 0.0, 1.0]),
        # header names are case-insensitive (requests keep them lower-case)
        ({"X-Session-Token": b64("a")}, [1.0, 0.0, 0.0]),
        # no header: all 0
        ({}, [0.0, 0.0, 0.0]),
        ({SESSION_HEADER: ""}, [0.0, 0.0, 0.0]),
        # a token naming no candidate: all 0
        ({SESSION_HEADER: b64("gone")}, [0.0, 0.0, 0.0]),
        # not base64: all 0
        ({SESSION_HEADER: "not base64!"}, [0.0, 0.0, 0.0]),
        ({SESSION_HEADER: "YQ"}, [0.0, 0.0, 0.0]),  # "a" without its padding
        # base64 of bytes that are not UTF-8: all 0
        ({SESSION_HEADER: base64.b64encode(b"\xff\xfe").decode()}, [0.0, 0.0, 0.0]),
        # the raw name instead of its base64: all 0
        ({SESSION_HEADER: "b"}, [0.0, 0.0, 0.0]),
    ],
)
def test_session_affinity_scorer(headers: dict[str, str], expected: list[float]) -> None:
    endpoints = eps("a", "b", "pod-c")
    assert score(SessionAffinityScorer(), endpoints, make_request(headers=headers)) == expected


def test_session_affinity_writes_the_token_on_the_response_and_it_round_trips() -> None:
    endpoints = eps("a", "b", "pod-c")
    scorer = SessionAffinityScorer()
    response = Response("r1")
    scorer.response_received(make_request(request_id="r1"), response, endpoints[2])
    assert response.add_headers == {SESSION_HEADER: b64("pod-c")}
    assert session_token("pod-c") == b64("pod-c")
    follow_up = make_request(headers={SESSION_HEADER: response.add_headers[SESSION_HEADER]})
    assert score(scorer, endpoints, follow_up) == [0.0, 0.0, 1.0]


# --- scorers in a profile -----------------------------------------------------------------------


def test_scorers_combine_by_weight_in_a_profile() -> None:
    endpoints = [
        make_endpoint("a", queue=0, kv=0.8),
        make_endpoint("b", queue=10, kv=0.0),
        make_endpoint("c", queue=5, kv=0.5),
    ]
    profile = make_profile(scorers=[(QueueScorer(), 2.0), (KVCacheUtilizationScorer(), 1.0)])
    trace = ScheduleTrace()
    result = make_scheduler(profile).schedule(make_request(), endpoints, trace=trace)
    # a: 2*1 + 1*0.2 = 2.2; b: 2*0 + 1*1 = 1.0; c: 2*0.5 + 1*0.5 = 1.5 -> a
    assert trace.profiles[0].totals == pytest.approx({"a": 2.2, "b": 1.0, "c": 1.5})
    assert [ep.name for ep in result.targets] == ["a"]


@pytest.mark.parametrize("token", ["é", "\x80", "YWJj€"])
def test_session_affinity_non_ascii_token_scores_zero(token: str) -> None:
    assert score(SessionAffinityScorer(), eps("a", "b"), make_request(headers={SESSION_HEADER: token})) == [
        0.0,
        0.0,
    ]
