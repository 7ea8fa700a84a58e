"""Blocks per request and automatic prefix caching, over a `BlockPool`.

A full block's hash covers its tokens, its parent block's hash and the request's LoRA adapter and
cache salt (both in the chain's root), so equal hashes mean equal prefixes (xxhash64: the same in
every process). Only full blocks are cached. When a whole prompt is cached, its last block is
recomputed anyway (a step needs at least one token to produce the next), as in vLLM.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence

import xxhash

from epick.sim.engine.block_pool import BlockPool
from epick.sim.engine.request import SimRequest

_xxh64 = xxhash.xxh64_intdigest
_WIDE = b"\xff"  # marks a block holding a token id of 2**16 or more (stored as 4 bytes per token)


def _root(lora_id: int | None, cache_salt: str = "") -> int:
    """The seed of a chain's first block: one per adapter (and cache salt), so adapters (and
    salts) never share blocks."""
    root = b"" if lora_id is None else b"lora:%d" % lora_id
    if cache_salt:
        root += b"\x00salt:" + cache_salt.encode("utf-8", "surrogatepass")
    return _xxh64(root)


def block_hash(parent: int | None, tokens: Sequence[int], lora_id: int | None) -> int:
    """A full block's hash: xxhash64 of its token ids, seeded with its parent block's hash (the
    chain's root for the first block), so equal hashes mean equal prefixes."""
    return chain_hashes(tokens, 0, 1, block_size=len(tokens), parent=parent, lora_id=lora_id)[0]


def chain_hashes(
    tokens: Sequence[int],
    start: int,
    end: int,
    *,
    block_size: int,
    parent: int | None,
    lora_id: int | None,
    cache_salt: str = "",
) -> list[int]:
    """The hashes of full blocks start … end−1 of `tokens`, chained on from `parent` (block start−1's).

    A block is hashed as its token ids in 16 bits each (one buffer for the whole range, sliced per
    block: a call per block and no int objects); a block holding a larger id is hashed in 32 bits
    with a marker, so the same tokens hash the same whatever sequence type holds them."""
    seed = parent if parent is not None else _root(lora_id, cache_salt)
    lo, hi = start * block_size, end * block_size
    if isinstance(tokens, array) and tokens.typecode == "H":
        data = tokens[lo:hi].tobytes()
    else:
        part = tokens[lo:hi]
        try:
            data = struct.pack(f"={len(part)}H", *part)  # as array("H").tobytes(), three times faster
        except struct.error:
            return _chain_wide(tokens, lo, hi, block_size, seed)
    hashes = []
    width = 2 * block_size
    for offset in range(0, len(data), width):
        seed = _xxh64(data[offset : offset + width], seed)
        hashes.append(seed)
    return hashes


def _chain_wide(tokens: Sequence[int], lo: int, hi: int, block_size: int, seed: int) -> list[int]:
    hashes = []
    for i in range(lo, hi, block_size):
        block = tokens[i : i + block_size]
        try:
            data = array("H", block).tobytes()
        except OverflowError:
            data = _WIDE + array("I", block).tobytes()
        seed = _xxh64(data, seed)
        hashes.append(seed)
    return hashes


class KVCacheManager:
    def __init__(
        self, pool: BlockPool, enable_prefix_caching: bool = True, cache_outputs: bool = True
    ) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.cache_outputs = cache_outputs  # also offer blocks of generated tokens (vLLM does)

    def _extend_hashes(self, req: SimRequest, upto_tokens: int) -> None:
        bs = self.block_size
        hashes = req.block_hashes
        want = upto_tokens // bs
        if want <= len(hashes):
            return
        lora_id = req.lora_id
        salt = req.cache_salt
        in_prompt = min(want, req.num_prompt // bs)  # blocks read straight from the prompt
        if in_prompt > len(hashes):
            parent = hashes[-1] if hashes else None
            have = len(hashes)
            hashes += chain_hashes(
                req.prompt_token_ids,
                have,
                in_prompt,
                block_size=bs,
                parent=parent,
                lora_id=lora_id,
                cache_salt=salt,
            )
        have = len(hashes)
        if have < want:  # blocks holding generated tokens: spelled once, then hashed
            tokens = req.tokens(have * bs, want * bs)
            parent = hashes[-1] if hashes else None
            hashes += chain_hashes(
                tokens, 0, want - have, block_size=bs, parent=parent, lora_id=lora_id, cache_salt=salt
            )

    def computed_blocks(self, req: SimRequest) -> list[int]:
        """The cached blocks that hold a prefix of this request's tokens (none when caching is off)."""
        if not self.enable_prefix_caching:
            return []
        # At least the last token is always computed: cap the hit below the full length.
        max_blocks = (req.num_tokens - 1) // self.block_size
        self._extend_hashes(req, max_blocks * self.block_size)
        found = []
        for h in req.block_hashes[:max_blocks]:
            block_id = self.pool.lookup(h)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def allocate(self, req: SimRequest, num_new_tokens: int, computed: list[int] | None = None) -> bool:
        """Give `req` blocks for `num_new_tokens` more tokens (after `computed` cached blocks).

        Returns False, changing nothing, when the pool cannot supply them: the caller may preempt.
        """
        bs = self.block_size
        if not computed:
            total_tokens = req.num_computed_tokens + num_new_tokens
            if total_tokens <= len(req.block_ids) * bs:
                return True  # fits in the blocks it has (most decode steps)
            computed = []
        total_tokens = req.num_computed_tokens + len(computed) * bs + num_new_tokens
        needed = -(-total_tokens // bs) - len(req.block_ids) - len(computed)
        # Cached blocks about to be touched are free now but will not be once touched.
        if computed:
            ref_count = self.pool.ref_count
            reusable_free = sum(1 for b in computed if ref_count[b] == 0)
            if needed > self.pool.num_free - reusable_free:
                return False
            for b in computed:
                self.pool.touch(b)
            req.block_ids.extend(computed)
        elif needed > self.pool.num_free:
            return False
        if needed > 0:
            req.block_ids.extend(self.pool.allocate(needed))
        return True

    def cache_full_blocks(self, req: SimRequest, num_computed_tokens: int) -> None:
        """Register the blocks that are full once `num_computed_tokens` of `req` are computed."""
        if not self.enable_prefix_caching:
            return
        if not self.cache_outputs and num_computed_tokens > req.num_prompt_tokens:
            num_computed_tokens = req.num_prompt_tokens
        bs = self.block_size
        full = num_computed_tokens // bs
        if full <= req.num_registered_blocks:
            return
        self._extend_hashes(req, full * bs)
        pool = self.pool
        hashes = req.block_hashes
        start = req.num_registered_blocks
        if full > start:
            req.num_registered_blocks = full
        block_ids = req.block_ids
        if not pool.record_events:
            # What BlockPool.cache_full_block does, inlined: this runs for every block of every prompt.
            block_hash_of = pool.block_hash
            cached = pool.cached
            for i in range(start, full):
                block_id = block_ids[i]
                h = hashes[i]
                if block_hash_of[block_id] is None and h not in cached:
                    block_hash_of[block_id] = h
                    cached[h] = block_id
            return
        for i in range(start, full):
            block_id = block_ids[i]
            if pool.block_hash[block_id] == hashes[i]:
                continue
            parent = hashes[i - 1] if i else None
            pool.cache_full_block(
                block_id,
                hashes[i],
                parent,
                req.tokens(i * bs, (i + 1) * bs),
                req.lora_id,
                cache_salt=req.cache_salt,
            )

    def free(self, req: SimRequest) -> None:
        # Tail blocks first, so a request's later blocks are evicted before its prefix (as vLLM);
        # anonymous blocks are its tail.
        if req.anonymous_blocks:
            self.pool.release_anonymous(req.anonymous_blocks)
            req.anonymous_blocks = 0
        self.pool.release(req.block_ids[::-1])
        req.block_ids = []
        req.num_registered_blocks = 0
