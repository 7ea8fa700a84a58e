"""vLLM's KV-cache events, decoded from the wire (vllm/distributed/kv_events.py).

A ZMQ message has three frames: the topic (`kv@<pod>@<model>` by llm-d's convention), the sequence
number (8 bytes, big-endian, from 0 per publisher) and the msgpack payload, an event batch
`[timestamp, [event, ...], data_parallel_rank]`. An event is either an array with its tag first
(vLLM before 0.34: `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
medium, lora_name, extra_keys, group_idx, ...]`, `["BlockRemoved", block_hashes, medium, group_idx]`,
`["AllBlocksCleared"]`) or, from vLLM 0.34, a map tagged by `"type"` with the same field names
(fields at their default are left out). Both are accepted, with trailing fields vLLM may add later
ignored. A block hash is an unsigned 64-bit integer (vLLM's default) or the digest's bytes, of which
the last 8 are read big-endian (what vLLM publishes as the integer).

Anything else is a `BadEventError` naming what is wrong: the batch it is in is refused whole, as
llm-d-kv-cache refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

MASK64 = (1 << 64) - 1


class BadEventError(ValueError):
    """A message that is not a well-formed vLLM KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None  # per block: None or the block's keys, tags stripped
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


_STORED_FIELDS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    "extra_keys", "group_idx",
)  # fmt: skip
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def block_hash(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise BadEventError(f"{where}: a block hash must be an integer or bytes, not a boolean")
    if isinstance(value, int):
        return value & MASK64  # int64 from some encoders: the same 64 bits
    if isinstance(value, bytes | bytearray) and value:
        return int.from_bytes(value[-8:], "big")
    raise BadEventError(f"{where}: a block hash must be an integer or bytes, got {type(value).__name__}")


def _hashes(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple):
        raise BadEventError(f"{where}: block_hashes must be a list")
    return tuple(block_hash(v, f"{where}.block_hashes[{i}]") for i, v in enumerate(value))


def _opt_int(value: Any, where: str, field: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadEventError(f"{where}: {field} must be an integer or null")
    return value


def _opt_str(value: Any, where: str, field: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        raise BadEventError(f"{where}: {field} must be a string or null")
    return value


def _fields(raw: Any, names: Sequence[str], required: int, where: str) -> dict[str, Any]:
    """An event's fields by name, from either encoding (its tag already read)."""
    if isinstance(raw, Mapping):
        missing = [n for n in names[:required] if n not in raw]
        if missing:
            raise BadEventError(f"{where}: missing {', '.join(missing)}")
        return {n: raw.get(n) for n in names}
    values = list(raw[1:])
    if len(values) < required:
        raise BadEventError(f"{where}: {len(values)} fields, at least {required} needed")
    values += [None] * (len(names) - len(values))
    return dict(zip(names, values, strict=False))


def decode_event(raw: Any, where: str = "event") -> KVEvent:
    if isinstance(raw, Mapping):
        tag = raw.get("type")
    elif isinstance(raw, list | tuple) and raw:
        tag = raw[0]
    else:
        raise BadEventError(f"{where}: an event must be a tagged array or map, got {type(raw).__name__}")
    if isinstance(tag, bytes):
        tag = tag.decode("utf-8", "replace")
    if tag == "BlockStored":
        f = _fields(raw, _STORED_FIELDS, 4, where)
        tokens = f["token_ids"]
        if not isinstance(tokens, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
        ):
            raise BadEventError(f"{where}: token_ids must be a list of non-negative integers")
        size = f["block_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise BadEventError(f"{where}: block_size must be a positive integer")
        parent = f["parent_block_hash"]
        extra = f["extra_keys"]
        return BlockStored(
            block_hashes=_hashes(f["block_hashes"], where),
            parent_block_hash=None if parent is None else block_hash(parent, f"{where}.parent_block_hash"),
            token_ids=tuple(tokens),
            block_size=size,
            lora_id=_opt_int(f["lora_id"], where, "lora_id"),
            medium=_opt_str(f["medium"], where, "medium"),
            lora_name=_opt_str(f["lora_name"], where, "lora_name"),
            extra_keys=tuple(extra) if isinstance(extra, list | tuple) else None,
            group_idx=_opt_int(f["group_idx"], where, "group_idx"),
        )
    if tag == "BlockRemoved":
        f = _fields(raw, _REMOVED_FIELDS, 1, where)
        return BlockRemoved(
            block_hashes=_hashes(f["block_hashes"], where),
            medium=_opt_str(f["medium"], where, "medium"),
            group_idx=_opt_int(f["group_idx"], where, "group_idx"),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise BadEventError(f"{where}: unknown event type {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise BadEventError(f"not msgpack: {e}") from None
    if not isinstance(raw, list) or len(raw) < 2:
        raise BadEventError("an event batch must be an array [timestamp, events, data_parallel_rank]")
    ts, events = raw[0], raw[1]
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise BadEventError("the batch's timestamp must be a number")
    if not isinstance(events, list):
        raise BadEventError("the batch's events must be an array")
    rank = raw[2] if len(raw) > 2 else None
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise BadEventError("the batch's data_parallel_rank must be an integer or null")
    return EventBatch(float(ts), tuple(decode_event(e, f"events[{i}]") for i, e in enumerate(events)), rank)


def decode_sequence(frame: bytes) -> int:
    if len(frame) != 8:
        raise BadEventError(f"the sequence frame must be 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big")


def parse_topic(topic: str) -> tuple[str, str]:
    """(pod, model) from `kv@<pod>@<model>`; another topic is all pod and no model (llm-d's rule)."""
    parts = topic.split("@")
    if len(parts) == 3:
        return parts[1], parts[2]
    return topic, ""


def encode_batch(batch: EventBatch, *, as_maps: bool = True) -> bytes:
    """A batch in vLLM's encoding: events as maps (vLLM 0.34), or as tagged arrays (earlier)."""
    out = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            fields: dict[str, Any] = {
                "block_hashes": list(e.block_hashes),
                "parent_block_hash": e.parent_block_hash,
                "token_ids": list(e.token_ids),
                "block_size": e.block_size,
                "lora_id": e.lora_id,
                "medium": e.medium,
                "lora_name": e.lora_name,
            }
            if e.extra_keys is not None:
                fields["extra_keys"] = [list(k) if isinstance(k, tuple) else k for k in e.extra_keys]
            if e.group_idx is not None:
                fields["group_idx"] = e.group_idx
            tag = "BlockStored"
        elif isinstance(e, BlockRemoved):
            fields = {"block_hashes": list(e.block_hashes), "medium": e.medium}
            if e.group_idx is not None:
                fields["group_idx"] = e.group_idx
            tag = "BlockRemoved"
        else:
            fields, tag = {}, "AllBlocksCleared"
        out.append({"type": tag, **fields} if as_maps else [tag, *fields.values()])
    return bytes(msgpack.packb([batch.ts, out, batch.data_parallel_rank], use_bin_type=True))
