"""`p2p-source-producer`: which peer a request pulls its prefix from, and when the header is sent
(llm-d/llm-d-router's p2psource/producer_test.go cases, with a block of 16 tokens)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest
import yaml

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, Endpoint, ProfileRunResult, SchedulingResult
from epick.framework.datalayer import data_key
from epick.plugins.prefix.p2p_source import HEADER, BestSource, P2PSourceProducer, fnv1a_32
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch
from tests.builders import make_endpoint, make_request

BLOCK_BYTES = 16 * 4  # 16 tokens


def ep(name: str, address: str, queue: int = 0) -> Endpoint:
    return make_endpoint(name, address=address, port=8080, queue=queue)


def state_with(
    blocks: Mapping[str, int],
    tiers: Callable[[str], Mapping[str, int]] | None = None,
    producer: str = "approx-prefix-cache-producer",
) -> CycleState:
    state = CycleState()
    state.write(data_key(MATCH_DATA_TYPE, producer), PrefixMatch(4, BLOCK_BYTES, dict(blocks), tiers=tiers))
    return state


def best(
    producer: P2PSourceProducer, state: CycleState, endpoints: Sequence[Endpoint], request_id: str = "r"
) -> BestSource | None:
    producer.produce(make_request(request_id=request_id), state, endpoints)
    return state.read(producer.key, BestSource)


def test_fnv1a_32_known_values() -> None:
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968


def test_the_peer_holding_the_most_is_the_source_and_one_block_less_is_out_of_band() -> None:
    a, b = ep("a", "10.0.0.1"), ep("b", "10.0.0.2")
    assert best(P2PSourceProducer(), state_with({"a": 1, "b": 3}), [a, b]) == BestSource("10.0.0.2:8080", 48)


def test_nothing_held_nothing_chosen() -> None:
    assert best(P2PSourceProducer(), state_with({}), [ep("a", "10.0.0.1")]) is None
    assert best(P2PSourceProducer(), CycleState(), [ep("a", "10.0.0.1")]) is None  # no producer ran


def test_an_ipv6_peer_is_bracketed() -> None:
    assert best(P2PSourceProducer(), state_with({"v6": 2}), [ep("v6", "fd00::9")]) == BestSource(
        "[fd00::9]:8080", 32
    )


def test_peers_within_one_block_are_drawn_by_inverse_queue() -> None:
    peers = [ep("a", "10.0.0.1", 12), ep("b", "10.0.0.2", 2), ep("c", "10.0.0.3", 7)]
    picks: Counter[str] = Counter()
    for i in range(400):
        found = best(P2PSourceProducer(), state_with({"a": 3, "b": 3, "c": 3}), peers, f"req-{i}")
        assert found is not None
        picks[found.host_port] += 1
    assert picks["10.0.0.2:8080"] > picks["10.0.0.3:8080"] > picks["10.0.0.1:8080"] > 0
    # The same request id draws the same peer.
    again = {
        best(P2PSourceProducer(), state_with({"a": 3, "b": 3, "c": 3}), peers, "req-7") for _ in range(3)
    }
    assert len(again) == 1


def test_the_drawn_peer_keeps_its_own_count() -> None:
    ahead, short = ep("ahead", "10.0.0.1", 20), ep("short", "10.0.0.2", 0)
    seen = set()
    for i in range(400):
        found = best(P2PSourceProducer(), state_with({"ahead": 4, "short": 3}), [ahead, short], f"req-{i}")
        assert found is not None
        seen.add((found.host_port, found.cached_tokens))
    assert seen == {("10.0.0.1:8080", 64), ("10.0.0.2:8080", 48)}
    # Beyond one block the busy peer with more wins outright.
    found = best(
        P2PSourceProducer(), state_with({"a": 5, "b": 3}), [ep("a", "10.0.0.1", 20), ep("b", "10.0.0.2")]
    )
    assert found == BestSource("10.0.0.1:8080", 80)


def test_with_tier_data_only_the_cpu_tier_serves_pulls() -> None:
    tiers = {"gpu-only": {"gpu": 10}, "cpu": {"cpu": 3, "gpu": 3}, "spec": {"speculative": 10}}
    endpoints = [ep("gpu-only", "10.0.0.1"), ep("cpu", "10.0.0.2"), ep("spec", "10.0.0.3")]
    found = best(
        P2PSourceProducer(), state_with({"gpu-only": 10, "cpu": 3, "spec": 10}, tiers.__getitem__), endpoints
    )
    assert found == BestSource("10.0.0.2:8080", 48)
    assert best(P2PSourceProducer(), state_with({"spec": 10}, tiers.__getitem__), endpoints[2:]) is None


def decided(
    target: Endpoint, prefill: Endpoint | None = None, prefill_name: str = "prefill"
) -> SchedulingResult:
    results: dict[str, ProfileRunResult | None] = {"decode": ProfileRunResult((target,))}
    if prefill is not None:
        results[prefill_name] = ProfileRunResult((prefill,))
    return SchedulingResult(results, "decode")


def header_after(
    producer: P2PSourceProducer,
    source: BestSource | None,
    blocks: Mapping[str, int],
    result: SchedulingResult,
) -> str | None:
    state = state_with(blocks)
    if source is not None:
        state.write(producer.key, source)
    producer.pre_request(make_request(), result, state)
    return result.forwarded_headers.get(HEADER)


def test_the_header_names_the_peer_when_it_holds_enough_more() -> None:
    decode = ep("a", "10.0.0.1")
    source = BestSource("10.0.0.2:8080", 48)
    assert header_after(P2PSourceProducer(), source, {"a": 1}, decided(decode)) == "10.0.0.2:8080"
    assert (
        header_after(
            P2PSourceProducer(min_cached_token_delta=17),
            BestSource("10.0.0.2:8080", 32),
            {"a": 1},
            decided(decode),
        )
        is None
    )
    assert (
        header_after(P2PSourceProducer(), BestSource("10.0.0.1:8080", 48), {"a": 1}, decided(decode)) is None
    )  # itself
    assert header_after(P2PSourceProducer(), None, {"a": 1}, decided(decode)) is None


def test_under_pd_the_prefill_endpoint_is_compared() -> None:
    decode, prefill = ep("a", "10.0.0.1"), ep("b", "10.0.0.2")
    assert (
        header_after(P2PSourceProducer(), BestSource("10.0.0.2:8080", 48), {}, decided(decode, prefill))
        is None
    )
    got = header_after(
        P2PSourceProducer(), BestSource("10.0.0.3:8080", 64), {"b": 1}, decided(decode, prefill)
    )
    assert got == "10.0.0.3:8080"
    renamed = P2PSourceProducer(prefill_profile="P")
    assert header_after(renamed, BestSource("10.0.0.2:8080", 48), {}, decided(decode, prefill, "P")) is None


def test_the_computing_side_counts_every_tier() -> None:
    decode = ep("a", "10.0.0.1")
    # The peer has 96 CPU tokens; the decode endpoint 80 on GPU: 16 more, under a delta of 32.
    got = header_after(
        P2PSourceProducer(min_cached_token_delta=32),
        BestSource("10.0.0.2:8080", 96),
        {"a": 5},
        decided(decode),
    )
    assert got is None


def load(parameters: dict[str, Any] | None = None, extra: list[dict[str, Any]] | None = None) -> Any:
    entry: dict[str, Any] = {"name": "p2p", "type": "p2p-source-producer"}
    if parameters is not None:
        entry["parameters"] = parameters
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [*(extra or []), entry],
    }
    return load_config_text(yaml.safe_dump(doc), source="p2p.yaml")


def test_defaults_and_a_named_producer() -> None:
    config = load()
    p2p = config.plugins["p2p"]
    assert (p2p.min_delta, p2p.prefill_profile) == (1, "prefill")
    assert p2p.match_key == "PrefixCacheMatchInfoDataKey/approx-prefix-cache-producer"
    assert "approx-prefix-cache-producer" in config.plugins  # added, as upstream's default producer
    named = load(
        {"prefixMatchInfoProducerName": "precise", "minCachedTokenDelta": 33, "prefillProfileName": "P"},
        [{"name": "precise", "type": "precise-prefix-cache-producer"}],
    ).plugins["p2p"]
    assert (named.match_key, named.min_delta, named.prefill_profile) == (
        "PrefixCacheMatchInfoDataKey/precise",
        33,
        "P",
    )


@pytest.mark.parametrize(
    ("parameters", "where"),
    [
        ({"minCachedTokenDelta": 0}, "minCachedTokenDelta"),
        ({"prefixMatchInfoProducerName": "nope"}, "prefixMatchInfoProducerName"),
    ],
)
def test_bad_parameters_name_their_path(parameters: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(parameters)
    assert [i.path for i in e.value.issues] == [f"plugins[0].parameters.{where}"]


def test_ext_proc_sets_the_header_a_hook_added_and_removes_a_clients_own() -> None:
    from epick.config import load_default_config
    from epick.datalayer.datastore import Datastore
    from epick.extproc.messages import routing
    from epick.requestcontrol.director import Director

    decode = ep("a", "10.0.0.1")
    result = decided(decode)
    cycle = Director(load_default_config(seed=1), Datastore().snapshot).cycle(make_request())
    cycle.result = result
    plain = routing(cycle, content_length=None)
    assert HEADER in plain.header_mutation.remove_headers
    result.hook_headers[HEADER] = "10.0.0.2:8080"
    common = routing(cycle, content_length=None)
    sets = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    assert sets[HEADER] == "10.0.0.2:8080" and HEADER not in common.header_mutation.remove_headers
