"""Predicted latency: the objectives' headers, the analytic model and the online predictor, the
producer's predictions and training, and the latency scorer, tier filter and admitter (cases
hand-checked against llm-d/llm-d-router's plugin code)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileRunResult,
    Response,
    SchedulingResult,
    Usage,
)
from epick.framework.datalayer import data_key
from epick.plugins.filters.prefix_affinity import PrefixAffinityParameters, PrefixCacheAffinityFilter
from epick.plugins.latency.admitter import REASON, LatencySLOAdmitter
from epick.plugins.latency.cost_scorer import CostParameters, LatencyCostScorer
from epick.plugins.latency.gie_scorer import GIEPredictedLatencyParameters, PredictedLatencyScorer
from epick.plugins.latency.learners import gbdt
from epick.plugins.latency.parameters import PredictedLatencyParameters
from epick.plugins.latency.predictions import LatencyPrediction, read_predictions
from epick.plugins.latency.predictor import AnalyticModel, Features, OnlinePredictor, matrix
from epick.plugins.latency.producer import DATA_TYPE, PredictedLatencyProducer
from epick.plugins.latency.scorer import LatencyScorer, LatencyScorerParameters, go_round
from epick.plugins.latency.slo import objectives
from epick.plugins.latency.tier_filter import SLOHeadroomTierFilter, TierFilterParameters
from epick.plugins.load.inflight import InFlightLoadProducer
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch
from tests.builders import make_endpoint, make_request

KEY = data_key(DATA_TYPE, "predicted-latency-producer")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def prediction(ttft_h: float, tpot_h: float, *, dispatched: int = 1, ttft: float = 10.0) -> LatencyPrediction:
    return LatencyPrediction(ttft_h >= 0, tpot_h >= 0, ttft_h, tpot_h, ttft, 5.0, dispatched)


def state(predictions: dict[str, LatencyPrediction]) -> CycleState:
    s = CycleState()
    s.write(KEY, predictions)
    return s


# Objectives.
def test_objectives_read_the_current_names_first_and_ignore_what_is_not_a_positive_number() -> None:
    assert objectives({"x-llm-d-slo-ttft-ms": "200", "x-llm-d-slo-tpot-ms": "20.5"}).tpot_ms == 20.5
    assert objectives({"x-slo-ttft-ms": "300"}).ttft_ms == 300.0
    # The current name wins even when it says 0.
    assert objectives({"x-llm-d-slo-ttft-ms": "0", "x-slo-ttft-ms": "300"}).ttft_ms == 0.0
    for bad in ("fast", "nan", "inf", "-5", ""):
        assert objectives({"x-llm-d-slo-ttft-ms": bad}).ttft_ms == 0.0
    assert not objectives({}).any


# The analytic model, by hand.
def test_analytic_predictions_by_hand() -> None:
    model = AnalyticModel(step_ms=6.0, prefill_tokens_per_s=10000.0, ttft_per_running_ms=0.1)
    row = Features(kv_cache=0.5, input_tokens=2000, running=10, prefix_score=0.25, prefill_tokens=3000)
    x = matrix([row])
    # uncached = 0.75 × 2000 = 1500; work 4500 tokens at 10,000/s = 450 ms; + 6 + 10 × 0.1.
    assert x[0, 7] == 1500.0
    assert model.ttft(x)[0] == pytest.approx(457.0)
    # TPOT: 6 + 10 × 0.05 + 0.5 × 17.
    assert model.tpot(x)[0] == pytest.approx(15.0)


def test_features_are_clamped() -> None:
    row = Features(kv_cache=1.7, input_tokens=-5, prefix_score=2.0, pod_type="decode").row()
    assert row[0] == 1.0 and row[1] == 0.0 and row[4] == 1.0 and row[7] == 0.0 and row[8] == 2.0


def _truth(x: np.ndarray) -> np.ndarray:
    """A latency function the predictor does not know: queueing bends it above 8 waiting."""
    waiting = x[:, 2]
    return 8.0 + 0.04 * (x[:, 5] + x[:, 7]) + np.where(waiting > 8, (waiting - 8) ** 2 * 30.0, waiting * 2.0)


def _sample(rng: random.Random) -> Features:
    return Features(
        kv_cache=rng.random(),
        input_tokens=rng.randrange(100, 8000),
        waiting=rng.randrange(0, 20),
        running=rng.randrange(0, 64),
        prefix_score=rng.random(),
        prefill_tokens=rng.randrange(0, 20000),
    )


def test_the_learned_predictor_improves_with_data_on_a_known_function() -> None:
    rng = random.Random(7)
    test_rows = [_sample(rng) for _ in range(500)]
    x_test = matrix(test_rows)
    truth = _truth(x_test)
    predictor = OnlinePredictor(gbdt, min_samples=100, retrain_every=100)

    def mae() -> float:
        ttft, _ = predictor.predict(x_test)
        return float(np.mean(np.abs(ttft - truth)))

    untrained = mae()  # the analytic model: it knows nothing of the queueing term
    errors = []
    for n in (100, 400, 2000):
        while predictor.observations[0] < n:
            row = _sample(rng)
            predictor.observe_ttft(row, float(_truth(matrix([row]))[0]))
        errors.append(mae())
    assert predictor.trained[0] and not predictor.trained[1]
    assert errors[0] < untrained / 2
    assert errors[2] < errors[1] < errors[0]
    assert errors[2] < 0.05 * float(np.mean(truth))


def test_the_predictor_ignores_bad_observations_and_never_predicts_negative() -> None:
    predictor = OnlinePredictor(gbdt, min_samples=2, retrain_every=1)
    row = Features(input_tokens=10)
    predictor.observe_ttft(row, float("nan"))
    predictor.observe_ttft(row, -1.0)
    assert predictor.observations == (0, 0)
    predictor.observe_ttft(row, 5.0)
    predictor.observe_ttft(row, 5.0)
    assert predictor.trained[0]  # a constant: the targets did not vary
    ttft, tpot = predictor.predict(matrix([row, Features(input_tokens=10**6)]))
    assert list(ttft) == [5.0, 5.0] and (tpot >= 0).all()


# The producer.
def _producer(
    clock: Clock, *, counted: bool = True, **params: object
) -> tuple[PredictedLatencyProducer, InFlightLoadProducer]:
    inflight = InFlightLoadProducer()
    producer = PredictedLatencyProducer(
        params=PredictedLatencyParameters.model_validate({"predictor": {"learner": "analytic"}, **params}),
        prefix_producer="approx-prefix-cache-producer",
        inflight=inflight if counted else None,
        clock=clock,
    )
    return producer, inflight


def _result(target: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    results = {"default": ProfileRunResult([target])}
    if prefill is not None:
        results["prefill"] = ProfileRunResult([prefill])
    return SchedulingResult(results, "default")


def test_produce_predicts_each_candidate_and_judges_it_against_the_objectives() -> None:
    clock = Clock()
    producer, _ = _producer(clock, counted=False)  # running requests: the scrape's
    a, b = make_endpoint("a", kv=0.0), make_endpoint("b", kv=0.0, running=40)
    s = CycleState()
    s.write(data_key(MATCH_DATA_TYPE, "approx-prefix-cache-producer"), PrefixMatch(4, 64, {"a": 4}))
    request = make_request("x" * 4000, headers={"x-llm-d-slo-ttft-ms": "60"})
    producer.produce(request, s, [a, b])
    got = read_predictions(s, KEY)
    assert got is not None
    # 1,000 prompt tokens; a holds them all (uncached 0): 6 ms; b computes 1,000: 6 + 62.78 + 4 ms.
    assert got["a"].ttft == pytest.approx(6.0)
    assert got["b"].ttft == pytest.approx(6.0 + 1000 / 15928 * 1000 + 40 * 0.1)
    assert got["a"].ttft_valid and not got["b"].ttft_valid
    assert got["a"].ttft_headroom == pytest.approx(54.0)
    # Not streaming: TPOT is valid with headroom 0.
    assert got["b"].tpot_valid and got["b"].tpot_headroom == 0.0 and not got["b"].valid


def test_streaming_tightens_the_tpot_objective_to_the_strictest_request_running_there() -> None:
    clock = Clock()
    producer, _ = _producer(clock, streamingMode=True, sloBufferFactor=2.0)
    a = make_endpoint("a", kv=0.5)  # TPOT predicted 6 + 8.5 = 14.5 ms
    strict = make_request(headers={"x-llm-d-slo-tpot-ms": "7"})
    producer.produce(strict, CycleState(), [a])
    producer.pre_request(strict, _result(a), CycleState())
    loose = make_request(headers={"x-llm-d-slo-tpot-ms": "50"})
    s = CycleState()
    producer.produce(loose, s, [a])
    got = read_predictions(s, KEY)
    assert got is not None
    # min(50 × 2, 7 × 2) = 14 < 14.5: invalid, headroom −0.5; one request dispatched there.
    assert got["a"].tpot_headroom == pytest.approx(-0.5) and not got["a"].tpot_valid
    assert got["a"].dispatched == 1
    # A prefill endpoint is never judged on TPOT.
    p = make_endpoint("p", kv=0.5, labels={"role": "prefill"})
    producer2, _ = _producer(clock, streamingMode=True, endpointRoleLabel="role")
    s2 = CycleState()
    producer2.produce(loose, s2, [p])
    assert read_predictions(s2, KEY)["p"].tpot_headroom == 0.0  # type: ignore[index]


def test_responses_train_ttft_at_the_first_chunk_and_tpot_at_the_end() -> None:
    clock = Clock()
    producer, _ = _producer(clock, streamingMode=True)
    seen: list[tuple[str, float]] = []
    producer.predictor.observe_ttft = lambda f, ms: seen.append(("ttft", ms))  # type: ignore[method-assign]
    producer.predictor.observe_tpot = lambda f, ms: seen.append(("tpot", ms))  # type: ignore[method-assign]
    a = make_endpoint("a")
    request = make_request()
    producer.produce(request, CycleState(), [a])
    producer.pre_request(request, _result(a), CycleState())
    assert producer.dispatched("a") == 1
    clock.now += 0.25
    response = Response(request.request_id, streaming=True, chunk=b"data: 1")
    producer.response_streaming(request, response, a)
    clock.now += 0.5
    producer.response_streaming(request, response, a)
    response.end_of_stream, response.usage = True, Usage(10, 51)
    producer.response_complete(request, response, a)
    # TTFT 250 ms; TPOT (750 − 250) / (51 − 1) = 10 ms.
    assert seen == [("ttft", pytest.approx(250.0)), ("tpot", pytest.approx(10.0))]
    assert producer.dispatched("a") == 0


def test_non_streaming_ttft_is_the_whole_response_and_failures_train_nothing() -> None:
    clock = Clock()
    producer, _ = _producer(clock)
    seen: list[float] = []
    producer.predictor.observe_ttft = lambda f, ms: seen.append(ms)  # type: ignore[method-assign]
    a = make_endpoint("a")
    ok, failed = make_request(), make_request()
    for r in (ok, failed):
        producer.produce(r, CycleState(), [a])
        producer.pre_request(r, _result(a), CycleState())
    clock.now += 1.2
    producer.response_complete(ok, Response(ok.request_id, end_of_stream=True), a)
    producer.response_complete(failed, Response(failed.request_id, status=502, error="bad gateway"), a)
    assert seen == [pytest.approx(1200.0)]
    assert producer.dispatched("a") == 0


def test_contexts_expire_after_the_context_ttl_and_leave_their_endpoint() -> None:
    clock = Clock()
    producer, _ = _producer(clock, contextTTL=2_000_000_000)  # Go's nanoseconds: 2 s
    assert producer.params.context_ttl == 2.0
    a = make_endpoint("a")
    r = make_request()
    producer.produce(r, CycleState(), [a])
    producer.pre_request(r, _result(a), CycleState())
    clock.now += 3
    producer.produce(make_request(), CycleState(), [a])
    assert producer.dispatched("a") == 0


def test_a_bad_buffer_factor_is_refused() -> None:
    with pytest.raises(ConfigError, match="sloBufferFactor"):
        load_config_text(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
            "plugins:\n- type: predicted-latency-producer\n  parameters: {sloBufferFactor: 0}\n"
            "- type: max-score-picker\n"
            "schedulingProfiles:\n- name: d\n  plugins: [{pluginRef: max-score-picker}]\n"
        )


# The latency scorer.
def test_the_positive_tier_alone_scores_least_headroom_highest() -> None:
    eps = [make_endpoint(n) for n in "abc"]
    scores = LatencyScorer().score(
        make_request(), state({"a": prediction(10, 0), "b": prediction(30, 0), "c": prediction(-5, 0)}), eps
    )
    # TTFT headroom varies, TPOT does not: TTFT takes the whole weight; a (least) 1.01, b 0.01, c 0.
    assert scores == [1.01, 0.01, 0.0]
    most = LatencyScorer(params=LatencyScorerParameters(headroomSelectionStrategy="most"))
    assert most.score(make_request(), state({"a": prediction(10, 0), "b": prediction(30, 0)}), eps[:2]) == [
        0.01,
        1.01,
    ]


def test_negative_only_prefers_idle_then_the_smallest_deficit() -> None:
    eps = [make_endpoint(n) for n in "abc"]
    idle = {"a": prediction(-50, 0), "b": prediction(-10, 0), "c": prediction(-80, 0, dispatched=0)}
    assert LatencyScorer().score(make_request(), state(idle), eps) == [0.0, 0.0, 0.51]  # alone: 0.5
    busy = {"a": prediction(-50, 0), "b": prediction(-10, 0), "c": prediction(-80, -1)}
    # TTFT-only negatives (a, b) before both-negative (c); the smallest deficit highest.
    assert LatencyScorer().score(make_request(), state(busy), eps) == [0.01, 1.01, 0.0]
    tpot_only = {"a": prediction(-50, 0), "b": prediction(5, -2)}
    assert LatencyScorer().score(make_request(), state(tpot_only), eps[:2]) == [0.0, 0.51]


def test_both_headrooms_blend_by_weight() -> None:
    eps = [make_endpoint(n) for n in "ab"]
    s = state({"a": prediction(-10, -4), "b": prediction(-30, -2)})
    # |ttft|: a 0, b 1; |tpot|: a 1, b 0; blend a 0.2, b 0.8 → int(80) + 1, int(20) + 1 (float: 19).
    assert LatencyScorer().score(make_request(), s, eps) == [0.81, pytest.approx(0.2, abs=0.011)]


def test_without_predictions_the_composite_scores_kv_queue_and_prefix() -> None:
    a = make_endpoint("a", kv=0.2, queue=0)
    b = make_endpoint("b", kv=0.9, queue=4)
    s = CycleState()
    s.write(data_key(MATCH_DATA_TYPE, "p"), PrefixMatch(4, 64, {"b": 2}))
    scorer = LatencyScorer(prefix_producer="p")
    # a: (0.8 + 1 + 0) / 3 = 0.6; b: (0.1 + 0 + 0.5) / 3 = 0.2.
    assert scorer.score(make_request(), s, [a, b]) == [0.6, 0.2]
    assert go_round(0.5) == 1 and go_round(-0.5) == -1 and go_round(2.5) == 3


# The tier filter.
def test_the_tier_filter_keeps_the_positive_tier_and_explores_rarely() -> None:
    eps = [make_endpoint(n) for n in "abc"]
    s = state({"a": prediction(1, 0), "b": prediction(-1, 0)})  # c: no prediction (negative tier)
    keep = SLOHeadroomTierFilter(rng=random.Random(1))
    assert [e.name for e in keep.filter(make_request(), s, eps)] == ["a"]
    always = SLOHeadroomTierFilter(params=TierFilterParameters(epsilonExploreNeg=1.0))
    assert [e.name for e in always.filter(make_request(), s, eps)] == ["b", "c"]
    assert keep.filter(make_request(), CycleState(), eps) == eps  # nothing predicted
    only_negative = state({"a": prediction(-1, 0), "b": prediction(-2, 0), "c": prediction(-3, 0)})
    assert keep.filter(make_request(), only_negative, eps) == eps
    with pytest.raises(ConfigError, match="epsilonExploreNeg"):
        load_config_text(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
            "plugins:\n- type: slo-headroom-tier-filter\n  parameters: {epsilonExploreNeg: 2}\n"
            "- type: max-score-picker\n"
            "schedulingProfiles:\n- name: d\n  plugins: [{pluginRef: max-score-picker}]\n"
        )


# The admitter.
def test_the_admitter_refuses_only_sheddable_requests_with_an_objective_nobody_meets() -> None:
    admitter = LatencySLOAdmitter()
    busy = [make_endpoint("a", running=3, kv=0.5), make_endpoint("b", running=2, kv=0.3)]
    invalid = state({"a": prediction(-1, 0), "b": prediction(-5, 0)})
    slo = {"x-llm-d-slo-ttft-ms": "100"}

    def request(priority: int, headers: dict[str, str]) -> InferenceRequest:
        return dataclasses.replace(make_request(headers=headers), priority=priority)

    assert admitter.admit(request(-1, slo), invalid, busy) == REASON
    assert admitter.admit(request(0, slo), invalid, busy) is None
    assert admitter.admit(request(-1, {}), invalid, busy) is None
    assert admitter.admit(request(-1, slo), CycleState(), busy) is None
    valid = state({"a": prediction(-1, 0), "b": prediction(5, 0)})
    assert admitter.admit(request(-1, slo), valid, busy) is None
    idle = [busy[0], make_endpoint("b", running=0, kv=0.3)]
    assert admitter.admit(request(-1, slo), invalid, idle) is None
    cold = [busy[0], make_endpoint("b", running=2, kv=0.01)]
    assert admitter.admit(request(-1, slo), invalid, cold) is None


# prefix-cache-affinity-filter with ttftSource latencyPredictor.
def test_the_affinity_gate_reads_predicted_ttft() -> None:
    params = PrefixAffinityParameters.model_validate(
        {"affinityThreshold": 0.8, "ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 100}
    )
    f = PrefixCacheAffinityFilter(
        params=params, prefix_producer="p", latency_producer="predicted-latency-producer"
    )
    eps = [make_endpoint("a"), make_endpoint("b")]

    def run(ttft_a: float, ttft_b: float) -> list[str]:
        s = state({"a": prediction(0, 0, ttft=ttft_a), "b": prediction(0, 0, ttft=ttft_b)})
        s.write(data_key(MATCH_DATA_TYPE, "p"), PrefixMatch(4, 64, {"a": 4}))
        return [e.name for e in f.filter(make_request(), s, eps)]

    assert run(150, 60) == ["a"]  # sticky a costs 90 ms more: within 100
    assert run(200, 60) == ["a", "b"]  # 140 ms more: stickiness broken


# Upstream's SLO configs.
SLO_CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true, contextTTL: 300000000000, samplingMean: 100}
- type: latency-scorer
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
- type: weighted-random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""


def test_an_slo_config_loads_with_its_default_producers() -> None:
    config = load_config_text(SLO_CONFIG, seed=0)
    types = {p.typed_name.type for p in config.plugins.values()}
    assert {"approx-prefix-cache-producer", "inflight-load-producer", "predicted-latency-producer"} <= types
    producer = next(p for p in config.plugins.values() if isinstance(p, PredictedLatencyProducer))
    assert producer.params.streaming_mode and producer.params.context_ttl == 300.0


def test_without_lightgbm_the_default_learner_is_analytic_and_gbdt_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The image has no LightGBM: an upstream config (no learner named) loads and predicts analytically,
    saying so at load; a config that asks for gbdt is refused, naming the extra."""
    from epick.plugins.latency import learners

    producer = next(
        p
        for p in load_config_text(SLO_CONFIG, seed=0).plugins.values()
        if isinstance(p, PredictedLatencyProducer)
    )
    assert producer.predictor.learner is gbdt  # LightGBM is installed here

    find_spec = learners.importlib.util.find_spec
    monkeypatch.setattr(
        learners.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "lightgbm" else find_spec(name, *a),
    )
    with caplog.at_level("WARNING"):
        config = load_config_text(SLO_CONFIG, seed=0)
    producer = next(p for p in config.plugins.values() if isinstance(p, PredictedLatencyProducer))
    assert producer.predictor.learner is None
    assert "analytic model only: LightGBM is not installed (pip install 'epick[gbdt]')" in caplog.text
    explicit = SLO_CONFIG.replace(
        "contextTTL: 300000000000,", "contextTTL: 300000000000, predictor: {learner: gbdt},"
    )
    with pytest.raises(
        ConfigError, match=r"learner gbdt: LightGBM is not installed \(pip install 'epick\[gbdt\]'\)"
    ):
        load_config_text(explicit, seed=0)


# latency-cost-scorer (epick's own).
def test_the_cost_scorer_prefers_the_soonest_finish() -> None:
    eps = [make_endpoint(n) for n in "abc"]
    s = CycleState()
    s.write(
        KEY,
        {
            "a": LatencyPrediction(False, True, 0, 0, ttft=100.0, tpot=10.0, dispatched=0),  # 100 + 100 × 10
            "b": LatencyPrediction(False, True, 0, 0, ttft=600.0, tpot=5.0, dispatched=0),  # 600 + 500
            "c": LatencyPrediction(False, True, 0, 0, ttft=50.0, tpot=20.0, dispatched=0),  # 50 + 2000
        },
    )
    scorer = LatencyCostScorer()
    # max_tokens 100: costs 1100, 1100, 2050 → 1, 1, 0.
    assert scorer.score(make_request(max_tokens=100), s, eps) == [1.0, 1.0, 0.0]
    # No max_tokens: the default 256 → 2660, 1880, 5170.
    assert scorer.score(make_request(), s, eps) == pytest.approx([(5170 - 2660) / 3290, 1.0, 0.0])
    # A candidate without a prediction scores 0; no predictions at all: all 0.
    assert scorer.score(make_request(), s, [*eps, make_endpoint("d")])[3] == 0.0
    assert scorer.score(make_request(), CycleState(), eps) == [0.0, 0.0, 0.0]
    capped = LatencyCostScorer(params=CostParameters(maxOutputTokens=10))
    assert capped.output_tokens(make_request(max_tokens=100)) == 10


# GIE v1.5.0's predicted-latency-scorer.
def _gie(**params: object) -> PredictedLatencyScorer:
    return PredictedLatencyScorer(
        "predicted-latency-scorer",
        GIEPredictedLatencyParameters.model_validate({"predictor": {"learner": "analytic"}, **params}),
        prefix_producer="p",
        rng=random.Random(3),
    )


def _gie_state(
    scorer: PredictedLatencyScorer, predictions: dict[str, LatencyPrediction], held: dict[str, int]
) -> CycleState:
    s = CycleState()
    s.write(scorer.key, predictions)
    s.write(data_key(MATCH_DATA_TYPE, "p"), PrefixMatch(10, 64, held))
    return s


def test_gie_scorer_picks_the_tightest_positive_fit_in_max_mode() -> None:
    scorer = _gie(selectionMode="max", epsilonExploreNeg=0, epsilonExploreSticky=0)
    eps = [make_endpoint(n) for n in "abc"]
    preds = {"a": prediction(50, 5), "b": prediction(10, 1), "c": prediction(-5, 1)}
    # Positive tier a, b; least headroom: b (blend 0 → weight 101) over a (weight 2).
    assert scorer.score(make_request(), _gie_state(scorer, preds, {}), eps) == [0.0, 1.0, 0.0]
    most = _gie(selectionMode="max", headroomSelectionStrategy="most", epsilonExploreNeg=0)
    assert most.score(make_request(), _gie_state(most, preds, {}), eps) == [1.0, 0.0, 0.0]


def test_gie_scorer_affinity_gate_keeps_a_lone_holder_unless_its_ttft_costs_too_much() -> None:
    scorer = _gie(selectionMode="max", epsilonExploreNeg=0, epsilonExploreSticky=0)
    eps = [make_endpoint(n) for n in "ab"]
    preds = {"a": prediction(50, 5, ttft=100.0), "b": prediction(10, 1, ttft=90.0)}
    assert scorer.score(make_request(), _gie_state(scorer, preds, {"a": 9}), eps) == [1.0, 0.0]
    slow = {"a": prediction(50, 5, ttft=9000.0), "b": prediction(10, 1, ttft=90.0)}
    assert scorer.score(make_request(), _gie_state(scorer, slow, {"a": 9}), eps) == [0.0, 1.0]


def test_gie_scorer_negative_tier_prefers_idle_endpoints_then_the_smallest_deficit() -> None:
    scorer = _gie(selectionMode="max", epsilonExploreSticky=0)
    a, b, c = (make_endpoint(n) for n in "abc")
    busy = make_request()
    scorer.produce(busy, CycleState(), [a])
    scorer.pre_request(busy, _result(a), CycleState())  # a has a request running
    preds = {"a": prediction(-1, -1), "b": prediction(-50, -3), "c": prediction(-20, -2)}
    # b and c are idle; among them c's deficits are the smaller.
    assert scorer.score(make_request(), _gie_state(scorer, preds, {}), [a, b, c]) == [0.0, 0.0, 1.0]


def test_gie_scorer_without_predictions_picks_by_composite() -> None:
    scorer = _gie(selectionMode="max")
    a, b = make_endpoint("a", kv=0.9, queue=5), make_endpoint("b", kv=0.1, queue=0)
    assert scorer.score(make_request(), _gie_state(scorer, {}, {}), [a, b]) == [0.0, 1.0]
    least = _gie(selectionMode="max", headroomSelectionStrategy="composite-least")
    preds = {"a": prediction(1, 1), "b": prediction(1, 1)}
    assert least.score(make_request(), _gie_state(least, preds, {}), [a, b]) == [1.0, 0.0]


def test_gie_scorer_parameters() -> None:
    assert GIEPredictedLatencyParameters().streaming_mode  # upstream's default here
    with pytest.raises(ValueError, match="samplingMean"):
        GIEPredictedLatencyParameters.model_validate({"samplingMean": 0})
    config = load_config_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: predicted-latency-scorer\n"
        "  parameters: {selectionMode: max, affinityGateTau: 0.5}\n"
        "- type: max-score-picker\n"
        "schedulingProfiles:\n- name: d\n  plugins:\n  - pluginRef: predicted-latency-scorer\n"
        "  - pluginRef: max-score-picker\n",
        seed=0,
    )
    scorer = config.plugins["predicted-latency-scorer"]
    assert isinstance(scorer, PredictedLatencyScorer) and scorer in config.hooks.producers


# smallest-cache-scorer (epick's own).
def test_smallest_cache_sends_cold_requests_where_the_index_holds_least() -> None:
    from epick.plugins.prefix.index import PrefixIndex
    from epick.plugins.prefix.smallest_cache import SmallestCacheScorer

    index = PrefixIndex(100)
    index.add("a", [1, 2, 3, 4])
    index.add("b", [5, 6])
    scorer = SmallestCacheScorer(producer="p", index=index)
    eps = [make_endpoint(n) for n in "abc"]
    cold = CycleState()
    cold.write(data_key(MATCH_DATA_TYPE, "p"), PrefixMatch(3, 64, {}))
    assert scorer.score(make_request(), cold, eps) == [0.0, 0.5, 1.0]  # a 4 blocks, b 2, c none
    warm = CycleState()
    warm.write(data_key(MATCH_DATA_TYPE, "p"), PrefixMatch(3, 64, {"b": 1}))
    assert scorer.score(make_request(), warm, eps) == [0.5, 0.5, 0.5]
    assert scorer.score(make_request(), CycleState(), eps) == [0.5, 0.5, 0.5]  # no match: nothing known
    empty = SmallestCacheScorer(producer="p", index=PrefixIndex(10))
    assert empty.score(make_request(), cold, eps) == [1.0, 1.0, 1.0]


def test_smallest_cache_reads_the_configs_approximate_index() -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: smallest-cache-scorer\n- type: max-score-picker\n"
        "schedulingProfiles:\n- name: d\n  plugins:\n  - pluginRef: smallest-cache-scorer\n"
        "  - pluginRef: max-score-picker\n",
        seed=0,
    )
    from epick.plugins.prefix.producer import ApproxPrefixCacheProducer
    from epick.plugins.prefix.smallest_cache import SmallestCacheScorer

    scorer, producer = config.plugins["smallest-cache-scorer"], config.plugins["approx-prefix-cache-producer"]
    assert isinstance(scorer, SmallestCacheScorer) and isinstance(producer, ApproxPrefixCacheProducer)
    assert scorer.index is producer.index
    with pytest.raises(ConfigError, match="not an approx-prefix-cache-producer"):
        load_config_text(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
            "plugins:\n- type: smallest-cache-scorer\n  parameters: {prefixMatchInfoProducerName: q}\n"
            "- name: q\n  type: queue-scorer\n",
            seed=0,
        )


# Found in review: retries, the running sets' heap, streaming without a chunk, the context TTL.
def test_a_retried_request_leaves_the_endpoint_it_was_first_sent_to() -> None:
    clock = Clock()
    producer, _ = _producer(clock, streamingMode=True)
    a, b = make_endpoint("a"), make_endpoint("b")
    r = make_request(headers={"x-llm-d-slo-tpot-ms": "5"})
    producer.produce(r, CycleState(), [a, b])
    producer.pre_request(r, _result(a), CycleState())
    producer.produce(r, CycleState(), [b])  # the proxy retries on the others: produce runs again
    producer.pre_request(r, _result(b), CycleState())
    assert (producer.dispatched("a"), producer.dispatched("b")) == (0, 1)
    producer.response_complete(r, Response(r.request_id, end_of_stream=True), b)
    assert (producer.dispatched("a"), producer.dispatched("b")) == (0, 0)


def test_the_running_set_heap_does_not_grow_with_departed_requests() -> None:
    from epick.plugins.latency.producer import _RunningSet

    running = _RunningSet()
    running.add(0, 9.0)  # a long request stays
    for key in range(1, 2000):
        running.add(key, 5.0)
        running.remove(key)
    assert len(running) == 1 and len(running._heap) <= 2 * len(running) + 16
    assert running.min_tpot() == 9.0


def test_streaming_mode_learns_nothing_from_a_response_without_an_earlier_chunk() -> None:
    clock = Clock()
    producer, _ = _producer(clock, streamingMode=True)
    seen: list[float] = []
    producer.predictor.observe_ttft = lambda f, ms: seen.append(ms)  # type: ignore[method-assign]
    producer.predictor.observe_tpot = lambda f, ms: seen.append(ms)  # type: ignore[method-assign]
    a = make_endpoint("a")
    r = make_request()
    producer.produce(r, CycleState(), [a])
    producer.pre_request(r, _result(a), CycleState())
    clock.now += 3
    producer.response_complete(r, Response(r.request_id, end_of_stream=True, usage=Usage(1, 20)), a)
    assert seen == [] and producer.dispatched("a") == 0


def test_the_context_ttl_counts_from_the_last_chunk_and_zero_never_expires() -> None:
    clock = Clock()
    producer, _ = _producer(clock, streamingMode=True, contextTTL="2s")
    a = make_endpoint("a")
    r = make_request()
    producer.produce(r, CycleState(), [a])
    producer.pre_request(r, _result(a), CycleState())
    for _ in range(3):  # a long stream: a chunk a second
        clock.now += 1.5
        producer.response_streaming(r, Response(r.request_id, streaming=True), a)
        producer.produce(make_request(), CycleState(), [a])
    assert producer.dispatched("a") == 1  # still heard of: kept
    forever, _ = _producer(clock, contextTTL=0)
    forever.produce(r, CycleState(), [a])
    forever.pre_request(r, _result(a), CycleState())
    clock.now += 10_000
    forever.produce(make_request(), CycleState(), [a])
    assert forever.dispatched("a") == 1


def test_a_window_smaller_than_min_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="minSamples"):
        PredictedLatencyParameters.model_validate({"predictor": {"window": 10, "minSamples": 200}})
    with pytest.raises(ValueError, match="never holds"):
        OnlinePredictor(None, window=10, min_samples=200)
