"""Filters: label selector, decode / prefill role filters, and the utilization (saturation) detector."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import ValidationError

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, Endpoint
from epick.plugins.filters.by_label import ByLabelFilter
from epick.plugins.filters.label_selector import LabelSelectorFilter, LabelSelectorParameters
from epick.plugins.filters.role import DecodeFilter, PrefillFilter
from epick.plugins.filters.utilization import UtilizationDetector, UtilizationParameters
from tests.builders import make_endpoint, make_profile, make_request, make_scheduler


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def names(endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in endpoints]


def run(plugin: Any, endpoints: Sequence[Endpoint]) -> list[str]:
    return names(plugin.filter(make_request(), CycleState(), endpoints))


# --- label-selector-filter ------------------------------------------------------------------------

LABELLED = [
    make_endpoint("gpu-a100", labels={"gpu": "a100", "zone": "east"}),
    make_endpoint("gpu-h100", labels={"gpu": "h100", "zone": "west", "canary": "true"}),
    make_endpoint("gpu-l4", labels={"gpu": "l4"}),
    make_endpoint("plain"),
]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        # empty selector keeps all
        ({}, ["gpu-a100", "gpu-h100", "gpu-l4", "plain"]),
        # matchLabels: every key equal
        ({"matchLabels": {"gpu": "h100"}}, ["gpu-h100"]),
        ({"matchLabels": {"gpu": "a100", "zone": "east"}}, ["gpu-a100"]),
        ({"matchLabels": {"gpu": "a100", "zone": "west"}}, []),
        # In: present with one of the values
        (
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100", "l4"]}]},
            ["gpu-a100", "gpu-l4"],
        ),
        # NotIn: absent, or present with another value
        (
            {"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["a100"]}]},
            ["gpu-h100", "gpu-l4", "plain"],
        ),
        # Exists / DoesNotExist
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, ["gpu-a100", "gpu-h100"]),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, ["gpu-l4", "plain"]),
        # everything is ANDed: gpu exists AND canary absent AND zone in {east, west}
        (
            {
                "matchExpressions": [
                    {"key": "gpu", "operator": "Exists"},
                    {"key": "canary", "operator": "DoesNotExist"},
                    {"key": "zone", "operator": "In", "values": ["east", "west"]},
                ]
            },
            ["gpu-a100"],
        ),
        # matchLabels AND matchExpressions
        (
            {"matchLabels": {"zone": "west"}, "matchExpressions": [{"key": "canary", "operator": "Exists"}]},
            ["gpu-h100"],
        ),
    ],
)
def test_label_selector(selector: dict[str, Any], expected: list[str]) -> None:
    params = LabelSelectorParameters.model_validate(selector)
    assert run(LabelSelectorFilter(selector=params), LABELLED) == expected


def test_label_selector_without_parameters_keeps_all() -> None:
    assert run(LabelSelectorFilter(), LABELLED) == names(LABELLED)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ({"key": "gpu", "operator": "In"}, "operator In needs a non-empty 'values' list"),
        ({"key": "gpu", "operator": "In", "values": []}, "operator In needs a non-empty 'values' list"),
        ({"key": "gpu", "operator": "NotIn"}, "operator NotIn needs a non-empty 'values' list"),
        ({"key": "gpu", "operator": "Exists", "values": ["a100"]}, "operator Exists takes no 'values'"),
        (
            {"key": "gpu", "operator": "DoesNotExist", "values": ["x"]},
            "operator DoesNotExist takes no 'values'",
        ),
        ({"key": "gpu", "operator": "Equals", "values": ["x"]}, "operator"),
        ({"key": "", "operator": "Exists"}, "key"),
        ({"key": "gpu", "operator": "Exists", "value": "x"}, "value"),  # unknown field
    ],
)
def test_label_selector_parameters_validation(expression: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LabelSelectorParameters.model_validate({"matchExpressions": [expression]})


# --- decode-filter and prefill-filter -------------------------------------------------------------

ROLE_TABLE = [
    # role label,              decode keeps, prefill keeps
    ("decode", True, False),
    ("prefill", False, True),
    ("prefill-decode", True, True),
    ("both", True, True),
    ("encode-prefill", False, True),
    ("encode-prefill-decode", True, True),
    ("encode", False, False),
    ("Decode", False, False),  # values are case-sensitive
    ("", False, False),
    (None, True, False),  # unlabelled: a plain server decodes, but is not a prefill endpoint
]


@pytest.mark.parametrize(("role", "decode", "prefill"), ROLE_TABLE)
def test_role_filters(role: str | None, decode: bool, prefill: bool) -> None:
    endpoint = make_endpoint("e", role=role)
    assert run(DecodeFilter(), [endpoint]) == (["e"] if decode else [])
    assert run(PrefillFilter(), [endpoint]) == (["e"] if prefill else [])


def test_role_filters_over_a_mixed_pool_keep_order() -> None:
    pool = [make_endpoint(f"e{i}-{role}", role=role) for i, (role, _, _) in enumerate(ROLE_TABLE)]
    assert run(DecodeFilter(), pool) == [ep.name for ep, (_, d, _) in zip(pool, ROLE_TABLE, strict=True) if d]
    assert run(PrefillFilter(), pool) == [
        ep.name for ep, (_, _, p) in zip(pool, ROLE_TABLE, strict=True) if p
    ]


def test_role_filters_read_only_the_role_label() -> None:
    endpoint = make_endpoint("e", labels={"role": "prefill"})  # not llm-d.ai/role: unlabelled
    assert run(DecodeFilter(), [endpoint]) == ["e"]
    assert run(PrefillFilter(), [endpoint]) == []


# --- utilization-detector -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queue", "kv", "kept"),
    [
        # defaults: queue < 5 and kv < 0.8 to be kept
        (0, 0.0, True),
        (4, 0.79, True),
        (5, 0.0, False),  # queue at the threshold: dropped
        (9, 0.0, False),
        (0, 0.8, False),  # kv at the threshold: dropped
        (0, 0.95, False),
    ],
)
def test_utilization_filter_drops_at_or_over_the_thresholds(queue: int, kv: float, kept: bool) -> None:
    pool = [make_endpoint("x", queue=queue, kv=kv), make_endpoint("idle")]
    assert run(UtilizationDetector(), pool) == (["x", "idle"] if kept else ["idle"])


@pytest.mark.parametrize(
    ("queue", "kv", "kept"),
    [
        # headroom 0.2: queue limit 5 * 1.2 = 6, kv limit 0.8 * 1.2 = 0.96
        (5, 0.0, True),
        (6, 0.0, False),
        (0, 0.9, True),
        (0, 0.96, False),
    ],
)
def test_utilization_filter_headroom(queue: int, kv: float, kept: bool) -> None:
    detector = UtilizationDetector(params=UtilizationParameters(headroom=0.2))
    pool = [make_endpoint("x", queue=queue, kv=kv), make_endpoint("idle")]
    assert run(detector, pool) == (["x", "idle"] if kept else ["idle"])


def test_utilization_filter_custom_thresholds() -> None:
    params = UtilizationParameters.model_validate({"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.5})
    detector = UtilizationDetector(params=params)
    pool = [make_endpoint("q9", queue=9), make_endpoint("q10", queue=10), make_endpoint("kv49", kv=0.49)]
    pool.append(make_endpoint("kv50", kv=0.5))
    assert run(detector, pool) == ["q9", "kv49"]


def test_utilization_filter_drops_stale_metrics() -> None:
    clock = FakeClock(1000.0)
    detector = UtilizationDetector(clock=clock)  # staleness threshold 200 ms
    pool = [
        make_endpoint("fresh", update_time=999.9),  # 100 ms old
        make_endpoint("stale", update_time=999.5),  # 500 ms old
        make_endpoint("untracked", update_time=None),  # no update time: fresh
    ]
    assert run(detector, pool) == ["fresh", "untracked"]
    clock.now = 1000.25  # now fresh is 350 ms old
    assert run(detector, pool) == ["untracked"]


def test_utilization_staleness_is_strictly_over_the_threshold() -> None:
    # 0.25 s is exact in binary floating point, so the boundary is exact too
    params = UtilizationParameters(metrics_staleness_threshold=0.25)
    clock = FakeClock(1000.0)
    detector = UtilizationDetector(params=params, clock=clock)
    pool = [make_endpoint("edge", update_time=999.75), make_endpoint("untracked")]
    assert run(detector, pool) == ["edge", "untracked"]  # 250 ms old: not over
    clock.now = 1000.0 + 2**-20
    assert run(detector, pool) == ["untracked"]


def test_utilization_filter_keeps_all_when_all_would_be_dropped() -> None:
    clock = FakeClock(1000.0)
    pool = [
        make_endpoint("busy", queue=50),
        make_endpoint("full", kv=0.99),
        make_endpoint("old", update_time=1.0),
    ]
    kept = UtilizationDetector(clock=clock).filter(make_request(), CycleState(), pool)
    assert names(kept) == ["busy", "full", "old"]
    assert all(k is p for k, p in zip(kept, pool, strict=True))


@pytest.mark.parametrize(
    ("endpoints", "expected"),
    [
        # saturation = max(queue / 5, kv / 0.8)
        ([make_endpoint(queue=0, kv=0.0)], 0.0),
        ([make_endpoint(queue=5)], 1.0),  # 5/5
        ([make_endpoint(kv=0.4)], 0.5),  # 0.4/0.8
        ([make_endpoint(queue=2, kv=0.6)], 0.75),  # max(0.4, 0.75)
        ([make_endpoint(queue=10)], 2.0),  # 10/5: not capped
        # mean: (0 + 1 + 0.5) / 3 = 0.5
        ([make_endpoint(), make_endpoint(queue=5), make_endpoint(kv=0.4)], 0.5),
        # stale metrics count as saturated: (1 + 0) / 2
        ([make_endpoint(update_time=0.0), make_endpoint(update_time=100.0)], 0.5),
        # an empty pool is saturated
        ([], 1.0),
    ],
)
def test_pool_saturation(endpoints: list[Endpoint], expected: float) -> None:
    detector = UtilizationDetector(clock=FakeClock(100.0))
    assert detector.pool_saturation(endpoints) == pytest.approx(expected)


def test_utilization_parameters() -> None:
    defaults = UtilizationParameters()
    assert defaults.queue_depth_threshold == 5
    assert defaults.kv_cache_util_threshold == 0.8
    assert defaults.metrics_staleness_threshold == pytest.approx(0.2)
    assert defaults.headroom == 0.0
    parsed = UtilizationParameters.model_validate({"metricsStalenessThreshold": "1s500ms"})
    assert parsed.metrics_staleness_threshold == pytest.approx(1.5)
    for bad in ({"queueDepthThreshold": 0}, {"kvCacheUtilThreshold": 1.5}, {"headroom": -0.1}):
        with pytest.raises(ValidationError):
            UtilizationParameters.model_validate(bad)


def test_utilization_filter_in_a_profile_removes_saturated_endpoints() -> None:
    pool = [make_endpoint("busy", queue=7), make_endpoint("ok", queue=4)]
    profile = make_profile(filters=[UtilizationDetector()])
    assert names(make_scheduler(profile).schedule(make_request(), pool).targets) == ["ok"]


# by-label (llm-d)


def by_label_names(f: ByLabelFilter, endpoints: Sequence[Endpoint]) -> list[str]:
    return [ep.name for ep in f.filter(make_request(), CycleState(), endpoints)]


def test_by_label_keeps_valid_values_and_optionally_unlabelled_endpoints() -> None:
    pool = [
        make_endpoint("fast", labels={"tier": "gold"}),
        make_endpoint("slow", labels={"tier": "bronze"}),
        make_endpoint("plain"),
        make_endpoint("blank", labels={"tier": ""}),
    ]
    gold = ByLabelFilter(label="tier", valid_values=["gold"])
    assert by_label_names(gold, pool) == ["fast"]
    lenient = ByLabelFilter(label="tier", valid_values=["gold"], allows_no_label=True)
    assert by_label_names(lenient, pool) == ["fast", "plain"]
    # As llm-d: a missing label reads as the empty value.
    empty = ByLabelFilter(label="tier", valid_values=[""])
    assert by_label_names(empty, pool) == ["plain", "blank"]


def test_llmd_label_filters_load_by_their_llmd_names() -> None:
    config = load_config_text(
        """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: by-label
  parameters: {label: tier, validValues: [gold, silver], allowsNoLabel: true}
- type: by-label-selector
  parameters:
    matchExpressions: [{key: zone, operator: NotIn, values: [mars]}]
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: by-label
  - pluginRef: by-label-selector
  - pluginRef: random-picker
""",
        seed=1,
    )
    pool = [
        make_endpoint("a", labels={"tier": "gold", "zone": "mars"}),
        make_endpoint("b", labels={"tier": "silver"}),
        make_endpoint("c", labels={"tier": "bronze"}),
    ]
    assert [ep.name for ep in config.scheduler.schedule(make_request(), pool).targets] == ["b"]
    with pytest.raises(ConfigError, match="label"):
        load_config_text(
            "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: by-label\n", seed=1
        )
