"""`precise-prefix-cache-scorer`: the precise prefix-cache index as one scorer (deprecated upstream
in favour of `precise-prefix-cache-producer` with `prefix-cache-scorer`; llm-d/llm-d-router,
pkg/epp/framework/plugins/scheduling/scorer/preciseprefixcache).

It takes the producer's parameters. When the config already has a `precise-prefix-cache-producer`,
it scores from that producer's match; otherwise it keeps an index of its own, as the producer would.
Score = blocks matched (tier-weighted, whole blocks) / prompt blocks, 0 without tokens or a match.
Its tokens come from the config's token producer; the older `indexerConfig.tokenizersPoolConfig`
(`modelName`) gives it a tokenizer of its own instead, used when a request has no tokens yet: the
tokenizer sidecar at `uds.socketFile` (as `token-producer`'s `udsTokenizerConfig`; the scorer is then
a remote tokenizer, initialized first and not ready until then), else the model's tokenizer files as
`token-producer`'s `local` backend finds them (epick's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from epick.framework import CycleState, Endpoint, InferenceRequest, Plugin, Reads, TokenizeCall
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
from epick.plugins.tokens.producer import TokenProducer, uds_producer

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

    # RemoteTokenizer, InitializedTokenizer, ReadinessChecker: its own tokenizer's, when it has one
    # that asks a sidecar (`tokenizersPoolConfig.uds`).
    @property
    def remote(self) -> bool:
        return self.own_tokenizer is not None and self.own_tokenizer.remote

    def tokenize_call(self, request: InferenceRequest) -> TokenizeCall | None:
        return self.own_tokenizer.tokenize_call(request) if self.own_tokenizer is not None else None

    def tokenized(self, request: InferenceRequest, answers: Sequence[Mapping[str, Any]]) -> None:
        if self.own_tokenizer is not None:
            self.own_tokenizer.tokenized(request, answers)

    def initialize_call(self) -> TokenizeCall | None:
        return self.own_tokenizer.initialize_call() if self.own_tokenizer is not None else None

    def initialized(self, answers: Sequence[Mapping[str, Any]] | None, error: str | None) -> None:
        if self.own_tokenizer is not None:
            self.own_tokenizer.initialized(answers, error)

    def check_ready(self) -> str | None:
        return self.own_tokenizer.check_ready() if self.own_tokenizer is not None else None

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


def _own_tokenizer(name: str, params: PreciseParameters) -> TokenProducer | None:
    """`indexerConfig.tokenizersPoolConfig`'s tokenizer: its `uds` sidecar, else the model's files."""
    pool = params.indexer_config.tokenizers_pool_config
    if pool is None:
        return None
    where = "indexerConfig.tokenizersPoolConfig"
    if not pool.model_name:
        raise ParameterError(f"{where}.modelName", "tokenizersPoolConfig needs modelName")
    if pool.uds is not None and pool.uds.socket_file:
        try:
            return uds_producer(f"{name}-tokenizer", pool.model_name, pool.uds, where=f"{where}.uds")
        except ParameterError as e:
            raise ParameterError(f"{where}.{e.parameter}", str(e), e.fix) from None
    return TokenProducer(
        f"{name}-tokenizer",
        backend="local",
        tokenizer_source=pool.model_name,
        search=pool.search_dirs(),
        model_name=pool.model_name,
    )


def _factory(name: str, params: PreciseParameters, handle: Handle) -> PrecisePrefixCacheScorer:
    tokenizer = _own_tokenizer(name, params)
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
