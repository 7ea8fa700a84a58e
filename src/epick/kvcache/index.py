"""The KV-block index: which endpoints hold which blocks, by request key (llm-d-kv-cache's in-memory
index, pkg/kvcache/kvblock/in_memory.go).

- `size` request keys at most, least recently added dropped first; each key holds at most
  `pod_cache_size` entries (an endpoint and a device tier: "gpu", "cpu", ...; an endpoint holding a
  block on two tiers takes two), the oldest dropped first.
- Engine keys (the hashes an engine's events name) map to the request keys they were stored under,
  so `BlockRemoved` finds what to evict; a mapping goes when none of its request keys has an entry
  left, or with the least recently added when there are `size` of them.
- `clear(pod)` drops an endpoint everywhere (it left, or its events can no longer be trusted).

Deviation, on purpose: entries are `(endpoint, tier)` pairs and a speculative entry (recorded at
routing time, before the engine confirms it) has the tier "speculative"; upstream keeps a flag.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence

Entry = tuple[str, str]  # (endpoint, device tier)
SPECULATIVE = "speculative"
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8}


class BlockIndex:
    def __init__(self, size: int = 100_000_000, pod_cache_size: int = 10) -> None:
        if size <= 0 or pod_cache_size <= 0:
            raise ValueError("the index size and the entries per key must be positive")
        self.size = size
        self.pod_cache_size = pod_cache_size
        self._keys: OrderedDict[int, tuple[Entry, ...]] = OrderedDict()
        self._engine: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self.tiers: set[str] = set()  # every tier ever added (scoring takes a fast path when all weigh 1)
        self.admissions = 0  # entries added to a key (upstream's kv_cache_index_admissions_total)
        self.evictions = 0  # entries dropped: removed, cleared, or pushed out by the bounds

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def engine_keys(self) -> int:
        return len(self._engine)

    def request_keys_of(self, engine_key: int) -> tuple[int, ...] | None:
        return self._engine.get(engine_key)

    def add(self, request_keys: Iterable[int], entry: Entry) -> None:
        self.tiers.add(entry[1])
        keys, cap = self._keys, self.pod_cache_size
        for key in request_keys:
            held = keys.pop(key, ())
            if entry in held:
                held = tuple(e for e in held if e != entry)
            else:
                self.admissions += 1
            held = (*held, entry)
            if len(held) > cap:
                self.evictions += len(held) - cap
                held = held[-cap:]
            keys[key] = held
        while len(keys) > self.size:
            self.evictions += len(keys.popitem(last=False)[1])

    def map_engine(self, engine_key: int, request_keys: tuple[int, ...]) -> None:
        engine = self._engine
        engine.pop(engine_key, None)
        engine[engine_key] = request_keys
        while len(engine) > self.size:
            engine.popitem(last=False)

    def remove(self, request_key: int, entry: Entry) -> bool:
        """Drop one entry from one key; whether the key still has entries."""
        held = self._keys.get(request_key)
        if held is None:
            return False
        rest = tuple(e for e in held if e != entry)
        self.evictions += len(held) - len(rest)
        if rest:
            self._keys[request_key] = rest
            return True
        del self._keys[request_key]
        return False

    def evict(self, engine_key: int, entry: Entry) -> None:
        """An engine dropped a block: its entry leaves the request keys the block was stored under."""
        request_keys = self._engine.get(engine_key)
        if request_keys is None:
            return
        alive = False
        for key in request_keys:
            alive |= self.remove(key, entry)
        if not alive:
            del self._engine[engine_key]

    def clear(self, pod: str) -> int:
        """Every entry of `pod`, on every tier; returns how many keys it held."""
        dropped = 0
        keys = self._keys
        for key, held in list(keys.items()):
            if any(e[0] == pod for e in held):
                dropped += 1
                rest = tuple(e for e in held if e[0] != pod)
                self.evictions += len(held) - len(rest)
                if rest:
                    keys[key] = rest
                else:
                    del keys[key]
        return dropped

    def blocks_by_pod(self) -> dict[str, int]:
        """How many keys each endpoint holds (a scan: for reports and tests, not the request path)."""
        out: dict[str, int] = {}
        for held in self._keys.values():
            for pod in {e[0] for e in held}:
                out[pod] = out.get(pod, 0) + 1
        return out

    def tier_runs(self, keys: Sequence[int], pod: str) -> dict[str, int]:
        """Per device tier, how many of `keys` from the first `pod` holds on that tier without a gap
        (a block held on two tiers counts on both; upstream's `matchedBlockCountByTier`)."""
        counts: dict[str, int] = {}
        alive: set[str] | None = None
        for key in keys:
            here = {tier for holder, tier in self._keys.get(key, ()) if holder == pod}
            alive = here if alive is None else alive & here
            if not alive:
                break
            for tier in alive:
                counts[tier] = counts.get(tier, 0) + 1
        return counts

    def longest_prefix(
        self,
        keys: Sequence[int],
        pods: Collection[str] | None = None,
        weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS,
    ) -> tuple[dict[str, float], dict[str, int]]:
        """`longest_prefix_scores(self.lookup(keys, pods), weights)`, in one pass: when every tier in
        the index weighs 1 (no offloading), a run's score is its length, found with set operations."""
        if any(weights.get(t, 1.0) != 1.0 for t in self.tiers):
            return longest_prefix_scores(self.lookup(keys, pods), weights)
        index = self._keys
        lengths: dict[str, int] = {}
        active: set[str] | None = None
        n = 0
        for key in keys:
            held = index.get(key)
            if not held:
                break
            here = {e[0] for e in held}
            if active is None:
                active = here if pods is None else here.intersection(pods)
            else:
                kept = active.intersection(here)
                if len(kept) != len(active):
                    for pod in active - kept:
                        lengths[pod] = n
                    active = kept
            if not active:
                break
            n += 1
        for pod in active or ():
            lengths[pod] = n
        return {pod: float(k) for pod, k in lengths.items()}, lengths

    def lookup(self, keys: Sequence[int], pods: Collection[str] | None = None) -> list[tuple[Entry, ...]]:
        """The entries of each key of the longest run, from the first, that some endpoint of `pods`
        (None: any) holds: the run ends at the first key none of them holds."""
        out: list[tuple[Entry, ...]] = []
        index = self._keys
        for key in keys:
            held = index.get(key)
            if not held:
                break
            if pods is not None:
                held = tuple(e for e in held if e[0] in pods)
                if not held:
                    break
            out.append(held)
        return out


def longest_prefix_scores(
    found: Sequence[tuple[Entry, ...]], weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS
) -> tuple[dict[str, float], dict[str, int]]:
    """llm-d-kv-cache's `LongestPrefixScorer`: for each endpoint holding the first block, the sum over
    its run of consecutive blocks of the block's weight (the highest of its tiers there; a tier
    without a weight counts 1). Also the run's length in blocks, unweighted."""
    scores: dict[str, float] = {}
    lengths: dict[str, int] = {}
    active: set[str] | None = None
    for held in found:
        best: dict[str, float] = {}
        for pod, tier in held:
            w = weights.get(tier, 1.0)
            if w > best.get(pod, -1.0):
                best[pod] = w
        pods = set(best) if active is None else active & best.keys()
        if not pods:
            break
        for pod in pods:
            scores[pod] = scores.get(pod, 0.0) + best[pod]
            lengths[pod] = lengths.get(pod, 0) + 1
        active = pods
    return scores, lengths
