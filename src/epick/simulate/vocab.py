"""Words ↔ tokens for generated workloads: one word is one token, so text and tokens correspond.

Word i is four letters spelling i in base 26 (deterministic, no word list to ship); token id = i.
Text is the words joined by spaces, so equal text prefixes are equal token prefixes, and a router
that hashes characters sees what the engine caches. Five characters per token with the space, close
to the ~4 characters per token of real tokenizers.

Words all have the same width so that a prompt's text is one gather from a table of all words
(numpy): joining string objects costs a cache miss per token, and routing by text reads a prompt
per request.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

_LETTERS = "etaoinshrdlucmfwypvbgkqjxz"
VOCAB_SIZE = 65_536  # token ids are 16-bit: random ones come straight from random bytes
WORD_CHARS = 4


def word(i: int) -> str:
    i %= VOCAB_SIZE
    out = []
    for _ in range(WORD_CHARS):
        out.append(_LETTERS[i % 26])
        i //= 26
    return "".join(out)


# Row i: word i and a space, as ASCII bytes.
_TABLE = np.frombuffer("".join(word(i) + " " for i in range(VOCAB_SIZE)).encode("ascii"), dtype="S5")


def text_length(tokens: int) -> int:
    """The length of `text` of that many tokens, without building it."""
    return tokens * (WORD_CHARS + 1) - 1 if tokens > 0 else 0


def text(tokens: Sequence[int]) -> str:
    if not tokens:
        return ""
    if isinstance(tokens, array) and tokens.typecode == "H":
        ids = np.frombuffer(tokens, dtype=np.uint16)
    else:
        try:
            ids = np.fromiter(tokens, dtype=np.uint16, count=len(tokens))
        except OverflowError:
            raise ValueError(f"token ids must be between 0 and {VOCAB_SIZE - 1}") from None
    return _TABLE.take(ids).tobytes()[:-1].decode("ascii")
