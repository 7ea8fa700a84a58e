"""KV-cache events over ZMQ, as vLLM publishes them (vLLM 0.34's wire format by default).

Each publish is a multipart message: topic `kv@<host:port>@<model>`, an 8-byte big-endian sequence
number (from 0, one per message) and a msgpack event batch `[timestamp, [event, ...],
data_parallel_rank]` (`epick.kvcache.encode_batch`). Events are maps tagged by `"type"`
(`--kv-events-encoding map`, vLLM 0.34) or tagged positional arrays (`array`, vLLM before 0.34):
`BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
extra_keys?}`, `BlockRemoved {block_hashes, medium}`, `AllBlocksCleared {}`.

Block hashes. The engine chains its own 64-bit hashes (xxhash64, `epick.sim.engine.kv_cache`); the
events carry vLLM's instead: `VLLMHashes` hashes each stored block as vLLM would
(`epick.kvcache.BlockHasher`: `--prefix-caching-hash-algo`, NONE_HASH from PYTHONHASHSEED, the
LoRA and cache-salt extra keys) and publishes the digest's last 8 bytes. It keeps the vLLM digest of
each block the engine has cached, keyed by the engine's hash, for the next block's parent and for
`BlockRemoved`; a mapping goes when its block is evicted, so memory is bounded by the cache size.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zmq

from epick.kvcache import AllBlocksCleared, BlockHasher, BlockRemoved, BlockStored, EventBatch, encode_batch
from epick.kvcache import KVEvent as WireEvent
from epick.kvcache.vllm_hashing import DEFAULT_ALGORITHM, event_extra_keys, event_hash
from epick.sim import engine

MEDIUM_GPU = "GPU"
ENCODINGS = ("map", "array")

# The adapter of a LoRA id: (name, path); None when the id is unknown.
AdapterLookup = Callable[[int], tuple[str, str] | None]


class VLLMHashes:
    """Turns the engine's KV events into vLLM's: vLLM's block hashes, medium, LoRA name, extra keys.

    `adapters` names the engine's LoRA ids. `requests`, when given, lists the requests in flight: it
    is asked only when a block's parent is no longer cached (its engine block, a duplicate of the
    request's own, was evicted meanwhile), to compute the parent's digest from the request's tokens.
    """

    def __init__(
        self,
        block_size: int,
        algorithm: str = DEFAULT_ALGORITHM,
        pythonhashseed: str | None = None,
        *,
        adapters: AdapterLookup | None = None,
        requests: Callable[[], Iterable[engine.SimRequest]] | None = None,
    ) -> None:
        self.hasher = BlockHasher(block_size, algorithm, pythonhashseed)
        self.block_size = block_size
        self.adapters = adapters or (lambda _id: None)
        self.requests = requests
        self.digests: dict[int, bytes] = {}  # engine hash of a cached block -> its vLLM digest

    def _lora(self, lora_id: int | None) -> tuple[str, str] | None:
        return None if lora_id is None else self.adapters(lora_id)

    def _parent_digest(self, parent: int) -> bytes | None:
        digest = self.digests.get(parent)
        if digest is not None or self.requests is None:
            return digest
        bs = self.block_size
        for req in self.requests():
            hashes = req.block_hashes
            if parent not in hashes:
                continue
            i = hashes.index(parent)
            chain = self.hasher.block_hashes(
                req.tokens(0, (i + 1) * bs), lora=self._lora(req.lora_id), cache_salt=req.cache_salt
            )
            return chain[i]
        return None

    def translate(self, events: Sequence[engine.KVEvent]) -> list[WireEvent]:
        out: list[WireEvent] = []
        for e in events:
            if isinstance(e, engine.BlockStored):
                stored = self._stored(e)
                if stored is not None:
                    out.append(stored)
            elif isinstance(e, engine.BlockRemoved):
                pop = self.digests.pop
                removed = [event_hash(d) for h in e.block_hashes if (d := pop(h, None)) is not None]
                if removed:
                    out.append(BlockRemoved(tuple(removed), MEDIUM_GPU))
            elif isinstance(e, engine.AllBlocksCleared):
                self.digests.clear()
                out.append(AllBlocksCleared())
        return out

    def _stored(self, e: engine.BlockStored) -> BlockStored | None:
        hasher, bs = self.hasher, self.block_size
        lora = self._lora(e.lora_id)
        if e.parent_block_hash is None:
            parent_digest, first_block = hasher.none_hash, 0
        else:
            found = self._parent_digest(e.parent_block_hash)
            if found is None:
                return None  # cannot happen with a live requester; never publish a wrong hash
            parent_digest, first_block = found, 1
        digests = hasher.block_hashes(
            e.token_ids, parent=parent_digest, first_block=first_block, lora=lora, cache_salt=e.cache_salt
        )
        for h, d in zip(e.block_hashes, digests, strict=True):
            self.digests[h] = d
        extra = [
            event_extra_keys(hasher.extra_keys(first_block + i == 0, lora, e.cache_salt))
            for i in range(len(digests))
        ]
        return BlockStored(
            block_hashes=tuple(event_hash(d) for d in digests),
            parent_block_hash=None if e.parent_block_hash is None else event_hash(parent_digest),
            token_ids=tuple(e.token_ids[: len(digests) * bs]),
            block_size=bs,
            lora_id=e.lora_id,
            medium=MEDIUM_GPU,
            lora_name=None if lora is None else lora[0],
            extra_keys=tuple(extra) if any(k is not None for k in extra) else None,
        )


class KVEventPublisher:
    """A PUB socket bound to `endpoint`; sends never block (ZMQ drops when subscribers lag)."""

    def __init__(
        self, endpoint: str, topic: str, context: zmq.Context[Any] | None = None, *, encoding: str = "map"
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"--kv-events-encoding {encoding!r}: choose from {', '.join(ENCODINGS)}")
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        self.topic = topic.encode()
        self.sequence = 0
        self.as_maps = encoding == "map"

    def publish(self, events: Sequence[WireEvent]) -> None:
        if not events:
            return
        payload = encode_batch(EventBatch(time.time(), tuple(events), 0), as_maps=self.as_maps)
        try:
            self.socket.send_multipart(
                [self.topic, self.sequence.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK
            )
        except zmq.Again:
            return  # no room: dropped, as a PUB socket would
        self.sequence += 1

    def close(self) -> None:
        self.socket.close(linger=0)
