"""Scorers: queue, running requests, KV cache, LoRA affinity, load-aware, active requests, token load,
session affinity. (The prefix-cache scorer is in test_prefix.py.)"""

from __future__ import annotations

import base64
from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from epick.config import LoadedConfig, load_config_text
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
from epick.plugins.load.inflight import InFlightLoadProducer
from epick.plugins.scorers.active_request import ActiveRequestScorer
from epick.plugins.scorers.kv_cache import KVCacheUtilizationScorer
from epick.plugins.scorers.load_aware import LoadAwareParameters, LoadAwareScorer
from epick.plugins.scorers.lora_affinity import LoraAffinityScorer
from epick.plugins.scorers.queue import QueueScorer
from epick.plugins.scorers.running_requests import RunningRequestsSizeScorer
from epick.plugins.scorers.session_affinity import SESSION_HEADER, SessionAffinityScorer, session_token
from epick.plugins.scorers.token_load import TokenLoadScorer
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


def load(body: str) -> LoadedConfig:
    return load_config_text("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n" + body)


SENT: dict[str, InferenceRequest] = {}  # the requests inflight_with counted, by their ids


def inflight_with(requests: dict[str, int], tokens: dict[str, int] | None = None) -> InFlightLoadProducer:
    """An in-flight producer holding `requests[name]` requests (and `tokens[name]` tokens) per endpoint."""
    producer = InFlightLoadProducer()
    for name, n in requests.items():
        for i in range(n):
            prompt = "x" * (4 * (tokens or {}).get(name, 0) // n)
            result = SchedulingResult({"default": ProfileRunResult((make_endpoint(name),))}, "default")
            request = SENT[f"{name}-{i}"] = make_request(prompt, request_id=f"{name}-{i}")
            producer.pre_request(request, result, CycleState())
    return producer


def test_active_request_scores_one_when_nothing_is_in_flight() -> None:
    assert score(ActiveRequestScorer(inflight=InFlightLoadProducer()), eps("a", "b")) == [1.0, 1.0]
    assert score(ActiveRequestScorer(), eps("a", "b")) == [1.0, 1.0]  # no producer: nothing counted


def test_active_request_scores_relative_to_the_busiest_candidate() -> None:
    # Upstream today: max over the candidates, not every tracked endpoint. A=1, B=2 candidates, C=4.
    scorer = ActiveRequestScorer(inflight=inflight_with({"a": 1, "b": 2, "c": 4}))
    assert score(scorer, eps("a", "b")) == [0.5, 0.0]
    assert score(scorer, eps("a", "b", "c")) == [0.75, 0.5, 0.0]
    assert score(scorer, eps("a", "d")) == [0.0, 1.0]


def test_active_request_idle_threshold_and_max_busy_score() -> None:
    scorer = ActiveRequestScorer(
        inflight=inflight_with({"a": 1, "b": 2, "c": 4}), idle_threshold=1, max_busy_score=0.8
    )
    # a: idle (1 <= 1) -> 1; b: (4 - 2) / 4 x 0.8 = 0.4; c: 0
    assert score(scorer, eps("a", "b", "c")) == [1.0, pytest.approx(0.4), 0.0]


def test_active_request_follows_the_producer_as_responses_complete() -> None:
    producer = inflight_with({"a": 2, "b": 1})
    scorer = ActiveRequestScorer(inflight=producer)
    assert score(scorer, eps("a", "b")) == [0.0, 0.5]
    producer.response_complete(SENT["a-0"], Response("a-0"), make_endpoint("a"))
    producer.response_complete(SENT["a-1"], Response("a-1"), make_endpoint("a"))
    assert score(scorer, eps("a", "b")) == [1.0, 0.0]


def test_active_request_parameters_as_upstream() -> None:
    config = load(
        "plugins:\n- type: active-request-scorer\n"
        "  parameters: {requestTimeout: 30s, idleThreshold: -3, maxBusyScore: 7}\n"
    )
    scorer = config.plugins["active-request-scorer"]
    assert isinstance(scorer, ActiveRequestScorer)
    # requestTimeout is deprecated and ignored; a negative threshold is 0; an out-of-range busy score 1.0.
    assert (scorer.idle_threshold, scorer.max_busy_score) == (0, 1.0)
    assert scorer.inflight is config.plugins["inflight-load-producer"]  # added with defaults


def test_token_load_adds_this_requests_uncached_tokens_to_the_in_flight_ones() -> None:
    producer = inflight_with({"a": 1}, tokens={"a": 1000})
    scorer = TokenLoadScorer(inflight=producer, queue_threshold_tokens=4000)
    state = CycleState()
    request = make_request("y" * 2000)  # 500 tokens
    producer.produce(request, state, eps("a", "b"))
    # a: 1000 in flight + 500 -> 1 - 1500/4000; b: 500 -> 1 - 500/4000
    assert scorer.score(request, state, eps("a", "b")) == [pytest.approx(0.625), pytest.approx(0.875)]


def test_token_load_threshold_caps_the_load_and_an_idle_endpoint_scores_one() -> None:
    scorer = TokenLoadScorer(
        inflight=inflight_with({"a": 1}, tokens={"a": 9000}), queue_threshold_tokens=4000
    )
    assert scorer.score(make_request(""), CycleState(), eps("a", "b")) == [0.0, 1.0]


def test_token_load_parameters() -> None:
    config = load("plugins:\n- type: token-load-scorer\n  parameters: {queueThresholdTokens: 0}\n")
    scorer = config.plugins["token-load-scorer"]
    assert isinstance(scorer, TokenLoadScorer)
    assert scorer.threshold == 4_194_304  # <= 0: the default, as upstream
    assert scorer.inflight is config.plugins["inflight-load-producer"]


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
