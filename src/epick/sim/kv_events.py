"""KV-cache events over ZMQ, in vLLM's wire format.

Each publish is a multipart message: topic `kv@<host:port>@<model>`, an 8-byte big-endian sequence
number, and a msgpack payload `[timestamp, [event, ...], data_parallel_rank]`. Events are encoded
array-like with their tag first, as vLLM's msgspec structs are:
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
`["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgpack
import zmq

from epick.sim.engine import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


def encode_event(event: KVEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            None,
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, None]
    if isinstance(event, AllBlocksCleared):
        return ["AllBlocksCleared"]
    raise TypeError(f"not a KV event: {event!r}")


class KVEventPublisher:
    """A PUB socket bound to `endpoint`; sends never block (ZMQ drops when subscribers lag)."""

    def __init__(self, endpoint: str, topic: str, context: zmq.Context[Any] | None = None) -> None:
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        self.topic = topic.encode()
        self.sequence = 0

    def publish(self, events: Sequence[KVEvent]) -> None:
        if not events:
            return
        payload = msgpack.packb([time.time(), [encode_event(e) for e in events], 0], use_bin_type=True)
        try:
            self.socket.send_multipart(
                [self.topic, self.sequence.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK
            )
        except zmq.Again:
            return  # no room: dropped, as a PUB socket would
        self.sequence += 1

    def close(self) -> None:
        self.socket.close(linger=0)
