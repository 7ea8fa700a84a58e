"""Block hashes of the engine's prefix cache: a chain over token ids, whatever holds them."""

from __future__ import annotations

import random
from array import array

from epick.sim.engine.kv_cache import block_hash, chain_hashes

TOKENS = tuple(random.Random(3).randrange(65536) for _ in range(16 * 6))


def chain(tokens: object, lora_id: int | None = None) -> list[int]:
    return chain_hashes(tokens, 0, 6, block_size=16, parent=None, lora_id=lora_id)  # type: ignore[arg-type]


def test_the_same_tokens_hash_the_same_in_any_sequence_type() -> None:
    assert chain(TOKENS) == chain(list(TOKENS)) == chain(array("H", TOKENS)) == chain(array("I", TOKENS))


def test_a_chain_continues_from_its_parent() -> None:
    whole = chain(TOKENS)
    head = chain_hashes(TOKENS, 0, 2, block_size=16, parent=None, lora_id=None)
    tail = chain_hashes(TOKENS, 2, 6, block_size=16, parent=head[-1], lora_id=None)
    assert head + tail == whole
    assert block_hash(whole[2], TOKENS[48:64], None) == whole[3]
    assert len(set(whole)) == 6


def test_a_hash_stands_for_the_whole_prefix_and_the_adapter() -> None:
    changed = list(TOKENS)
    changed[40] ^= 1  # a token of block 2
    other = chain(changed)
    base = chain(TOKENS)
    assert other[:2] == base[:2]
    assert all(x != y for x, y in zip(other[2:], base[2:], strict=True))
    assert chain(TOKENS, lora_id=1) != base
    assert chain(TOKENS, lora_id=1) != chain(TOKENS, lora_id=2)


def test_token_ids_past_16_bits_hash_their_own_blocks_only() -> None:
    wide = list(TOKENS)
    wide[70] = 70_000  # block 4
    hashes = chain(wide)
    base = chain(TOKENS)
    assert hashes[:4] == base[:4]  # the blocks before it hash as they do without it
    assert hashes[4] != base[4]
    assert chain(tuple(wide)) == hashes
