"""vLLM's prefix-cache block hashes (v1 engine, vllm/v1/core/kv_cache_utils.py and
vllm/utils/hashing.py, as of vLLM 0.34), so that a simulated engine publishes the block hashes a real
vLLM would publish for the same tokens.

A full block's hash is `hash_fn((parent, tuple(token_ids), extra_keys))`: `parent` is the previous
block's hash (`NONE_HASH` for the first block), `extra_keys` a tuple of tagged keys or None. The
functions (`--prefix-caching-hash-algo`): `sha256` (pickle protocol 5, the default), `sha256_cbor`
(canonical CBOR), `xxhash` and `xxhash_cbor` (xxh3-128 of the same). `NONE_HASH` is
`hash_fn(seed)`, the seed being `PYTHONHASHSEED` when set, else "vllm-none-hash" for the sha256
functions (the xxhash ones draw a random seed, so they need PYTHONHASHSEED to be reproducible).
Events carry each hash as the digest's last 8 bytes, big-endian (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`,
on by default).

Extra keys, in vLLM's order: `("lora", name, path)` on every block of a LoRA request, then
`("cache_salt", salt)` on the first block. (Multimodal and prompt-embedding keys are not modelled.)
vLLM before 0.34 used untagged keys and a random `NONE_HASH` without PYTHONHASHSEED; the
`legacy_extra_keys` switch spells the keys the old way.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
import xxhash

HASH_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
DEFAULT_ALGORITHM = "sha256"
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

HashFn = Callable[[Any], bytes]


def _sha256(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(value: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def _xxhash(value: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(value: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(value, canonical=True))


_FUNCTIONS: dict[str, HashFn] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def hash_function(name: str) -> HashFn:
    try:
        return _FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown prefix-caching hash algorithm {name!r}; vLLM's are {', '.join(HASH_ALGORITHMS)}"
        ) from None


def none_hash_seed(algorithm: str, pythonhashseed: str | None) -> str:
    """The string vLLM hashes into NONE_HASH: PYTHONHASHSEED, else a fixed or random one."""
    if pythonhashseed is not None:
        return pythonhashseed
    if algorithm.startswith("xxhash"):
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def event_hash(digest: bytes) -> int:
    """A block hash as vLLM's KV events carry it: the digest's last 8 bytes, big-endian."""
    return int.from_bytes(digest[-8:], "big")


class BlockHasher:
    """vLLM's chain of block hashes for one algorithm, block size and seed."""

    def __init__(
        self,
        block_size: int,
        algorithm: str = DEFAULT_ALGORITHM,
        pythonhashseed: str | None = None,
        *,
        legacy_extra_keys: bool = False,
    ) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.algorithm = algorithm
        self.fn = hash_function(algorithm)
        self.none_hash = self.fn(none_hash_seed(algorithm, pythonhashseed))
        self.legacy_extra_keys = legacy_extra_keys

    def extra_keys(
        self, first_block: bool, lora: tuple[str, str] | None, cache_salt: str
    ) -> tuple[Any, ...] | None:
        keys: list[Any] = []
        if lora is not None:
            keys.append(lora[0] if self.legacy_extra_keys else ("lora", lora[0], lora[1]))
        if first_block and cache_salt:
            keys.append(cache_salt if self.legacy_extra_keys else ("cache_salt", cache_salt))
        return tuple(keys) if keys else None

    def block_hashes(
        self,
        token_ids: Sequence[int],
        *,
        parent: bytes | None = None,
        first_block: int = 0,
        lora: tuple[str, str] | None = None,
        cache_salt: str = "",
    ) -> list[bytes]:
        """The hashes of the full blocks of `token_ids`, chained on from `parent` (None: the start of
        a request; `first_block` is then the index of the first block, for the salt)."""
        bs = self.block_size
        out: list[bytes] = []
        prev = parent or self.none_hash
        for i in range(len(token_ids) // bs):
            extra = self.extra_keys(first_block + i == 0, lora, cache_salt)
            prev = self.fn((prev, tuple(token_ids[i * bs : (i + 1) * bs]), extra))
            out.append(prev)
        return out


def event_extra_keys(keys: tuple[Any, ...] | None) -> list[Any] | None:
    """A block's extra keys as vLLM's events carry them (`to_event_extra_keys`): tags stripped, a
    multimodal key ("mm", id, offset) as (id, offset), any other (tag, value, ...) as its value."""
    if not keys:
        return None
    out: list[Any] = []
    for key in keys:
        if isinstance(key, tuple) and len(key) >= 3 and key[0] == "mm":
            out.append((key[1], key[2]))
        elif isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str):
            out.append(key[1])
        else:
            out.append(key)
    return out
