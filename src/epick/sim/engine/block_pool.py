"""KV-cache blocks: reference counts, an LRU queue of free blocks, and the hash → block map.

Invariants: a block is in the free queue iff its ref count is 0; a block with a hash is the one the
map points to for that hash; a freed block keeps its hash (its contents stay reusable) until it is
evicted, least recently freed first.

The queue starts as every block in id order. Blocks never used yet are its head and are not stored:
`_fresh` is the next of them, and blocks from `_fresh` to the end come out before any freed block
(a fleet of 256 engines with 27,000 blocks each would otherwise spend seconds building queues).

Anonymous blocks. A block without a hash is interchangeable with any other; only its place in the
free queue matters. `take_anonymous(n)` and `release_anonymous(n)` move such blocks as counts: a
released run of them is one queue entry (a negative key; its length in `_runs`), and their ids wait
in `_anonymous` until a block of a run must be named (`allocate` taking from a run, or
`name_anonymous` for a holder that needs ids). The fleet's engine holds the blocks that decoding
requests fill this way (epick.sim.engine.cohort). Ref counts are kept for named blocks only.
"""

from __future__ import annotations

import itertools
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
    cache_salt: str = ""  # the storing request's (it is part of a chain's first block hash in vLLM)


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
        self._anonymous: list[int] = []  # ids of the blocks held or freed anonymously
        self._runs: dict[int, int] = {}  # key in `free` of a run of anonymous free blocks -> length
        self._run_keys = itertools.count(-1, -1)
        self._free_in_runs = 0
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.events: list[KVEvent] = []
        self.record_events = record_events  # off when nobody listens (fleet simulation)

    @property
    def num_free(self) -> int:
        return len(self.free) - len(self._runs) + self._free_in_runs + self.num_blocks - self._fresh

    def free_block_ids(self) -> list[int]:
        """The named blocks of the free queue, head first."""
        return [*range(self._fresh, self.num_blocks), *(b for b in self.free if b >= 0)]

    def free_hashes(self) -> list[int | None]:
        """The free queue, head first, as the hash each block holds (None: none)."""
        out: list[int | None] = [None] * (self.num_blocks - self._fresh)
        for key in self.free:
            if key >= 0:
                out.append(self.block_hash[key])
            else:
                out.extend([None] * self._runs[key])
        return out

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
        self.take_anonymous(n)
        return self.name_anonymous(n)

    def _take_from_run(self, key: int, n: int) -> int:
        """Up to n blocks from the run just popped from the queue's head; the rest goes back there."""
        length = self._runs.pop(key)
        taken = min(length, n)
        self._free_in_runs -= taken
        if length > taken:
            self._runs[key] = length - taken
            self.free[key] = None
            self.free.move_to_end(key, last=False)
        return taken

    def take_anonymous(self, n: int) -> None:
        """n blocks, as a count (the caller checked `num_free`): what `allocate` would take, unnamed."""
        fresh = min(n, self.num_blocks - self._fresh)
        if fresh:
            self._anonymous.extend(range(self._fresh, self._fresh + fresh))
            self._fresh += fresh
            n -= fresh
        removed = []
        pop = self.free.popitem
        while n:
            block_id = pop(last=False)[0]
            if block_id < 0:
                n -= self._take_from_run(block_id, n)  # their ids are in _anonymous already
                continue
            old = self.block_hash[block_id]
            if old is not None:
                del self.cached[old]
                self.block_hash[block_id] = None
                removed.append(old)
            self._anonymous.append(block_id)
            n -= 1
        if removed and self.record_events:
            self.events.append(BlockRemoved(removed))

    def name_anonymous(self, n: int) -> list[int]:
        """Ids for n blocks held anonymously (each now a named block with one reference)."""
        if n <= 0:
            return []
        ids = self._anonymous[-n:]
        del self._anonymous[-n:]
        ref_count = self.ref_count
        for block_id in ids:
            ref_count[block_id] = 1
        return ids

    def release_anonymous(self, n: int) -> None:
        """n blocks held anonymously join the free queue's tail, as one run."""
        if n <= 0:
            return
        self._free_in_runs += n
        if self.free:
            last = next(reversed(self.free))
            if last < 0:
                self._runs[last] += n
                return
        key = next(self._run_keys)
        self._runs[key] = n
        self.free[key] = None

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
        *,
        cache_salt: str = "",
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
        self.events.append(
            BlockStored([block_hash], parent, list(token_ids), self.block_size, lora_id, cache_salt)
        )

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
