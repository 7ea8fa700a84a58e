"""`smallest-cache-scorer` (epick's own): send a cold request where the approximate index holds least.

A request is cold when no candidate holds any of its blocks (the prefix match of
`prefixMatchInfoProducerName`, default the config's `approx-prefix-cache-producer`). A cold request
starts a new prefix, and the requests that will share it follow it; SGLang's cache-aware router sends
such a request to the worker whose tree holds the fewest characters, which spreads both the cached
prompts and the load they bring. This scorer does the same with the approximate index: for a cold
request, the candidates are scored by the blocks the index records for them, min-max normalised, the
fewest 1 and the most 0 (all 1 when equal). A warm request scores 0.5 everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.prefix.index import PrefixIndex
from epick.plugins.prefix.producer import ApproxPrefixCacheProducer
from epick.plugins.prefix.scorer import DEFAULT_PRODUCER, MATCH_DATA_TYPE, PrefixMatch
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec, default_producer

TYPE = "smallest-cache-scorer"


class SmallestCacheParameters(Parameters):
    prefix_match_info_producer_name: str = ""


class SmallestCacheScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # the prefix match and the index's contents

    def __init__(self, name: str | None = None, *, producer: str, index: PrefixIndex) -> None:
        super().__init__(name)
        self.match_key = data_key(MATCH_DATA_TYPE, producer)
        self.index = index

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        match = cycle_state.read(self.match_key, PrefixMatch)
        if match is None or any(match.matched.get(ep.name, 0) > 0 for ep in endpoints):
            return [0.5] * len(endpoints)
        held = [self.index.blocks(ep.name) for ep in endpoints]
        low, high = min(held, default=0), max(held, default=0)
        if high == low:
            return [1.0] * len(endpoints)
        return [(high - h) / (high - low) for h in held]


def _factory(name: str, params: SmallestCacheParameters, handle: Handle) -> SmallestCacheScorer:
    producer_name = params.prefix_match_info_producer_name or DEFAULT_PRODUCER
    try:
        producer = handle.plugin(producer_name)
    except LookupError:
        raise ParameterError(
            "prefixMatchInfoProducerName",
            f"no plugin named {producer_name!r} in this config",
            "add an approx-prefix-cache-producer (or name one)",
        ) from None
    if not isinstance(producer, ApproxPrefixCacheProducer):
        raise ParameterError(
            "prefixMatchInfoProducerName",
            f"{producer_name!r} is a {producer.typed_name.type}, not an approx-prefix-cache-producer",
            "name a plugin of type approx-prefix-cache-producer",
        )
    return SmallestCacheScorer(name, producer=producer.typed_name.name, index=producer.index)


SPEC = PluginSpec(
    TYPE,
    _factory,
    SmallestCacheParameters,
    "epick: cold requests to the endpoints whose approximate index holds the fewest blocks",
    requires=default_producer("prefix_match_info_producer_name", DEFAULT_PRODUCER),
    worker_state="",
)
