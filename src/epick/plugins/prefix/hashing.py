"""Block hashes of a prompt, as the Go EPP's approximate prefix index computes them.

The prompt's UTF-8 bytes are cut into blocks of `block_bytes` bytes (at most `max_blocks` of them;
the scorer's `blockSizeTokens` × 4, or GIE's older `hashBlockSize`). The chain starts from
xxhash64(model name ‖ NUL ‖ cache_salt); each block's hash is xxhash64 of the block seeded with the
previous hash. The Go EPP appends the previous hash to the block instead; both make a block's hash
depend on everything before it, and the seeded form is one call per block (40% faster here). The
values differ from Go's, which nothing outside epick ever sees. The trailing partial block is hashed
too (as the GIE's prefix-cache proposal describes it: docs/proposals/0602-prefix-cache-aware-routing-
proposal/README.md), so prompts shorter than one block still find the endpoint that served them;
the Go EPP v1.x drops that block, which gives a short prompt no affinity at all.
"""

from __future__ import annotations

import xxhash

_xxh64 = xxhash.xxh64_intdigest


def prompt_block_hashes(
    text: str, model: str, *, block_bytes: int, max_blocks: int, cache_salt: str = ""
) -> list[int]:
    data = text.encode()
    size = block_bytes
    limit = size * max_blocks
    if len(data) > limit:
        data = data[:limit]
    prev = _xxh64(f"{model}\0{cache_salt}".encode())  # NUL: ('ab', 'c') and ('a', 'bc') differ
    hashes = []
    for start in range(0, len(data), size):
        prev = _xxh64(data[start : start + size], prev)
        hashes.append(prev)
    return hashes
