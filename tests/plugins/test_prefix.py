"""The approximate prefix index: block hashing, the per-endpoint LRU index, and the prefix-cache scorer."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import xxhash
from pydantic import ValidationError

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileRunResult,
    SchedulingResult,
    state_key,
)
from epick.plugins.prefix.hashing import prompt_block_hashes
from epick.plugins.prefix.index import PrefixIndex
from epick.plugins.prefix.scorer import (
    PrefixCacheParameters,
    PrefixCacheScorer,
    PrefixMatch,
    find_prefix_match,
)
from tests.builders import make_endpoint, make_request


def hashes(text: str, model: str = "m", *, bst: int = 1, max_blocks: int = 256, salt: str = "") -> list[int]:
    """Block hashes with `bst` tokens per block (bst * 4 bytes)."""
    return prompt_block_hashes(text, model, block_bytes=bst * 4, max_blocks=max_blocks, cache_salt=salt)


def result_of(*profiles: tuple[str, Sequence[Endpoint]]) -> SchedulingResult:
    return SchedulingResult({name: ProfileRunResult(tuple(t)) for name, t in profiles}, profiles[0][0])


# --- hashing --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bst", "max_blocks", "count"),
    [
        ("", 1, 256, 0),  # nothing to hash
        ("abc", 1, 256, 1),  # shorter than one 4-byte block: the partial block is hashed
        ("abcd", 1, 256, 1),  # exactly one block
        ("abcde", 1, 256, 2),  # one block + a partial one
        ("abcdefgh", 1, 256, 2),
        ("x" * 64, 16, 256, 1),  # default block: 16 tokens * 4 = 64 bytes
        ("x" * 65, 16, 256, 2),  # 64 + 1
        ("x" * 640, 16, 256, 10),  # 640 / 64
        ("x" * 100, 1, 5, 5),  # 25 blocks, truncated to maxPrefixBlocksToMatch = 5
        ("x" * 64 * 300, 16, 256, 256),  # truncated at the default 256
        ("éé", 1, 256, 1),  # UTF-8 bytes, not characters: 2 chars = 4 bytes = one block
        ("ééé", 1, 256, 2),  # 6 bytes: 4 + 2
    ],
)
def test_block_count(text: str, bst: int, max_blocks: int, count: int) -> None:
    assert len(hashes(text, bst=bst, max_blocks=max_blocks)) == count


def test_hash_chain_formula() -> None:
    # seed = xxh64(model ‖ NUL ‖ salt); h1 = xxh64(block 1, seed); h2 = xxh64(block 2, h1), ...
    seed = xxhash.xxh64_intdigest(b"model\0salt")
    h1 = xxhash.xxh64_intdigest(b"abcd", seed)
    h2 = xxhash.xxh64_intdigest(b"ef", h1)
    assert hashes("abcdef", "model", salt="salt") == [h1, h2]


def test_a_shared_prefix_gives_shared_leading_hashes() -> None:
    base = hashes("aaaabbbbcccc")
    assert hashes("aaaabbbbcccc" + "dddd")[:3] == base
    # the third block differs: the first two still match, the rest do not
    other = hashes("aaaabbbbXXXXcccc")
    assert other[:2] == base[:2]
    assert other[2] != base[2]


def test_a_block_hash_depends_on_everything_before_it() -> None:
    # same second block "bbbb", different first block -> the second hashes differ too
    assert hashes("aaaabbbb")[1] != hashes("zzzzbbbb")[1]


def test_the_trailing_partial_block_is_hashed() -> None:
    assert hashes("abcde")[0] == hashes("abcd")[0]
    assert hashes("abcde")[1] != hashes("abcdf")[1]
    # a partial block is not the same block as a full one that starts the same way
    assert hashes("abcdef")[1] != hashes("abcdefgh")[1]


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"model": "m1"}, {"model": "m2"}),
        ({"salt": ""}, {"salt": "tenant-a"}),
        ({"salt": "tenant-a"}, {"salt": "tenant-b"}),
        ({"model": "ab", "salt": "c"}, {"model": "a", "salt": "bc"}),  # the seed separates the two
    ],
)
def test_the_chain_depends_on_model_and_cache_salt(left: dict[str, str], right: dict[str, str]) -> None:
    text = "aaaabbbbcc"
    first = hashes(text, **left)  # type: ignore[arg-type]
    second = hashes(text, **right)  # type: ignore[arg-type]
    assert len(first) == len(second) == 3
    assert all(x != y for x, y in zip(first, second, strict=True))


def test_truncation_keeps_the_leading_blocks() -> None:
    long = "".join(chr(ord("a") + i) * 4 for i in range(10))  # aaaabbbb...jjjj: 10 blocks
    assert hashes(long, max_blocks=3) == hashes(long[:12])
    assert hashes(long, max_blocks=3) == hashes(long)[:3]


# --- PrefixIndex ----------------------------------------------------------------------------------


def test_empty_index_matches_nothing() -> None:
    index = PrefixIndex(10)
    assert index.match([1, 2, 3]) == {}
    assert len(index) == 0
    assert index.endpoints() == []


@pytest.mark.parametrize(
    ("holdings", "query", "expected"),
    [
        # a holds 1,2,3: all three of 1,2,3,4 before the unheld 4
        ({"a": [1, 2, 3]}, [1, 2, 3, 4], {"a": 3}),
        # the first block nobody holds stops the walk: 9 is unheld -> nothing
        ({"a": [1, 2, 3]}, [9, 1, 2], {}),
        # a holds 1,3; b holds 2: no block is unheld, so a gains for 1 and 3 -> a 2, b 1 (Go's count)
        ({"a": [1, 3], "b": [2]}, [1, 2, 3], {"a": 2, "b": 1}),
        # a holds 1,3 only: the walk stops at 2 -> a 1 (3 comes after the gap)
        ({"a": [1, 3]}, [1, 2, 3], {"a": 1}),
        # both hold 1, only a holds 2: a 2, b 1
        ({"a": [1, 2], "b": [1]}, [1, 2, 3], {"a": 2, "b": 1}),
        # empty query
        ({"a": [1]}, [], {}),
    ],
)
def test_index_match(holdings: dict[str, list[int]], query: list[int], expected: dict[str, int]) -> None:
    index = PrefixIndex(100)
    for endpoint, held in holdings.items():
        index.add(endpoint, held)
    assert dict(index.match(query)) == expected


def test_index_lru_evicts_the_least_recently_used_block_per_endpoint() -> None:
    index = PrefixIndex(2)
    index.add("a", [1, 2])
    index.add("a", [1])  # touch 1: now 2 is the oldest
    index.add("a", [3])  # over capacity: 2 goes
    assert index.blocks("a") == 2
    assert dict(index.match([1])) == {"a": 1}
    assert dict(index.match([3])) == {"a": 1}
    assert dict(index.match([2])) == {}
    # the reverse map forgot 2 as well: 1 and 3 remain
    assert len(index) == 2


def test_index_capacity_is_per_endpoint() -> None:
    index = PrefixIndex(2)
    index.add("a", [1, 2])
    index.add("b", [3, 4])
    assert index.blocks("a") == index.blocks("b") == 2
    assert len(index) == 4
    index.add("b", [5])  # evicts b's 3, not a's 1
    assert dict(index.match([1, 2])) == {"a": 2}
    assert dict(index.match([3])) == {}
    assert sorted(index.endpoints()) == ["a", "b"]


def test_one_add_longer_than_capacity_keeps_the_last_blocks() -> None:
    index = PrefixIndex(3)
    index.add("a", [1, 2, 3, 4, 5])
    assert index.blocks("a") == 3
    assert len(index) == 3
    assert dict(index.match([3, 4, 5])) == {"a": 3}
    assert dict(index.match([1])) == {}


def test_eviction_keeps_a_block_other_endpoints_hold() -> None:
    index = PrefixIndex(1)
    index.add("a", [7])
    index.add("b", [7])
    index.add("a", [8])  # a evicts 7; b still holds it
    assert dict(index.match([7])) == {"b": 1}
    assert dict(index.match([8])) == {"a": 1}
    assert len(index) == 2


def test_remove_endpoint_cleans_the_reverse_map() -> None:
    index = PrefixIndex(10)
    index.add("a", [1, 2])
    index.add("b", [2, 3])
    index.remove_endpoint("a")
    index.remove_endpoint("missing")  # no-op
    assert index.endpoints() == ["b"]
    assert index.blocks("a") == 0
    assert dict(index.match([1])) == {}
    assert dict(index.match([2, 3])) == {"b": 2}
    assert len(index) == 2  # 2 and 3, held by b


# --- PrefixCacheScorer ----------------------------------------------------------------------------


def score(scorer: PrefixCacheScorer, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
    return scorer.score(request, CycleState(), endpoints)


def record(scorer: PrefixCacheScorer, request: InferenceRequest, *targets: Endpoint) -> None:
    """Score then PreRequest, as a scheduling call followed by dispatch would."""
    scorer.score(request, CycleState(), list(targets))
    scorer.pre_request(request, result_of(("default", list(targets))), CycleState())


def test_prefix_scorer_is_zero_for_an_empty_index() -> None:
    a, b = make_endpoint("a"), make_endpoint("b")
    assert score(PrefixCacheScorer(block_size_tokens=1), make_request("aaaabbbb"), [a, b]) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("recorded", "prompt", "expected_a"),
    [
        # blocks of 4 chars
        ("aaaabbbbccccdddd", "aaaabbbbccccdddd", 1.0),  # 4/4
        ("aaaabbbbccccdddd", "aaaabbbbxxxxyyyy", 0.5),  # 2/4
        ("aaaabbbbccccdddd", "aaaabbbbcc", 2 / 3),  # aaaa, bbbb match; partial "cc" does not: 2/3
        ("aaaabbbbccccdddd", "aaaabbbbccccddddeeee", 0.8),  # 4/5
        ("aaaabbbbccccdddd", "zzzzbbbbccccdddd", 0.0),  # first block differs: the chain differs after
        ("abc", "abc", 1.0),  # a short prompt (one partial block) finds its endpoint: 1/1
        ("aaaabbbb", "aaaa", 1.0),  # the prompt's one block is held: 1/1
    ],
)
def test_prefix_scorer_matched_over_total(recorded: str, prompt: str, expected_a: float) -> None:
    a, b = make_endpoint("a"), make_endpoint("b")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    record(scorer, make_request(recorded), a)
    assert score(scorer, make_request(prompt), [a, b]) == pytest.approx([expected_a, 0.0])


def test_prefix_scorer_separates_models() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    record(scorer, make_request("aaaabbbb", model="m1"), a)
    assert score(scorer, make_request("aaaabbbb", model="m2"), [a]) == [0.0]
    assert score(scorer, make_request("aaaabbbb", model="m1"), [a]) == [1.0]


def test_prefix_scorer_separates_cache_salts() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    record(scorer, make_request("aaaabbbb", cache_salt="t1"), a)
    assert score(scorer, make_request("aaaabbbb", cache_salt="t2"), [a]) == [0.0]
    assert score(scorer, make_request("aaaabbbb"), [a]) == [0.0]
    assert score(scorer, make_request("aaaabbbb", cache_salt="t1"), [a]) == [1.0]


def test_prefix_scorer_hashes_the_chat_messages_json() -> None:
    scorer = PrefixCacheScorer(block_size_tokens=2)
    messages = [{"role": "system", "content": "You are terse. " * 4}, {"role": "user", "content": "hi"}]
    request = make_request(messages=messages)
    expected_text = json.dumps(messages, separators=(",", ":"), ensure_ascii=False)
    assert scorer.hashes(request) == hashes(expected_text, bst=2)


def test_prefix_scorer_chat_requests_share_the_system_prompt_blocks() -> None:
    a, b = make_endpoint("a"), make_endpoint("b")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    system = {"role": "system", "content": "s" * 60}
    first = make_request(messages=[system, {"role": "user", "content": "first question"}])
    record(scorer, first, a)
    second = make_request(messages=[system, {"role": "user", "content": "second question"}])
    text = second.body.prefix_text
    # the JSON agrees up to the user content's first character ('f' vs 's'): 118 chars, 29 full
    # blocks of 4; the second is 136 chars = 34 blocks -> 29/34
    shared = len(json.dumps([system, {"role": "user", "content": ""}], separators=(",", ":"))) - 3
    assert (shared, len(text)) == (118, 136)
    scores = score(scorer, second, [a, b])
    assert scores[0] == pytest.approx(29 / 34)
    assert 0.0 < scores[0] < 1.0
    assert scores[1] == 0.0


def test_prefix_scorer_records_the_first_target_of_every_profile_result() -> None:
    d1, d2, p1 = make_endpoint("d1"), make_endpoint("d2"), make_endpoint("p1")
    other = make_endpoint("other")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    request = make_request("aaaabbbb")
    scorer.score(request, CycleState(), [d1, d2, p1, other])
    scorer.pre_request(request, result_of(("decode", [d1, d2]), ("prefill", [p1])), CycleState())
    # d1 (decode primary) and p1 (prefill primary) hold the prompt; the fallback d2 does not
    assert score(scorer, make_request("aaaabbbb"), [d1, d2, p1, other]) == [1.0, 0.0, 1.0, 0.0]


def test_prefix_scorer_pre_request_without_a_prior_score_still_records() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    scorer.pre_request(make_request("aaaabbbb"), result_of(("default", [a])), CycleState())
    assert score(scorer, make_request("aaaabbbb"), [a]) == [1.0]


def test_prefix_scorer_skips_a_failed_profile_result() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    result = SchedulingResult({"decode": ProfileRunResult((a,)), "prefill": None}, "decode")
    scorer.pre_request(make_request("aaaabbbb"), result, CycleState())
    assert scorer.index.endpoints() == ["a"]


def test_prefix_scorer_empty_prompt_scores_zero_and_records_nothing() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    record(scorer, make_request(""), a)
    assert score(scorer, make_request(""), [a]) == [0.0]
    assert len(scorer.index) == 0


def test_prefix_scorer_leaves_its_match_in_the_cycle_state() -> None:
    a, b = make_endpoint("a"), make_endpoint("b")
    scorer = PrefixCacheScorer(block_size_tokens=2)  # 8-char blocks, 2 tokens each
    record(scorer, make_request("a" * 24), a)  # 3 blocks on a
    cycle_state = CycleState()
    scorer.score(make_request("a" * 24 + "b" * 16), cycle_state, [a, b])  # 5 blocks, 3 on a
    match = cycle_state.read(state_key(scorer), PrefixMatch)
    assert match is not None
    assert match.total_blocks == 5
    assert match.block_bytes == 8
    assert dict(match.matched) == {"a": 3}
    # cached tokens = matched blocks * block size: a 3 * 2 = 6, b 0
    assert match.cached_tokens("a") == 6
    assert match.cached_tokens("b") == 0
    assert find_prefix_match(cycle_state) is match
    assert find_prefix_match(cycle_state, "prefix-cache-scorer") is match
    assert find_prefix_match(cycle_state, "another-name") is None
    assert find_prefix_match(CycleState()) is None


def test_two_prefix_scorers_write_under_their_own_names() -> None:
    a = make_endpoint("a")
    small, large = (
        PrefixCacheScorer("small", block_size_tokens=1),
        PrefixCacheScorer("large", block_size_tokens=4),
    )
    cycle_state = CycleState()
    request = make_request("x" * 32)
    small.score(request, cycle_state, [a])
    large.score(request, cycle_state, [a])
    # 32 chars: 8 blocks of 4, or 2 blocks of 16
    small_match = find_prefix_match(cycle_state, "small")
    large_match = find_prefix_match(cycle_state, "large")
    assert small_match is not None and small_match.total_blocks == 8
    assert large_match is not None and large_match.total_blocks == 2


def test_prefix_scorer_lru_capacity_per_server() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1, lru_capacity_per_server=2)
    record(scorer, make_request("aaaabbbb"), a)  # 2 blocks: full
    record(scorer, make_request("ccccdddd"), a)  # evicts both
    assert score(scorer, make_request("aaaabbbb"), [a]) == [0.0]
    assert score(scorer, make_request("ccccdddd"), [a]) == [1.0]
    assert scorer.index.blocks("a") == 2


def test_prefix_scorer_max_blocks_bounds_the_total() -> None:
    a = make_endpoint("a")
    scorer = PrefixCacheScorer(block_size_tokens=1, max_prefix_blocks_to_match=2)
    record(scorer, make_request("aaaabbbb"), a)
    # "aaaabbbbcccc" is cut to 2 blocks, both held: 2/2, the third block does not count
    assert score(scorer, make_request("aaaabbbbcccc"), [a]) == [1.0]


def test_prefix_scorer_hit_ratio() -> None:
    a, b = make_endpoint("a"), make_endpoint("b")
    scorer = PrefixCacheScorer(block_size_tokens=1)
    assert scorer.hit_ratio == 0.0
    record(scorer, make_request("aaaabbbb"), a)  # 0 of 2 blocks hit
    record(scorer, make_request("aaaabbbbcccc"), a)  # 2 of 3 hit on a
    record(scorer, make_request("aaaa"), b)  # 0 of 1 hit on b (a holds it, b was chosen)
    # (0 + 2 + 0) / (2 + 3 + 1) = 1/3
    assert scorer.lookups == 3
    assert scorer.hit_ratio == pytest.approx(1 / 3)


def test_prefix_cache_parameters() -> None:
    defaults = PrefixCacheParameters()
    assert (
        defaults.block_size_tokens,
        defaults.max_prefix_blocks_to_match,
        defaults.lru_capacity_per_server,
    ) == (
        16,
        256,
        31250,
    )
    custom = PrefixCacheParameters.model_validate(
        {"blockSizeTokens": 8, "maxPrefixBlocksToMatch": 10, "lruCapacityPerServer": 5, "autoTune": True}
    )
    assert (custom.block_size_tokens, custom.max_prefix_blocks_to_match, custom.lru_capacity_per_server) == (
        8,
        10,
        5,
    )
    with pytest.raises(ValidationError):
        PrefixCacheParameters.model_validate({"blockSizeTokens": 0})
    with pytest.raises(ValidationError):
        PrefixCacheParameters.model_validate({"blockSize": 16})  # unknown key


def test_hash_block_size_gives_the_block_in_bytes() -> None:
    """GIE's older `hashBlockSize` (bytes per block), as llm-d's P/D configs still write it."""
    params = PrefixCacheParameters.model_validate({"hashBlockSize": 5})
    assert params.block_bytes() == 5
    assert PrefixCacheParameters().block_bytes() == 64  # 16 tokens of 4 bytes
    scorer = PrefixCacheScorer(block_bytes=5)
    a, b = make_endpoint("a"), make_endpoint("b")
    record(scorer, make_request("x" * 10), a)  # blocks of 5 bytes: 2 on a
    cycle_state = CycleState()
    assert scorer.score(make_request("x" * 10 + "y" * 5), cycle_state, [a, b]) == [2 / 3, 0.0]
    match = cycle_state.read(state_key(scorer), PrefixMatch)
    assert match is not None
    assert (match.cached_bytes("a"), match.cached_tokens("a")) == (10, 2)
    with pytest.raises(ValidationError, match="not both"):
        PrefixCacheParameters.model_validate({"hashBlockSize": 64, "blockSizeTokens": 16})
    with pytest.raises(ValidationError):
        PrefixCacheParameters.model_validate({"hashBlockSize": 0})
