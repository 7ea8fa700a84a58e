"""Did-you-mean suggestions for config errors that never point to a name of the opposite meaning.

A misspelt name is closest to a name that differs by a few letters; `encode-filter` is just as close
to `decode-filter`, which selects the other side of a disaggregated deployment. A suggestion is
dropped when it holds one word of an antonym pair (encode/decode, prefill/decode, min/max, ...) and
the given name the other, compared word by word (names split at `-`, `_`, `.`, `/`, spaces and
camelCase humps; a word within one or two letters of an antonym, like `encod`, counts as it).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

# Pairs of words of opposite meaning in plugin, profile and parameter names.
ANTONYMS: tuple[tuple[str, str], ...] = (
    ("encode", "decode"),
    ("prefill", "decode"),
    ("encode", "prefill"),
    ("min", "max"),
    ("minimum", "maximum"),
    ("low", "high"),
    ("least", "most"),
    ("include", "exclude"),
    ("allow", "deny"),
)

_VOCABULARY = sorted({word for pair in ANTONYMS for word in pair})
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def words(name: str) -> list[str]:
    """`name`'s words, lower case: `prefillProfile` and `prefill-profile` give prefill, profile."""
    return [w.lower() for w in _WORD.findall(name)]


def _canonical(word: str) -> str:
    """The antonym word `word` stands for (itself, or one it misspells), else `word`."""
    if word in _VOCABULARY or len(word) < 4:
        return word
    ratios = sorted(((difflib.SequenceMatcher(None, word, v).ratio(), v) for v in _VOCABULARY), reverse=True)
    (best, match), (second, _) = ratios[0], ratios[1]
    return match if best >= 0.8 and best > second else word


def is_opposite(given: str, candidate: str) -> bool:
    """Whether `candidate` has a word whose antonym is in `given` (and neither has both)."""
    ours = {_canonical(w) for w in words(given)}
    theirs = {_canonical(w) for w in words(candidate)}
    for a, b in ANTONYMS:
        for x, y in ((a, b), (b, a)):
            if x in ours and y in theirs and y not in ours and x not in theirs:
                return True
    return False


def did_you_mean(given: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to `given` (difflib's measure and cutoff) that is not its opposite."""
    pool = list(dict.fromkeys(candidates))
    if not pool:
        return None
    for match in difflib.get_close_matches(given, pool, n=len(pool)):
        if not is_opposite(given, match):
            return match
    return None
