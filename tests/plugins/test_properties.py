"""Properties every in-tree plugin keeps, checked with hypothesis (derandomized: the same examples each run).

- scorers: one score per endpoint, each in [0, 1] for valid metrics, and in [0, 1] after the runtime's
  clamping whatever the metrics;
- filters: never add an endpoint (output is a subset of the input, by identity) and are idempotent;
- pickers: a non-empty subset of the candidates, no repeats, min(k, n) of them;
- a scheduler built twice from one config with one seed makes the same choices.
"""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from epick.config.loader import load_config_text
from epick.framework import (
    Clock,
    CycleState,
    Endpoint,
    Filter,
    InferenceRequest,
    Picker,
    PreRequest,
    ProfileRunResult,
    Response,
    ResponseComplete,
    ScheduleTrace,
    SchedulingError,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
)
from epick.plugins import in_tree_plugins
from epick.plugins.conformance.header_filter import HeaderBasedTestingFilter
from epick.plugins.datalayer.models import ModelsDataExtractor
from epick.plugins.filters.by_label import ByLabelFilter
from epick.plugins.filters.classic import (
    DecisionTreeFilter,
    LeastKVCacheFilter,
    LeastQueueFilter,
    LoraAffinityFilter,
    LowQueueFilter,
)
from epick.plugins.filters.endpoint_attribute import EndpointAttributeFilter
from epick.plugins.filters.label_selector import (
    LabelSelectorFilter,
    LabelSelectorParameters,
)
from epick.plugins.filters.modality import ModalityFilter
from epick.plugins.filters.prefix_affinity import PrefixCacheAffinityFilter
from epick.plugins.filters.role import DecodeFilter, EncodeFilter, PrefillFilter
from epick.plugins.filters.served_model import ServedModelFilter, ServedModelParameters
from epick.plugins.filters.topology_affinity import TopologyAffinityFilter
from epick.plugins.filters.utilization import UtilizationDetector, UtilizationParameters
from epick.plugins.filters.utilization_filter import UtilizationFilter, UtilizationFilterParameters
from epick.plugins.latency.cost_scorer import LatencyCostScorer
from epick.plugins.latency.gie_scorer import PredictedLatencyScorer
from epick.plugins.latency.observation_scorer import LatencyObservationScorer
from epick.plugins.latency.observer import LatencyObserver, ObserverParameters
from epick.plugins.latency.scorer import LatencyScorer
from epick.plugins.latency.tier_filter import SLOHeadroomTierFilter
from epick.plugins.load.concurrency import ConcurrencyDetector, ConcurrencyParameters
from epick.plugins.load.inflight import InFlightLoadProducer
from epick.plugins.multimodal.scorer import MMEmbeddingsCacheScorer
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.pickers.random_picker import RandomPicker
from epick.plugins.pickers.round_robin import RoundRobinPicker
from epick.plugins.pickers.weighted_random import WeightedRandomPicker
from epick.plugins.prefix.index import PrefixIndex
from epick.plugins.prefix.precise_scorer import PrecisePrefixCacheScorer
from epick.plugins.prefix.producer import ApproxPrefixCacheProducer
from epick.plugins.prefix.scorer import MultiClusterPrefixCacheScorer, PrefixCacheScorer
from epick.plugins.prefix.smallest_cache import SmallestCacheScorer
from epick.plugins.scorers.active_request import ActiveRequestScorer
from epick.plugins.scorers.attribute_weight import EndpointAttributeWeightScorer
from epick.plugins.scorers.context_length_aware import ContextLengthAware
from epick.plugins.scorers.endpoint_attribute import EndpointAttributeScorer
from epick.plugins.scorers.header_label_affinity import HeaderLabelAffinityScorer
from epick.plugins.scorers.kv_cache import KVCacheUtilizationScorer
from epick.plugins.scorers.load_aware import LoadAwareScorer
from epick.plugins.scorers.lora_affinity import LoraAffinityScorer
from epick.plugins.scorers.multicluster import MultiClusterKVCacheUtilizationScorer, MultiClusterQueueScorer
from epick.plugins.scorers.no_hit_lru import NoHitLruScorer
from epick.plugins.scorers.queue import QueueScorer
from epick.plugins.scorers.running_requests import RunningRequestsSizeScorer
from epick.plugins.scorers.session_affinity import SESSION_HEADER, SessionAffinityScorer, session_token
from epick.plugins.scorers.token_load import TokenLoadScorer
from epick.plugins.scorers.topology_affinity import TopologyAffinityScorer
from epick.plugins.session.filter import MultiClusterSessionAffinityFilter, SessionAffinityFilter
from tests.builders import make_endpoint, make_profile, make_request, make_scheduler

PROPERTY = settings(deadline=None, max_examples=100, derandomize=True, database=None)

NAMES = [f"ep{i}" for i in range(6)]
ROLES = [
    None,
    "decode",
    "prefill",
    "prefill-decode",
    "both",
    "encode-prefill",
    "encode-prefill-decode",
    "encode",
]
ADAPTERS = st.frozensets(st.sampled_from(["m", "lora-a", "lora-b", "lora-c"]), max_size=3)
LABEL_KEYS = ["gpu", "zone", "tier"]
LABEL_VALUES = ["a", "b", "c"]
NOW = 100.0


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@st.composite
def endpoint_lists(
    draw: st.DrawFn, *, wild: bool = False, min_size: int = 1, with_labels: bool = False
) -> list[Endpoint]:
    """1..6 endpoints ep0, ep1, ... with random metrics; `wild` allows out-of-range and NaN metrics;
    `with_labels` adds roles, labels and update times (only filters read them)."""
    n = draw(st.integers(min_size, len(NAMES)))
    if wild:
        kv = st.floats(-1.0, 3.0) | st.just(math.nan)
        count = st.integers(-50, 500)
    else:
        kv = st.floats(0.0, 1.0)
        count = st.integers(0, 500)
    endpoints = []
    for i in range(n):
        extra: dict[str, Any] = {}
        if with_labels:
            extra = {
                "role": draw(st.sampled_from(ROLES)),
                "labels": draw(
                    st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=3)
                ),
                "update_time": draw(st.none() | st.floats(NOW - 1.0, NOW)),
            }
        endpoints.append(
            make_endpoint(
                NAMES[i],
                queue=draw(count),
                running=draw(count),
                kv=draw(kv),
                active=sorted(draw(ADAPTERS)),
                waiting=sorted(draw(ADAPTERS)),
                max_models=draw(st.integers(0, 4)),
                **extra,
            )
        )
    return endpoints


@st.composite
def requests(draw: st.DrawFn) -> InferenceRequest:
    text = draw(st.text(alphabet="abcdé", max_size=60))
    model = draw(st.sampled_from(["m", "lora-a", "lora-b"]))
    # Any junk a client may send, non-ASCII included: it must score 0, never crash.
    junk = st.text(max_size=8)
    token = draw(st.none() | st.sampled_from(NAMES).map(session_token) | junk)
    headers = {SESSION_HEADER: token} if token is not None else {}
    body: dict[str, Any] = {}
    if (max_tokens := draw(st.none() | st.integers(0, 5000))) is not None:
        body["max_tokens"] = max_tokens
    if draw(st.booleans()):
        return make_request(
            model=model, headers=headers, messages=[{"role": "user", "content": text}], **body
        )
    return make_request(text, model=model, headers=headers, **body)


def observed(clock: FakeClock, inflight: InFlightLoadProducer) -> LatencyObserver:
    """A latency observer that has timed three endpoints (two seconds ago, so it has published them):
    ep0 and ep1 slower as their load rises, ep2 below the calibration threshold."""
    observer = LatencyObserver(params=ObserverParameters(min_requests=4), inflight=inflight, clock=clock)
    for i, count in enumerate((4, 4, 3)):
        for k in range(count):
            observer.record(NAMES[i], 0.1 * (i + 1) * (k + 1), k, clock.now - 2.0)
    return observer


def every_scorer(clock: FakeClock, inflight: InFlightLoadProducer | None = None) -> list[Any]:
    """One of each in-tree scorer, small thresholds so that the interesting ranges are reached; the
    load scorers read `inflight`."""
    inflight = inflight or InFlightLoadProducer()
    return [
        QueueScorer(),
        RunningRequestsSizeScorer(),
        KVCacheUtilizationScorer(),
        LoraAffinityScorer(),
        PrefixCacheScorer(block_size_tokens=1, lru_capacity_per_server=20),
        NoHitLruScorer(lru_size=3),  # after the prefix scorer, whose match it reads
        LoadAwareScorer(threshold=16),
        ActiveRequestScorer(inflight=inflight),
        SessionAffinityScorer(),
        TokenLoadScorer(inflight=inflight, queue_threshold_tokens=64),
        TopologyAffinityScorer(),
        EndpointAttributeScorer(None, "GPUUtilization/dcgm-extractor", lower_is_better=True),
        EndpointAttributeScorer(
            None, "q/core-metrics-extractor", lower_is_better=False, fixed_range=(0.0, 5.0)
        ),
        HeaderLabelAffinityScorer(None, SESSION_HEADER, LABEL_KEYS[0]),
        ContextLengthAware(label=LABEL_KEYS[0]),
        PrecisePrefixCacheScorer(),
        MMEmbeddingsCacheScorer(),
        MultiClusterQueueScorer(),
        MultiClusterKVCacheUtilizationScorer(),
        MultiClusterPrefixCacheScorer(block_size_tokens=1, lru_capacity_per_server=20),
        LatencyScorer(prefix_producer="approx-prefix-cache-producer"),
        LatencyCostScorer(),
        PredictedLatencyScorer(prefix_producer="approx-prefix-cache-producer", rng=random.Random(0)),
        SmallestCacheScorer(producer="approx-prefix-cache-producer", index=PrefixIndex(16)),
        EndpointAttributeWeightScorer(None, "gpu/", {"a": 2.0, "b": 1.0}),
        LatencyObservationScorer(observer=observed(clock, inflight), inflight=inflight, rng=random.Random(0)),
    ]


class _Handle:
    def plugin(self, name: str) -> Any:
        if name == "low-queue-filter":  # what REQUIRED_PARAMETERS' decision trees refer to
            return LowQueueFilter()
        if name == "approx-prefix-cache-producer":  # the index smallest-cache-scorer reads
            return ApproxPrefixCacheProducer(name)
        if name == "utilization-detector":  # what max-saturation-detector combines
            return UtilizationDetector(name)
        if name == "models-data-extractor":  # whose lists served-model-filter reads
            return ModelsDataExtractor(name)
        raise LookupError(name, "not in this test")  # as the loader's handle says so

    def rng(self, name: str) -> random.Random:
        return random.Random(0)

    clock = Clock()  # the config's clock, as the loader's handle gives it
    workers = 1
    plugin_state_staleness = 300.0


# Types with a parameter that has no default.
_TREE = {"current": {"pluginRef": "low-queue-filter"}}
REQUIRED_PARAMETERS = {
    "endpoint-attribute-filter": {
        "attribute": "GPUUtilization",
        "producer": "dcgm-extractor",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 0.5}},
    },
    "endpoint-attribute-scorer": {"attributeKey": "a", "algorithm": {"type": "linear_lower_is_better"}},
    "header-label-affinity-scorer": {"headerName": "x-h", "labelKey": "k"},
    "utilization-filter": {"conditions": [{"metric": "waiting-queue", "maxValue": 3}]},
    "session-id-producer": {"headerName": "x-session-id"},
    "pd-profile-handler": {"threshold": 0},
    "disaggregatedset-rollout-screener": {
        "scope": {"labelSelector": "app=vllm"},
        "revisionGating": {"mode": "disabled"},
    },
    "request-attribute-reporter": {
        "attributes": [{"key": {"name": "x-cost"}, "expression": "usage.completion_tokens"}]
    },
    "by-label": {"label": "tier"},
    "decision-tree-filter": _TREE,
    "decision-tree": _TREE,
    "k8s-notification-source": {"version": "v1", "kind": "Pod"},
    "file-discovery": {"path": "endpoints.yaml"},
    "multicluster-file-discovery": {"path": "clusters.yaml"},
    "shared-state-syncer": {"address": "redis://127.0.0.1:6379"},
    "max-saturation-detector": {"detectors": ["utilization-detector"]},
    "priority-holdback-policy": {"minCeiling": 0.4},
    "endpoint-attribute-weight-scorer": {"attributeKey": "gpu", "producer": "", "weights": {"a": 2, "b": 1}},
    "label-producer": {"labels": [{"label": "gpu", "attributeKey": "gpu"}]},
    "selective-kv-policy": {"loadPolicy": "disable"},
}


def in_tree_types(kind: type) -> set[str]:
    """Types of the in-tree plugins that, built with default parameters, implement `kind`."""
    found = set()
    for spec in in_tree_plugins():
        params = spec.parameters.model_validate(REQUIRED_PARAMETERS.get(spec.type, {}))
        plugin = spec.factory(spec.type, params, _Handle())
        if isinstance(plugin, kind):
            found.add(spec.type)
    return found


def test_the_properties_cover_every_in_tree_scorer_filter_and_picker() -> None:
    assert {s.typed_name.type for s in every_scorer(FakeClock())} == in_tree_types(Scorer)
    assert {f.typed_name.type for f in some_filters(LabelSelectorParameters(), UtilizationParameters())} == (
        in_tree_types(Filter)
    )
    assert {p.typed_name.type for p in every_picker(1, 0)} == in_tree_types(Picker)


# --- scorers --------------------------------------------------------------------------------------


@PROPERTY
@given(
    steps=st.lists(
        st.tuples(requests(), endpoint_lists(), st.integers(0, 5), st.floats(0.0, 3.0), st.booleans()),
        min_size=1,
        max_size=4,
    )
)
def test_scores_are_in_unit_interval_for_valid_metrics(
    steps: list[tuple[InferenceRequest, list[Endpoint], int, float, bool]],
) -> None:
    clock = FakeClock()
    inflight = InFlightLoadProducer()
    scorers = every_scorer(clock, inflight)
    hooks = [inflight, *scorers]  # the producer counts what the load scorers read
    for request, endpoints, choice, advance, complete in steps:
        cycle_state = CycleState()
        inflight.produce(request, cycle_state, endpoints)
        for scorer in scorers:
            scores = scorer.score(request, cycle_state, endpoints)
            assert len(scores) == len(endpoints), scorer
            assert all(0.0 <= s <= 1.0 for s in scores), (scorer, scores)
        # act on a choice so the stateful scorers (prefix, active requests, token load) move on
        target = endpoints[choice % len(endpoints)]
        result = SchedulingResult({"default": ProfileRunResult((target,))}, "default")
        for hook in hooks:
            if isinstance(hook, PreRequest):
                hook.pre_request(request, result, cycle_state)
            if complete and isinstance(hook, ResponseComplete):
                hook.response_complete(request, Response(request.request_id), target)
        clock.now += advance


@PROPERTY
@given(
    request=requests(),
    endpoints=endpoint_lists(wild=True),
    weights=st.lists(st.floats(0.0, 10.0), min_size=26, max_size=26),
    seed=st.integers(0, 2**16),
)
def test_scores_after_the_runtime_clamps_are_in_unit_interval(
    request: InferenceRequest, endpoints: list[Endpoint], weights: list[float], seed: int
) -> None:
    scorers = every_scorer(FakeClock())
    profile = make_profile(scorers=list(zip(scorers, weights, strict=True)), seed=seed)
    trace = ScheduleTrace()
    result = make_scheduler(profile).schedule(request, endpoints, trace=trace)
    (ptrace,) = trace.profiles
    assert len(ptrace.scorers) == len(scorers)
    for step in ptrace.scorers:
        assert set(step.scores) == {ep.name for ep in endpoints}
        assert all(0.0 <= s <= 1.0 for s in step.scores.values()), step
    # every total is a weighted sum of unit scores: 0 <= total <= sum(weights)
    assert all(0.0 <= t <= sum(weights) + 1e-9 for t in ptrace.totals.values())
    assert result.targets[0] in endpoints


# --- filters --------------------------------------------------------------------------------------

requirement: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.builds(
        dict,
        key=st.sampled_from(LABEL_KEYS),
        operator=st.sampled_from(["In", "NotIn"]),
        values=st.lists(st.sampled_from(LABEL_VALUES), min_size=1, max_size=2),
    ),
    st.builds(dict, key=st.sampled_from(LABEL_KEYS), operator=st.sampled_from(["Exists", "DoesNotExist"])),
)
selectors = st.builds(
    lambda labels, exprs: LabelSelectorParameters.model_validate(
        {"matchLabels": labels, "matchExpressions": exprs}
    ),
    st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=2),
    st.lists(requirement, max_size=3),
)
utilization_params = st.builds(
    UtilizationParameters,
    queue_depth_threshold=st.integers(1, 300),
    kv_cache_util_threshold=st.floats(0.05, 1.0),
    metrics_staleness_threshold=st.floats(0.01, 2.0),
    headroom=st.floats(0.0, 1.0),
)


# Filters that keep endpoints relative to the others given (a range's lowest part, a random group):
# applied again to their own result they may keep fewer.
RELATIVE = (LeastQueueFilter, LeastKVCacheFilter, LoraAffinityFilter, DecisionTreeFilter)


def classic_filters() -> list[Any]:
    """The GIE's first filters (a decision tree over the others); their short names are aliases."""
    filters = [LowQueueFilter(threshold=2), LeastQueueFilter(), LeastKVCacheFilter()]
    filters.append(LoraAffinityFilter(threshold=0.5, rng=random.Random(1)))
    filters.append(DecisionTreeFilter(None, filters[0], on_success=filters[1], on_failure=filters[2]))
    return filters


def some_filters(selector: LabelSelectorParameters, params: UtilizationParameters) -> list[Any]:
    return [
        LabelSelectorFilter(selector=selector),
        ByLabelFilter(label=LABEL_KEYS[0], valid_values=LABEL_VALUES[:1], allows_no_label=True),
        *classic_filters(),
        DecodeFilter(),
        PrefillFilter(),
        EncodeFilter(),
        TopologyAffinityFilter(),
        UtilizationFilter(
            None,
            UtilizationFilterParameters.model_validate(
                {"conditions": [{"metric": "waiting-queue", "maxValue": 3}], "fallbackOnEmpty": True}
            ),
        ),
        SessionAffinityFilter(),
        MultiClusterSessionAffinityFilter(),
        ConcurrencyDetector(params=ConcurrencyParameters(max_concurrency=1)),
        PrefixCacheAffinityFilter(prefix_producer="approx-prefix-cache-producer"),
        EndpointAttributeFilter(
            None, "GPUUtilization/dcgm-extractor", "LessThan", 0.5, fallback_on_empty=True
        ),
        ContextLengthAware(label=LABEL_KEYS[0], enable_filtering=True),
        UtilizationDetector(params=params, clock=FakeClock()),
        SLOHeadroomTierFilter(rng=random.Random(0)),
        HeaderBasedTestingFilter(),
        ServedModelFilter(),
        ServedModelFilter(params=ServedModelParameters(on_missing="Fail", fallback_on_empty=True)),
        ModalityFilter(),
    ]


@PROPERTY
@given(
    endpoints=endpoint_lists(wild=True, min_size=0, with_labels=True),
    selector=selectors,
    params=utilization_params,
    request=requests(),
)
def test_filters_never_add_endpoints_and_are_idempotent(
    endpoints: list[Endpoint],
    selector: LabelSelectorParameters,
    params: UtilizationParameters,
    request: InferenceRequest,
) -> None:
    for f in some_filters(selector, params):
        kept = list(f.filter(request, CycleState(), endpoints))
        given_ids = {id(ep) for ep in endpoints}
        assert all(id(ep) in given_ids for ep in kept), f
        assert len({id(ep) for ep in kept}) == len(kept), f
        if isinstance(f, RELATIVE):
            continue  # what they keep depends on what they are given, by design (GIE's)
        again = list(f.filter(request, CycleState(), kept))
        assert [id(ep) for ep in again] == [id(ep) for ep in kept], f
        if isinstance(f, UtilizationDetector):
            # it fails open: never empties a non-empty pool
            assert bool(kept) == bool(endpoints)


# --- pickers --------------------------------------------------------------------------------------


def every_picker(k: int, seed: int) -> list[Any]:
    return [
        MaxScorePicker(max_num_of_endpoints=k, rng=random.Random(seed)),
        RandomPicker(max_num_of_endpoints=k, rng=random.Random(seed)),
        WeightedRandomPicker(max_num_of_endpoints=k, rng=random.Random(seed)),
        RoundRobinPicker(max_num_of_endpoints=k),
    ]


totals = st.one_of(
    st.floats(0.0, 10.0),
    st.just(0.0),
    st.sampled_from([5e-324, 1e-300, 1e-12]),  # tiny positive totals: 1/total overflows to inf
)


@PROPERTY
@given(
    scores=st.lists(totals, min_size=1, max_size=8),
    k=st.integers(1, 10),
    seed=st.integers(0, 2**32 - 1),
)
def test_pickers_return_a_non_empty_subset_of_at_most_k(scores: list[float], k: int, seed: int) -> None:
    candidates = [ScoredEndpoint(make_endpoint(f"e{i}"), s) for i, s in enumerate(scores)]
    by_id = {id(c.endpoint): c.score for c in candidates}
    for picker in every_picker(k, seed):
        targets = picker.pick(make_request(), CycleState(), candidates).targets
        assert targets, picker
        assert all(id(ep) in by_id for ep in targets), picker
        assert len({id(ep) for ep in targets}) == len(targets), picker
        assert len(targets) == min(k, len(candidates)), picker
        if isinstance(picker, MaxScorePicker):
            chosen = {id(ep) for ep in targets}
            left = [s for i, s in by_id.items() if i not in chosen]
            assert not left or min(by_id[id(ep)] for ep in targets) >= max(left)
            # primary first: targets come in descending order of total
            picked = [by_id[id(ep)] for ep in targets]
            assert picked == sorted(picked, reverse=True)
        if isinstance(picker, WeightedRandomPicker) and any(s > 0 for s in scores):
            # a zero total never comes before a positive one
            picked = [by_id[id(ep)] for ep in targets]
            first_zero = next((i for i, s in enumerate(picked) if s <= 0), len(picked))
            assert all(s <= 0 for s in picked[first_zero:])


# --- determinism ----------------------------------------------------------------------------------

PD_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: decode-filter
- type: prefill-filter
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: active-request-scorer
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 1}
- type: load-aware-scorer
  parameters: {threshold: 4}
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
- name: weighted
  type: weighted-random-picker
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 4}
- type: disagg-profile-handler
  parameters:
    deciders: {prefill: prefix-based-pd-decider}
schedulingProfiles:
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
  - pluginRef: active-request-scorer
  - pluginRef: max-score-picker
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: prefix-cache-scorer
  - pluginRef: load-aware-scorer
  - pluginRef: weighted
"""

SHADOW_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 1}
- type: max-score-picker
- type: random-picker
  parameters: {maxNumOfEndpoints: 3}
- type: shadow-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
- name: candidate
  plugins:
  - pluginRef: random-picker
"""


def run_workload(config: str, config_seed: int, workload_seed: int, steps: int = 25) -> list[object]:
    """Schedule a seeded random workload on a config loaded with `config_seed`; what was chosen, in order."""
    loaded = load_config_text(config, seed=config_seed)
    rng = random.Random(workload_seed)
    outcomes: list[object] = []
    for i in range(steps):
        endpoints = [
            make_endpoint(
                name,
                queue=rng.randint(0, 2),  # few distinct values: many ties for the pickers to break
                kv=rng.choice([0.0, 0.5]),
                role=rng.choice([None, "decode", "prefill", "both"]),
            )
            for name in NAMES[: rng.randint(1, len(NAMES))]
        ]
        prompt = rng.choice(["system prompt A ", "system prompt B ", ""]) + "q" * rng.randint(0, 40)
        request = make_request(prompt, request_id=f"r{i}")
        cycle_state = CycleState()
        try:
            result = loaded.scheduler.schedule(request, endpoints, cycle_state=cycle_state)
        except SchedulingError as e:
            outcomes.append(("error", str(e)))
            continue
        outcomes.append(
            (
                result.primary_profile,
                {k: [ep.name for ep in v.targets] if v else None for k, v in result.profile_results.items()},
                {k: [ep.name for ep in v.targets] if v else None for k, v in result.shadow_results.items()},
            )
        )
        for hook in loaded.hooks.pre_request:
            hook.pre_request(request, result, cycle_state)
        if rng.random() < 0.5:
            for done in loaded.hooks.response_complete:
                done.response_complete(request, Response(request.request_id), result.targets[0])
    return outcomes


@settings(deadline=None, max_examples=15, derandomize=True, database=None)
@given(
    config=st.sampled_from([PD_CONFIG, SHADOW_CONFIG]),
    config_seed=st.integers(0, 2**31),
    workload_seed=st.integers(0, 2**31),
)
def test_schedule_is_deterministic_for_a_fixed_seed(
    config: str, config_seed: int, workload_seed: int
) -> None:
    first = run_workload(config, config_seed, workload_seed)
    second = run_workload(config, config_seed, workload_seed)
    assert first == second


def test_the_seed_matters() -> None:
    # with many ties to break, two seeds choosing identically over 25 requests would mean the seed is unused
    runs = {seed: run_workload(SHADOW_CONFIG, seed, workload_seed=1) for seed in (1, 2, 3)}
    assert runs[1] != runs[2] or runs[1] != runs[3]
    # and the workload does exercise disaggregation and errors in the P/D config
    outcomes = run_workload(PD_CONFIG, 7, workload_seed=3, steps=60)
    assert any(isinstance(o, tuple) and o[0] == "error" for o in outcomes)
    assert any(isinstance(o, tuple) and isinstance(o[1], dict) and "prefill" in o[1] for o in outcomes)
