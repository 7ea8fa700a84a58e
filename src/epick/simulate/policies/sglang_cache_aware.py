"""SGLang's router `cache_aware` policy: an approximate radix tree of what each worker was sent."""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from typing import Literal

from epick.simulate.policies.least_request import _least_in_flight
from epick.simulate.types import ServerView, SimRequestSpec

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

    # A worker removed from the router (its health check failed, or discovery removed it) leaves
    # the tree, as SGLang's `remove_worker` removes its tenant; when it returns it starts empty.
    def server_left(self, server: int, now: float) -> None:
        self.remove_worker(server)

    def server_joined(self, server: int, now: float) -> None:
        pass

    def remove_worker(self, worker: int) -> None:
        """Forget every node worker `worker` holds; nodes nobody holds any more are deleted."""
        order: list[_Node] = []
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(node.children.values())
        for node in reversed(order):  # children before their parents
            node.tenants.pop(worker, None)
            node.child_tenants.pop(worker, None)
            if not node.tenants and not node.children:
                parent = node.parent
                assert parent is not None
                del parent.children[node.text[0]]
        self._root.child_tenants.pop(worker, None)
        self._chars.pop(worker, None)

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
