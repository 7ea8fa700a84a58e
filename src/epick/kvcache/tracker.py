"""Applies an endpoint's KV events to the index, with llm-d-kv-cache's semantics
(pkg/kvevents/pool.go, processEventBatch; the dual-key design of docs/architecture.md).

- `BlockStored` with token ids: the request keys are computed from the event's tokens, chained on
  from the request key its parent engine block was stored under (the model's root for a first
  block); a parent never seen means the chain cannot be placed, and the event is skipped (counted).
  The model is the event's `lora_name` when it has one, else the topic's. Extra keys that are
  strings (a cache salt, a multimodal item's id) enter the block's key, the LoRA name excepted (it
  is in the root). Engine blocks map to the request blocks they overlap, so the engine's block size
  need not equal the index's. An event whose tokens end inside one of the index's blocks leaves a
  tail (the tokens since the last full block, for its last engine block): the next event chained on
  that block continues it, so chunked prefills and decode steps index whole prompts. A child of an
  engine block in the middle of an index block (another request branching there) cannot be placed,
  and is skipped as one of an unknown parent.
- `BlockStored` without tokens (a block offloaded to another tier): the tier is added to the
  request keys the engine block already maps to.
- `BlockRemoved`: the endpoint's entry on that tier leaves those request keys.
- `AllBlocksCleared`: the endpoint leaves the index.

The tier is the event's `medium`, lower-cased ("gpu" when absent).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from epick.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epick.kvcache.index import BlockIndex
from epick.kvcache.keys import BlockKeys

MAX_TAILS = 65_536  # engine blocks remembered as ending inside an index block, least recent dropped


@dataclass(slots=True)
class TrackerStats:
    batches: int = 0
    stored: int = 0  # BlockStored events applied
    removed: int = 0  # engine blocks removed
    cleared: int = 0
    skipped_unknown_parent: int = 0
    skipped_partial: int = 0  # tokens too few for one of the index's blocks


class EventTracker:
    def __init__(self, index: BlockIndex, processor: BlockKeys) -> None:
        self.index = index
        self.processor = processor
        self.stats = TrackerStats()
        # Engine blocks that end inside one of the index's blocks (the last of an event whose tokens
        # do not fill the index's last block): the request key before them and the tokens since.
        self._tails: OrderedDict[int, tuple[int | None, tuple[int, ...]]] = OrderedDict()

    def apply(self, pod: str, model: str, batch: EventBatch) -> None:
        self.stats.batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(pod, model, event)
            elif isinstance(event, BlockRemoved):
                tier = (event.medium or "gpu").lower()
                for h in event.block_hashes:
                    self.index.evict(h, (pod, tier))
                    self._tails.pop(h, None)
                self.stats.removed += len(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.index.clear(pod)
                self.stats.cleared += 1

    def _stored(self, pod: str, model: str, event: BlockStored) -> None:
        index = self.index
        entry = (pod, (event.medium or "gpu").lower())
        if not event.token_ids:  # the same blocks, on another tier
            for h in event.block_hashes:
                known = index.request_keys_of(h)
                if known:
                    index.add(known, entry)
            self.stats.stored += 1
            return
        parent: int | None = None
        pending: tuple[int, ...] = ()
        if event.parent_block_hash is not None:
            tail = self._tails.get(event.parent_block_hash)
            if tail is not None:  # the parent ended inside one of the index's blocks
                parent, pending = tail
            else:
                mapped = index.request_keys_of(event.parent_block_hash)
                if not mapped:
                    self.stats.skipped_unknown_parent += 1
                    return
                parent = mapped[-1]
        bs = self.processor.block_size
        ebs = event.block_size
        tokens = pending + event.token_ids if pending else event.token_ids
        offset = len(pending)
        extra = _extra_keys(event, bs, offset)
        keys = self.processor.keys(tokens, event.lora_name or model, parent=parent, extra=extra)
        n = len(keys)
        if keys:
            index.add(keys, entry)
        for j, h in enumerate(event.block_hashes):
            first, last = (offset + j * ebs) // bs, (offset + (j + 1) * ebs - 1) // bs
            if first >= n:
                break
            index.map_engine(h, tuple(keys[first : min(last, n - 1) + 1]))
        covered = n * bs
        if len(tokens) > covered and event.block_hashes:
            # Its last block ends inside an index block: a child event continues from here.
            tails = self._tails
            tails[event.block_hashes[-1]] = (keys[-1] if keys else parent, tuple(tokens[covered:]))
            if len(tails) > MAX_TAILS:
                tails.popitem(last=False)
        elif not keys:
            self.stats.skipped_partial += 1
            return
        self.stats.stored += 1


def _extra_keys(event: BlockStored, block_size: int, offset: int = 0) -> list[list[str] | None] | None:
    """The string extra keys of each of the index's blocks, from the engine's per-block keys (the
    event's tokens start `offset` tokens into the first index block)."""
    raw = event.extra_keys
    if not raw:
        return None
    n = (offset + len(event.token_ids)) // block_size
    out: list[list[str] | None] = [None] * n
    for j, keys in enumerate(raw):
        if not keys:
            continue
        i = (offset + j * event.block_size) // block_size
        if i >= n:
            break
        items = keys if isinstance(keys, list | tuple) else [keys]
        strings = [k for k in items if isinstance(k, str) and k != event.lora_name]
        if strings:
            out[i] = [*(out[i] or []), *strings]
    return out
