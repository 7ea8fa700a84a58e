"""`burst-prefix-cache-producer`: the placement rule on hand-made batches (llm-d/llm-d-router's
burstprefix/assign_test.go cases, traced by hand), and the producer's window, limits and match."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
import yaml

from epick.config import ConfigError, load_config_text
from epick.framework import CycleState, Endpoint, InferenceRequest
from epick.plugins.prefix.burst import BurstParameters, BurstPrefixCacheProducer
from epick.plugins.prefix.burst_assign import BurstEntry, assign
from epick.plugins.prefix.scorer import PrefixCacheScorer, PrefixMatch
from epick.requestcontrol.path import RequestPath
from tests.builders import make_endpoint, make_request


def pods(n: int) -> tuple[Endpoint, ...]:
    return tuple(make_endpoint(f"pod{i + 1}") for i in range(n))


def group(n: int, hashes: Sequence[int], replicas: Sequence[Endpoint]) -> list[BurstEntry]:
    return [BurstEntry(tuple(hashes), replicas) for _ in range(n)]


def where(entries: Sequence[BurstEntry]) -> list[str | None]:
    return [e.assigned.name if e.assigned else None for e in entries]


def counts(entries: Sequence[BurstEntry]) -> dict[str, int]:
    return dict(Counter(e.assigned.name for e in entries if e.assigned))


def test_no_cap_keeps_a_whole_group_on_one_replica() -> None:
    entries = group(8, [1, 2, 3], pods(4))
    assign(entries, -1, 0, False)
    assert where(entries) == ["pod1"] * 8


@pytest.mark.parametrize(
    ("cap", "expected"), [(2, {f"pod{i}": 2 for i in range(1, 5)}), (4, {"pod1": 4, "pod2": 4})]
)
def test_a_cap_fills_each_replica_before_spilling(cap: int, expected: dict[str, int]) -> None:
    entries = group(8, [1, 2, 3], pods(4))
    assign(entries, cap, 0, False)
    assert counts(entries) == expected


def test_past_every_cap_the_rest_alternate_by_load() -> None:
    entries = group(8, [1, 2, 3], pods(2))
    assign(entries, 2, 0, False)
    assert where(entries) == ["pod1", "pod1", "pod2", "pod2", "pod1", "pod2", "pod1", "pod2"]


def test_a_lone_request_and_prompts_without_blocks_get_no_affinity() -> None:
    lone = group(1, [1, 2, 3], pods(2))
    assign(lone, -1, 0, False)
    empty = group(2, [], pods(2))
    assign(empty, -1, 0, False)
    assert where(lone) + where(empty) == [None, None, None]


def test_distinct_groups_spread_over_replicas() -> None:
    a, b = group(8, [1, 2, 3], pods(4)), group(8, [9, 9, 9], pods(4))
    assign(a + b, -1, 0, False)
    assert (set(where(a)), set(where(b))) == ({"pod1"}, {"pod2"})


def test_families_sharing_a_prefix_colocate_within_the_fair_share() -> None:
    replicas = pods(2)
    x1, x2 = group(2, [1, 2, 3], replicas), group(2, [1, 2, 4], replicas)
    y1, y2 = group(2, [7, 8, 5], replicas), group(2, [7, 8, 6], replicas)
    assign(x1 + x2 + y1 + y2, -1, 2, False)
    assert set(where(x1 + x2)) == {"pod1"} and set(where(y1 + y2)) == {"pod2"}
    # Below the shared length they are strangers: the families split.
    x1, x2 = group(2, [1, 2, 3], replicas), group(2, [1, 2, 4], replicas)
    y1, y2 = group(2, [7, 8, 5], replicas), group(2, [7, 8, 6], replicas)
    assign(x1 + x2 + y1 + y2, -1, 3, False)
    assert set(where(x1)) != set(where(x2))
    assert counts(x1 + x2 + y1 + y2) == {"pod1": 4, "pod2": 4}


def test_the_fair_share_stops_a_stampede_onto_the_replica_holding_the_prefix() -> None:
    replicas = pods(4)
    families = [group(2, [1, 2, 10 + i], replicas) for i in range(4)]
    assign([e for f in families for e in f], -1, 2, False)
    assert counts([e for f in families for e in f]) == {f"pod{i}": 2 for i in range(1, 5)}


def test_a_lone_request_joins_the_group_it_shares_a_prefix_with() -> None:
    replicas = pods(2)
    gx, sx = group(2, [1, 2, 3], replicas), group(1, [1, 2, 8], replicas)
    gy, sy = group(2, [7, 8, 5], replicas), group(1, [7, 8, 9], replicas)
    assign(gx + sx + gy + sy, -1, 2, False)
    assert len(set(where(gx + sx))) == 1 and len(set(where(gy + sy))) == 1
    assert counts(gx + sx + gy + sy) == {"pod1": 3, "pod2": 3}
    g, lone = group(2, [1, 2, 3], replicas), group(1, [5, 5, 5], replicas)
    assign(g + lone, -1, 2, False)
    assert where(lone) == [None] and len(set(where(g))) == 1


def test_lone_requests_sharing_a_prefix_colocate_without_a_group() -> None:
    singles = [BurstEntry((1, 2, 3 + i), pods(2)) for i in range(4)]
    assign(singles, -1, 2, False)
    assert counts(singles) == {"pod1": 2, "pod2": 2}


def test_one_replica_takes_everything() -> None:
    replicas = pods(1)
    entries = group(4, [1, 2, 3], replicas) + group(4, [9, 9, 9], replicas)
    assign(entries, -1, 2, False)
    assert where(entries) == ["pod1"] * 8


def test_balancing_by_tokens_weighs_a_long_prefix() -> None:
    def batch() -> tuple[list[BurstEntry], list[BurstEntry], list[BurstEntry]]:
        replicas = pods(2)
        return group(2, [1, 2, 3, 4], replicas), group(2, [5], replicas), group(2, [6], replicas)

    long, s1, s2 = batch()
    assign(long + s1 + s2, -1, 0, False)  # by requests: 2 + 2 + 2 over two replicas
    assert set(where(long)) == set(where(s2)) == {"pod1"} and set(where(s1)) == {"pod2"}
    long, s1, s2 = batch()
    assign(long + s1 + s2, -1, 0, True)  # by blocks: the 4-block prompt outweighs both short ones
    assert set(where(long)) == {"pod1"} and set(where(s1)) == set(where(s2)) == {"pod2"}


def test_balancing_by_tokens_charges_only_the_blocks_a_replica_lacks() -> None:
    replicas = pods(2)
    units = [group(2, [*range(1, 10), 100 + i], replicas) for i in range(3)]
    entries = [e for u in units for e in u]
    assign(entries, -1, 9, True)  # loads 10, 11, 12: under the fair share of 15
    assert where(entries) == ["pod1"] * 6


def test_ties_go_to_the_replica_running_fewer_requests() -> None:
    replicas = (make_endpoint("pod1", running=5), make_endpoint("pod2", running=1))
    entries = group(3, [1, 2], replicas)
    assign(entries, -1, 0, False)
    assert where(entries) == ["pod2"] * 3


# --- the producer ---------------------------------------------------------------------------------

PROMPT = "a system prompt shared by every sample of the group. " * 40


def producer(**params: Any) -> BurstPrefixCacheProducer:
    return BurstPrefixCacheProducer(None, BurstParameters.model_validate(params))


def match(
    p: BurstPrefixCacheProducer, request: InferenceRequest, endpoints: Sequence[Endpoint]
) -> PrefixMatch:
    state = CycleState()
    p.produce(request, state, endpoints)
    found = state.read(p.key, PrefixMatch)
    assert found is not None
    return found


async def burst(
    p: BurstPrefixCacheProducer, requests: list[InferenceRequest], endpoints: Sequence[Endpoint]
) -> list[PrefixMatch]:
    await asyncio.gather(*(p.collect(r, endpoints) for r in requests))
    return [match(p, r, endpoints) for r in requests]


def test_a_burst_of_one_prompt_is_matched_whole_on_one_replica_and_empty_elsewhere() -> None:
    p, endpoints = producer(windowDurationMs=5), pods(4)
    matches = asyncio.run(burst(p, [make_request(PROMPT) for _ in range(8)], endpoints))
    holders = {name for m in matches for name in m.matched}
    assert len(holders) == 1
    (holder,) = holders
    for m in matches:
        assert m.total_blocks > 1 and m.matched == {holder: m.total_blocks}
    assert p.batch is None and p.waiting == {}
    scores = PrefixCacheScorer(producer=p.name).score(make_request(PROMPT), _state(p, matches[0]), endpoints)
    assert scores == [1.0 if ep.name == holder else 0.0 for ep in endpoints]


def _state(p: BurstPrefixCacheProducer, m: PrefixMatch) -> CycleState:
    state = CycleState()
    state.write(p.key, m)
    return state


def test_a_request_alone_in_its_window_has_no_affinity() -> None:
    p, endpoints = producer(windowDurationMs=5), pods(2)
    (m,) = asyncio.run(burst(p, [make_request(PROMPT)], endpoints))
    assert m.total_blocks > 0 and m.matched == {}
    # Scheduled without waiting (a retry, `epick explain`): the same.
    assert match(p, make_request(PROMPT), endpoints).matched == {}


def test_each_window_is_a_new_batch() -> None:
    p, endpoints = producer(windowDurationMs=5), pods(4)

    async def two_rounds() -> tuple[list[PrefixMatch], list[PrefixMatch]]:
        first = await burst(p, [make_request(PROMPT) for _ in range(4)], endpoints)
        assert p.batch is None
        second = await burst(
            p, [make_request("another prompt, another group " * 30) for _ in range(4)], endpoints
        )
        return first, second

    first, second = asyncio.run(two_rounds())
    assert len({n for m in first for n in m.matched}) == 1
    # The second batch places afresh: its group goes to the least loaded replica of its own batch.
    assert {n for m in second for n in m.matched} == {"pod1"}


def test_a_full_batch_fails_the_producer_for_the_requests_past_the_limit() -> None:
    p, endpoints = producer(windowDurationMs=5, maxBatchSize=2), pods(2)
    requests = [make_request(PROMPT) for _ in range(3)]

    async def run() -> list[BaseException | None]:
        return await asyncio.gather(*(p.collect(r, endpoints) for r in requests), return_exceptions=True)

    outcomes = asyncio.run(run())
    assert outcomes[:2] == [None, None] and isinstance(outcomes[2], RuntimeError)
    assert match(p, requests[0], endpoints).matched == match(p, requests[1], endpoints).matched != {}
    with pytest.raises(RuntimeError, match="maxBatchSize 2 reached"):
        p.produce(requests[2], CycleState(), endpoints)


def test_a_request_that_stops_waiting_stays_in_its_batch() -> None:
    p, endpoints = producer(windowDurationMs=20), pods(2)

    async def run() -> list[PrefixMatch]:
        leaver = asyncio.ensure_future(p.collect(make_request(PROMPT), endpoints))
        await asyncio.sleep(0)  # it has joined the batch
        leaver.cancel()
        return await burst(p, [make_request(PROMPT)], endpoints)

    (m,) = asyncio.run(run())
    assert m.matched != {}  # placed as a group of two with the one that left


def test_requests_are_batched_through_the_request_path_and_later_producers_still_run() -> None:
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "burst-prefix-cache-producer", "parameters": {"windowDurationMs": 5}},
            {
                "type": "prefix-cache-scorer",
                "parameters": {"prefixMatchInfoProducerName": "burst-prefix-cache-producer"},
            },
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": "prefix-cache-scorer"}, {"pluginRef": "max-score-picker"}],
            }
        ],
    }
    config = load_config_text(yaml.safe_dump(doc), source="burst.yaml", seed=0)
    assert [type(b).__name__ for b in config.hooks.batching] == ["BurstPrefixCacheProducer"]
    path, endpoints = RequestPath(config), pods(4)

    async def run() -> list[str]:
        requests = [make_request(PROMPT) for _ in range(6)]
        snapshot = _snapshot(endpoints)
        await asyncio.gather(*(path.collect(r, config.hooks.batching, snapshot) for r in requests))
        return [path.decide(r, endpoints).targets[0].name for r in requests]

    assert len(set(asyncio.run(run()))) == 1


def _snapshot(endpoints: Sequence[Endpoint]) -> Any:
    from epick.framework import Snapshot

    return Snapshot(tuple(endpoints), 1)


@pytest.mark.parametrize(
    ("parameters", "path", "words"),
    [
        ({"windowDurationMs": 0}, "windowDurationMs", "greater than or equal to 1"),
        ({"windowDurationMs": 10001}, "windowDurationMs", "less than or equal to 10000"),
        ({"maxPerReplica": 0}, "maxPerReplica", "maxPerReplica is 0"),
        ({"blockSizeTokens": 0}, "blockSizeTokens", "greater than 0"),
        ({"balanceBy": "bogus"}, "balanceBy", "'bogus' is not allowed"),
        ({"maxBatchSize": 0}, "maxBatchSize", "maxBatchSize is 0"),
        ({"maxPrefixTokensToMatch": 10}, "maxPrefixTokensToMatch", "less than one block"),
    ],
)
def test_bad_parameters_are_errors_naming_the_parameter(
    parameters: dict[str, Any], path: str, words: str
) -> None:
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "burst-prefix-cache-producer", "parameters": parameters}],
    }
    with pytest.raises(ConfigError) as e:
        load_config_text(yaml.safe_dump(doc), source="burst.yaml")
    assert any(i.path == f"plugins[0].parameters.{path}" and words in i.message for i in e.value.issues), (
        e.value.issues
    )
