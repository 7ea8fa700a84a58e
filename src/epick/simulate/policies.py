"""Baseline routing policies that no epick config expresses: what other routers do, for `epick simulate`.

Each policy implements `epick.simulate.types.Policy`: `route` returns the chosen server's
`ServerView.index`. All randomness comes from the `random.Random` a policy is built with, so a seeded
run is reproducible. Every policy here reads only what the router it imitates could know: the
router-counted in-flight requests (`ServerView.in_flight`), the last scrape (`waiting`, `kv_usage`),
and its own past decisions — except `OraclePrefix`, which reads the engines' exact cache contents on
purpose.

`POLICIES` maps a policy's name to its factory, `factory(rng, **params)`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import xxhash

from epick.simulate.types import Policy, ServerView, SimRequestSpec

_xxh64 = xxhash.xxh64_intdigest


def _least_in_flight(servers: Sequence[ServerView], rng: random.Random) -> int:
    """The index of the server with the fewest router-counted in-flight requests; ties at random."""
    best = servers[0].in_flight
    ties = [servers[0].index]
    for s in servers[1:]:
        n = s.in_flight
        if n < best:
            best = n
            ties = [s.index]
        elif n == best:
            ties.append(s.index)
    return ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]


class LeastRequest:
    """Least request: the server with the fewest in-flight requests this router sent, ties at random.

    The classic least-outstanding-requests balancer (NGINX `least_conn`; Envoy `LEAST_REQUEST` with
    every host compared rather than its default two-choice sample), the `shortest queue` half of
    SGLang's router, and llm-d's load-only baseline in spirit. The count is the router's own
    (`ServerView.in_flight`), so it is always fresh: no scrape is involved. Deviation: none beyond
    comparing all servers.
    """

    name = "least-request"
    reads_metrics = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(0)

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        return _least_in_flight(servers, self._rng)

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        pass


# SGLang's approximate radix tree.


class _Node:
    """A node of the shared radix tree: an edge of text, and which workers hold it.

    `tenants` maps a worker to the tick it last used this node (its LRU clock); `child_tenants`
    counts, per worker, the children that worker holds, so "is this node a leaf of worker w" is a
    dict lookup during eviction.
    """

    __slots__ = ("child_tenants", "children", "parent", "tenants", "text")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, _Node] = {}
        self.tenants: dict[int, int] = {}
        self.child_tenants: dict[int, int] = {}


# A walk down the tree: nodes matched whole, the node the match ends inside, how far in, chars matched.
_Walk = tuple[list[_Node], _Node | None, int, int]


def _common_prefix(edge: str, text: str, pos: int) -> int:
    """The length of the common prefix of `edge` and `text[pos:]`, knowing that edge[0] matches.

    A binary search over `startswith`, which compares in C: O(log n) C-speed comparisons instead of
    a Python loop over the characters.
    """
    lo = 1
    hi = min(len(edge), len(text) - pos)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(edge[:mid], pos):
            lo = mid
        else:
            hi = mid - 1
    return lo


class SGLangCacheAware:
    """SGLang router's `cache_aware` policy (the vllm-router's is the same algorithm).

    Load: router-counted in-flight requests per worker. The fleet is imbalanced when
    `max_load - min_load > balance_abs_threshold` and `max_load > min_load * balance_rel_threshold`
    (both must hold); then the request goes to the least-loaded worker, and its text is still
    inserted into that worker's tree. Otherwise: `match_rate` = (characters of the request text
    matched by the longest prefix any worker's tree holds) / (characters of the text); if
    `match_rate > cache_threshold` the request goes to a worker with that longest match, else to the
    worker whose tree holds the fewest characters (`fallback="smallest_tree"`, the original SGLang
    behaviour), or to the least-loaded one (`fallback="least_load"`, what newer SGLang/vllm-router
    versions do). The chosen worker's tree then learns the text. The trees are built only from this
    router's decisions; the engines' real caches are never consulted.

    Defaults are the router code's (cache_threshold 0.5, balance_abs_threshold 32,
    balance_rel_threshold 1.1, max tree size 2**24 characters per worker, eviction every 60 s); its
    docs give 0.3 / 64 / 1.5. (Releases differ: early Python launchers used 0.5 / 32 / 1.0001 with
    2**24 and 60 s; recent ones 0.3 / 64 / 1.5 with 2**26 and 120 s.)

    Structure (as SGLang's): one radix tree over characters with compressed edges, shared by all
    workers; each node records which workers hold it and when each last used it, and a per-worker
    character count gives each worker's tree size. A worker's tree is the set of nodes that name
    it, so the longest match over all workers is one walk down the shared tree, and the workers
    holding the deepest node reached are exactly those whose own tree matches that far. Edge
    comparisons use `str.startswith` (C speed) rather than per-character loops.

    Eviction (as SGLang's periodic thread, in virtual time): every `eviction_interval_s` seconds of
    simulated time, each worker whose tree holds more than `max_tree_chars` characters loses its
    least-recently-used leaves until it holds at most `max_tree_chars`; a node no worker holds any
    more is deleted. As a memory guard SGLang lacks, a worker reaching twice `max_tree_chars`
    triggers the same eviction at once, so memory stays bounded (about workers x 2 x
    `max_tree_chars` characters, less where workers share prefixes) however long the run.
    `eviction_interval_s=0` evicts after every insertion that leaves a tree over the cap.

    Deviations: ties (several workers holding the longest match, several with the smallest tree or
    the lowest load) are broken at random with the seeded generator, where SGLang takes whichever
    its hash map or worker list yields first; the LRU clock is a counter of routing decisions
    instead of wall-clock milliseconds; SGLang's match step also refreshes the LRU time of the
    matched worker when the request goes elsewhere, which is not reproduced (only the chosen
    worker's path is refreshed).
    """

    name = "sglang-cache-aware"
    reads_metrics = False

    def __init__(
        self,
        rng: random.Random | None = None,
        *,
        cache_threshold: float = 0.5,
        balance_abs_threshold: int = 32,
        balance_rel_threshold: float = 1.1,
        max_tree_chars: int = 2**24,
        eviction_interval_s: float = 60.0,
        fallback: Literal["smallest_tree", "least_load"] = "smallest_tree",
    ) -> None:
        if fallback not in ("smallest_tree", "least_load"):
            raise ValueError(f"fallback must be 'smallest_tree' or 'least_load', not {fallback!r}")
        if max_tree_chars < 0:
            raise ValueError("max_tree_chars must be >= 0")
        self._rng = rng if rng is not None else random.Random(0)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.max_tree_chars = max_tree_chars
        self.eviction_interval_s = eviction_interval_s
        self.fallback = fallback
        self._root = _Node("", None)
        self._chars: dict[int, int] = {}  # worker -> characters its tree holds
        self._tick = 0
        self._next_eviction: float | None = None
        self.evictions = 0  # eviction passes run (some tree was over the cap)

    # Introspection (tests, reports).
    def tree_chars(self, worker: int) -> int:
        """The characters worker `worker`'s tree holds."""
        return self._chars.get(worker, 0)

    def match_chars(self, text: str, worker: int) -> int:
        """The longest prefix of `text` that worker `worker`'s tree holds, in characters."""
        node = self._root
        pos = 0
        n = len(text)
        while pos < n:
            child = node.children.get(text[pos])
            if child is None or worker not in child.tenants:
                break
            edge = child.text
            if text.startswith(edge, pos):
                pos += len(edge)
                node = child
            else:
                return pos + _common_prefix(edge, text, pos)
        return pos

    def insert(self, text: str, worker: int, now: float = 0.0) -> None:
        """Teach worker `worker`'s tree `text`, as routing `text` there does (then evict if due)."""
        self._insert(text, worker, self._walk(text))
        self._maybe_evict(worker, now)

    def _walk(self, text: str) -> _Walk:
        """One walk down the shared tree: the nodes `text` matches whole, the node the match ends
        inside (None when it ends at a node boundary), how far into that node, and the characters
        matched in all."""
        node = self._root
        path: list[_Node] = []
        pos = 0
        n = len(text)
        while pos < n:
            child = node.children.get(text[pos])
            if child is None:
                break
            edge = child.text
            if not text.startswith(edge, pos):
                split_at = _common_prefix(edge, text, pos)
                return path, child, split_at, pos + split_at
            pos += len(edge)
            path.append(child)
            node = child
        return path, None, 0, pos

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        text = request.prompt
        rng = self._rng
        loads = [s.in_flight for s in servers]
        max_load = max(loads)
        min_load = min(loads)
        imbalanced = (
            max_load - min_load > self.balance_abs_threshold
            and max_load > min_load * self.balance_rel_threshold
        )

        walk = self._walk(text)
        path, partial, _, pos = walk
        n = len(text)

        if imbalanced:
            chosen = _least_in_flight(servers, rng)
        else:
            chosen = -1
            if n and pos / n > self.cache_threshold:
                deepest = partial if partial is not None else (path[-1] if path else None)
                if deepest is None:
                    holders = [s.index for s in servers]
                else:
                    held = deepest.tenants
                    holders = [s.index for s in servers if s.index in held]
                if holders:
                    chosen = holders[0] if len(holders) == 1 else holders[rng.randrange(len(holders))]
            if chosen < 0:
                if self.fallback == "least_load":
                    chosen = _least_in_flight(servers, rng)
                else:
                    chosen = self._smallest_tree(servers)

        self._insert(text, chosen, walk)
        self._maybe_evict(chosen, now)
        return chosen

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        pass

    def _smallest_tree(self, servers: Sequence[ServerView]) -> int:
        chars = self._chars
        best = -1
        ties: list[int] = []
        for s in servers:
            c = chars.get(s.index, 0)
            if best < 0 or c < best:
                best = c
                ties = [s.index]
            elif c == best:
                ties.append(s.index)
        return ties[0] if len(ties) == 1 else ties[self._rng.randrange(len(ties))]

    def _insert(self, text: str, worker: int, walk: _Walk) -> None:
        """Insert `text` for `worker`, given the walk down the tree `_walk` made for it."""
        path, partial, split_at, pos = walk
        self._tick += 1
        tick = self._tick
        added = 0
        for node in path:
            tenants = node.tenants
            if worker not in tenants:
                added += len(node.text)
                parent = node.parent
                assert parent is not None
                parent.child_tenants[worker] = parent.child_tenants.get(worker, 0) + 1
            tenants[worker] = tick
        if partial is not None:
            # Split `partial` after its first `split_at` characters: parent -> mid -> partial.
            parent = partial.parent
            assert parent is not None
            edge = partial.text
            mid = _Node(edge[:split_at], parent)
            mid.tenants = dict(partial.tenants)
            mid.children[edge[split_at]] = partial
            mid.child_tenants = dict.fromkeys(partial.tenants, 1)
            parent.children[edge[0]] = mid
            partial.text = edge[split_at:]
            partial.parent = mid
            if worker not in mid.tenants:
                added += split_at
                parent.child_tenants[worker] = parent.child_tenants.get(worker, 0) + 1
            mid.tenants[worker] = tick
            last = mid
        else:
            last = path[-1] if path else self._root
        if pos < len(text):
            leaf = _Node(text[pos:], last)
            leaf.tenants[worker] = tick
            last.children[text[pos]] = leaf
            last.child_tenants[worker] = last.child_tenants.get(worker, 0) + 1
            added += len(text) - pos
        self._chars[worker] = self._chars.get(worker, 0) + added

    def _maybe_evict(self, worker: int, now: float) -> None:
        cap = self.max_tree_chars
        if self._next_eviction is None:
            self._next_eviction = now + self.eviction_interval_s
        if now >= self._next_eviction:
            self._next_eviction = now + self.eviction_interval_s
            if any(c > cap for c in self._chars.values()):
                self._evict()
        elif self._chars.get(worker, 0) > 2 * cap:
            self._evict()

    def _evict(self) -> None:
        """SGLang's `evict_tenant_by_size`: LRU leaves of each over-size worker go until it fits."""
        cap = self.max_tree_chars
        chars = self._chars
        over = {w for w, c in chars.items() if c > cap}
        if not over:
            return
        heap: list[tuple[int, int, int, _Node]] = []
        seq = 0
        root = self._root
        stack = list(root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            counts = node.child_tenants
            for w, t in node.tenants.items():
                if w in over and not counts.get(w):
                    heap.append((t, seq, w, node))
                    seq += 1
        heapq.heapify(heap)
        while heap:
            _, _, w, node = heapq.heappop(heap)
            if chars[w] <= cap:
                continue
            del node.tenants[w]
            chars[w] -= len(node.text)
            parent = node.parent
            assert parent is not None
            left = parent.child_tenants[w] - 1
            if left:
                parent.child_tenants[w] = left
            else:
                del parent.child_tenants[w]
            if not node.tenants and not node.children:
                del parent.children[node.text[0]]
            if parent is not root and not left and w in parent.tenants:
                heapq.heappush(heap, (parent.tenants[w], seq, w, parent))
                seq += 1
        self.evictions += 1


# The vLLM production-stack's prefix-aware router.


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

    A trailing partial chunk counts as a chunk, as upstream. Low-match fallback (REFERENCE.md: "falls
    back to lowest QPS when the match is shorter than a minimum"): when fewer than
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


# The oracle.


class OraclePrefix:
    """The upper bound of cache-aware routing: epick's default config, given exact cache contents.

    Score of server i (the Go EPP default weights prefix 3 : queue 2 : kv-cache 2, the cache hit
    made exact):

        score_i = 3 * hit_i + load_weight * (2 * queue_i + 2 * (1 - kv_usage_i))

        hit_i   = cached_tokens_i / len(tokens)   (0 for an empty prompt), where cached_tokens_i is
                  `ServerView.cached_tokens(request)`: the prefix-cache hit the engine would give now
        queue_i = (max_w - waiting_i) / (max_w - min_w) over the servers (1 when all are equal), the
                  `queue-scorer`; waiting and kv_usage are from the last scrape, as epick sees them

    The highest score wins; exact ties go to the fewest router-counted in-flight requests (fresher
    than the scrape, so a burst of cold requests between scrapes spreads), then at random with the
    seeded generator. `load_weight=1` (the default) is exactly the default config with a perfect
    prefix scorer; larger values trade cache hits for balance, 0 is pure cache affinity. The load
    terms are what stop a hot prefix piling onto one server: a full hit (3 points) loses once that
    server's queue and KV usage cost it more than 3 points against a cold, idle server, e.g. the
    longest queue (queue 0 vs 1: -2) and KV 0.9 vs 0.1 (-1.6), 3.2 < 3.8.
    """

    name = "oracle-prefix"
    reads_metrics = True

    def __init__(self, rng: random.Random | None = None, *, load_weight: float = 1.0) -> None:
        if load_weight < 0:
            raise ValueError("load_weight must be >= 0")
        self._rng = rng if rng is not None else random.Random(0)
        self.load_weight = load_weight

    def scores(self, request: SimRequestSpec, servers: Sequence[ServerView]) -> list[float]:
        tokens = request.tokens
        n = len(tokens)
        waits = [s.waiting for s in servers]
        hi = max(waits)
        lo = min(waits)
        span = hi - lo
        lw2 = 2.0 * self.load_weight
        out = []
        for s in servers:
            hit = s.cached_tokens(request) / n if n else 0.0
            queue = (hi - s.waiting) / span if span else 1.0
            out.append(3.0 * hit + lw2 * (queue + 1.0 - s.kv_usage))
        return out

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        scores = self.scores(request, servers)
        best = max(scores)
        ties = [s for s, v in zip(servers, scores, strict=True) if v == best]
        if len(ties) == 1:
            return ties[0].index
        return _least_in_flight(ties, self._rng)

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        pass


PolicyFactory = Callable[..., Policy]


def _least_request(rng: random.Random, **params: Any) -> Policy:
    return LeastRequest(rng, **params)


def _sglang(rng: random.Random, **params: Any) -> Policy:
    return SGLangCacheAware(rng, **params)


def _prefix_random(rng: random.Random, **params: Any) -> Policy:
    return PrefixRandom(rng, **params)


def _oracle(rng: random.Random, **params: Any) -> Policy:
    return OraclePrefix(rng, **params)


POLICIES: Mapping[str, PolicyFactory] = {
    "least-request": _least_request,
    "sglang-cache-aware": _sglang,
    "prefix-random": _prefix_random,
    "oracle-prefix": _oracle,
}
