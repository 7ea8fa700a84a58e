"""The vLLM production-stack's prefix-aware router: a hash trie of chunks, a random pick among the
longest matches."""

from __future__ import annotations

import random
from collections.abc import Sequence

import xxhash

from epick.simulate.policies.least_request import _least_in_flight
from epick.simulate.types import ServerView, SimRequestSpec

_xxh64 = xxhash.xxh64_intdigest


def _lowest_set_bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class PrefixRandom:
    """The vLLM production-stack's `prefixaware` router: a hash trie of 128-character chunks.

    The request text is cut into `chunk_chars`-character chunks (the last one may be shorter) and
    each chunk is hashed with xxhash64. Routing walks the chunks from the start, keeping the
    endpoints (among those available) that hold every chunk so far, and stops at the first chunk
    no kept endpoint holds; the request goes to an endpoint chosen uniformly at random among those
    kept (the longest match), and the chosen endpoint then holds every chunk of the text. Matching
    nothing leaves every available endpoint kept, so a cold prompt goes to a random endpoint.

    A trailing partial chunk counts as a chunk, as upstream. Low-match fallback (the production-stack
    router's documented rule: below a minimum match it falls back to the lowest-QPS endpoint): when fewer than
    `min_match_chunks` chunks match, the request goes to the endpoint with the lowest request rate,
    approximated here by the fewest router-counted in-flight requests (ties at random).
    `min_match_chunks=0` turns it off, which is the upstream router code we read exactly (a random
    endpoint when nothing matches).

    Structure: upstream keeps a trie whose nodes are keyed by each chunk's own hash; here one dict
    maps the hash chain (hash_i = xxhash64(chunk_i, seed=hash_{i-1}), seed 0 for the first) to the
    bit mask of the endpoints (bit `ServerView.index`) that hold that prefix. A chained hash names
    the same path as the trie's node (up to hash collisions), and a flat dict of ints is faster and
    smaller in Python than trie nodes holding sets. Text is chunked by characters as upstream; ASCII
    text (all generated workloads) is encoded once and sliced as bytes, which is the same thing.

    No eviction, as the upstream version this follows: memory grows by one dict entry (about
    100-150 bytes) per distinct chunk-aligned prefix ever routed, i.e. by ceil(new characters / 128)
    entries per request whose text is new, e.g. ~55 million entries (several GB) for a million
    requests with 7,000 fresh characters each; shared prefixes cost nothing more. (Later
    production-stack versions add LRU eviction of trie nodes under process memory pressure, which
    is not modelled.)
    """

    name = "prefix-random"
    reads_metrics = False

    def __init__(
        self, rng: random.Random | None = None, *, chunk_chars: int = 128, min_match_chunks: int = 1
    ) -> None:
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be >= 1")
        if min_match_chunks < 0:
            raise ValueError("min_match_chunks must be >= 0")
        self._rng = rng if rng is not None else random.Random(0)
        self.chunk_chars = chunk_chars
        self.min_match_chunks = min_match_chunks
        self._table: dict[int, int] = {}  # chained chunk hash -> bit mask of endpoints

    def __len__(self) -> int:
        """Distinct chunk-aligned prefixes stored (the memory the policy holds)."""
        return len(self._table)

    def chunk_hashes(self, text: str) -> list[int]:
        c = self.chunk_chars
        h = 0
        if text.isascii():
            data = text.encode()
            return [h := _xxh64(data[i : i + c], h) for i in range(0, len(data), c)]
        return [h := _xxh64(text[i : i + c].encode(), h) for i in range(0, len(text), c)]

    def matched_chunks(self, text: str, servers: Sequence[ServerView]) -> tuple[int, list[int]]:
        """The longest match in chunks, and the indices of the servers holding it."""
        n, mask = self._match(self.chunk_hashes(text), self._available(servers))
        return n, _lowest_set_bits(mask)

    @staticmethod
    def _available(servers: Sequence[ServerView]) -> int:
        mask = 0
        for s in servers:
            mask |= 1 << s.index
        return mask

    def _match(self, hashes: list[int], selected: int) -> tuple[int, int]:
        table = self._table
        matched = 0
        for h in hashes:
            held = table.get(h)
            if held is None:
                break
            both = held & selected
            if not both:
                break
            selected = both
            matched += 1
        return matched, selected

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        hashes = self.chunk_hashes(request.prompt)
        matched, selected = self._match(hashes, self._available(servers))
        if matched < self.min_match_chunks:
            chosen = _least_in_flight(servers, self._rng)
            known = matched if selected >> chosen & 1 else 0
        else:
            k = selected.bit_count()
            if k > 1:
                for _ in range(self._rng.randrange(k)):
                    selected &= selected - 1  # drop the lowest set bit
            chosen = (selected & -selected).bit_length() - 1
            known = matched
        # The chosen server already holds the first `known` chunks (it is among their holders).
        self._insert(hashes[known:] if known else hashes, chosen)
        return chosen

    def insert(self, text: str, server: int) -> None:
        """Record that server `server` holds `text`, as routing `text` there does."""
        self._insert(self.chunk_hashes(text), server)

    def _insert(self, hashes: list[int], server: int) -> None:
        bit = 1 << server
        table = self._table
        for h in hashes:
            table[h] = table.get(h, 0) | bit

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        pass
