"""The KV-block index shared through a real Redis (epick.plugins.prefix.redis_index): llm-d's layout byte for
byte, what one replica's events write read by another, and Redis down, slow and back."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio

from epick.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epick.kvcache.index import SPECULATIVE
from epick.kvcache.tracker import EventTracker
from epick.kvcache.upstream_keys import UpstreamTokenProcessor
from epick.plugins.prefix.redis_index import SharedBlockIndex, decode_entry, encode_entry, normalize_address

POD_A, POD_B = "10.0.0.5:8000", "10.0.0.6:8000"
PROCESSOR = UpstreamTokenProcessor(4, "42")
TOKENS = tuple(range(100, 112))  # three blocks of four


def stored(
    hashes: tuple[int, ...], tokens: tuple[int, ...] = TOKENS, parent: int | None = None
) -> EventBatch:
    return EventBatch(0.0, (BlockStored(hashes, parent, tokens, 4),))


async def eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


@pytest.fixture
async def indexes(redis_server: Any) -> AsyncIterator[tuple[SharedBlockIndex, SharedBlockIndex, Any]]:
    """Two replicas' indexes on one Redis, and a plain client to look at what it holds."""
    a = SharedBlockIndex(redis_server.url, lookup_timeout=0.5, retry_s=(0.05, 0.2))
    b = SharedBlockIndex(redis_server.url, lookup_timeout=0.5, retry_s=(0.05, 0.2))
    raw = redis.asyncio.Redis.from_url(redis_server.url)
    yield a, b, raw
    await a.aclose()
    await b.aclose()
    await raw.aclose()


def norm(found: list[list[tuple[Any, ...]]] | None) -> list[list[set[Any]]] | None:
    """Entries per key as sets: Redis keeps a hash's fields in no order."""
    return None if found is None else [[set(held) for held in run] for run in found]


def held(*runs: list[tuple[Any, ...]]) -> list[list[set[Any]]]:
    return [[set(h) for h in run] for run in runs]


async def written(index: SharedBlockIndex) -> None:
    """Until what `index` queued has been sent."""
    await eventually(lambda: not index._ops and (index._writer is None or index._writer.done()), "writes")


def test_entries_are_encoded_as_go_encodes_podentry() -> None:
    assert encode_entry((POD_A, "gpu")) == (
        '{"PodIdentifier":"10.0.0.5:8000","DeviceTier":"gpu","Speculative":false,"HasGroup":false,"GroupIdx":0}'
    )
    assert encode_entry((POD_A, SPECULATIVE)) == (
        '{"PodIdentifier":"10.0.0.5:8000","DeviceTier":"","Speculative":true,"HasGroup":false,"GroupIdx":0}'
    )
    assert encode_entry(("a<b>&c", "cpu")).startswith('{"PodIdentifier":"a\\u003cb\\u003e\\u0026c"')
    assert decode_entry(encode_entry((POD_A, "cpu"))) == (POD_A, "cpu")
    assert decode_entry(encode_entry((POD_A, SPECULATIVE))) == (POD_A, SPECULATIVE)
    # what a hybrid model's events make llm-d write, and Go's case-insensitive keys
    assert decode_entry('{"podidentifier":"p:1","devicetier":"GPU","HasGroup":true,"GroupIdx":2}') == (
        "p:1",
        "gpu",
    )
    assert decode_entry("10.0.0.5:8000@gpu") is None  # llm-d-kv-cache <= v0.8.1 wrote this; skipped
    assert decode_entry(b"\xff") is None


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("", "redis://127.0.0.1:6379"),
        ("redis-host:6380", "redis://redis-host:6380"),
        ("valkey://v:6379/1", "redis://v:6379/1"),
        ("valkeys://user:pw@v:6379", "rediss://user:pw@v:6379"),
        ("unix:///run/redis.sock", "unix:///run/redis.sock"),
    ],
)
def test_addresses_read_as_upstream_reads_them(given: str, used: str) -> None:
    assert normalize_address(given) == used


async def test_the_layout_is_llm_ds(indexes: tuple[SharedBlockIndex, SharedBlockIndex, Any]) -> None:
    a, _, raw = indexes
    tracker = EventTracker(a, PROCESSOR)
    tracker.apply(POD_A, "m", stored((901, 902, 903)))
    await written(a)
    keys = PROCESSOR.keys(TOKENS, "m")
    field = encode_entry((POD_A, "gpu")).encode()
    for key in keys:
        assert await raw.hgetall(str(key)) == {field: b""}
    for engine, key in zip((901, 902, 903), keys, strict=True):
        assert await raw.zrange(f"engine:{engine}", 0, -1, withscores=True) == [(str(key).encode(), 0.0)]
    assert await raw.dbsize() == 6  # nothing else: no prefix, no bookkeeping keys


async def test_what_one_replica_hears_the_other_reads(
    indexes: tuple[SharedBlockIndex, SharedBlockIndex, Any],
) -> None:
    a, b, _ = indexes
    EventTracker(a, PROCESSOR).apply(POD_A, "m", stored((901, 902, 903)))
    await written(a)
    keys = PROCESSOR.keys(TOKENS, "m")
    assert len(b) == 0  # b heard nothing itself
    found = await b.fetch([keys], {POD_A, POD_B})
    assert found == [[((POD_A, "gpu"),)] * 3]
    assert await b.fetch([keys], {POD_B}) == [[]]  # filtered to the candidates: the run is empty
    # the same event received by both replicas writes the same state (idempotent)
    EventTracker(b, PROCESSOR).apply(POD_A, "m", stored((901, 902, 903)))
    await written(b)
    assert await a.fetch([keys], None) == [[((POD_A, "gpu"),)] * 3]


async def test_a_field_written_by_a_go_epp_is_read(
    indexes: tuple[SharedBlockIndex, SharedBlockIndex, Any],
) -> None:
    a, _, raw = indexes
    keys = PROCESSOR.keys(TOKENS, "m")
    go = '{"PodIdentifier":"10.0.0.6:8000","DeviceTier":"cpu","Speculative":false,"HasGroup":true,'
    go += '"GroupIdx":1}'
    for key in keys[:2]:
        await raw.hset(str(key), go, "")
    assert norm(await a.fetch([keys], None)) == held([((POD_B, "cpu"),), ((POD_B, "cpu"),)])


async def test_removals_and_clears_reach_redis(
    indexes: tuple[SharedBlockIndex, SharedBlockIndex, Any],
) -> None:
    a, b, raw = indexes
    tracker = EventTracker(a, PROCESSOR)
    tracker.apply(POD_A, "m", stored((901, 902, 903)))
    tracker.apply(POD_B, "m", stored((801, 802, 803)))
    keys = PROCESSOR.keys(TOKENS, "m")
    tracker.apply(POD_A, "m", EventBatch(0.0, (BlockRemoved((903,)),)))
    await written(a)
    assert norm(await b.fetch([keys], None)) == held(
        [((POD_A, "gpu"), (POD_B, "gpu"))] * 2 + [((POD_B, "gpu"),)]
    )
    # its request key still holds B's entry: the mapping stays until every key it maps to is empty
    assert await raw.exists("engine:903")
    tracker.apply(POD_B, "m", EventBatch(0.0, (BlockRemoved((803,)),)))
    await written(a)
    assert not await raw.exists("engine:803") and not await raw.exists(str(keys[2]))
    tracker.apply(POD_B, "m", EventBatch(0.0, (AllBlocksCleared(),)))
    await written(a)
    assert await b.fetch([keys], None) == [[((POD_A, "gpu"),)] * 2]
    tracker.apply(POD_A, "m", EventBatch(0.0, (AllBlocksCleared(),)))
    await written(a)
    assert norm(await b.fetch([keys], None)) == held([])
    assert [k for k in await raw.keys() if not k.startswith(b"engine:")] == []  # emptied hashes are deleted


async def test_redis_down_falls_back_once_then_converges_when_it_is_back(
    indexes: tuple[SharedBlockIndex, SharedBlockIndex, Any],
    redis_server: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, _ = indexes
    tracker = EventTracker(a, PROCESSOR)
    tracker.apply(POD_A, "m", stored((901, 902, 903)))
    await written(a)
    keys = PROCESSOR.keys(TOKENS, "m")
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="epick.plugins.prefix.redis_index"):
        assert await a.fetch([keys], None) is None  # the error: a falls back, and knows Redis is down
        assert a.down and a.stats.fallbacks["error"] == 1
        for _ in range(3):
            assert await a.fetch([keys], None) is None  # at once, without trying
        assert a.stats.fallbacks["down"] == 3
        tracker.apply(POD_B, "m", stored((801, 802, 803)))  # heard while Redis is away
        tracker.apply(POD_A, "m", EventBatch(0.0, (BlockRemoved((903,)),)))
    assert len([r for r in caplog.records if "does not answer" in r.getMessage()]) == 1
    redis_server.start()  # empty: nothing was persisted
    await eventually(lambda: not a.down, "a noticing Redis is back")
    await written(a)
    # b reads what a holds: written again after the outage, the removal made meanwhile included
    assert norm(await b.fetch([keys], None)) == held(
        [((POD_A, "gpu"), (POD_B, "gpu"))] * 2 + [((POD_B, "gpu"),)]
    )
    assert a.stats.resyncs == 1


async def test_a_slow_redis_is_waited_for_at_most_the_lookup_timeout(
    indexes: tuple[SharedBlockIndex, SharedBlockIndex, Any], redis_server: Any
) -> None:
    a, _, _ = indexes
    a.lookup_timeout = 0.05
    keys = PROCESSOR.keys(TOKENS, "m")
    sleeper = asyncio.create_task(asyncio.to_thread(redis_server.command, "DEBUG", "SLEEP", "0.5"))
    await asyncio.sleep(0.1)  # the server is asleep now
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await a.fetch([keys], None) is None
    assert loop.time() - started < 0.3
    assert a.stats.fallbacks["timeout"] == 1 and not a.down
    await sleeper
    await eventually(lambda: a.fetch([keys], None), "an answer once Redis is awake")
