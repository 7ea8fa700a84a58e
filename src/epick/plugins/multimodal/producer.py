"""`mm-embeddings-cache-producer`: which endpoints have already encoded the request's media.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/multimodal):
each endpoint keeps an LRU of the media hashes it was sent (`epick.plugins.multimodal.items`), of
`cacheSizeInMBPerServer` / 2 entries (upstream assumes 2 MiB per item; default 4096 MB: 2,048
entries, at least 1). Before scheduling it publishes, as "MultiModalEncoderCacheMatchInfoKey/<its
name>", the request's items and, per candidate, those the candidate holds (nothing when the request
carries no media); `mm-embeddings-cache-scorer` reads it. After the decision the primary profile's
targets are believed to hold every item (upstream's optimistic update; no response confirms it).
Looking an item up does not refresh it; sending it does. An endpoint that leaves the pool loses its
cache.

Deviations, on purpose:
- Upstream reads the items from the token producer's multimodal features, so it needs one; epick
  reads them from the body with the same hashes (a generate body's `features` carry vLLM's own), so
  no tokenizer is needed.
- `cacheSizeInMB` is read as `cacheSizeInMBPerServer`: llm-d-router's sample config
  (deploy/config/epp-mm-embeddings-cache-config.yaml) spells it so, and upstream's strict decoder
  refuses it.
- Upstream's `llm_d_epp_encoder_cache_*` metrics and its state dump are not served.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import AliasChoices, Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, SchedulingResult
from epick.framework.datalayer import data_key
from epick.plugins.debug_state import MAX_LISTED, capped
from epick.plugins.multimodal.items import MediaItem, media_items
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "mm-embeddings-cache-producer"
MATCH_DATA_TYPE = "MultiModalEncoderCacheMatchInfoKey"
DEFAULT_CACHE_MB = 4096
MB_PER_ITEM = 2


def match_key(producer_name: str = TYPE) -> str:
    return data_key(MATCH_DATA_TYPE, producer_name)


def capacity_of(cache_mb: int) -> int:
    """Entries per endpoint for a cache of `cache_mb` MB (upstream's `lruCapacityFromCacheSizeMB`)."""
    if cache_mb <= 0:
        cache_mb = DEFAULT_CACHE_MB
    return max(1, cache_mb // MB_PER_ITEM)


@dataclass(frozen=True, slots=True)
class EncoderCacheMatch:
    """The request's media items, and per endpoint name those the endpoint holds."""

    request_items: tuple[MediaItem, ...]
    matched: Mapping[str, tuple[MediaItem, ...]]

    def matched_items(self, endpoint: str) -> tuple[MediaItem, ...]:
        return self.matched.get(endpoint, ())


class MMEmbeddingsCacheParameters(Parameters):
    cache_size_in_mb_per_server: int = Field(
        default=DEFAULT_CACHE_MB,
        validation_alias=AliasChoices(
            "cacheSizeInMBPerServer", "cacheSizeInMB", "cache_size_in_mb_per_server"
        ),
    )


class MMEmbeddingsCacheProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT | Reads.BODY | Reads.HISTORY

    def __init__(self, name: str | None = None, cache_size_mb: int = DEFAULT_CACHE_MB) -> None:
        super().__init__(name)
        self.capacity = capacity_of(cache_size_mb)
        self.caches: dict[str, OrderedDict[str, None]] = {}
        self.key = match_key(self.name)

    def holds(self, endpoint: str, digest: str) -> bool:
        cache = self.caches.get(endpoint)
        return cache is not None and digest in cache

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        items = media_items(request)
        if not items:
            return
        matched = {ep.name: tuple(i for i in items if self.holds(ep.name, i.hash)) for ep in endpoints}
        cycle_state.write(self.key, EncoderCacheMatch(items, matched))

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        match = cycle_state.read(self.key, EncoderCacheMatch)
        primary = result.profile_results.get(result.primary_profile)
        if match is None or primary is None:
            return
        for target in primary.targets:
            self.record(target.name, match.request_items)

    def record(self, endpoint: str, items: Sequence[MediaItem]) -> None:
        cache = self.caches.setdefault(endpoint, OrderedDict())
        for item in items:
            cache[item.hash] = None
            cache.move_to_end(item.hash)
        while len(cache) > self.capacity:
            cache.popitem(last=False)

    def dump_state(self) -> object:
        """Items cached per endpoint (`/debug/plugins/state`), as upstream's encoder-cache dump."""
        names = capped(self.caches)
        return {
            "pods": [{"pod": n, "items": len(self.caches[n])} for n in names],
            "totalPods": len(self.caches),
            "maxPods": MAX_LISTED,
        }

    def endpoint_removed(self, name: str) -> None:
        self.caches.pop(name, None)

    def endpoint_changed(self, endpoint: Endpoint) -> Mapping[str, object | None]:
        """As an extractor of `endpoint-notification-source` (upstream's sample wires it so): departures
        arrive through `endpoint_removed`; nothing to set on the endpoint."""
        return {}


def _factory(name: str, params: MMEmbeddingsCacheParameters, handle: Handle) -> MMEmbeddingsCacheProducer:
    return MMEmbeddingsCacheProducer(name, params.cache_size_in_mb_per_server)


SPEC = PluginSpec(
    TYPE,
    _factory,
    MMEmbeddingsCacheParameters,
    "which endpoints already encoded the request's media",
    worker_state="which media each endpoint was sent",
)
