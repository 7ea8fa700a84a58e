"""`mm-embeddings-cache-scorer`: the share of the request's media an endpoint has already encoded.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/scorer/mmcacheaffinity): the
score is the summed size of the items the endpoint holds over the summed size of the request's items,
from `mm-embeddings-cache-producer`'s data (`producerName`, default that type); 0 for every endpoint
when the request carries no media or no producer ran. When the config has no producer, the loader
adds one with default parameters (upstream registers it as its key's default producer).
"""

from __future__ import annotations

from collections.abc import Sequence

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.plugins.multimodal.producer import TYPE as PRODUCER_TYPE
from epick.plugins.multimodal.producer import EncoderCacheMatch, match_key
from epick.plugins.registry import Handle, Parameters, PluginSpec, default_producer, producer_for

TYPE = "mm-embeddings-cache-scorer"


class MMEmbeddingsCacheScorerParameters(Parameters):
    producer_name: str = ""


class MMEmbeddingsCacheScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING  # the producer's data in the cycle state alone

    def __init__(self, name: str | None = None, producer: str = PRODUCER_TYPE) -> None:
        super().__init__(name)
        self.key = match_key(producer)

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        match = cycle_state.read(self.key, EncoderCacheMatch)
        total = sum(item.size for item in match.request_items) if match is not None else 0
        if match is None or total <= 0:
            return [0.0] * len(endpoints)
        return [sum(item.size for item in match.matched_items(ep.name)) / total for ep in endpoints]


def _factory(name: str, params: MMEmbeddingsCacheScorerParameters, handle: Handle) -> MMEmbeddingsCacheScorer:
    producer = producer_for(
        handle,
        params.producer_name,
        PRODUCER_TYPE,
        "producerName",
        accepts=lambda p: p.typed_name.type == PRODUCER_TYPE,
        what="multimodal cache producer",
        produces="multimodal cache matches",
        fix=f"name a plugin of type {PRODUCER_TYPE}",
    )
    return MMEmbeddingsCacheScorer(name, producer.typed_name.name if producer is not None else PRODUCER_TYPE)


SPEC = PluginSpec(
    TYPE,
    _factory,
    MMEmbeddingsCacheScorerParameters,
    "held media items / the request's media items",
    requires=default_producer("producer_name", PRODUCER_TYPE),
)
