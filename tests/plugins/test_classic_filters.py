"""The GIE's first filters (low-queue, least-queue, least-kv-cache, lora-affinity, decision-tree),
as llm-d's default plugins still configure them."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, Endpoint
from epick.plugins.filters.classic import (
    DecisionTreeFilter,
    LeastKVCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
)
from tests.builders import make_endpoint, make_request


def kept(f: object, endpoints: Sequence[Endpoint], model: str = "m") -> list[str]:
    out = f.filter(make_request(model=model), CycleState(), endpoints)  # type: ignore[attr-defined]
    return [ep.name for ep in out]


def queues(*sizes: int) -> list[Endpoint]:
    return [make_endpoint(f"e{i}", queue=q) for i, q in enumerate(sizes)]


def test_low_queue_keeps_queues_up_to_the_threshold() -> None:
    assert kept(LowQueueFilter(threshold=3), queues(0, 3, 4, 10)) == ["e0", "e1"]
    assert kept(LowQueueFilter(), queues(128, 129)) == ["e0"]


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        # min 0, max 12, 4 endpoints: up to 0 + 12 // 4 = 3
        ((0, 3, 4, 12), ["e0", "e1"]),
        # max - min = 5 over 4 endpoints: 5 // 4 = 1 (integer division, as Go's)
        ((2, 3, 4, 7), ["e0", "e1"]),
        # all equal: all
        ((5, 5, 5), ["e0", "e1", "e2"]),
        ((9,), ["e0"]),
    ],
)
def test_least_queue_keeps_the_lowest_nth_of_the_range(sizes: tuple[int, ...], expected: list[str]) -> None:
    assert kept(LeastQueueFilter(), queues(*sizes)) == expected


def test_least_kv_cache_keeps_the_lowest_nth_of_the_range() -> None:
    pool = [make_endpoint(f"e{i}", kv=kv) for i, kv in enumerate((0.1, 0.3, 0.5, 0.9))]
    # min 0.1, max 0.9: up to 0.1 + 0.8 / 4 = 0.3
    assert kept(LeastKVCacheFilter(), pool) == ["e0", "e1"]
    assert kept(LeastKVCacheFilter(), []) == []


def lora_pool() -> list[Endpoint]:
    return [
        make_endpoint("has", active=["ad"], max_models=2),
        make_endpoint("waiting", waiting=["ad"], max_models=1),
        make_endpoint("room", active=["x"], max_models=2),
        make_endpoint("full", active=["x", "y"], max_models=2),
    ]


def test_lora_affinity_prefers_the_adapter_then_room_for_it() -> None:
    always = LoraAffinityFilter(threshold=1.0, rng=random.Random(0))
    never = LoraAffinityFilter(threshold=0.0, rng=random.Random(0))
    assert kept(always, lora_pool(), "ad") == ["has", "waiting"]
    assert kept(never, lora_pool(), "ad") == ["room"]
    # Only one group: that group, whatever the draw.
    assert kept(never, lora_pool()[:2], "ad") == ["has", "waiting"]
    assert kept(always, lora_pool()[2:], "ad") == ["room"]
    assert kept(always, lora_pool()[3:], "ad") == []


def test_lora_affinity_draws_from_its_seeded_source() -> None:
    f = LoraAffinityFilter(threshold=0.7, rng=random.Random(5))
    draws = random.Random(5)
    for _ in range(50):
        expected = ["has", "waiting"] if draws.random() < 0.7 else ["room"]
        assert kept(f, lora_pool(), "ad") == expected


def test_decision_tree_follows_success_and_failure() -> None:
    low = LowQueueFilter(threshold=2)
    least = LeastQueueFilter()
    tree = DecisionTreeFilter("t", low, on_success=least, on_failure=LeastKVCacheFilter())
    # low keeps e0, e1 (queues 0, 2); least-queue over those: up to 0 + 2 // 2 = 1 -> e0
    assert kept(tree, queues(0, 2, 9)) == ["e0"]
    # low keeps nothing: the failure branch gets every endpoint (all kv 0: all kept)
    assert kept(tree, queues(5, 7)) == ["e0", "e1"]
    # no branch: the current filter's result, empty or not
    assert kept(DecisionTreeFilter("t", low), queues(5, 1)) == ["e1"]
    assert kept(DecisionTreeFilter("t", low), queues(5)) == []


LLMD_DEFAULT = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: low-queue-filter
  parameters: {threshold: 4}
- type: least-queue-filter
- type: least-kv-cache-filter
- type: decision-tree-filter
  name: low-latency-filter
  parameters:
    current: {pluginRef: low-queue-filter}
    nextOnSuccess:
      decisionTree:
        current: {pluginRef: least-queue-filter}
        nextOnSuccessOrFailure:
          decisionTree:
            current: {pluginRef: least-kv-cache-filter}
    nextOnFailure:
      decisionTree:
        current: {pluginRef: least-queue-filter}
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: low-latency-filter
  - pluginRef: random-picker
"""


def test_llmd_default_plugins_load_and_route() -> None:
    config = load_config_text(LLMD_DEFAULT, seed=1)
    pool = [
        make_endpoint("a", queue=0, kv=0.9),
        make_endpoint("b", queue=1, kv=0.1),
        make_endpoint("c", queue=3, kv=0.0),
        make_endpoint("d", queue=9, kv=0.0),
    ]
    # low-queue: a, b, c; least-queue over them: up to 0 + 3 // 3 = 1 -> a, b; least-kv: b
    assert [ep.name for ep in config.scheduler.schedule(make_request(), pool).targets] == ["b"]
    # All over the threshold: the failure branch, least-queue over all: up to 5 + 1 // 2 = 5 -> e
    busy = [make_endpoint("e", queue=5), make_endpoint("f", queue=6)]
    assert [ep.name for ep in config.scheduler.schedule(make_request(), busy).targets] == ["e"]


def test_the_later_short_type_names_load_too() -> None:
    text = LLMD_DEFAULT.replace("-filter\n", "\n").replace("name: low-latency-filter", "name: low-latency")
    text = text.replace("pluginRef: low-latency-filter", "pluginRef: low-latency").replace(
        "type: decision-tree-filter", "type: decision-tree"
    )
    text = text.replace("pluginRef: low-queue-filter", "pluginRef: low-queue")
    text = text.replace("pluginRef: least-queue-filter", "pluginRef: least-queue")
    text = text.replace("pluginRef: least-kv-cache-filter", "pluginRef: least-kv-cache")
    config = load_config_text(text, seed=1)
    # An alias builds the same type, named as the config names it.
    assert str(config.plugins["low-queue"].typed_name) == "low-queue/low-queue-filter"
    assert config.plugins["low-latency"].typed_name.type == "decision-tree-filter"
    assert len(config.scheduler.schedule(make_request(), queues(0, 1)).targets) == 1


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ("{}", "current"),
        (
            "{current: {pluginRef: nobody}}",
            "parameters.current.pluginRef: decision-tree-filter: there is no plugin named 'nobody'",
        ),
        ("{current: {pluginRef: random-picker}}", "is not a filter"),
        (
            "{current: {pluginRef: random-picker, decisionTree: {current: {pluginRef: x}}}}",
            "exactly one of pluginRef and decisionTree",
        ),
        (
            "{current: {pluginRef: low-queue-filter}, "
            "nextOnFailure: {decisionTree: {current: {pluginRef: zz}}}}",
            "nextOnFailure.decisionTree.current.pluginRef: decision-tree-filter: there is no plugin",
        ),
    ],
)
def test_bad_decision_trees_are_named(parameters: str, message: str) -> None:
    text = f"""
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: low-queue-filter
- type: random-picker
- type: decision-tree-filter
  name: tree
  parameters: {parameters}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: tree
  - pluginRef: random-picker
"""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config_text(text, seed=1)
