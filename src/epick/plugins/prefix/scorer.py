"""`prefix-cache-scorer`: prefer the endpoint most likely to hold the prompt's prefix in its KV cache.

score = matched blocks / prompt blocks (0 for an empty prompt), from the approximate index. A block
is `blockSizeTokens` × 4 bytes of the prompt; GIE's older parameter `hashBlockSize` gives its size in
bytes directly (llm-d's P/D configs still use it), and the two cannot be mixed. The
index learns in `PreRequest`: the prompt's blocks are recorded for the first target of every
profile result acted on (decode and prefill in P/D; never a shadow profile's). The match found
while scoring is left in the cycle state (`PrefixMatch`) for deciders such as
`prefix-based-pd-decider`.

With a producer (llm-d's layout): when `prefixMatchInfoProducerName` names an
`approx-prefix-cache-producer`, or the config has one under its type's name, the scorer keeps no
index: it reads the producer's match for this request ("PrefixCacheMatchInfoDataKey/<producer>")
and the producer records. A request the producer left no match for scores 0 everywhere. Upstream's
`matchLengthWeight` (0..1, default 0) and `matchLengthScaleTokens` (8192) blend in the match length:
score = w × min(1, matched tokens / scale)² + (1 − w) × matched blocks / prompt blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import Field, model_validator

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    SchedulingResult,
    state_key,
)
from epick.framework.datalayer import data_key
from epick.framework.metrics import LLMD_SUBSYSTEM, HistogramCounts, MetricSample
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.prefix.hashing import prompt_block_hashes
from epick.plugins.prefix.index import PrefixIndex, SharedIndex
from epick.plugins.registry import Handle, Parameters, PluginSpec, producer_for

TYPE = "prefix-cache-scorer"
MATCH_DATA_TYPE = "PrefixCacheMatchInfoDataKey"  # upstream's data type of a prefix-match producer's output
DEFAULT_PRODUCER = "approx-prefix-cache-producer"
# GIE's gauges of the approximate prefix index, per plugin.
# Upstream's prefix-indexer families (approximateprefix/metrics.go): each as llm_d_epp_* with plugin
# labels, and under the deprecated inference_extension_* name without them.
INDEXER_SIZE = "prefix_indexer_size"
INDEXER_SIZE_DOC = "Block hashes in the approximate prefix index."
INDEXER_HIT_RATIO = "prefix_indexer_hit_ratio"
INDEXER_HIT_RATIO_DOC = "Share of a request's prompt blocks found on the endpoint chosen."
INDEXER_HIT_BYTES = "prefix_indexer_hit_bytes"
INDEXER_HIT_BYTES_DOC = "Prompt bytes found on the endpoint chosen, per request."
HIT_RATIO_BUCKETS = (0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1)
HIT_BYTES_BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
MATCH_PRODUCER_TYPES = (
    DEFAULT_PRODUCER,
    "precise-prefix-cache-producer",
    "burst-prefix-cache-producer",
    "multicluster-approx-prefix-cache-producer",
)


class PrefixCacheParameters(Parameters):
    block_size_tokens: int = Field(default=16, gt=0)
    max_prefix_blocks_to_match: int = Field(default=256, gt=0)
    lru_capacity_per_server: int = Field(default=31250, gt=0)
    # GIE up to v1.0: the block size in bytes (characters) instead of tokens.
    hash_block_size: int | None = Field(default=None, gt=0)
    # Accepted for compatibility with Go EPP files; epick sizes blocks from the parameters above.
    auto_tune: bool = False
    prefix_match_info_producer_name: str = ""
    match_length_weight: float = Field(default=0.0, ge=0.0, le=1.0)
    match_length_scale_tokens: int = Field(default=8192)

    @model_validator(mode="after")
    def _scale(self) -> PrefixCacheParameters:
        if self.match_length_weight > 0 and self.match_length_scale_tokens <= 0:
            raise ValueError(
                "matchLengthScaleTokens must be greater than 0 when matchLengthWeight is greater than 0, "
                f"got {self.match_length_scale_tokens}"
            )
        return self

    @model_validator(mode="after")
    def _one_block_size(self) -> PrefixCacheParameters:
        if self.hash_block_size is not None and "block_size_tokens" in self.model_fields_set:
            raise ValueError(
                "give the block size once: blockSizeTokens (tokens) or hashBlockSize (bytes), not both"
            )
        return self

    def block_bytes(self) -> int:
        if self.hash_block_size is not None:
            return self.hash_block_size
        return self.block_size_tokens * CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """What the scorer found for this request: blocks matched per endpoint name."""

    total_blocks: int
    block_bytes: int
    matched: Mapping[str, int]
    hashes: list[int] = field(default_factory=list, repr=False)
    # Blocks held per endpoint, unweighted, where `matched` is weighted by tier (the precise index)
    unweighted: Mapping[str, int] | None = None
    # Per device tier, the run of the prompt's blocks an endpoint holds on that tier, computed when
    # asked (the precise index; None: the producer knows no tiers).
    tiers: Callable[[str], Mapping[str, int]] | None = field(default=None, repr=False, compare=False)

    def cached_bytes(self, endpoint: str) -> int:
        held = self.unweighted if self.unweighted is not None else self.matched
        return held.get(endpoint, 0) * self.block_bytes

    def cached_tokens(self, endpoint: str) -> int:
        return self.cached_bytes(endpoint) // CHARS_PER_TOKEN


class PrefixCacheScorer(SharedIndex, NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT | Reads.MODEL | Reads.BODY | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        block_size_tokens: int = 16,
        max_prefix_blocks_to_match: int = 256,
        lru_capacity_per_server: int = 31250,
        *,
        block_bytes: int | None = None,  # instead of block_size_tokens: GIE's older hashBlockSize
        producer: str | None = None,  # the name of the producer whose match to read (None: own index)
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = 8192,
    ) -> None:
        super().__init__(name)
        self.producer_key = data_key(MATCH_DATA_TYPE, producer) if producer is not None else None
        self.match_length_weight = match_length_weight
        self.match_length_scale_tokens = match_length_scale_tokens
        self.block_bytes = block_bytes if block_bytes is not None else block_size_tokens * CHARS_PER_TOKEN
        self.max_blocks = max_prefix_blocks_to_match
        self.index = PrefixIndex(lru_capacity_per_server)
        # Requests scored, and blocks matched on the chosen endpoint, for a hit ratio.
        self.lookups = 0
        self.lookup_blocks = 0
        self.hit_blocks = 0
        self.hit_ratios = HistogramCounts(HIT_RATIO_BUCKETS)
        self.hit_bytes = HistogramCounts(HIT_BYTES_BUCKETS)

    def hashes(self, request: InferenceRequest) -> list[int]:
        return prompt_block_hashes(
            request.body.prefix_text,
            request.target_model,
            block_bytes=self.block_bytes,
            max_blocks=self.max_blocks,
            cache_salt=request.body.cache_salt,
        )

    def _match(self, request: InferenceRequest, cycle_state: CycleState) -> PrefixMatch:
        if self.producer_key is not None:
            return cycle_state.read(self.producer_key, PrefixMatch) or _NO_MATCH
        # Computed once per scheduling call and left in its cycle state: a scorer in two profiles,
        # and PreRequest, reuse it.
        key = state_key(self)
        found = cycle_state.read(key, PrefixMatch)
        if found is None:
            hashes = self.hashes(request)
            found = PrefixMatch(len(hashes), self.block_bytes, self.index.match(hashes), hashes)
            cycle_state.write(key, found)
        return found

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        match = self._match(request, cycle_state)
        matched = match.matched
        if not matched:
            return [0.0] * len(endpoints)
        total = match.total_blocks
        w = self.match_length_weight
        if w <= 0:
            return [matched.get(ep.name, 0) / total for ep in endpoints]
        scale = self.match_length_scale_tokens
        block_tokens = match.block_bytes // CHARS_PER_TOKEN
        return [
            w * min(1.0, matched.get(ep.name, 0) * block_tokens / scale) ** 2
            + (1 - w) * matched.get(ep.name, 0) / total
            for ep in endpoints
        ]

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        if self.producer_key is not None:
            return  # the producer records
        match = self._match(request, cycle_state)
        if not match.hashes:
            return
        primary = result.profile_results.get(result.primary_profile)
        if primary is not None and primary.targets:
            hits = match.matched.get(primary.targets[0].name, 0)
            self.lookups += 1
            self.lookup_blocks += match.total_blocks
            self.hit_blocks += hits
            if match.total_blocks:
                self.hit_ratios.observe(hits / match.total_blocks)
            self.hit_bytes.observe(hits * match.block_bytes)
        for r in result.profile_results.values():
            if r is not None and r.targets:
                self.index.add(r.targets[0].name, match.hashes)

    def endpoint_removed(self, name: str) -> None:
        """An endpoint that left holds no blocks: it leaves the index."""
        self.index.remove_endpoint(name)

    @property
    def hit_ratio(self) -> float:
        """Share of prompt blocks found on the chosen endpoint, over all requests recorded."""
        return self.hit_blocks / self.lookup_blocks if self.lookup_blocks else 0.0

    # ExportsMetrics: upstream's prefix-indexer families, new and deprecated names.
    def metric_samples(self) -> Iterator[MetricSample]:
        size = float(len(self.index))
        for prefix, labelled in ((f"{LLMD_SUBSYSTEM}_", True), ("inference_extension_", False)):
            yield MetricSample(prefix + INDEXER_SIZE, INDEXER_SIZE_DOC, "gauge", size, plugin_labels=labelled)
            yield self.hit_ratios.sample(
                prefix + INDEXER_HIT_RATIO, INDEXER_HIT_RATIO_DOC, plugin_labels=labelled
            )
            yield self.hit_bytes.sample(
                prefix + INDEXER_HIT_BYTES, INDEXER_HIT_BYTES_DOC, plugin_labels=labelled
            )


_NO_MATCH = PrefixMatch(0, 0, {})


def find_prefix_match(cycle_state: CycleState, plugin_name: str | None = None) -> PrefixMatch | None:
    """The `PrefixMatch` a prefix scorer or producer left in this cycle: the named one's (a scorer's,
    else a producer's), or any if no name is given."""
    if plugin_name is not None:
        return cycle_state.read(f"{plugin_name}/{TYPE}", PrefixMatch) or cycle_state.read(
            data_key(MATCH_DATA_TYPE, plugin_name), PrefixMatch
        )
    for key in cycle_state.keys():  # noqa: SIM118 (CycleState is not a dict)
        found = cycle_state.read(key, PrefixMatch)
        if found is not None:
            return found
    return None


def resolve_producer(handle: Handle, producer_name: str, parameter: str) -> str | None:
    """The prefix-match producer a consumer reads: the one `producer_name` names (an error if the config
    has no such producer), else the config's `approx-prefix-cache-producer` if it has one, else None
    (the consumer keeps its own index: what upstream's auto-created default producer would do)."""
    plugin = producer_for(
        handle,
        producer_name,
        DEFAULT_PRODUCER,
        parameter,
        accepts=lambda p: p.typed_name.type in MATCH_PRODUCER_TYPES,
        what="prefix-match producer",
        produces="prefix-match data",
        fix=f"name a plugin of type {' or '.join(MATCH_PRODUCER_TYPES)}",
    )
    return plugin.typed_name.name if plugin is not None else None


def _factory(name: str, params: PrefixCacheParameters, handle: Handle) -> PrefixCacheScorer:
    return _build(PrefixCacheScorer, name, params, handle)


def _build(
    kind: type[PrefixCacheScorer], name: str, params: PrefixCacheParameters, handle: Handle
) -> PrefixCacheScorer:
    producer = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    return kind(
        name,
        params.block_size_tokens,
        params.max_prefix_blocks_to_match,
        params.lru_capacity_per_server,
        block_bytes=params.block_bytes(),
        producer=producer,
        match_length_weight=params.match_length_weight,
        match_length_scale_tokens=params.match_length_scale_tokens,
    )


INDEX_PARAMETERS = frozenset(
    {"block_size_tokens", "max_prefix_blocks_to_match", "lru_capacity_per_server", "hash_block_size"}
)


def _requires(params: PrefixCacheParameters, api_version: str = "") -> tuple[str, ...]:
    """Under llm-d's apiVersion a prefix-cache-scorer that sizes no index of its own reads an
    approx-prefix-cache-producer with default parameters (llm-d/llm-d-router's loader creates one);
    under GIE's, the scorer keeps its own index, which is what GIE v1.5's loader builds for it (a
    producer with the scorer's parameters)."""
    if params.prefix_match_info_producer_name or not api_version.startswith("llm-d.ai/"):
        return ()
    return () if params.model_fields_set & INDEX_PARAMETERS else (DEFAULT_PRODUCER,)


SPEC = PluginSpec(
    TYPE, _factory, PrefixCacheParameters, "matched prompt blocks / prompt blocks", requires=_requires
)

MULTICLUSTER_TYPE = "multicluster-prefix-cache-scorer"


class MultiClusterPrefixCacheScorer(PrefixCacheScorer):
    """`prefix-cache-scorer` over peer clusters (llm-d/llm-d-router, scheduling/scorer/prefix/
    multicluster.go): the same parameters and score, only the type differs."""

    plugin_type = MULTICLUSTER_TYPE


def _multicluster(name: str, params: PrefixCacheParameters, handle: Handle) -> PrefixCacheScorer:
    return _build(MultiClusterPrefixCacheScorer, name, params, handle)


MULTICLUSTER_SPEC = PluginSpec(
    MULTICLUSTER_TYPE,
    _multicluster,
    PrefixCacheParameters,
    "prefix-cache-scorer over peer clusters",
    requires=_requires,
)
