"""Words ↔ tokens for generated workloads: one word is one token, so text and tokens correspond.

Word i is a short pseudo-word spelled from its index (deterministic, no word list to ship); token id
= i. Text is the words joined by spaces, so equal text prefixes are equal token prefixes, and a
router that hashes characters sees what the engine caches. Words average ~5 characters with their
space, close to the ~4 characters per token of real tokenizers.
"""

from __future__ import annotations

from collections.abc import Sequence

_LETTERS = "etaoinshrdlucmfwypvbgkqjxz"
VOCAB_SIZE = 65_536  # token ids are 16-bit: random ones come straight from random bytes


def word(i: int) -> str:
    out = []
    i %= VOCAB_SIZE
    while True:
        out.append(_LETTERS[i % 26])
        i //= 26
        if i == 0:
            return "".join(out)


_WORDS = [word(i) for i in range(VOCAB_SIZE)]


def text(tokens: Sequence[int]) -> str:
    return " ".join(map(_WORDS.__getitem__, tokens))
