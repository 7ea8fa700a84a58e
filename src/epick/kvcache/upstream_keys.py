"""Request keys computed as llm-d-router computes them (pkg/kvcache/kvblock/token_processor.go at
ebab687), for an index shared with a Go EPP through Redis: both must put a prompt's blocks under the
same keys.

- `cbor-fnv` (upstream's default): a block's key is FNV-1a 64 of the canonical CBOR encoding of the
  array [parent, tokens, extra]: the parent key as an unsigned integer, the block's token ids as an
  array of unsigned integers, and the block's extra keys as an array of {"Hash": text} maps (null when
  it has none). The chain's root is the key of [seed hash, null, model name], the seed hash being
  FNV-1a 64 of `hashSeed`.
- `xxh64`: a block's key is XXH64 (seed 0) of the parent key (8 bytes little-endian), the token ids
  (4 bytes little-endian each) and each extra key (its length in 8 bytes little-endian, then its
  UTF-8 bytes). The root is that digest of the seed hash (XXH64 of `hashSeed`) with the model name as
  the one extra key and no tokens.

Only full blocks have keys. Extra keys are per block, as `TokenProcessor.keys` takes them (the cache
salt in the first block's, after multimodal hashes). epick's own keys (epick.kvcache.keys) cost a
fifth of these and stay the default for an index nobody else reads.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import cbor2
import xxhash

from epick.kvcache.keys import _le32, extra_bytes

ALGORITHMS = ("cbor-fnv", "xxh64")
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF
_LE64 = struct.Struct("<Q")


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64 bits (Go's hash/fnv New64a)."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def cbor_payload(parent: int, tokens: Sequence[int] | None, extra: object) -> bytes:
    """The canonical CBOR of [parent, tokens, extra], as fxamacker/cbor's canonical mode writes it
    (a nil slice as null)."""
    return cbor2.dumps([parent, None if tokens is None else list(tokens), extra], canonical=True)


@dataclass(frozen=True, slots=True)
class UpstreamTokenProcessor:
    """llm-d-router's `chunkedTokenDatabase`: the same interface as `TokenProcessor`."""

    block_size: int = 16
    hash_seed: str = ""
    algorithm: str = "cbor-fnv"
    _seed: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("blockSizeTokens must be positive")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"hashAlgorithm {self.algorithm!r}: accepted values are cbor-fnv and xxh64")
        seed = self.hash_seed.encode()
        object.__setattr__(self, "_seed", xxhash.xxh64_intdigest(seed) if self.xxh64 else fnv1a_64(seed))

    @property
    def xxh64(self) -> bool:
        return self.algorithm == "xxh64"

    def root(self, model: str) -> int:
        if self.xxh64:
            return xxhash.xxh64_intdigest(_LE64.pack(self._seed) + extra_bytes((model,)))
        return fnv1a_64(cbor_payload(self._seed, None, model))

    def keys(
        self,
        token_ids: Sequence[int],
        model: str,
        *,
        parent: int | None = None,
        extra: Sequence[Sequence[str] | None] | None = None,
    ) -> list[int]:
        """The keys of the full blocks of `token_ids`, chained on from `parent` (None: the model's
        root). `extra[i]`, when given, are block i's extra keys."""
        bs = self.block_size
        n = len(token_ids) // bs
        if n == 0:
            return []
        prev = self.root(model) if parent is None else parent
        out = []
        if self.xxh64:
            data = _le32(token_ids, n * bs)
            width = 4 * bs
            for i in range(n):
                block = _LE64.pack(prev) + data[i * width : (i + 1) * width]
                keys = extra[i] if extra is not None and i < len(extra) else None
                if keys:
                    block += extra_bytes(keys)
                prev = xxhash.xxh64_intdigest(block)
                out.append(prev)
            return out
        for i in range(n):
            keys = extra[i] if extra is not None and i < len(extra) else None
            hashes = [{"Hash": k} for k in keys] if keys else None
            prev = fnv1a_64(cbor_payload(prev, token_ids[i * bs : (i + 1) * bs], hashes))
            out.append(prev)
        return out
