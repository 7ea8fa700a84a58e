"""KV-cache blocks: reference counts, an LRU queue of free blocks, and the hash → block map.

Invariants: a block is in the free queue iff its ref count is 0; a block with a hash is the one the
map points to for that hash; a freed block keeps its hash (its contents stay reusable) until it is
evicted, least recently freed first.

The queue starts as every block in id order. Blocks never used yet are its head and are not stored:
`_fresh` is the next of them, and blocks from `_fresh` to the end come out before any freed block
(a fleet of 256 engines with 27,000 blocks each would otherwise spend seconds building queues).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int, *, record_events: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict()  # freed blocks, after the fresh ones
        self._fresh = 0  # blocks _fresh.. have never been used: the head of the free queue
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.events: list[KVEvent] = []
        self.record_events = record_events  # off when nobody listens (fleet simulation)

    @property
    def num_free(self) -> int:
        return len(self.free) + self.num_blocks - self._fresh

    def free_block_ids(self) -> list[int]:
        """The free queue, head first."""
        return [*range(self._fresh, self.num_blocks), *self.free]

    def usage(self) -> float:
        """Share of blocks in use by requests (cached free blocks count as free, as in vLLM)."""
        return 1.0 - self.num_free / self.num_blocks

    def lookup(self, block_hash: int) -> int | None:
        return self.cached.get(block_hash)

    def touch(self, block_id: int) -> None:
        """Take a reference on a (possibly free, cached) block."""
        if self.ref_count[block_id] == 0:
            del self.free[block_id]
        self.ref_count[block_id] += 1

    def allocate(self, n: int) -> list[int]:
        """n new blocks, evicting the least recently freed; the caller checked `num_free`."""
        fresh = min(n, self.num_blocks - self._fresh)
        if fresh:
            start = self._fresh
            self._fresh += fresh
            out = list(range(start, start + fresh))
            self.ref_count[start : start + fresh] = [1] * fresh
            if fresh == n:
                return out
            n -= fresh
        else:
            out = []
        removed = []
        pop = self.free.popitem
        hashes = self.block_hash
        cached = self.cached
        ref_count = self.ref_count
        for _ in range(n):
            block_id = pop(last=False)[0]
            old = hashes[block_id]
            if old is not None:
                del cached[old]
                hashes[block_id] = None
                removed.append(old)
            ref_count[block_id] = 1
            out.append(block_id)
        if removed and self.record_events:
            self.events.append(BlockRemoved(removed))
        return out

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference on each block, in order; blocks reaching 0 join the free queue's tail."""
        ref_count = self.ref_count
        free = self.free
        for block_id in block_ids:
            left = ref_count[block_id] - 1
            ref_count[block_id] = left
            if not left:
                free[block_id] = None

    def cache_full_block(
        self,
        block_id: int,
        block_hash: int,
        parent: int | None,
        token_ids: Sequence[int],  # for the BlockStored event (empty when events are off)
        lora_id: int | None,
    ) -> None:
        if self.block_hash[block_id] is not None or block_hash in self.cached:
            return  # already cached (here or in an identical block)
        self.block_hash[block_id] = block_hash
        self.cached[block_hash] = block_id
        if not self.record_events:
            return
        last = self.events[-1] if self.events else None
        if (
            isinstance(last, BlockStored)
            and last.lora_id == lora_id
            and last.block_hashes
            and last.block_hashes[-1] == parent
        ):
            # Extend the previous event of this chain, as vLLM batches a request's new blocks.
            last.block_hashes.append(block_hash)
            last.token_ids.extend(token_ids)
            return
        self.events.append(BlockStored([block_hash], parent, list(token_ids), self.block_size, lora_id))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash (vLLM's reset); refused while blocks are in use."""
        if self.num_free != self.num_blocks:
            return False
        self.cached.clear()
        self.block_hash = [None] * self.num_blocks
        self.events.append(AllBlocksCleared())
        return True

    def drain_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events
