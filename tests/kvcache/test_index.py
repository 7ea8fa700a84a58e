"""The block index and the event tracker: upstream's semantics (longest consecutive prefix, tier
weights, engine keys mapped to request keys whatever the engine's block size), and bounded memory."""

from __future__ import annotations

import pytest

from epick.kvcache import (
    AllBlocksCleared,
    BlockHasher,
    BlockIndex,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventTracker,
    TokenProcessor,
    event_hash,
    longest_prefix_scores,
)

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
TOKENS = list(range(100, 164))  # 4 blocks of 16


def stored(hasher: BlockHasher, tokens: list[int], *, parent: bytes | None = None, medium: str | None = "GPU",
           first: int = 0, lora: str | None = None) -> tuple[BlockStored, list[bytes]]:  # fmt: skip
    digests = hasher.block_hashes(tokens, parent=parent, first_block=first)
    event = BlockStored(
        tuple(event_hash(d) for d in digests),
        None if parent is None else event_hash(parent),
        tuple(tokens),
        hasher.block_size,
        None,
        medium,
        lora,
    )
    return event, digests


def batch(*events: object) -> EventBatch:
    return EventBatch(0.0, tuple(events), 0)  # type: ignore[arg-type]


@pytest.fixture
def tracker() -> EventTracker:
    return EventTracker(BlockIndex(), TokenProcessor(16, "42"))


def scores(
    tracker: EventTracker, tokens: list[int], model: str = "m", pods: set[str] | None = None
) -> dict[str, float]:
    return longest_prefix_scores(tracker.index.lookup(tracker.processor.keys(tokens, model), pods))[0]


def test_events_in_two_steps_chain_through_the_parent(tracker: EventTracker) -> None:
    h = BlockHasher(16, "sha256_cbor", "0")
    first, digests = stored(h, TOKENS[:32])
    second, _ = stored(h, TOKENS[32:], parent=digests[-1], first=2)
    tracker.apply(A, "m", batch(first))
    tracker.apply(A, "m", batch(second))
    tracker.apply(B, "m", batch(stored(h, TOKENS[:16])[0]))
    assert scores(tracker, TOKENS) == {A: 4.0, B: 1.0}
    assert scores(tracker, TOKENS, pods={B}) == {B: 1.0}
    assert scores(tracker, TOKENS, model="other") == {}
    assert scores(tracker, [1] * 64) == {}


def test_removal_cuts_the_run_and_clear_drops_the_endpoint(tracker: EventTracker) -> None:
    h = BlockHasher(16, "sha256", "0")
    event, _ = stored(h, TOKENS)
    tracker.apply(A, "m", batch(event))
    tracker.apply(B, "m", batch(event))
    tracker.apply(A, "m", batch(BlockRemoved((event.block_hashes[1],), "GPU")))
    assert scores(tracker, TOKENS) == {A: 1.0, B: 4.0}
    tracker.apply(B, "m", batch(AllBlocksCleared()))
    assert scores(tracker, TOKENS) == {A: 1.0}
    # Removing what was never stored, or on another tier, changes nothing.
    tracker.apply(A, "m", batch(BlockRemoved((12345,), "GPU"), BlockRemoved((event.block_hashes[0],), "CPU")))
    assert scores(tracker, TOKENS) == {A: 1.0}


def test_a_block_offloaded_to_cpu_counts_with_its_weight(tracker: EventTracker) -> None:
    h = BlockHasher(16, "sha256", "0")
    event, _ = stored(h, TOKENS)
    tracker.apply(A, "m", batch(event))
    offload = BlockStored(event.block_hashes, None, (), 16, None, "CPU", None)
    tracker.apply(B, "m", batch(event, offload))
    tracker.apply(B, "m", batch(BlockRemoved(event.block_hashes[2:], "GPU")))
    # B: blocks 0-1 on both tiers (weight 1.0), 2-3 on cpu only (0.8).
    got = scores(tracker, TOKENS)
    assert got[A] == 4.0 and got[B] == pytest.approx(3.6)


def test_an_unknown_parent_skips_the_event(tracker: EventTracker) -> None:
    h = BlockHasher(16, "sha256", "0")
    _, digests = stored(h, TOKENS[:16])
    orphan, _ = stored(h, TOKENS[16:], parent=digests[0], first=1)
    tracker.apply(A, "m", batch(orphan))
    assert tracker.stats.skipped_unknown_parent == 1 and len(tracker.index) == 0


@pytest.mark.parametrize("engine_block", [4, 16, 64])
def test_engine_block_size_need_not_equal_the_index_block_size(engine_block: int) -> None:
    tracker = EventTracker(BlockIndex(), TokenProcessor(16, ""))
    h = BlockHasher(engine_block, "sha256_cbor", "7")
    event, _ = stored(h, TOKENS)
    tracker.apply(A, "m", batch(event))
    assert scores(tracker, TOKENS) == {A: 4.0}
    # Removing the engine's last block takes the index blocks it covered.
    tracker.apply(A, "m", batch(BlockRemoved(event.block_hashes[-1:], "GPU")))
    expected = {4: 3.0, 16: 3.0, 64: None}[engine_block]
    assert scores(tracker, TOKENS).get(A) == expected


def test_lora_name_is_the_model_and_salt_is_a_first_block_key(tracker: EventTracker) -> None:
    h = BlockHasher(16, "sha256", "0")
    event, _ = stored(h, TOKENS, lora="sql-adapter")
    tracker.apply(A, "base", batch(event))
    assert scores(tracker, TOKENS, model="sql-adapter") == {A: 4.0}
    assert scores(tracker, TOKENS, model="base") == {}
    salted = BlockStored((1, 2, 3, 4), None, tuple(TOKENS), 16, None, "GPU", None, (["s"], None, None, None))
    tracker.apply(B, "m", batch(salted))
    keys = tracker.processor.keys(TOKENS, "m", extra=[["s"]])
    assert longest_prefix_scores(tracker.index.lookup(keys))[0] == {B: 4.0}
    assert B not in scores(tracker, TOKENS)


def test_memory_is_bounded() -> None:
    index = BlockIndex(size=100, pod_cache_size=2)
    for i in range(1000):
        index.add([i], (A, "gpu"))
        index.map_engine(i, (i,))
    assert len(index) == 100 and index.engine_keys == 100
    for pod in ("p1", "p2", "p3"):
        index.add([999], (pod, "gpu"))
    assert index.lookup([999]) == [(("p2", "gpu"), ("p3", "gpu"))]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BlockIndex(size=0)
    with pytest.raises(ValueError):
        TokenProcessor(0)
    with pytest.raises(ValueError, match="token id"):
        TokenProcessor(2).keys([1, -1], "m")


@pytest.mark.parametrize("offloaded", [False, True], ids=["one-tier", "tiered"])
def test_the_one_pass_scoring_equals_the_two_step_one(offloaded: bool) -> None:
    import random

    rng = random.Random(5)
    index = BlockIndex(pod_cache_size=4)
    keys = list(range(40))
    for pod in ("a", "b", "c", "d", "e"):
        held = rng.randrange(len(keys))
        index.add(keys[:held], (pod, "gpu"))
        index.add(rng.sample(keys, 10), (pod, "gpu"))  # holes after the run do not extend it
        if offloaded:
            index.add(keys[: held + 3], (pod, "cpu"))
    for pods in (None, {"a", "c", "e"}):
        assert index.longest_prefix(keys, pods) == longest_prefix_scores(index.lookup(keys, pods))


@pytest.mark.parametrize("split", [2048, 2064, 3008, 4000, 5984])
def test_a_prompt_stored_in_chunks_that_end_mid_block_is_indexed_whole(split: int) -> None:
    """Chunked prefill: an engine with blocks of 16 stores a 6,000-token prompt in two events split
    where the index (blocks of 64) has no boundary; the second continues the first's tail."""
    import random

    rng = random.Random(0)
    prompt = tuple(rng.randrange(65536) for _ in range(6000))
    tracker = EventTracker(BlockIndex(), TokenProcessor(64))
    hashes = [1000 + j for j in range(len(prompt) // 16)]
    s = split // 16
    first = BlockStored(tuple(hashes[:s]), None, prompt[: s * 16], 16)
    second = BlockStored(tuple(hashes[s:]), hashes[s - 1], prompt[s * 16 : len(hashes) * 16], 16)
    tracker.apply(A, "m", batch(first))
    tracker.apply(A, "m", batch(second))
    assert scores(tracker, list(prompt)) == {A: 93.0}
    assert tracker.stats.skipped_unknown_parent == 0


def test_decode_steps_of_one_engine_block_fill_index_blocks() -> None:
    tracker = EventTracker(BlockIndex(), TokenProcessor(64))
    tokens = tuple(range(5000, 5256))  # 16 engine blocks of 16: 4 index blocks
    parent = None
    for j in range(16):
        event = BlockStored((j + 1,), parent, tokens[j * 16 : (j + 1) * 16], 16)
        tracker.apply(A, "m", batch(event))
        parent = j + 1
    assert scores(tracker, list(tokens)) == {A: 4.0}
    # Evicting the last engine block takes the index block it completed.
    tracker.apply(A, "m", batch(BlockRemoved((16,), "GPU")))
    assert scores(tracker, list(tokens)) == {A: 3.0}
