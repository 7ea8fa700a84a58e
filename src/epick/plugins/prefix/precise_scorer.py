"""`precise-prefix-cache-scorer`: the precise prefix-cache index as one scorer (deprecated upstream
in favour of `precise-prefix-cache-producer` with `prefix-cache-scorer`; llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache).

It takes the producer's parameters. When the config already has a `precise-prefix-cache-producer`,
it scores from that producer's match; otherwise it keeps an index of its own, as the producer would.
Score = blocks matched (tier-weighted, whole blocks) / prompt blocks, 0 without tokens or a match.
Its tokens come from the config's token producer; the older `indexerConfig.tokenizersPoolConfig`
(`modelName`) gives it a tokenizer of its own instead, used when a request has no tokens yet (epick
loads that model's tokenizer files as `token-producer`'s `local` backend finds them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, Plugin, Reads
from epick.plugins.prefix.precise import (
    TOKENS_TYPE,
    PrecisePrefixCacheProducer,
    SharedPrecisePrefixCacheProducer,
    speculative_state,
    token_source,
)
from epick.plugins.prefix.precise import TYPE as PRODUCER_TYPE
from epick.plugins.prefix.precise_parameters import PreciseParameters
from epick.plugins.prefix.producer import match_key
from epick.plugins.prefix.scorer import PrefixMatch
from epick.plugins.registry import Handle, ParameterError, PluginSpec
from epick.plugins.tokens.producer import TokenProducer

TYPE = "precise-prefix-cache-scorer"


class PrecisePrefixCacheScorer(PrecisePrefixCacheProducer):
    plugin_type = TYPE
    reads = Reads.TOKENS | Reads.MODEL | Reads.HISTORY

    def __init__(
        self,
        name: str | None = None,
        params: PreciseParameters | None = None,
        *,
        producer: str | None = None,  # an existing precise producer to score from
        tokenizer: TokenProducer | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name, params, clock)
        self.source = match_key(producer) if producer is not None else self.key
        self.delegating = producer is not None
        self.own_tokenizer = tokenizer

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        if self.delegating:
            return
        if self.own_tokenizer is not None and request.body.tokenized is None:
            self.own_tokenizer.produce(request, cycle_state, endpoints)
        super().produce(request, cycle_state, endpoints)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        match = cycle_state.read(self.source, PrefixMatch)
        if match is None or not match.total_blocks:
            return [0.0] * len(endpoints)
        total = match.total_blocks
        return [min(1.0, match.matched.get(ep.name, 0) / total) for ep in endpoints]


class SharedPrecisePrefixCacheScorer(PrecisePrefixCacheScorer, SharedPrecisePrefixCacheProducer):
    """`precise-prefix-cache-scorer` keeping its own index, on Redis or Valkey."""


def _existing_producer(handle: Handle) -> str | None:
    try:
        plugin: Plugin = handle.plugin(PRODUCER_TYPE)
    except LookupError:
        return None
    return plugin.typed_name.name if plugin.typed_name.type == PRODUCER_TYPE else None


def _factory(name: str, params: PreciseParameters, handle: Handle) -> PrecisePrefixCacheScorer:
    pool = params.indexer_config.tokenizers_pool_config
    tokenizer = None
    if pool is not None:
        model = pool.get("modelName")
        if not isinstance(model, str) or not model:
            raise ParameterError(
                "indexerConfig.tokenizersPoolConfig.modelName", "tokenizersPoolConfig needs modelName"
            )
        tokenizer = TokenProducer(
            f"{name}-tokenizer", backend="local", tokenizer_source=model, model_name=model
        )
    producer = _existing_producer(handle)
    if params.shared_index() is None or producer is not None:
        return PrecisePrefixCacheScorer(
            name, params, producer=producer, tokenizer=tokenizer, clock=handle.clock
        )
    plugin = SharedPrecisePrefixCacheScorer(name, params, tokenizer=tokenizer, clock=handle.clock)
    plugin.tokenizer = tokenizer or token_source(handle)
    return plugin


def _requires(params: PreciseParameters, api_version: str = "") -> tuple[str, ...]:
    return () if params.indexer_config.tokenizers_pool_config is not None else (TOKENS_TYPE,)


SPEC = PluginSpec(
    TYPE,
    _factory,
    PreciseParameters,
    "prompt blocks the candidate holds, from the engines' KV events (deprecated upstream)",
    requires=_requires,
    worker_state=speculative_state,
)
