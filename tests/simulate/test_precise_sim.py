"""The precise prefix index in the fleet simulator: the simulated engines' KV events feed it in
virtual time, after `kv_event_delay`; staleness costs what it costs."""

from __future__ import annotations

import random

import pytest

from epick.config import load_config_text
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
from epick.sim.engine import CostModel, EngineConfig
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Fleet, FleetResult, Poisson
from epick.simulate.workloads import build_workload

ENGINE = EngineConfig(num_gpu_blocks=200, cost=CostModel())  # 3,200 tokens: groups evict each other
PRECISE = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters: {tokenProcessorConfig: {blockSize: 16}}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""


def run(delay: float, seed: int = 2) -> tuple[FleetResult, PrecisePrefixCacheProducer]:
    policy = EpickPolicy("precise", load_config_text(PRECISE, seed=seed))
    producer = policy.config.plugins["precise-prefix-cache-producer"]
    assert isinstance(producer, PrecisePrefixCacheProducer)
    workload = build_workload(
        "shared-prefix",
        {
            "groups": "12",
            "prompts-per-group": "10",
            "system-tokens": "1024",
            "question-tokens": "64",
            "output-tokens": "16",
        },
    )
    fleet = Fleet(4, ENGINE, policy, kv_event_delay=delay)
    result = fleet.run(workload.requests(random.Random(seed)), Poisson(20.0), random.Random(seed + 1))
    return result, producer


def hit_rate(result: FleetResult) -> float:
    return result.prefix_hits / result.prefix_queries


def test_the_engines_events_fill_and_empty_the_index() -> None:
    result, producer = run(0.0)
    stats = producer.tracker.stats
    assert stats.stored > 0 and stats.removed > 0  # blocks were cached, and evicted under pressure
    assert stats.skipped_unknown_parent == 0
    assert len(producer.index) > 0
    assert all(r.failed is None for r in result.records)


def test_events_that_arrive_too_late_to_matter_lose_the_hits() -> None:
    fresh, _ = run(0.0)
    never, _ = run(10_000.0)  # after the last request: routing never saw them
    assert hit_rate(fresh) > hit_rate(never) + 0.2
    assert never.makespan == pytest.approx(fresh.makespan, rel=0.5)  # late events do not stretch the run


def test_the_policy_hears_events_only_when_a_plugin_indexes_them() -> None:
    body = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
    policy = EpickPolicy("queue", load_config_text(body, seed=0))
    assert not policy.consumes_kv_events
    fleet = Fleet(2, ENGINE, policy)
    assert not fleet.engines[0].pool.record_events
    with pytest.raises(ValueError, match="negative"):
        Fleet(2, ENGINE, EpickPolicy("p", load_config_text(PRECISE, seed=0)), kv_event_delay=-1.0)
