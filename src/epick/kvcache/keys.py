"""The index's own block keys ("request keys", llm-d-kv-cache's dual-key design): chained hashes of a
request's full blocks of `block_size` tokens, rooted in the model name and a seed.

Both sides of the index compute them the same way: the request side from the prompt's token ids,
the event side from the token ids a `BlockStored` event carries. So they meet whatever hash
algorithm, seed and block size the engine uses (its own hashes, the "engine keys", are only mapped
to request keys, for `BlockRemoved`).

Each block's key is XXH64 of its token ids (little-endian uint32) and of its extra keys (per key:
LE64 length, then the UTF-8 bytes), seeded with the parent's key; the root is XXH64 of the model
name, seeded with XXH64 of `hashSeed`. A partial last block has no key. Deviation, on purpose:
llm-d-router computes the same chain with FNV-64a over canonical CBOR (`cbor-fnv`, its default) or
XXH64 over the parent and the block (`xxh64`); epick accepts both names and computes its own: request
keys never leave the process (epick has no shared Redis index), and seeding XXH64 with the parent
costs 0.2 µs per block in Python where FNV costs about 20.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import xxhash

HASH_ALGORITHMS = ("cbor-fnv", "xxh64")
_xxh64 = xxhash.xxh64_intdigest
_LE64 = struct.Struct("<Q")


def _le32(tokens: Sequence[int], n: int) -> bytes:
    try:
        packed = array("I", tokens if n == len(tokens) else tokens[:n])
    except (OverflowError, TypeError) as e:
        raise ValueError(f"a token id outside 0..2^32-1: {e}") from None
    if sys.byteorder != "little":
        packed.byteswap()
    return packed.tobytes()


def extra_bytes(keys: Sequence[str]) -> bytes:
    """A block's extra keys as both XXH64 chains hash them: per key, its length (8 bytes little-endian),
    then its UTF-8 bytes."""
    return b"".join(_LE64.pack(len(raw)) + raw for raw in (k.encode() for k in keys))


class BlockKeys(Protocol):
    """What turns token ids into request keys: epick's `TokenProcessor`, or llm-d's
    (`epick.kvcache.upstream_keys.UpstreamTokenProcessor`) for an index shared with Go EPPs."""

    @property
    def block_size(self) -> int: ...

    def keys(
        self,
        token_ids: Sequence[int],
        model: str,
        *,
        parent: int | None = None,
        extra: Sequence[Sequence[str] | None] | None = None,
    ) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class TokenProcessor:
    """Turns token ids into request keys (llm-d's `tokenProcessorConfig`)."""

    block_size: int = 16
    hash_seed: str = ""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("blockSizeTokens must be positive")

    def root(self, model: str) -> int:
        return _xxh64(model.encode(), _xxh64(self.hash_seed.encode()))

    def keys(
        self,
        token_ids: Sequence[int],
        model: str,
        *,
        parent: int | None = None,
        extra: Sequence[Sequence[str] | None] | None = None,
    ) -> list[int]:
        """The keys of the full blocks of `token_ids`, chained on from `parent` (None: the model's
        root). `extra[i]`, when given, are block i's extra keys (strings: a cache salt, ...)."""
        bs = self.block_size
        n = len(token_ids) // bs
        if n == 0:
            return []
        data = _le32(token_ids, n * bs)
        width = 4 * bs
        prev = self.root(model) if parent is None else parent
        out = []
        for i in range(n):
            block = data[i * width : (i + 1) * width]
            keys = extra[i] if extra is not None and i < len(extra) else None
            if keys:
                block += extra_bytes(keys)
            prev = _xxh64(block, prev)
            out.append(prev)
        return out
