"""`approx-prefix-cache-producer`: the approximate prefix index as a data producer (llm-d's layout).

Upstream (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix)
moved the index out of `prefix-cache-scorer` into this producer: before scheduling it computes, for
every candidate, how many of the prompt's blocks the endpoint is believed to hold, and publishes it as
"PrefixCacheMatchInfoDataKey/<its name>"; `prefix-cache-scorer`, `no-hit-lru-scorer` and
`prefix-based-pd-decider` read it (`prefixMatchInfoProducerName`, default this type). It records in
PreRequest: the prompt's blocks go to the primary profile's first target and to the first target of
a profile named `prefill`.

Parameters as upstream's: `blockSizeTokens` (16, raised to upstream's minimum of 64 when used),
`blockSize` (deprecated: used as blockSizeTokens when that is left at its default),
`maxPrefixTokensToMatch` (131072; when > 0 the block cap is it / block size), `maxPrefixBlocksToMatch`
(2048; used when the token cap is 0; 0 for both: no cap), `lruCapacityPerServer` (31250), `autoTune`
(true: the block size is the first candidate's reported `cache_block_size`, when it reports one).
Blocks are `blockSize × 4` bytes of the prefix text, upstream's estimate tokenizer's 4 bytes per token
(docs/plugins.md, "The approximate prefix index", has the text per API). Deviation, on purpose: with
`autoTune` upstream also sizes each endpoint's LRU from its reported block count; epick keeps
`lruCapacityPerServer` for every endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, SchedulingResult
from epick.framework.datalayer import data_key
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.prefix.hashing import prompt_block_hashes
from epick.plugins.prefix.index import PrefixIndex, SharedIndex
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "approx-prefix-cache-producer"
MIN_BLOCK_SIZE_TOKENS = 64
PREFILL_PROFILE = "prefill"


def match_key(producer_name: str = TYPE) -> str:
    """The cycle-state key a prefix-match producer named `producer_name` writes."""
    return data_key(MATCH_DATA_TYPE, producer_name)


class ApproxPrefixParameters(Parameters):
    auto_tune: bool = True
    block_size_tokens: int = Field(default=16, ge=0)
    block_size: int = Field(default=0, ge=0)  # deprecated upstream
    max_prefix_blocks_to_match: int = Field(default=2048, ge=0)
    max_prefix_tokens_to_match: int = Field(default=131072, ge=0)
    lru_capacity_per_server: int = Field(default=31250, gt=0)

    @model_validator(mode="after")
    def _block_size(self) -> ApproxPrefixParameters:
        if not self.auto_tune and self.effective_block_size_tokens() <= 0:
            raise ValueError(
                "blockSizeTokens must be > 0 when autoTune is disabled "
                f"(current value: {self.block_size_tokens})"
            )
        return self

    def effective_block_size_tokens(self) -> int:
        if self.block_size > 0 and "block_size_tokens" not in self.model_fields_set:
            return self.block_size
        return self.block_size_tokens


class ApproxPrefixCacheProducer(SharedIndex, NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT | Reads.MODEL | Reads.BODY | Reads.HISTORY

    def __init__(self, name: str | None = None, params: ApproxPrefixParameters | None = None) -> None:
        super().__init__(name)
        self.params = params or ApproxPrefixParameters()
        self.configured_block_tokens = self.params.effective_block_size_tokens()
        self.index = PrefixIndex(self.params.lru_capacity_per_server)
        self.key = match_key(self.name)

    def block_size_tokens(self, endpoints: Sequence[Endpoint]) -> int:
        size = self.configured_block_tokens
        if self.params.auto_tune and endpoints and endpoints[0].metrics.cache_block_size > 0:
            size = endpoints[0].metrics.cache_block_size
        return max(size, MIN_BLOCK_SIZE_TOKENS)

    def max_blocks(self, block_tokens: int) -> int:
        p = self.params
        if p.max_prefix_tokens_to_match > 0:
            return p.max_prefix_tokens_to_match // block_tokens
        if p.max_prefix_blocks_to_match == 0:
            return 1 << 40  # no cap
        return p.max_prefix_blocks_to_match

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        block_tokens = self.block_size_tokens(endpoints)
        block_bytes = block_tokens * CHARS_PER_TOKEN
        cap = self.max_blocks(block_tokens)
        hashes = (
            prompt_block_hashes(
                request.body.prefix_text,
                request.target_model,
                block_bytes=block_bytes,
                max_blocks=cap,
                cache_salt=request.body.cache_salt,
            )
            if cap > 0
            else []
        )
        cycle_state.write(self.key, PrefixMatch(len(hashes), block_bytes, self.index.match(hashes), hashes))

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        match = cycle_state.read(self.key, PrefixMatch)
        if match is None or not match.hashes:
            return
        for target in recording_targets(result):
            self.index.add(target.name, match.hashes)

    def endpoint_removed(self, name: str) -> None:
        self.index.remove_endpoint(name)


def recording_targets(result: SchedulingResult) -> list[Endpoint]:
    """Where a decision puts the prompt's blocks: the primary profile's first target, and the first
    target of a profile named `prefill` (upstream's rule for both prefix producers)."""
    primary = result.profile_results.get(result.primary_profile)
    if primary is None or not primary.targets:
        return []
    targets = [primary.targets[0]]
    prefill = result.profile_results.get(PREFILL_PROFILE)
    if prefill is not None and prefill.targets and result.primary_profile != PREFILL_PROFILE:
        targets.append(prefill.targets[0])
    return targets


def _factory(name: str, params: ApproxPrefixParameters, handle: Handle) -> ApproxPrefixCacheProducer:
    return ApproxPrefixCacheProducer(name, params)


SPEC = PluginSpec(TYPE, _factory, ApproxPrefixParameters, "which candidates hold the prompt's prefix blocks")

MULTICLUSTER_TYPE = "multicluster-approx-prefix-cache-producer"


class MultiClusterApproxPrefixCacheProducer(ApproxPrefixCacheProducer):
    """`approx-prefix-cache-producer` over peer clusters (llm-d/llm-d-router,
    dataproducer/approximateprefix/multicluster.go): the index keys blocks by cluster endpoint;
    parameters and behaviour are the stock producer's, only the type differs."""

    plugin_type = MULTICLUSTER_TYPE


def _multicluster(
    name: str, params: ApproxPrefixParameters, handle: Handle
) -> MultiClusterApproxPrefixCacheProducer:
    return MultiClusterApproxPrefixCacheProducer(name, params)


MULTICLUSTER_SPEC = PluginSpec(
    MULTICLUSTER_TYPE,
    _multicluster,
    ApproxPrefixParameters,
    "approx-prefix-cache-producer over peer clusters",
)
