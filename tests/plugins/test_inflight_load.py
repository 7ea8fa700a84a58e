"""`inflight-load-producer`, `concurrency-detector` and `prefix-cache-affinity-filter`, with values
worked out by hand from upstream's rules (llm-d-router's inflightload, concurrency and
prefixcacheaffinity packages)."""

from __future__ import annotations

import random
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epick.config import ConfigError, LoadedConfig, LoadOptions, load_config_text
from epick.framework import CycleState, ProfileRunResult, Response, SchedulingResult
from epick.plugins.filters.prefix_affinity import PrefixAffinityParameters, PrefixCacheAffinityFilter
from epick.plugins.load.concurrency import ConcurrencyDetector, ConcurrencyParameters
from epick.plugins.load.inflight import InFlightLoad, InFlightLoadProducer, InFlightParameters, prompt_tokens
from epick.plugins.prefix.producer import match_key
from epick.plugins.prefix.scorer import PrefixMatch
from tests.builders import make_endpoint, make_request

HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
BLOCK = 64  # tokens per block


def load(body: str) -> LoadedConfig:
    return load_config_text(HEADER + textwrap.dedent(body), seed=0)


def with_match(match: PrefixMatch) -> CycleState:
    state = CycleState()
    state.write(match_key(), match)
    return state


def test_prompt_tokens_are_ids_or_ceil_bytes_over_four() -> None:
    assert prompt_tokens(make_request("hello world")) == 3  # 11 bytes
    assert prompt_tokens(make_request("x" * 1000)) == 250


def test_uncached_tokens_discount_the_matched_prefix() -> None:
    p = InFlightLoadProducer(prefix_producer="approx-prefix-cache-producer")
    match = PrefixMatch(4, BLOCK * 4, {"A": 3})  # 4 blocks of 64 tokens; A holds 3
    # A: (4 - 3) x 64 + max(0, 250 - 256) = 64; B: 4 x 64 = 256 (the partial block counts whole)
    assert p.uncached_tokens(250, match, "A") == 64
    assert p.uncached_tokens(250, match, "B") == 256
    assert p.uncached_tokens(250, None, "A") == 250


def test_estimated_output_is_capped_by_the_request_and_the_parameter() -> None:
    p = InFlightLoadProducer(params=InFlightParameters(add_estimated_output_tokens=True))
    assert p.estimated_output(250, None) == 375  # round(250 x 1.5)
    assert p.estimated_output(250, 100) == 100
    capped = InFlightLoadProducer(params=InFlightParameters(max_estimated_output_tokens=50))
    assert capped.estimated_output(250, None) == 50
    assert p.estimated_output(0, None) == 0


def decided(*profiles: tuple[str, str]) -> SchedulingResult:
    results = {name: ProfileRunResult((make_endpoint(target),)) for name, target in profiles}
    return SchedulingResult(results, profiles[0][0])


def test_counts_follow_the_request_and_release_as_the_response_goes() -> None:
    p = InFlightLoadProducer(prefix_producer="approx-prefix-cache-producer")
    request = make_request("x" * 1000, request_id="r1")  # 250 tokens
    state = with_match(PrefixMatch(4, BLOCK * 4, {"D": 3}))
    p.pre_request(request, decided(("decode", "D"), ("prefill", "P")), state)
    assert (p.load("D").requests, p.load("D").tokens) == (1, 64)
    assert (p.load("P").requests, p.load("P").tokens) == (1, 256)
    # First chunk: prefill released whole, decode's tokens released, its request still counted.
    p.response_streaming(request, Response("r1"), make_endpoint("D"))
    assert (p.load("P").requests, p.load("P").tokens) == (0, 0)
    assert (p.load("D").requests, p.load("D").tokens) == (1, 0)
    p.response_complete(request, Response("r1"), make_endpoint("D"))
    assert (p.load("D").requests, p.load("D").tokens) == (0, 0)
    p.response_complete(request, Response("r1"), make_endpoint("D"))  # twice: nothing below 0
    assert p.load("D").requests == 0


def test_with_estimated_output_decode_tokens_stay_until_the_end() -> None:
    p = InFlightLoadProducer(params=InFlightParameters(add_estimated_output_tokens=True))
    request = make_request("x" * 1000, request_id="r2", max_tokens=100)
    p.pre_request(request, decided(("decode", "D")), CycleState())
    assert p.load("D").tokens == 350  # 250 prompt + min(375, 100)
    p.response_streaming(request, Response("r2"), make_endpoint("D"))
    assert p.load("D").tokens == 350
    p.response_complete(request, Response("r2"), make_endpoint("D"))
    assert p.load("D").tokens == 0


def loaded(requests: dict[str, int], tokens: dict[str, int] | None = None) -> InFlightLoadProducer:
    p = InFlightLoadProducer()
    for name, n in requests.items():
        for i in range(n):
            request = make_request(
                "x" * (4 * (tokens or {}).get(name, 0) // max(n, 1)), request_id=f"{name}{i}"
            )
            p.pre_request(request, decided(("decode", name)), CycleState())
    return p


def test_concurrency_saturation_and_filter_in_requests_mode() -> None:
    producer = loaded({"a": 50, "b": 110})
    d = ConcurrencyDetector(params=ConcurrencyParameters(headroom=0.2), producer=producer)
    eps = [make_endpoint("a"), make_endpoint("b")]
    assert d.pool_saturation(eps) == pytest.approx(160 / 200)
    assert [ep.name for ep in d.filter(make_request(), CycleState(), eps)] == ["a", "b"]  # limit 120
    at_limit = ConcurrencyDetector(params=ConcurrencyParameters(headroom=0.2), producer=loaded({"c": 120}))
    assert at_limit.filter(make_request(), CycleState(), [make_endpoint("c")]) == []
    assert d.pool_saturation([]) == 1.0


def test_concurrency_hybrid_mode_takes_the_larger_share_per_endpoint() -> None:
    producer = loaded({"e1": 50, "e2": 10}, tokens={"e1": 900})
    d = ConcurrencyDetector(
        params=ConcurrencyParameters(concurrency_mode="hybrid", max_token_concurrency=1000), producer=producer
    )
    # e1: max(50/100, 900/1000) = 0.9; e2: max(0.1, 0) = 0.1 -> 0.5
    assert d.pool_saturation([make_endpoint("e1"), make_endpoint("e2")]) == pytest.approx(0.5)


def test_concurrency_detector_adds_the_producer_it_reads_and_can_be_the_saturation_detector() -> None:
    config = load(
        """\
        plugins:
        - type: concurrency-detector
          parameters: {maxConcurrency: 2}
        - type: queue-scorer
        saturationDetector: {pluginRef: concurrency-detector}
        """
    )
    assert isinstance(config.plugins["inflight-load-producer"], InFlightLoadProducer)
    detector = config.saturation_detector
    assert (
        isinstance(detector, ConcurrencyDetector)
        and detector.producer is config.plugins["inflight-load-producer"]
    )
    assert any("'inflight-load-producer' added with default parameters" in w for w in config.warnings)


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"concurrencyMode": "bytes"}, "concurrencyMode"),
        ({"maxConcurrency": 0}, "maxConcurrency"),
        ({"maxTokenConcurrency": -1}, "maxTokenConcurrency"),
        ({"headroom": -0.1}, "headroom"),
        ({"inFlightLoadProducerName": "nope"}, "inFlightLoadProducerName"),
    ],
)
def test_concurrency_bad_parameters(params: dict[str, object], path: str) -> None:
    text = HEADER + f"plugins:\n- type: concurrency-detector\n  parameters: {params!r}\n".replace("'", '"')
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert info.value.issues[0].path == f"plugins[0].parameters.{path}"


def affinity(inflight: InFlightLoadProducer | None = None, **params: object) -> PrefixCacheAffinityFilter:
    return PrefixCacheAffinityFilter(
        params=PrefixAffinityParameters.model_validate(params),
        prefix_producer="approx-prefix-cache-producer",
        inflight=inflight,
        rng=random.Random(0),
    )


def test_affinity_keeps_the_sticky_endpoints() -> None:
    eps = [make_endpoint("A"), make_endpoint("B")]
    state = with_match(PrefixMatch(5, BLOCK * 4, {"A": 4}))  # A: 0.8 (sticky), B: 0
    assert [ep.name for ep in affinity().filter(make_request(), state, eps)] == ["A"]
    assert [ep.name for ep in affinity(affinityThreshold=0.9).filter(make_request(), state, eps)] == [
        "A",
        "B",
    ]
    assert affinity(affinityThreshold=0).filter(make_request(), state, eps) == eps
    assert affinity().filter(make_request(), CycleState(), eps) == eps  # no match data


def test_affinity_load_gate_breaks_stickiness_past_the_ttft_penalty() -> None:
    eps = [make_endpoint("A"), make_endpoint("B")]
    state = with_match(PrefixMatch(5, BLOCK * 4, {"A": 4}))
    # 300000 tokens in flight on A: 300000 / 15928 x 1000 = 18834.8 ms > 18000 -> both
    heavy = loaded({"A": 1}, tokens={"A": 300_000})
    assert heavy.load("A").tokens == 300_000
    assert affinity(heavy).filter(make_request(), state, eps) == eps
    # 200000 tokens: 12556.5 ms <= 18000 -> A only
    light = loaded({"A": 1}, tokens={"A": 200_000})
    assert [ep.name for ep in affinity(light).filter(make_request(), state, eps)] == ["A"]


def test_affinity_decisions_are_counted_by_outcome() -> None:
    """llm-d-router #2494: llm_d_epp_prefix_cache_affinity_filter_decisions_total{plugin_name,outcome}."""
    eps = [make_endpoint("A"), make_endpoint("B")]
    sticky = with_match(PrefixMatch(5, BLOCK * 4, {"A": 4}))
    f = affinity(loaded({"A": 1}, tokens={"A": 300_000}))
    f.filter(make_request(), sticky, eps)  # 18834.8 ms past the penalty: load_override
    f.filter(make_request(), with_match(PrefixMatch(5, BLOCK * 4, {})), eps)  # no_match
    f.filter(make_request(), sticky, eps[:1])  # not_applicable
    g = affinity(loaded({"A": 1}, tokens={"A": 1000}))
    g.filter(make_request(), sticky, eps)  # sticky
    assert f.decisions == {"load_override": 1, "no_match": 1, "not_applicable": 1}
    assert g.decisions == {"sticky": 1}
    samples = {(dict(s.labels)["outcome"], s.value) for s in f.metric_samples()}
    assert samples == {("load_override", 1.0), ("no_match", 1.0), ("not_applicable", 1.0)}
    sample = next(iter(g.metric_samples()))
    assert sample.name == "llm_d_epp_prefix_cache_affinity_filter_decisions" and sample.kind == "counter"
    assert sample.labels == (("plugin_name", g.name), ("outcome", "sticky")) and not sample.plugin_labels
    explore = affinity(explorationProbability=1.0)
    explore.filter(make_request(), sticky, eps)
    assert explore.decisions == {"exploration": 1}


def test_affinity_request_gate_adds_the_lightly_loaded_endpoints_within_the_penalty() -> None:
    """maxInFlightRequestsDelta (llm-d-router after ebab687): the sticky A holds 10 requests, B one
    and C two; B can serve within the TTFT penalty, C (400,000 tokens in flight: 25 s) cannot."""
    eps = [make_endpoint("A"), make_endpoint("B"), make_endpoint("C")]
    state = with_match(PrefixMatch(5, BLOCK * 4, {"A": 4}))  # A sticky; the prompt is 5 blocks of 64
    busy = loaded({"A": 10, "B": 1, "C": 2}, tokens={"A": 1000, "C": 400_000})
    f = affinity(busy, maxInFlightRequestsDelta=5)
    # Request TTFTs: A 1000/15928 s + 64 lacking tokens = 66.8 ms; B 320 lacking = 20.1 ms (within
    # 18000 of A); C 400,000 + 320 tokens = 25.1 s (not). 10 - 1 = 9 requests > 5: B joins A.
    assert [ep.name for ep in f.filter(make_request(), state, eps)] == ["A", "B"]
    assert f.decisions == {"request_load_override": 1}
    calm = loaded({"A": 3, "B": 1}, tokens={"A": 1000})
    g = affinity(calm, maxInFlightRequestsDelta=5)
    assert [ep.name for ep in g.filter(make_request(), state, eps)] == ["A"]  # 3 - 1 = 2: stay
    assert g.decisions == {"sticky": 1}
    off = affinity(busy)  # 0: the gate is off, as by default
    assert [ep.name for ep in off.filter(make_request(), state, eps)] == ["A"]


def test_affinity_request_gate_reads_the_inflight_producer_whatever_the_ttft_source() -> None:
    config = load(
        "plugins:\n- type: prefix-cache-affinity-filter\n"
        "  parameters: {ttftSource: latencyPredictor, maxInFlightRequestsDelta: 4}\n"
    )
    assert {"predicted-latency-producer", "inflight-load-producer"} <= set(config.plugins)
    f = config.plugins["prefix-cache-affinity-filter"]
    assert isinstance(f, PrefixCacheAffinityFilter)
    assert f.inflight is config.plugins["inflight-load-producer"] and f.latency_key is not None


def test_affinity_exploration_lets_everyone_through() -> None:
    eps = [make_endpoint("A"), make_endpoint("B")]
    state = with_match(PrefixMatch(5, BLOCK * 4, {"A": 5}))
    f = affinity(explorationProbability=1.0)
    assert f.filter(make_request(), state, eps) == eps


@pytest.mark.parametrize(
    ("params", "path", "message"),
    [
        ({"affinityThreshold": 1.5}, "affinityThreshold", ""),
        ({"explorationProbability": 2}, "explorationProbability", ""),
        ({"ttftSource": ""}, "ttftSource", "not empty"),
        ({"ttftSource": "other"}, "ttftSource", "is not allowed here"),
        ({"peakPrefillThroughput": 0}, "", "peakPrefillThroughput must be > 0"),
        ({"maxInFlightRequestsDelta": -1}, "maxInFlightRequestsDelta", ""),
        (
            {"maxInFlightRequestsDelta": 2, "maxTTFTPenaltyMs": 0},
            "",
            "maxTTFTPenaltyMs must be > 0 when maxInFlightRequestsDelta is set",
        ),
    ],
)
def test_affinity_bad_parameters(params: dict[str, object], path: str, message: str) -> None:
    text = HEADER + f"plugins:\n- type: prefix-cache-affinity-filter\n  parameters: {params!r}\n".replace(
        "'", '"'
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    issue = info.value.issues[0]
    assert issue.path == "plugins[0].parameters" + (f".{path}" if path else "")
    assert message in issue.message


def test_affinity_filter_on_predicted_ttft_adds_the_latency_producer() -> None:
    config = load(
        "plugins:\n- type: prefix-cache-affinity-filter\n  parameters: {ttftSource: latencyPredictor}\n"
    )
    assert "predicted-latency-producer" in config.plugins
    f = config.plugins["prefix-cache-affinity-filter"]
    assert isinstance(f, PrefixCacheAffinityFilter) and f.inflight is None and f.latency_key is not None


def test_affinity_filter_adds_both_producers_it_reads() -> None:
    config = load("plugins:\n- type: prefix-cache-affinity-filter\n- type: prefix-cache-scorer\n")
    assert {"approx-prefix-cache-producer", "inflight-load-producer"} <= set(config.plugins)
    f = config.plugins["prefix-cache-affinity-filter"]
    assert isinstance(f, PrefixCacheAffinityFilter) and f.inflight is config.plugins["inflight-load-producer"]


def test_a_request_decided_again_moves_its_load() -> None:
    p = InFlightLoadProducer()
    request = make_request("x" * 40, request_id="r")
    p.pre_request(request, decided(("decode", "A")), CycleState())
    p.pre_request(request, decided(("decode", "B")), CycleState())  # the retry's decision
    assert (p.load("A").requests, p.load("B").requests) == (0, 1)


def test_two_requests_with_the_same_client_id_are_counted_apart() -> None:
    p = InFlightLoadProducer()
    first, second = make_request("x", request_id="same"), make_request("x", request_id="same")
    p.pre_request(first, decided(("decode", "A")), CycleState())
    p.pre_request(second, decided(("decode", "A")), CycleState())
    assert p.load("A").requests == 2
    p.response_complete(first, Response("same"), make_endpoint("A"))
    assert p.load("A").requests == 1


def test_a_request_never_reported_complete_is_released_after_five_minutes() -> None:
    """Upstream's plugin-state staleness (`--plugin-state-staleness-threshold`, 5 minutes)."""
    now = [0.0]
    p = InFlightLoadProducer(clock=lambda: now[0])
    p.pre_request(make_request("x", request_id="lost"), decided(("decode", "A")), CycleState())
    now[0] = 299.0
    p.pre_request(make_request("x", request_id="new"), decided(("decode", "B")), CycleState())
    assert p.load("A").requests == 1
    now[0] = 301.0
    p.pre_request(make_request("x", request_id="newer"), decided(("decode", "B")), CycleState())
    assert (p.load("A").requests, p.load("B").requests) == (0, 2)


# --- under `epick serve --workers`: every worker reads the sum of every worker's counts -------------


class Hub:
    """In-memory `--workers`, as `epick.cli.workers` wires it: each worker writes to the hub, the hub
    forwards each update to every other worker, and each worker reads its own link, all in order;
    the test says when each step happens (so updates can cross snapshots and each other)."""

    def __init__(self, workers: int) -> None:
        self.producers = [InFlightLoadProducer() for _ in range(workers)]
        self.to_hub: list[list[tuple[str, object, int]]] = [[] for _ in range(workers)]
        self.to_worker: list[list[tuple[str, object, int]]] = [[] for _ in range(workers)]
        self.ready = set(range(workers))  # those not waiting for a snapshot
        for i, p in enumerate(self.producers):
            self.join(i, p)

    def join(self, index: int, producer: InFlightLoadProducer) -> None:
        self.producers[index] = producer
        producer.replicate(lambda update: self.to_hub[index].append(("u", update, index)), index)

    def hub_reads(self, origin: int) -> bool:
        if not self.to_hub[origin]:
            return False
        kind, payload, target = self.to_hub[origin].pop(0)
        if kind == "u":
            for dest in range(len(self.producers)):
                if dest != origin:
                    self.to_worker[dest].append((kind, payload, origin))
        else:  # a snapshot, for the worker that asked
            self.to_worker[target].append((kind, payload, origin))
        return True

    def worker_reads(self, dest: int) -> bool:
        if not self.to_worker[dest]:
            return False
        kind, payload, origin = self.to_worker[dest].pop(0)
        p = self.producers[dest]
        if kind == "u":
            p.apply_update(payload, origin)
        elif kind == "snapshot?":
            self.to_hub[dest].append(("snapshot", p.snapshot(), int(payload)))  # type: ignore[call-overload]
        elif kind == "snapshot":
            p.restore(payload)
            self.ready.add(dest)
        elif kind == "left":
            p.worker_left(int(payload))  # type: ignore[call-overload]
        return True

    def restart(self, dead: int, peer: int) -> InFlightLoadProducer:
        """The worker exits: the hub forwards what it had sent, tells the others it left; its
        successor joins and asks `peer` for a snapshot."""
        while self.hub_reads(dead):
            pass
        for other in range(len(self.producers)):
            if other != dead:
                self.to_worker[other].append(("left", dead, -1))
        self.to_worker[dead] = []
        self.ready.discard(dead)
        fresh = InFlightLoadProducer()
        self.join(dead, fresh)
        self.to_worker[peer].append(("snapshot?", dead, -1))
        return fresh

    def drain(self) -> None:
        while any([self.hub_reads(w) or self.worker_reads(w) for w in range(len(self.producers))]):
            pass


def send(p: InFlightLoadProducer, request_id: str, endpoint: str, chars: int = 400) -> object:
    request = make_request("x" * chars, request_id=request_id)
    p.pre_request(request, decided(("decode", endpoint)), CycleState())
    return request


def test_workers_read_the_sum_of_every_workers_requests() -> None:
    hub = Hub(3)
    a, b, c = hub.producers
    r1 = send(a, "r1", "E1")  # 100 tokens
    send(b, "r2", "E1")
    send(b, "r3", "E2")
    assert a.load("E1") == InFlightLoad(1, 100)  # not delivered yet: its own only
    hub.drain()
    for p in hub.producers:
        assert p.load("E1") == InFlightLoad(2, 200) and p.load("E2") == InFlightLoad(1, 100)
        assert p.loads(["E1", "E2", "E3"]) == ([2, 1, 0], [200, 100, 0])
    a.response_complete(r1, Response("r1"), make_endpoint("E1"))  # type: ignore[arg-type]
    hub.drain()
    assert [p.load("E1") for p in hub.producers] == [InFlightLoad(1, 100)] * 3
    # b exits: its requests went with its connections.
    a.worker_left(1)
    c.worker_left(1)
    assert a.load("E1") == c.load("E1") == InFlightLoad() and c.load("E2") == InFlightLoad()


def test_a_restarted_worker_loads_the_counts_and_an_update_crossing_the_snapshot_counts_once() -> None:
    hub = Hub(3)
    a, b, _ = hub.producers
    send(a, "r1", "E1")
    send(b, "r2", "E1")
    send(hub.producers[2], "old", "E1")  # worker 2's first life
    hub.drain()
    fresh = hub.restart(2, peer=0)
    send(b, "r3", "E1")  # crosses the snapshot: worker 0 counted it before it answers, or not
    hub.hub_reads(1)
    hub.worker_reads(2)  # the new worker hears b's newer count (2 requests) first
    hub.worker_reads(0)  # "left"
    hub.worker_reads(0)  # b's update: worker 0 now counts b's 2 requests too
    hub.worker_reads(0)  # "snapshot?"
    hub.drain()
    assert fresh.load("E1") == InFlightLoad(3, 300)
    assert a.load("E1") == b.load("E1") == InFlightLoad(3, 300)


def test_alone_the_counts_are_this_processes_own_and_nothing_is_published() -> None:
    p = InFlightLoadProducer()
    send(p, "r1", "E1")
    p.apply_update(["E1", 5, 500], 1)  # not replicated: ignored
    assert p.load("E1") == InFlightLoad(1, 100)
    p.replicate(lambda update: None, 0)
    p.apply_update(["E1", 5, 500], 1)
    assert p.load("E1") == InFlightLoad(6, 600)
    p.replicate(None, 0)  # back to one process: its own counts
    assert p.load("E1") == InFlightLoad(1, 100)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_every_worker_converges_on_the_sum_whatever_the_order(data: st.DataObject) -> None:
    workers = 3
    hub = Hub(workers)
    open_requests: list[tuple[int, object, str]] = []
    for step in range(data.draw(st.integers(10, 80), label="steps")):
        action = data.draw(st.sampled_from(["send", "end", "hub", "hub", "read", "read", "restart"]))
        if action == "send":
            w = data.draw(st.integers(0, workers - 1))
            endpoint = data.draw(st.sampled_from(["E1", "E2", "E3"]))
            request = send(hub.producers[w], f"r{step}", endpoint, data.draw(st.integers(0, 900)))
            open_requests.append((w, request, endpoint))
        elif action == "end" and open_requests:
            w, request, endpoint = open_requests.pop(data.draw(st.integers(0, len(open_requests) - 1)))
            hub.producers[w].response_complete(request, Response("x"), make_endpoint(endpoint))  # type: ignore[arg-type]
        elif action == "hub":
            hub.hub_reads(data.draw(st.integers(0, workers - 1)))
        elif action == "read":
            hub.worker_reads(data.draw(st.integers(0, workers - 1)))
        elif action == "restart" and len(hub.ready) == workers:  # one restart at a time
            dead = data.draw(st.integers(0, workers - 1))
            open_requests = [(w, r, e) for w, r, e in open_requests if w != dead]
            hub.restart(dead, peer=(dead + 1) % workers)
    hub.drain()
    expected: dict[str, list[int]] = {}
    for p in hub.producers:
        for endpoint, counts in p._counts.items():
            total = expected.setdefault(endpoint, [0, 0])
            total[0] += counts.requests
            total[1] += counts.tokens
    for p in hub.producers:
        for endpoint, (requests, tokens) in expected.items():
            assert p.load(endpoint) == InFlightLoad(requests, tokens)


def test_a_snapshot_arriving_after_a_worker_left_does_not_bring_its_requests_back() -> None:
    hub = Hub(3)
    send(hub.producers[1], "r1", "E1")
    hub.drain()
    snapshot = hub.producers[0].snapshot()  # holds worker 1's request
    fresh = InFlightLoadProducer()
    fresh.replicate(lambda update: None, 2)
    fresh.worker_left(1)  # the news of worker 1's exit overtook the snapshot
    fresh.restore(snapshot)
    assert fresh.load("E1") == InFlightLoad()


def test_the_staleness_threshold_comes_from_the_handle() -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: inflight-load-producer\n",
        options=LoadOptions(plugin_state_staleness=42.0),
    )
    producer = config.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer) and producer.stale_after == 42.0
