"""vLLM's block hashes: known digests for tokens 1..32 in blocks of 16 (computed with vLLM 0.34's
definitions: pickle protocol 5 or canonical CBOR of (parent, tokens, extra_keys), NONE_HASH from the
default seed), and the rules around them."""

from __future__ import annotations

import pytest

from epick.kvcache import BlockHasher, event_hash
from epick.kvcache.vllm_hashing import hash_function, none_hash_seed

TOKENS = list(range(1, 33))


def test_sha256_matches_vllm() -> None:
    h = BlockHasher(16, "sha256")
    assert h.none_hash.hex() == "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198"
    first, second = h.block_hashes(TOKENS)
    assert first.hex() == "7b255da405e1d722823892e4fef187b4d8ac78215d7f0dd2137bb037547f4caf"
    assert second.hex() == "8e717becdc2054b7a3223b7b844f462c0db0ac86287b752b16d077ad0843c577"
    assert [event_hash(first), event_hash(second)] == [1403909460543360175, 1643945449041937783]


def test_sha256_cbor_matches_vllm() -> None:
    h = BlockHasher(16, "sha256_cbor")
    assert h.none_hash.hex() == "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"
    first = h.block_hashes(TOKENS[:16])[0]
    assert first.hex() == "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682"
    assert event_hash(first) == 8866452693264111234


def test_pythonhashseed_is_the_none_hash_seed() -> None:
    assert BlockHasher(16, "sha256_cbor", "42").none_hash == hash_function("sha256_cbor")("42")
    assert none_hash_seed("sha256", None) == "vllm-none-hash"
    # xxhash without PYTHONHASHSEED: random, as vLLM draws it.
    assert none_hash_seed("xxhash", None) != none_hash_seed("xxhash", None)
    assert len(BlockHasher(16, "xxhash_cbor", "0").none_hash) == 16


def test_chains_continue_and_partial_blocks_have_no_hash() -> None:
    h = BlockHasher(16, "sha256_cbor", "0")
    whole = h.block_hashes(TOKENS + [99] * 5)
    assert len(whole) == 2
    assert h.block_hashes(TOKENS[16:], parent=whole[0], first_block=1) == whole[1:]


def test_extra_keys_change_the_hash_where_vllm_puts_them() -> None:
    h = BlockHasher(16, "sha256_cbor", "0")
    plain = h.block_hashes(TOKENS)
    salted = h.block_hashes(TOKENS, cache_salt="s")
    lora = h.block_hashes(TOKENS, lora=("adapter", "/path"))
    assert salted[0] != plain[0] and lora[0] != plain[0] and lora[1] != plain[1]
    assert h.extra_keys(True, ("a", "/p"), "s") == (("lora", "a", "/p"), ("cache_salt", "s"))
    assert h.extra_keys(False, None, "s") is None
    legacy = BlockHasher(16, "sha256_cbor", "0", legacy_extra_keys=True)
    assert legacy.extra_keys(True, ("a", "/p"), "s") == ("a", "s")


def test_unknown_algorithm_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="sha256, sha256_cbor, xxhash, xxhash_cbor"):
        BlockHasher(16, "builtin")


def test_event_extra_keys_strip_the_tags_as_vllm_publishes_them() -> None:
    from epick.kvcache.vllm_hashing import event_extra_keys

    assert event_extra_keys((("lora", "a", "/p"), ("mm", "img0", -3), ("cache_salt", "s"))) == [
        "a",
        ("img0", -3),
        "s",
    ]
    assert event_extra_keys(None) is None and event_extra_keys(("bare",)) == ["bare"]
