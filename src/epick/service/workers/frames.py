"""The hub's frames: a length and a kind, then a msgpack message."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

HEAD = struct.Struct("!IB")  # payload length, kind
UPDATES, CONTROL = ord("u"), ord("c")  # the hub forwards updates unread; it reads control messages


def frame(message: dict[str, Any]) -> bytes:
    """A message on the hub: its kind (updates when `t` is "u"), then msgpack."""
    payload: bytes = msgpack.packb(message, use_bin_type=True)
    return HEAD.pack(len(payload), UPDATES if message.get("t") == "u" else CONTROL) + payload


async def read_raw_frame(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes] | None:
    """(kind, the whole frame, its payload), or None at the end of the stream (a worker that exits
    may reset its link rather than close it)."""
    try:
        head = await reader.readexactly(HEAD.size)
        length, kind = HEAD.unpack(head)
        payload = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return kind, head + payload, payload


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message, decoded, or None at the end of the stream."""
    raw = await read_raw_frame(reader)
    return None if raw is None else msgpack.unpackb(raw[2], raw=False, strict_map_key=False)
