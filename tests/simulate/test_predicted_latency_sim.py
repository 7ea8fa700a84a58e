"""Predicted latency in the fleet simulator: the response hooks hear each first token when it leaves
its server (virtual time), so the predictor trains on the TTFTs and TPOTs the fleet records."""

from __future__ import annotations

import random

import pytest

from epick.config import load_config_text
from epick.plugins.latency.producer import PredictedLatencyProducer
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Fleet, Poisson
from epick.simulate.workloads.registry import build_workload
from tests.simulate.test_fleet import ENGINE

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters:
    streamingMode: true
    predictor: {learner: gbdt, minSamples: 50, retrainEvery: 50}
- type: latency-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
"""


def test_the_predictor_trains_on_the_fleets_own_timings() -> None:
    policy = EpickPolicy("predicted", load_config_text(CONFIG, seed=1))
    producer = next(p for p in policy.config.plugins.values() if isinstance(p, PredictedLatencyProducer))
    ttfts: list[float] = []
    tpots: list[float] = []
    observe_ttft, observe_tpot = producer.predictor.observe_ttft, producer.predictor.observe_tpot

    def record_ttft(features: object, ms: float) -> None:
        ttfts.append(ms)
        observe_ttft(features, ms)  # type: ignore[arg-type]

    def record_tpot(features: object, ms: float) -> None:
        tpots.append(ms)
        observe_tpot(features, ms)  # type: ignore[arg-type]

    producer.predictor.observe_ttft = record_ttft  # type: ignore[method-assign]
    producer.predictor.observe_tpot = record_tpot  # type: ignore[method-assign]
    workload = build_workload("sharegpt-like", {"n": "300"})
    result = Fleet(2, ENGINE, policy).run(workload.requests(random.Random(1)), Poisson(20), random.Random(1))
    done = sorted(result.records, key=lambda r: r.first_token or 0.0)
    assert all(r.failed is None and r.first_token is not None for r in done)
    # Each TTFT is heard at its first token, in first-token order, measured from the decision.
    assert ttfts == pytest.approx([(r.first_token - r.arrival) * 1000 for r in done if r.first_token])  # type: ignore[operator]
    multi = [r for r in result.records if r.output_tokens > 1]
    assert len(tpots) == len(multi)
    assert sorted(tpots) == pytest.approx(
        sorted((r.finish - r.first_token) / (r.output_tokens - 1) * 1000 for r in multi)  # type: ignore[operator]
    )
    assert producer.predictor.trained == (True, True)
    assert producer.dispatched("s0") == producer.dispatched("s1") == 0  # every request left
