"""The KV-block index shared through Redis or Valkey, in llm-d-router's layout
(pkg/kvcache/kvblock/redis.go at ebab687; llm-d-kv-cache v0.9.0 writes the same), so that epick
replicas and Go EPPs can share one index.

Layout, in a database of its own (nothing has a prefix or a TTL):
- a request key is a hash at the key's decimal text; each field is the JSON of one entry, as Go
  writes llm-d's `PodEntry` (`{"PodIdentifier":"10.0.0.5:8000","DeviceTier":"gpu","Speculative":false,
  "HasGroup":false,"GroupIdx":0}`; a speculative entry has DeviceTier "" and Speculative true), the
  value empty;
- an engine key is a sorted set at `engine:<decimal>` of the request keys its block was stored under
  (scored by their position), for `BlockRemoved`.

`SharedBlockIndex` is the local `BlockIndex` (what this replica's events and guesses built, always
kept), whose every change is also written to Redis: in pipelines, one a turn of the event loop, in
the order they were made (a clear of an endpoint, a SCAN of the keyspace as upstream's, in its
place). `fetch` reads one request's keys in one pipeline, one round trip; the caller waits at most
`lookup_timeout` for it and decides on the local index otherwise.

Faults: while Redis does not answer, lookups fall back to the local index at once and writes are not
sent, with one warning; every attempt in between counts in `stats.fallbacks`. Once Redis answers again
(tried with backoff), the removals made meanwhile are replayed, then the whole local index is written
again, so Redis converges (a Redis that restarted empty refills) without a restart of epick.

Deviations, on purpose: an eviction by engine key is one Lua script (the sorted set's request keys,
HDEL, the empty hashes and the set deleted), where upstream sends ZRANGE then HDELs then two scripts:
the end state is the same, in one round trip. A `BlockStored` whose parent engine block this replica
never saw is skipped, as by the local index (upstream asks Redis): every engine's events reach the
replica that subscribed to it, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from epick.kvcache.index import SPECULATIVE, BlockIndex, Entry

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "redis://127.0.0.1:6379"
DEFAULT_LOOKUP_TIMEOUT = 0.05
ENGINE_PREFIX = "engine:"
MAX_PENDING_REMOVALS = 100_000  # removals kept while Redis is away, to replay when it is back
RESYNC_BATCH = 2_000  # keys written per pipeline when the whole index is written again
_DECODED_CAP = 65_536

# KEYS[1] = engine:<hash>; ARGV[1] = the entry's field. The entry leaves every request key the engine
# block was stored under; an emptied hash goes, and the engine key goes once all its hashes have.
_EVICT = """
local keys = redis.call('ZRANGE', KEYS[1], 0, -1)
local alive = 0
for _, key in ipairs(keys) do
  redis.call('HDEL', key, ARGV[1])
  if redis.call('HLEN', key) == 0 then redis.call('DEL', key) else alive = 1 end
end
if #keys > 0 and alive == 0 then redis.call('DEL', KEYS[1]) end
return #keys
"""
# KEYS[1] = a request key; ARGV[1] = the entry's field: it leaves, and an emptied hash goes.
_REMOVE = """
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return 1
"""


def normalize_address(address: str) -> str:
    """A `redisConfig.address` as upstream reads it: redis://, rediss:// (TLS) or unix://; valkey:// and
    valkeys:// stand for the first two; a bare host:port is redis://; empty is the default."""
    address = address.strip() or DEFAULT_ADDRESS
    for scheme, standard in (("valkey://", "redis://"), ("valkeys://", "rediss://")):
        if address.startswith(scheme):
            return standard + address[len(scheme) :]
    if not address.startswith(("redis://", "rediss://", "unix://")):
        return "redis://" + address
    return address


def _go_json_text(text: str) -> str:
    """A JSON string as Go's encoding/json writes it (HTML characters and line separators escaped)."""
    out = json.dumps(text, ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        out = out.replace(raw, escaped)
    return out.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def encode_entry(entry: Entry) -> str:
    """The hash field of an entry, byte for byte as llm-d writes it (an HDEL matches it exactly)."""
    pod, tier = entry
    speculative = tier == SPECULATIVE
    return (
        f'{{"PodIdentifier":{_go_json_text(pod)},"DeviceTier":{_go_json_text("" if speculative else tier)},'
        f'"Speculative":{"true" if speculative else "false"},"HasGroup":false,"GroupIdx":0}}'
    )


def decode_entry(field: str | bytes) -> Entry | None:
    """An entry from a hash field (None: not one; older llm-d releases wrote "pod@tier", which
    upstream's reader skips too). Keys match without regard to case, as Go's decoder matches them."""
    try:
        value = json.loads(field)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    folded = {str(k).lower(): v for k, v in value.items()}
    pod = folded.get("podidentifier")
    if not isinstance(pod, str) or not pod:
        return None
    if folded.get("speculative") is True:
        return (pod, SPECULATIVE)
    tier = folded.get("devicetier")
    return (pod, tier.lower() if isinstance(tier, str) and tier else "gpu")


@dataclass(slots=True)
class SharedIndexStats:
    lookups: int = 0  # fetches answered by Redis
    fallbacks: dict[str, int] = field(default_factory=lambda: {"down": 0, "timeout": 0, "error": 0})
    writes: int = 0  # commands sent
    writes_dropped: int = 0  # not sent because Redis was away (the resync writes them again)
    outages: int = 0
    resyncs: int = 0


class SharedBlockIndex(BlockIndex):
    """The local index, mirrored to the Redis or Valkey at `address` (see the module's docstring)."""

    def __init__(
        self,
        address: str,
        size: int = 100_000_000,
        pod_cache_size: int = 10,
        *,
        lookup_timeout: float = DEFAULT_LOOKUP_TIMEOUT,
        retry_s: tuple[float, float] = (0.5, 10.0),
        client: Any = None,
    ) -> None:
        super().__init__(size, pod_cache_size)
        self.address = normalize_address(address)
        self.lookup_timeout = lookup_timeout
        self.retry_s = retry_s
        self.stats = SharedIndexStats()
        self.down = False
        self._client = client if client is not None else _client(self.address)
        self._evict = self._client.register_script(_EVICT)
        self._remove = self._client.register_script(_REMOVE)
        self._ops: list[tuple[Any, ...]] = []
        self._removals: deque[tuple[Any, ...]] = deque(maxlen=MAX_PENDING_REMOVALS)
        self._writer: asyncio.Task[None] | None = None
        self._decoded: dict[bytes, Entry | None] = {}
        self._closed = False

    # writes: the local index, then Redis

    def add(self, request_keys: Sequence[int] | Any, entry: Entry) -> None:
        keys = tuple(request_keys)
        super().add(keys, entry)
        self._queue(("hset", keys, encode_entry(entry)))

    def map_engine(self, engine_key: int, request_keys: tuple[int, ...]) -> None:
        super().map_engine(engine_key, request_keys)
        self._queue(("zadd", engine_key, request_keys))

    def remove(self, request_key: int, entry: Entry) -> bool:
        alive = super().remove(request_key, entry)
        self._queue(("remove", request_key, encode_entry(entry)))
        return alive

    def evict(self, engine_key: int, entry: Entry) -> None:
        super().evict(engine_key, entry)
        self._queue(("evict", engine_key, encode_entry(entry)))

    def clear(self, pod: str) -> int:
        dropped = super().clear(pod)
        self._queue(("clear", pod))
        return dropped

    def _queue(self, op: tuple[Any, ...]) -> None:
        if self._closed:
            return
        if self.down:
            if op[0] != "hset" and op[0] != "zadd":
                self._removals.append(op)
            self.stats.writes_dropped += 1
            return
        self._ops.append(op)
        self._start_writer()

    def _start_writer(self) -> None:
        if self._writer is None or self._writer.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a synchronous caller): written with the next change made in one
            self._writer = loop.create_task(self._write())

    async def _write(self) -> None:
        while self._ops and not self.down:
            ops, self._ops = self._ops, []
            try:
                await self._send(ops)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._went_down(e)
                self._removals.extend(op for op in ops if op[0] in ("remove", "evict", "clear"))
                self.stats.writes_dropped += len(ops)

    async def _send(self, ops: Sequence[tuple[Any, ...]]) -> None:
        """The commands in order, in pipelines, each clear in its place."""
        pipe = self._client.pipeline(transaction=False)
        queued = 0
        for op in ops:
            kind = op[0]
            if kind == "clear":
                if queued:
                    await pipe.execute()
                    pipe, queued = self._client.pipeline(transaction=False), 0
                await self._clear(op[1])
                continue
            if kind == "hset":
                for key in op[1]:
                    pipe.hset(str(key), op[2], "")
                queued += len(op[1])
            elif kind == "zadd":
                pipe.zadd(f"{ENGINE_PREFIX}{op[1]}", {str(k): j for j, k in enumerate(op[2])})
                queued += 1
            elif kind == "evict":
                await self._evict(keys=[f"{ENGINE_PREFIX}{op[1]}"], args=[op[2]], client=pipe)
                queued += 1
            else:  # remove
                await self._remove(keys=[str(op[1])], args=[op[2]], client=pipe)
                queued += 1
        if queued:
            await pipe.execute()
        self.stats.writes += len(ops)

    async def _clear(self, pod: str) -> None:
        """Every field of `pod`, on every request key (a scan of the database, as upstream's Clear)."""
        client = self._client
        async for key in client.scan_iter(match="*", count=1024):
            name = key.decode() if isinstance(key, bytes) else str(key)
            if name.startswith(ENGINE_PREFIX):
                continue
            with contextlib.suppress(Exception):  # not a hash: not the index's (upstream fails here)
                fields = await client.hkeys(name)
                stale = [f for f in fields if (e := self._decode(f)) is not None and e[0] == pod]
                if stale:
                    await client.hdel(name, *stale)
                    if await client.hlen(name) == 0:
                        await client.delete(name)

    # reads

    async def fetch(
        self, per_prompt: Sequence[Sequence[int]], pods: set[str] | None
    ) -> list[list[tuple[Entry, ...]]] | None:
        """Each prompt's run of keys from the first that some endpoint of `pods` holds, with the
        entries (of `pods`) on each, from Redis in one round trip; None when Redis cannot answer within
        `lookup_timeout` (then decide on the local index)."""
        if self.down:
            self.stats.fallbacks["down"] += 1
            return None
        pipe = self._client.pipeline(transaction=False)
        for keys in per_prompt:
            for key in keys:
                pipe.hkeys(str(key))
        try:
            answers = await asyncio.wait_for(pipe.execute(), self.lookup_timeout)
        except TimeoutError:
            self.stats.fallbacks["timeout"] += 1
            return None
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.stats.fallbacks["error"] += 1
            self._went_down(e)
            return None
        self.stats.lookups += 1
        out: list[list[tuple[Entry, ...]]] = []
        at = 0
        for keys in per_prompt:
            found: list[tuple[Entry, ...]] = []
            stopped = False
            for fields in answers[at : at + len(keys)]:
                if stopped:
                    break
                held = tuple(
                    entry
                    for f in fields
                    if (entry := self._decode(f)) is not None and (pods is None or entry[0] in pods)
                )
                if held:
                    found.append(held)
                else:
                    stopped = True
            at += len(keys)
            out.append(found)
        return out

    def _decode(self, field: bytes | str) -> Entry | None:
        raw = field if isinstance(field, bytes) else field.encode()
        cache = self._decoded
        if raw in cache:
            return cache[raw]
        if len(cache) >= _DECODED_CAP:
            cache.clear()
        entry = cache[raw] = decode_entry(raw)
        return entry

    # faults

    def _went_down(self, error: BaseException) -> None:
        if self.down or self._closed:
            return
        self.down = True
        self.stats.outages += 1
        log.warning(
            "shared KV-block index at %s does not answer (%s: %s); deciding on this replica's own index "
            "until it is back",
            redacted(self.address),
            type(error).__name__,
            error,
        )
        asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        delay, longest = self.retry_s
        while not self._closed:
            await asyncio.sleep(delay)
            try:
                await self._client.ping()
                removals = list(self._removals)
                self._removals.clear()
                await self._send(removals)
                written = await self._resync()
            except asyncio.CancelledError:
                raise
            except Exception:
                delay = min(delay * 2, longest)
                continue
            self.down = False
            self.stats.resyncs += 1
            log.info(
                "shared KV-block index at %s answers again: %d removals replayed, %d keys written again",
                redacted(self.address),
                len(removals),
                written,
            )
            self._start_writer()
            return

    async def _resync(self) -> int:
        """Write the whole local index again (idempotent: what Redis has stays)."""
        keys = list(self._keys.items())
        engine = list(self._engine.items())
        for start in range(0, len(keys), RESYNC_BATCH):
            pipe = self._client.pipeline(transaction=False)
            for key, held in keys[start : start + RESYNC_BATCH]:
                pipe.hset(str(key), mapping={encode_entry(e): "" for e in held})
            await pipe.execute()
        for start in range(0, len(engine), RESYNC_BATCH):
            pipe = self._client.pipeline(transaction=False)
            for engine_key, request_keys in engine[start : start + RESYNC_BATCH]:
                pipe.zadd(f"{ENGINE_PREFIX}{engine_key}", {str(k): j for j, k in enumerate(request_keys)})
            await pipe.execute()
        return len(keys)

    async def aclose(self) -> None:
        """Send what is queued (briefly), then close the connections."""
        if self._writer is not None and not self._writer.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._writer), 1.0)
        self._closed = True
        if self._writer is not None:
            self._writer.cancel()
        await self._client.aclose()


def _client(address: str) -> Any:
    import redis.asyncio

    return redis.asyncio.Redis.from_url(address, socket_connect_timeout=2.0, health_check_interval=30)


def redacted(address: str) -> str:
    """The address without its password."""
    scheme, sep, rest = address.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at:
        return address
    user = credentials.partition(":")[0]
    return f"{scheme}{sep}{user + ':***' if user else '***'}@{host}"
