"""Decoding vLLM's event batches, both encodings, and refusing anything else with a clear error."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epick.kvcache import (
    AllBlocksCleared,
    BadEventError,
    BlockRemoved,
    BlockStored,
    EventBatch,
    decode_batch,
    decode_sequence,
    encode_batch,
    parse_topic,
)

BATCH = EventBatch(
    1.5,
    (
        BlockStored((1, 2**64 - 1), None, tuple(range(32)), 16, None, "GPU", None, (None, ["salt"]), 0),
        BlockRemoved((5,), "CPU", 0),
        AllBlocksCleared(),
    ),
    0,
)


@pytest.mark.parametrize("as_maps", [True, False], ids=["vllm-0.34-maps", "arrays"])
def test_round_trip(as_maps: bool) -> None:
    assert decode_batch(encode_batch(BATCH, as_maps=as_maps)) == BATCH


def test_vllm_034_map_layout_with_defaults_omitted_and_new_fields_ignored() -> None:
    stored = {
        "type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1, 2],
        "block_size": 2, "lora_id": None, "medium": "GPU", "lora_name": None,
        "kv_cache_spec_kind": "full_attention", "session_id": "s",
    }  # fmt: skip
    payload = msgpack.packb([2.0, [stored, {"type": "AllBlocksCleared"}], None])
    batch = decode_batch(payload)
    assert batch.events[0] == BlockStored((7,), None, (1, 2), 2, None, "GPU", None)
    assert batch.data_parallel_rank is None


def test_old_array_layouts_and_bytes_hashes() -> None:
    # vLLM before medium/lora_name: five fields; a hash as its digest bytes (last 8, big-endian).
    digest = bytes(24) + (258).to_bytes(8, "big")
    payload = msgpack.packb(
        [1.0, [["BlockStored", [digest], None, [1, 2, 3, 4], 4, None]]], use_bin_type=True
    )
    [event] = decode_batch(payload).events
    assert isinstance(event, BlockStored) and event.block_hashes == (258,) and event.medium is None
    # A negative int64 is the same 64 bits.
    [removed] = decode_batch(msgpack.packb([1.0, [["BlockRemoved", [-1], None]]])).events
    assert removed == BlockRemoved((2**64 - 1,), None)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1\xff garbage", "not msgpack"),
        (msgpack.packb({"a": 1}), "must be an array"),
        (msgpack.packb([1.0, [["Teleported", [1]]]]), "unknown event type 'Teleported'"),
        (msgpack.packb([1.0, [["BlockStored", [1], None]]]), "at least 4 needed"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [-3], 16]]]), "token_ids"),
        (msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]]]), "block_size"),
        (msgpack.packb([1.0, [["BlockRemoved", "x"]]]), "block_hashes must be a list"),
        (msgpack.packb([1.0, [["BlockRemoved", [1.5]]]]), "events\\[0\\].block_hashes\\[0\\]"),
        (msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1]}]]), "missing"),
        (msgpack.packb(["now", []]), "timestamp"),
        (msgpack.packb([1.0, [], "rank"]), "data_parallel_rank"),
    ],
)
def test_bad_batches_name_what_is_wrong(payload: bytes, message: str) -> None:
    with pytest.raises(BadEventError, match=message):
        decode_batch(payload)


@settings(max_examples=300, derandomize=True, database=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_bad_event(payload: bytes) -> None:
    with contextlib.suppress(BadEventError):
        decode_batch(payload)


def test_sequence_and_topic() -> None:
    assert decode_sequence((5).to_bytes(8, "big")) == 5
    with pytest.raises(BadEventError, match="8 bytes"):
        decode_sequence(b"\x01")
    assert parse_topic("kv@10.0.0.1:8000@Qwen/Qwen3-32B") == ("10.0.0.1:8000", "Qwen/Qwen3-32B")
    assert parse_topic("custom") == ("custom", "")
