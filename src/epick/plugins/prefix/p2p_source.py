"""`p2p-source-producer`: name a peer that holds the request's prefix in its CPU KV cache, so the
serving engine pulls those blocks instead of recomputing them (vLLM's OffloadingConnector with a p2p
tier; llm-d's routing sidecar turns the header into `kv_transfer_params.remote_kv_source`).

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/p2psource):
- Before scheduling: from the prefix match of `prefixMatchInfoProducerName` (default
  `approx-prefix-cache-producer`), each candidate's cached tokens: its CPU-tier run when the producer
  knows tiers (the precise index: pulls are served from CPU, so GPU-only and speculative blocks do not
  count), else its matched blocks; × the block size. Of the candidates within one block of the most,
  one is drawn with weight 1 / (1 + waiting queue), by FNV-1a (32-bit) of the request id, so one
  request always draws the same peer.
- After the decision: the endpoint that computes the prompt is the `prefillProfileName` profile's
  target when that profile ran, else the primary one's. Unless it is the peer, or the peer holds fewer
  than `minCachedTokenDelta` tokens more than it does (its own count, every tier), the forwarded
  request carries `x-kv-cache-source-host-port: <peer ip:port>` (IPv6 in brackets).

A client's own `x-kv-cache-source-host-port` is always dropped; epick's front ends drop it whether or
not this plugin is configured (upstream drops it in this plugin's PreRequest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, SchedulingResult
from epick.framework.datalayer import data_key
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch, resolve_producer
from epick.plugins.registry import Handle, Parameters, PluginSpec, default_producer

TYPE = "p2p-source-producer"
DEFAULT_PRODUCER = "approx-prefix-cache-producer"
HEADER = "x-kv-cache-source-host-port"
CPU_TIER = "cpu"
FNV_OFFSET, FNV_PRIME = 0x811C9DC5, 0x01000193


def fnv1a_32(data: bytes) -> int:
    h = FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return h


def host_port(endpoint: Endpoint) -> str:
    address = endpoint.address
    return f"[{address}]:{endpoint.port}" if ":" in address else f"{address}:{endpoint.port}"


@dataclass(frozen=True, slots=True)
class BestSource:
    host_port: str
    cached_tokens: int


class P2PSourceParameters(Parameters):
    prefix_match_info_producer_name: str = ""
    min_cached_token_delta: int = Field(default=1, ge=1)
    prefill_profile_name: str = ""


class P2PSourceProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS  # and the prefix match

    def __init__(
        self,
        name: str | None = None,
        producer: str = DEFAULT_PRODUCER,
        min_cached_token_delta: int = 1,
        prefill_profile: str = "prefill",
    ) -> None:
        super().__init__(name)
        self.match_key = data_key(MATCH_DATA_TYPE, producer)
        self.min_delta = min_cached_token_delta
        self.prefill_profile = prefill_profile or "prefill"
        self.key = data_key("best-match", self.name)

    @staticmethod
    def source_tokens(match: PrefixMatch, endpoint: str) -> int:
        block_tokens = match.block_bytes // CHARS_PER_TOKEN
        if match.tiers is not None:
            return match.tiers(endpoint).get(CPU_TIER, 0) * block_tokens
        return match.cached_tokens(endpoint)

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        match = cycle_state.read(self.match_key, PrefixMatch)
        if match is None:
            return
        held = [(ep, tokens) for ep in endpoints if (tokens := self.source_tokens(match, ep.name)) > 0]
        if not held:
            return
        block_tokens = match.block_bytes // CHARS_PER_TOKEN
        most = max(tokens for _, tokens in held)
        band = [(ep, tokens) for ep, tokens in held if tokens + block_tokens >= most]
        weights = [1.0 / (1.0 + ep.metrics.waiting_queue_size) for ep, _ in band]
        target = fnv1a_32(request.request_id.encode()) / 2**32 * sum(weights)
        chosen = len(band) - 1
        for i, weight in enumerate(weights):
            if target < weight:
                chosen = i
                break
            target -= weight
        ep, tokens = band[chosen]
        cycle_state.write(self.key, BestSource(host_port(ep), tokens))

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        best = cycle_state.read(self.key, BestSource)
        if best is None:
            return
        computing = result.profile_results.get(self.prefill_profile)
        if computing is None or not computing.targets:
            computing = result.profile_results.get(result.primary_profile)
        if computing is None or not computing.targets:
            return
        endpoint = computing.targets[0]
        if best.host_port == host_port(endpoint):
            return
        match = cycle_state.read(self.match_key, PrefixMatch)
        own = match.cached_tokens(endpoint.name) if match is not None else 0
        if best.cached_tokens - own < self.min_delta:
            return
        result.hook_headers[HEADER] = best.host_port


def _factory(name: str, params: P2PSourceParameters, handle: Handle) -> P2PSourceProducer:
    producer = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    return P2PSourceProducer(
        name, producer or DEFAULT_PRODUCER, params.min_cached_token_delta, params.prefill_profile_name
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    P2PSourceParameters,
    "names a peer holding the prompt's KV blocks (x-kv-cache-source-host-port)",
    requires=default_producer("prefix_match_info_producer_name", DEFAULT_PRODUCER),
)
