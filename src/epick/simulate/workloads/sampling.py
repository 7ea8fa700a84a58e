"""Random prompts and lengths the generators share: compact random token arrays, pairwise distinct
first tokens, per-workload sub-generators, think times, lognormal lengths, and `_grouped`, the prefix ×
suffix stream behind `SharedPrefix` and `LongDocQA`.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Iterator

from epick.simulate import vocab
from epick.simulate.types import SimRequestSpec

# Every token id as one shared int object: prompts are tuples of references into this pool.
_TOKENS: tuple[int, ...] = tuple(range(vocab.VOCAB_SIZE))


def _sub_rng(rng: random.Random) -> random.Random:
    """A private generator seeded from `rng` now, so later draws from `rng` do not change the stream."""
    return random.Random(rng.getrandbits(64))


def _random_tokens(rng: random.Random, n: int, first: int | None = None) -> array[int]:
    """`n` uniformly random token ids (the first one given, if `first` is set), compact: two bytes a
    token and no int object each (VOCAB_SIZE is 2**16: any 16 bits are a token)."""
    if n <= 0:
        return array("H")
    if first is None:
        return array("H", rng.randbytes(2 * n))
    tokens = array("H", (first,))
    tokens.frombytes(rng.randbytes(2 * (n - 1)))
    return tokens


def _distinct_tokens(rng: random.Random, count: int) -> list[int]:
    """`count` token ids, pairwise distinct while `count` ≤ VOCAB_SIZE (first tokens of sibling prompts)."""
    if count <= vocab.VOCAB_SIZE:
        return rng.sample(_TOKENS, count)
    return rng.choices(_TOKENS, k=count)


def _coprime_stride(rng: random.Random) -> int:
    while True:
        stride = rng.randrange(1, vocab.VOCAB_SIZE)
        if math.gcd(stride, vocab.VOCAB_SIZE) == 1:
            return stride


def _join(a: str, b: str) -> str:
    return f"{a} {b}" if a and b else a or b


def _think_time(rng: random.Random, mean: float) -> float:
    return rng.expovariate(1.0 / mean) if mean > 0 else 0.0


def _lognormal_length(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


def _grouped(
    rng: random.Random,
    id_format: str,
    *,
    groups: int,
    per_group: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    shuffle: bool,
) -> Iterator[SimRequestSpec]:
    """`groups` random prefixes × `per_group` random suffixes; request = prefix + suffix.

    Prefixes of different groups start with different tokens, and so do the suffixes within a group
    (up to VOCAB_SIZE of each), so requests of one group share exactly the prefix.
    """
    prefixes = [_random_tokens(rng, prefix_tokens, first) for first in _distinct_tokens(rng, groups)]
    prefix_texts = [vocab.text(p) for p in prefixes]
    # Suffix p of group g starts with token (offset + p × stride) mod VOCAB_SIZE: a random walk over
    # the vocabulary that repeats no token before VOCAB_SIZE steps (stride coprime with it).
    offsets = array("q", (rng.randrange(vocab.VOCAB_SIZE) for _ in range(groups)))
    strides = array("q", (_coprime_stride(rng) for _ in range(groups)))
    order = array("q", range(groups * per_group))
    if shuffle:
        rng.shuffle(order)
    for i in order:
        g, p = divmod(i, per_group)
        first = (offsets[g] + p * strides[g]) % vocab.VOCAB_SIZE
        suffix = _random_tokens(rng, suffix_tokens, first)
        yield SimRequestSpec(
            request_id=id_format.format(g, p),
            text=None,  # the prefix's text and the suffix's, joined if a policy reads it
            tokens=prefixes[g] + suffix,
            output_tokens=output_tokens,
            known_text=prefix_texts[g],
            known_text_tokens=prefix_tokens,
        )
