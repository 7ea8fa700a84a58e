"""`precise-prefix-cache-producer`: which candidates hold the prompt's blocks, from the engines' own
KV-cache events (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/
preciseprefixcache; the index is llm-d-kv-cache's, see epick.kvcache).

Per request, from the tokens a token producer left on the body: the prompt's block keys (full blocks
of `tokenProcessorConfig.blockSizeTokens` tokens, rooted in the request's model; the cache salt in the
first block's key), each candidate's longest run of consecutive blocks held (tier-weighted: a block
counts the highest weight of the tiers the endpoint holds it on, `kvCacheBackendConfigs`, default
gpu 1.0 and cpu 0.8), published as "PrefixCacheMatchInfoDataKey/<its name>" with the weighted run
truncated to whole blocks, as upstream. `prefix-cache-scorer` (`prefixMatchInfoProducerName`),
`no-hit-lru-scorer` and `prefix-based-pd-decider` read it. A request without tokens, or shorter than
one block, gets no match (every score 0). Endpoints are identified as "address:port", as in the
engines' topics (`kv@<address:port>@<model>`).

The index fills from the events the data layer receives (`kvEventsConfig`): with `zmqEndpoint` set,
one socket bound there that every engine publishes to; with `discoverPods` (the default), a socket
connected to each endpoint's publisher at its address and `podDiscoveryConfig.socketPort` (+ its
data-parallel rank). An endpoint that leaves leaves the index.

Fields of older llm-d-kv-cache releases load and act: `indexerConfig.tokenProcessorConfig` (used when
the top-level one is absent) and `indexerConfig.kvBlockIndexConfig.maxPrefixBlocksToMatch` (a cap on the
blocks looked up).

`speculativeIndexing`: the prompt's blocks are recorded for the chosen endpoint (and the `prefill`
profile's) at routing time, before the engine confirms them, and dropped after `speculativeTTL` (2s)
unless the events have confirmed them by then.

Deviations, on purpose: epick subscribes to every endpoint's publisher with `discoverPods`, whether
or not the config wires this plugin to an `endpoint-notification-source` (epick's data layer always
tracks endpoints); `costAwareMemoryConfig.size` bounds the in-memory index by its estimated bytes
(about 200 per block key) instead of Ristretto's cost model; with an in-memory index, `hashAlgorithm`
is accepted and the keys are epick's own (epick.kvcache.keys), five times cheaper to compute.

A shared index: `kvBlockIndexConfig.redisConfig` (or `valkeyConfig`, llm-d-kv-cache v0.9.0's name for
the same) keeps the index in Redis or Valkey, in llm-d's layout and with llm-d's keys (`hashAlgorithm`,
default cbor-fnv: epick.kvcache.upstream_keys), so replicas, epick's or the Go EPP's, share what each
learns (epick.plugins.prefix.redis_index). As upstream, `costAwareMemoryConfig` wins over it and it wins over
`inMemoryConfig`. Each request's keys are read in one round trip before it is scheduled, waiting at
most `redisConfig.lookupTimeout` (epick's own, default 50ms), else decided on this replica's own
index, which is always kept: Redis down, slow or back is a fallback counted in
`epick_shared_index_fallbacks_total`, never a failed request. Unlike upstream, an unreachable
Redis at start-up is not fatal.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence

from epick.framework import (
    CycleState,
    DataProducer,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    SchedulingResult,
)
from epick.framework.metrics import EPICK_PREFIX, LLMD_SUBSYSTEM, MetricSample
from epick.framework.request import CHARS_PER_TOKEN
from epick.kvcache import (
    SPECULATIVE,
    BlockIndex,
    EventTracker,
    KVEventsSettings,
    TokenProcessor,
)
from epick.kvcache.index import Entry, longest_prefix_scores
from epick.kvcache.keys import BlockKeys
from epick.kvcache.upstream_keys import UpstreamTokenProcessor
from epick.plugins.debug_state import MAX_LISTED, capped
from epick.plugins.prefix.precise_parameters import PreciseParameters
from epick.plugins.prefix.producer import match_key, recording_targets
from epick.plugins.prefix.redis_index import SharedBlockIndex, redacted
from epick.plugins.prefix.scorer import PrefixMatch
from epick.plugins.registry import Handle, ParameterError, PluginSpec

TYPE = "precise-prefix-cache-producer"
TOKENS_TYPE = "token-producer"


def endpoint_id(ep: Endpoint) -> str:
    """How the index names an endpoint: its "address:port", as the engines' topics name it."""
    return f"{ep.address}:{ep.port}" if ep.address else ep.name


class PrecisePrefixCacheProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.TOKENS | Reads.MODEL | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: PreciseParameters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.params = params = params or PreciseParameters()
        processor = params.processor()
        self.block_size = processor.effective_block_size()
        self.max_blocks = params.indexer_config.kv_block_index_config.max_prefix_blocks_to_match
        size, per_key = params.index_size()
        shared = params.shared_index()
        self.processor: BlockKeys
        if shared is None:
            self.processor = TokenProcessor(self.block_size, processor.hash_seed)
            self.index = BlockIndex(size, per_key)
        else:  # llm-d's keys, so that every replica sharing the index, Go or Python, meets on them
            algorithm = processor.hash_algorithm or "cbor-fnv"
            self.processor = UpstreamTokenProcessor(self.block_size, processor.hash_seed, algorithm)
            self.index = SharedBlockIndex(shared.address, size, per_key, lookup_timeout=shared.lookup_timeout)
        self._tracker = EventTracker(self.index, self.processor)
        self._settings = params.settings()
        self.weights = params.weights()
        self.key = match_key(self.name)
        self.speculative = params.speculative_indexing
        self.speculative_ttl = params.speculative_ttl
        self.clock = clock
        self.enable_metrics = params.indexer_config.kv_block_index_config.enable_metrics
        self.lookups = 0  # lookups made (upstream's kv_cache_index_lookup_requests_total)
        self.lookup_hits = 0  # blocks of the best candidate's run, summed over lookups
        self.without_tokens = 0  # requests it saw with no tokens: scored 0 everywhere
        self._speculative: deque[tuple[float, tuple[int, ...], str]] = deque()
        # With a shared index: each request's keys and what the index held, read before its cycle
        self._fetched: OrderedDict[int, tuple[list[list[int]], list[list[tuple[Entry, ...]]]]] = OrderedDict()

    # ExportsMetrics: llm-d's KV-block index metrics (llm-d/llm-d-router pkg/kvcache/metrics), when
    # `kvBlockIndexConfig.enableMetrics` is on; and the index's size in keys.
    def metric_samples(self) -> Iterator[MetricSample]:
        yield from self.shared_index_samples()
        yield MetricSample(
            f"{EPICK_PREFIX}_precise_prefix_requests_without_tokens",
            "Requests the precise prefix plugin saw without token ids (no tokenizer answered): each "
            "was scored 0 on every endpoint.",
            "counter",
            float(self.without_tokens),
        )
        if not self.enable_metrics:
            return
        for name, doc, value in (
            ("admissions", "KV-block admissions to the index.", self.index.admissions),
            ("evictions", "KV-block evictions from the index.", self.index.evictions),
            ("lookup_requests", "Lookups made.", self.lookups),
            (
                "lookup_hits",
                "Contiguous prefix blocks matched by the best endpoint, summed over lookups.",
                self.lookup_hits,
            ),
        ):
            # upstream's families have no plugin labels; the deprecated kvcache_index_* twins neither
            for prefix in (f"{LLMD_SUBSYSTEM}_kv_cache_index", "kvcache_index"):
                yield MetricSample(f"{prefix}_{name}", doc, "counter", float(value), plugin_labels=False)
        yield MetricSample(
            f"{EPICK_PREFIX}_kv_cache_index_keys", "Block keys in the index.", "gauge", float(len(self.index))
        )

    def dump_state(self) -> object:
        """`/debug/plugins/state`: upstream's fields (no subscribers: the service subscribes to the
        KV events here, not the plugin), then the index and how many requests came without tokens."""
        speculative = [endpoint for _, _, endpoint in self._speculative]
        index = self.index
        return {
            "speculativeIndexing": self.speculative,
            "speculativeEntries": capped(set(speculative)),
            "totalSpeculativeEntries": len(speculative),
            "maxSpeculativeEntries": MAX_LISTED,
            "blockSizeTokens": self.block_size,
            "index": (
                {"backend": "redis", "address": redacted(index.address), "up": not index.down}
                if isinstance(index, SharedBlockIndex)
                else {"backend": "memory", "keys": len(index)}
            ),
            "requestsWithoutTokens": self.without_tokens,
        }

    def shared_index_samples(self) -> Iterator[MetricSample]:
        """With a shared index: its lookups, the decisions made on the local index instead, and the
        outages (whatever `enableMetrics` says: these are about the service, not the index)."""
        index = self.index
        if not isinstance(index, SharedBlockIndex):
            return
        stats = index.stats
        yield MetricSample(
            f"{EPICK_PREFIX}_shared_index_lookups", "Lookups the shared KV-block index answered.", "counter",
            float(stats.lookups),
        )  # fmt: skip
        for reason, count in sorted(stats.fallbacks.items()):
            yield MetricSample(
                f"{EPICK_PREFIX}_shared_index_fallbacks",
                "Decisions made on this replica's own KV-block index because the shared one was down, "
                "slow (past lookupTimeout) or failed.",
                "counter",
                float(count),
                labels=(("reason", reason),),
            )
        yield MetricSample(
            f"{EPICK_PREFIX}_shared_index_up", "Whether the shared KV-block index answers (1) or not (0).",
            "gauge", 0.0 if index.down else 1.0,
        )  # fmt: skip
        yield MetricSample(
            f"{EPICK_PREFIX}_shared_index_writes_dropped",
            "Index changes not sent while the shared index was down (written again when it is back).",
            "counter", float(stats.writes_dropped),
        )  # fmt: skip

    # KVEventSink: what the data layer subscribes to and feeds.
    @property
    def kv_events(self) -> KVEventsSettings:
        return self._settings

    @property
    def tracker(self) -> EventTracker:
        return self._tracker

    def endpoint_changed(self, endpoint: Endpoint) -> Mapping[str, object | None]:
        """An endpoint notification (upstream wires this plugin to `endpoint-notification-source`):
        the data layer subscribes to the endpoint's publisher; nothing to set on the endpoint."""
        return {}

    def endpoint_left(self, pod: str) -> None:
        self.index.clear(pod)

    def block_keys(self, request: InferenceRequest) -> list[list[int]]:
        """The request's block keys, per prompt (none without tokens)."""
        tokenized = request.body.tokenized
        if tokenized is None:
            return []
        salt = tokenized.cache_salt or request.body.cache_salt
        extra = [[salt]] if salt else None
        cap = self.max_blocks * self.block_size
        return [
            self.processor.keys(p[:cap] if cap else p, request.target_model, extra=extra)
            for p in tokenized.prompts
        ]

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        if self._speculative:
            self._expire(self.clock())
        fetched = self._fetched.pop(request.key, None)
        per_prompt = fetched[0] if fetched is not None else [k for k in self.block_keys(request) if k]
        if not per_prompt:
            if request.body.tokenized is None:
                self.without_tokens += 1  # shown continuously (a metric), not in one log line
            return  # upstream: no tokens, or fewer than a block: no match written
        ids = {endpoint_id(ep): ep.name for ep in endpoints}
        weighted: dict[str, float] = {}
        runs: dict[str, int] = {}
        for i, keys in enumerate(per_prompt):
            if fetched is not None:  # what the shared index held, read before this cycle
                scores, lengths = longest_prefix_scores(
                    [tuple(e for e in held if e[0] in ids) for held in fetched[1][i]], self.weights
                )
            else:
                scores, lengths = self.index.longest_prefix(keys, ids.keys(), self.weights)
            self.lookups += 1
            self.lookup_hits += max(lengths.values(), default=0)
            for pod, s in scores.items():
                weighted[pod] = weighted.get(pod, 0.0) + s
                runs[pod] = runs.get(pod, 0) + lengths[pod]
        total = sum(len(k) for k in per_prompt)

        def tiers(endpoint: str) -> dict[str, int]:
            """Computed only when a consumer asks (p2p-source-producer): nothing on the common path."""
            counts: dict[str, int] = {}
            pod = next((pod for pod, name in ids.items() if name == endpoint), None)
            if pod is None:
                return counts
            for i, keys in enumerate(per_prompt):
                found = fetched[1][i] if fetched is not None else None
                for tier, n in (
                    _tier_runs(found, pod) if found is not None else self.index.tier_runs(keys, pod)
                ).items():
                    counts[tier] = counts.get(tier, 0) + n
            return counts

        match = PrefixMatch(
            total,
            self.block_size * CHARS_PER_TOKEN,
            {ids[pod]: int(s) for pod, s in weighted.items()},
            [k for keys in per_prompt for k in keys],
            unweighted={ids[pod]: n for pod, n in runs.items()},
            tiers=tiers,
        )
        cycle_state.write(self.key, match)

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        if not self.speculative:
            return
        match = cycle_state.read(self.key, PrefixMatch)
        targets = recording_targets(result)
        if match is None or not match.hashes or not targets:
            return
        expires = self.clock() + self.speculative_ttl
        keys = tuple(match.hashes)
        for target in targets:
            pod = endpoint_id(target)
            self.index.add(keys, (pod, SPECULATIVE))
            self._speculative.append((expires, keys, pod))

    def _expire(self, now: float) -> None:
        pending = self._speculative
        while pending and pending[0][0] <= now:
            _, keys, pod = pending.popleft()
            entry = (pod, SPECULATIVE)
            for key in keys:
                self.index.remove(key, entry)


def _tier_runs(found: Sequence[tuple[Entry, ...]], pod: str) -> dict[str, int]:
    """`BlockIndex.tier_runs` on entries read from the shared index."""
    counts: dict[str, int] = {}
    alive: set[str] | None = None
    for held in found:
        here = {tier for holder, tier in held if holder == pod}
        alive = here if alive is None else alive & here
        if not alive:
            break
        for tier in alive:
            counts[tier] = counts.get(tier, 0) + 1
    return counts


FETCHED_CAP = 4096  # requests read ahead and not yet scheduled (a refused one is never popped)


class SharedPrecisePrefixCacheProducer(PrecisePrefixCacheProducer):
    """`precise-prefix-cache-producer` on a Redis or Valkey index: before a request is scheduled (the
    front end awaits `collect`, as a `BatchingProducer`'s), its tokens (from the config's token
    producer when the request has none yet), its keys, and what the shared index holds for them, in
    one round trip; `produce` then decides on that."""

    index: SharedBlockIndex
    tokenizer: DataProducer | None = None

    async def collect(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        if getattr(self, "delegating", False):
            return
        if request.body.tokenized is None and self.tokenizer is not None:
            try:
                self.tokenizer.produce(request, CycleState(), endpoints)
            except Exception:  # the token producer fails again in its own phase, and says why there
                return
        per_prompt = [k for k in self.block_keys(request) if k]
        if not per_prompt:
            return
        found = await self.index.fetch(per_prompt, {endpoint_id(ep) for ep in endpoints})
        if found is None:
            return  # counted as a fallback: produce reads the local index
        fetched = self._fetched
        fetched[request.key] = (per_prompt, found)
        while len(fetched) > FETCHED_CAP:
            fetched.popitem(last=False)

    async def aclose(self) -> None:
        await self.index.aclose()


def token_source(handle: Handle) -> DataProducer | None:
    """The config's token producer (by its default name), for a plugin that needs tokens early."""
    for name in (TOKENS_TYPE, "tokenizer"):
        try:
            plugin = handle.plugin(name)
        except LookupError:
            continue
        if isinstance(plugin, DataProducer):
            return plugin
    return None


def _factory(name: str, params: PreciseParameters, handle: Handle) -> PrecisePrefixCacheProducer:
    if params.indexer_config.tokenizers_pool_config is not None:
        raise ParameterError(
            "indexerConfig.tokenizersPoolConfig",
            "tokenizersPoolConfig is not supported; configure a token-producer plugin instead",
            "add a token-producer plugin (its tokens are shared by every plugin that reads them)",
        )
    if params.shared_index() is None:
        return PrecisePrefixCacheProducer(name, params, clock=handle.clock)
    plugin = SharedPrecisePrefixCacheProducer(name, params, clock=handle.clock)
    plugin.tokenizer = token_source(handle)
    return plugin


def _requires(params: PreciseParameters, api_version: str = "") -> tuple[str, ...]:
    return (TOKENS_TYPE,)  # upstream's default producer of the tokens it reads


def speculative_state(params: PreciseParameters) -> str:
    """What stays per worker: the engines' events reach every worker, a speculative guess only the
    worker that made it."""
    return "its speculative entries" if params.speculative_indexing else ""


SPEC = PluginSpec(
    TYPE,
    _factory,
    PreciseParameters,
    "which candidates hold the prompt's blocks, from the engines' KV events",
    requires=_requires,
    worker_state=speculative_state,
)
