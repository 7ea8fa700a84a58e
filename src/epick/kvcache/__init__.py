"""Precise prefix-cache state from the engines' own KV events (llm-d-kv-cache's design): vLLM's block
hashes and event format, the index's request keys, the block index and its longest-prefix scoring.
Pure: the ZMQ subscribers that feed it live in the data layer."""

from epick.kvcache.events import (
    AllBlocksCleared,
    BadEventError,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEvent,
    decode_batch,
    decode_sequence,
    encode_batch,
    parse_topic,
)
from epick.kvcache.index import DEFAULT_TIER_WEIGHTS, SPECULATIVE, BlockIndex, Entry, longest_prefix_scores
from epick.kvcache.keys import TokenProcessor
from epick.kvcache.sink import KVEventSink, KVEventsSettings
from epick.kvcache.tracker import EventTracker, TrackerStats
from epick.kvcache.vllm_hashing import HASH_ALGORITHMS, BlockHasher, event_hash

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "HASH_ALGORITHMS",
    "SPECULATIVE",
    "AllBlocksCleared",
    "BadEventError",
    "BlockHasher",
    "BlockIndex",
    "BlockRemoved",
    "BlockStored",
    "Entry",
    "EventBatch",
    "EventTracker",
    "KVEvent",
    "KVEventSink",
    "KVEventsSettings",
    "TokenProcessor",
    "TrackerStats",
    "decode_batch",
    "decode_sequence",
    "encode_batch",
    "event_hash",
    "longest_prefix_scores",
    "parse_topic",
]
