"""The baseline routing policies of `epick simulate`, on small hand-checked cases."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from epick.simulate.policies import (
    POLICIES,
    LeastRequest,
    OraclePrefix,
    PrefixRandom,
    SGLangCacheAware,
)
from epick.simulate.types import Policy, ServerView, SimRequestSpec


def view(
    i: int,
    in_flight: int = 0,
    *,
    waiting: int = 0,
    kv: float = 0.0,
    cached: Callable[[SimRequestSpec], int] | None = None,
) -> ServerView:
    v = ServerView(i, f"s{i}", in_flight, waiting, 0, kv)
    if cached is not None:
        v.cached_tokens = cached
    return v


def views(*in_flight: int) -> list[ServerView]:
    return [view(i, n) for i, n in enumerate(in_flight)]


def req(text: str = "", tokens: Sequence[int] = ()) -> SimRequestSpec:
    return SimRequestSpec("r", text, tuple(tokens), 1)


# least-request


def test_least_request_picks_the_fewest_in_flight() -> None:
    policy = LeastRequest(random.Random(1))
    assert policy.route(req(), views(3, 1, 2), 0.0) == 1
    assert policy.route(req(), views(0, 1, 2), 0.0) == 0
    assert policy.route(req(), views(4, 4, 2), 0.0) == 2


def test_least_request_breaks_ties_with_the_seed() -> None:
    servers = views(2, 0, 0, 0, 5)  # servers 1, 2, 3 tie at 0
    policy = LeastRequest(random.Random(7))
    got = [policy.route(req(), servers, 0.0) for _ in range(60)]
    # Each route draws one randrange(3) over the ties [1, 2, 3].
    expected_rng = random.Random(7)
    assert got == [[1, 2, 3][expected_rng.randrange(3)] for _ in range(60)]
    assert set(got) == {1, 2, 3}
    again = LeastRequest(random.Random(7))
    assert [again.route(req(), servers, 0.0) for _ in range(60)] == got


# sglang-cache-aware


def sglang(**params: object) -> SGLangCacheAware:
    policy = POLICIES["sglang-cache-aware"](random.Random(0), **params)
    assert isinstance(policy, SGLangCacheAware)
    return policy


def test_sglang_balanced_follows_the_longest_match_above_the_threshold() -> None:
    policy = sglang()
    policy.insert("the cat sat on the mat", 0)  # 22 chars
    policy.insert("the dog", 1)  # 7 chars
    # "the cat sat on the hat" (22 chars) shares "the cat sat on the " (19) with server 0:
    # 19 / 22 = 0.86 > 0.5, so server 0, although server 2's tree is the smallest (0 chars).
    assert policy.route(req("the cat sat on the hat"), views(0, 0, 0), 0.0) == 0
    # Server 0's tree learned it: 22 + "hat" (3) = 25 chars; the others are unchanged.
    assert policy.tree_chars(0) == 25
    assert policy.tree_chars(1) == 7
    assert policy.match_chars("the cat sat on the hat", 0) == 22
    assert policy.match_chars("the cat sat on the hat", 1) == 4  # "the "


def test_sglang_balanced_below_the_threshold_goes_to_the_smallest_tree() -> None:
    policy = sglang()
    policy.insert("the cat sat on the mat", 0)  # 22 chars
    policy.insert("xyzxyzxyzx", 1)  # 10 chars
    policy.insert("qq", 2)  # 2 chars
    # "the dog barked loudly" (21 chars) shares "the " (4) with server 0: 4 / 21 = 0.19 <= 0.5.
    assert policy.route(req("the dog barked loudly"), views(0, 0, 0), 0.0) == 2
    assert policy.tree_chars(2) == 2 + 21


def test_sglang_match_rate_must_exceed_the_threshold() -> None:
    policy = sglang()
    policy.insert("abcdefgh", 0)
    policy.insert("zzzzzzzzzz", 1)  # 10 chars: server 2 (0 chars) has the smallest tree
    # "abcdWXYZ" matches "abcd" on server 0: 4 / 8 = 0.5, not > 0.5, so the smallest tree.
    assert policy.route(req("abcdWXYZ"), views(0, 0, 0), 0.0) == 2
    # "abcdeXYZ": 5 / 8 = 0.625 > 0.5, so server 0.
    assert policy.route(req("abcdeXYZ"), views(0, 0, 0), 0.0) == 0


def test_sglang_least_load_fallback() -> None:
    policy = sglang(fallback="least_load")
    policy.insert("the cat sat on the mat", 0)
    policy.insert("qq", 2)  # the smallest non-empty tree; server 1 has none
    # 4 / 21 <= 0.5: no cache route. Loads (5, 3, 0) are balanced (5 - 0 = 5 <= 32), and the
    # fallback is the least-loaded server (2), not the smallest tree (server 1, 0 chars).
    assert policy.route(req("the dog barked loudly"), views(5, 3, 0), 0.0) == 2
    with pytest.raises(ValueError, match="fallback"):
        sglang(fallback="most_load")


def test_sglang_imbalance_needs_both_thresholds() -> None:
    text = "hello world again"  # 17 chars; server 0 holds "hello world" (11): 11 / 17 = 0.65 > 0.5
    # Both hold: 40 - 5 = 35 > 32 and 40 > 5 * 1.1 = 5.5: shortest queue, server 1.
    policy = sglang()
    policy.insert("hello world", 0)
    assert policy.route(req(text), views(40, 5, 7), 0.0) == 1
    # The text still went into server 1's tree.
    assert policy.tree_chars(1) == 17
    assert policy.match_chars(text, 1) == 17

    # Absolute only: 435 - 400 = 35 > 32, but 435 <= 400 * 1.1 = 440: balanced, cache route to 0.
    policy = sglang()
    policy.insert("hello world", 0)
    assert policy.route(req(text), views(435, 400, 420), 0.0) == 0

    # Relative only: 40 > 8 * 1.1 = 8.8, but 40 - 8 = 32 is not > 32: balanced, cache route to 0.
    policy = sglang()
    policy.insert("hello world", 0)
    assert policy.route(req(text), views(40, 8, 9), 0.0) == 0


def test_sglang_ties_on_the_longest_match_are_seeded() -> None:
    # Servers 0 and 1 both hold "shared prefix " (14 chars); every request below extends it by 4
    # new chars, so the best match is 14 / 18 = 0.78 on both and one randrange(2) picks.
    picks = []
    for seed in range(20):
        policy = SGLangCacheAware(random.Random(seed))
        policy.insert("shared prefix ", 0)
        policy.insert("shared prefix ", 1)
        pick = policy.route(req("shared prefix abcd"), views(0, 0, 0), 0.0)
        assert pick == random.Random(seed).randrange(2)
        picks.append(pick)
    assert set(picks) == {0, 1}


def _recount(policy: SGLangCacheAware) -> tuple[dict[int, int], int]:
    """Characters per worker and node count, recomputed by walking the whole tree."""
    chars: dict[int, int] = {}
    nodes = 0
    stack = list(policy._root.children.values())
    while stack:
        node = stack.pop()
        nodes += 1
        stack.extend(node.children.values())
        for w in node.tenants:
            chars[w] = chars.get(w, 0) + len(node.text)
            assert w in node.parent.tenants or node.parent is policy._root  # type: ignore[union-attr]
        holding: dict[int, int] = {}
        for child in node.children.values():
            assert child.parent is node
            for w in child.tenants:
                holding[w] = holding.get(w, 0) + 1
        assert node.child_tenants == holding
    return chars, nodes


def test_sglang_eviction_drops_the_least_recently_used_leaf() -> None:
    policy = sglang(max_tree_chars=100, eviction_interval_s=0)
    a, b, c, d = ("a" * 30, "b" * 30, "c" * 30, "d" * 30)
    for text in (a, b, c):
        policy.insert(text, 0)
    assert policy.tree_chars(0) == 90
    policy.insert(a, 0)  # a used again: b is now the least recently used
    policy.insert(d, 0)  # 120 chars > 100: b goes (120 - 30 = 90)
    assert policy.tree_chars(0) == 90
    assert policy.match_chars(b, 0) == 0
    assert [policy.match_chars(t, 0) for t in (a, c, d)] == [30, 30, 30]
    assert _recount(policy) == ({0: 90}, 3)


def test_sglang_eviction_keeps_trees_bounded() -> None:
    rng = random.Random(3)
    cap = 500
    policy = sglang(max_tree_chars=cap, eviction_interval_s=0)
    servers = views(0, 0, 0, 0)
    prefixes = ["system prompt one. ", "system prompt two. ", "another system prompt. "]
    for i in range(2000):
        suffix = "".join(rng.choice("abcdefgh ") for _ in range(rng.randrange(1, 60)))
        policy.route(req(rng.choice(prefixes) + suffix), servers, float(i))
        assert all(policy.tree_chars(w) <= cap for w in range(4))
    chars, nodes = _recount(policy)
    assert chars == {w: policy.tree_chars(w) for w in range(4) if policy.tree_chars(w)}
    assert nodes <= 4 * cap
    assert policy.evictions > 0


def test_sglang_periodic_eviction_and_memory_guard() -> None:
    policy = sglang(max_tree_chars=100, eviction_interval_s=60.0)
    policy.insert("a" * 80, 0, now=0.0)  # the first call schedules the next eviction at t = 60
    policy.insert("b" * 80, 0, now=10.0)  # 160 chars: over the cap, under the guard (200): kept
    assert policy.tree_chars(0) == 160
    policy.insert("c" * 10, 0, now=60.0)  # 170 chars at t = 60: evict LRU leaves to <= 100
    assert policy.tree_chars(0) == 90  # "a" * 80 went: 170 - 80
    policy.insert("d" * 120, 0, now=61.0)  # 210 > 2 * 100: the guard evicts at once
    assert policy.tree_chars(0) <= 100


def test_sglang_radix_tree_matches_brute_force() -> None:
    rng = random.Random(11)
    policy = sglang(max_tree_chars=10**9)
    held: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def lcp(x: str, y: str) -> int:
        n = 0
        for p, q in zip(x, y, strict=False):
            if p != q:
                break
            n += 1
        return n

    for _ in range(400):
        text = "".join(rng.choice("ab") for _ in range(rng.randrange(0, 14)))
        w = rng.randrange(3)
        policy.insert(text, w)
        held[w].append(text)
        probe = "".join(rng.choice("ab") for _ in range(rng.randrange(0, 14)))
        for v in range(3):
            assert policy.match_chars(probe, v) == max((lcp(probe, t) for t in held[v]), default=0)
    chars, _ = _recount(policy)
    assert chars == {w: policy.tree_chars(w) for w in range(3)}


# prefix-random


def prefix_random(seed: int = 0, **params: object) -> PrefixRandom:
    policy = POLICIES["prefix-random"](random.Random(seed), chunk_chars=4, **params)
    assert isinstance(policy, PrefixRandom)
    return policy


def test_prefix_random_longest_match_wins() -> None:
    policy = prefix_random()
    policy.insert("aaaabbbbcccc", 0)
    policy.insert("aaaabbbbdddd", 1)
    policy.insert("aaaaeeee", 2)
    # Chunks "aaaa" | "bbbb" | "cccc" | "ZZ": held by {0,1,2}, {0,1}, {0}, {} -> 3 chunks, server 0.
    assert policy.matched_chunks("aaaabbbbccccZZ", views(0, 0, 0)) == (3, [0])
    assert policy.route(req("aaaabbbbccccZZ"), views(9, 0, 0), 0.0) == 0
    # Only the servers offered count: without server 0 the longest match is 2 chunks, on server 1.
    assert policy.matched_chunks("aaaabbbbccccZZ", [view(1), view(2)]) == (2, [1])


def test_prefix_random_chunks_are_chained() -> None:
    policy = prefix_random()
    policy.insert("xxxxaaaa", 0)
    # "aaaa" is held only after "xxxx": a text starting with "aaaa" matches nothing.
    assert policy.matched_chunks("aaaabbbb", views(0))[0] == 0
    assert policy.matched_chunks("xxxxaaaa", views(0))[0] == 2
    # Memory: one entry per distinct chunk-aligned prefix: "xxxx", "xxxxaaaa".
    assert len(policy) == 2
    policy.insert("xxxxaaaab", 0)  # one more: "xxxxaaaab"
    assert len(policy) == 3


def test_prefix_random_picks_at_random_among_equals() -> None:
    policy = prefix_random(seed=5)
    policy.insert("aaaabbbbcccc", 0)
    policy.insert("aaaabbbbdddd", 1)
    policy.insert("aaaaeeee", 2)
    # "aaaabbbb" + a fresh 4-char chunk: 2 chunks held by {0, 1}; one randrange(2) picks the
    # first (0) or second (1) of them, so the picks replay random.Random(5).
    expected = random.Random(5)
    picks = [policy.route(req(f"aaaabbbb{i:04d}"), views(0, 0, 0), 0.0) for i in range(40)]
    assert picks == [expected.randrange(2) for _ in range(40)]
    assert set(picks) == {0, 1}


def test_prefix_random_falls_back_below_the_minimum() -> None:
    # A cold text matches 0 chunks < 1: the fewest in-flight (server 1), not a random one.
    policy = prefix_random()
    assert policy.route(req("zzzzyyyy"), views(3, 1, 2), 0.0) == 1
    # The chosen server now holds it: 2 chunks on server 1.
    assert policy.matched_chunks("zzzzyyyy", views(0, 0, 0)) == (2, [1])

    policy = prefix_random(min_match_chunks=2)
    for s in range(3):
        policy.insert("aaaa", s)
    # "aaaaQQQQ" matches 1 chunk (on all three) < 2: the fewest in-flight, server 1.
    assert policy.route(req("aaaaQQQQ"), views(3, 1, 2), 0.0) == 1

    # min_match_chunks=0 is upstream exactly: a cold text goes to a random server.
    policy = prefix_random(seed=9, min_match_chunks=0)
    assert policy.route(req("coldtext"), views(3, 1, 2), 0.0) == random.Random(9).randrange(3)


# oracle-prefix


def cached(n: int) -> Callable[[SimRequestSpec], int]:
    return lambda request: n


def test_oracle_chooses_the_most_cached_tokens() -> None:
    policy = POLICIES["oracle-prefix"](random.Random(0))
    servers = [view(0, cached=cached(20)), view(1, cached=cached(80)), view(2, cached=cached(50))]
    # Equal queues (queue 1) and empty caches (kv 1): 3 * hit + 2 * 1 + 2 * 1
    # = 4.6, 6.4, 5.5 for hits 0.2, 0.8, 0.5 of the 100 tokens.
    assert isinstance(policy, OraclePrefix)
    assert policy.scores(req(tokens=range(100)), servers) == pytest.approx([4.6, 6.4, 5.5])
    assert policy.route(req(tokens=range(100)), servers, 0.0) == 1


def test_oracle_load_penalty_breaks_a_hot_spot() -> None:
    def fleet(kv0: float, kv1: float) -> list[ServerView]:
        return [
            view(0, waiting=10, kv=kv0, cached=cached(100)),  # the whole prompt cached, busy
            view(1, waiting=0, kv=kv1, cached=cached(0)),
        ]

    tokens = range(100)
    # Queue scores: (10 - 10) / 10 = 0 and (10 - 0) / 10 = 1.
    # Hot and full: 3 * 1 + 2 * 0 + 2 * 0.1 = 3.2 < cold and idle: 0 + 2 * 1 + 2 * 0.9 = 3.8.
    assert OraclePrefix().route(req(tokens=tokens), fleet(0.9, 0.1), 0.0) == 1
    # Same KV: 3 + 0 + 2 * 0.5 = 4 > 0 + 2 + 2 * 0.5 = 3: the hit still wins.
    assert OraclePrefix().route(req(tokens=tokens), fleet(0.5, 0.5), 0.0) == 0
    # load_weight 2: 3 + 2 * (0 + 1) = 5 < 0 + 2 * (2 + 1) = 6: balance wins.
    assert OraclePrefix(load_weight=2).route(req(tokens=tokens), fleet(0.5, 0.5), 0.0) == 1
    # load_weight 0: pure affinity, 3 > 0 even on the hot, full server.
    assert OraclePrefix(load_weight=0).route(req(tokens=tokens), fleet(0.9, 0.1), 0.0) == 0


def test_oracle_ties_go_to_the_fewest_in_flight() -> None:
    # Nothing cached, equal queues and KV: all score 4; in-flight (2, 0, 1) decides.
    servers = [view(0, 2), view(1, 0), view(2, 1)]
    assert OraclePrefix().route(req(tokens=range(10)), servers, 0.0) == 1
    # An empty prompt has no hit (no division by zero).
    assert OraclePrefix().route(req(), servers, 0.0) == 1


# the registry


def test_policies_registry() -> None:
    assert set(POLICIES) == {"least-request", "sglang-cache-aware", "prefix-random", "oracle-prefix"}
    for name, factory in POLICIES.items():
        policy: Policy = factory(random.Random(0))
        assert policy.name == name
        assert policy.route(req("some text", range(3)), views(1, 0, 2), 0.0) in {0, 1, 2}
        policy.finished(req("some text"), 0, 1.0)
    with pytest.raises(TypeError):
        POLICIES["least-request"](random.Random(0), cache_threshold=0.3)
