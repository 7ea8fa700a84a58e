"""`precise-prefix-cache-producer`'s and `-scorer`'s parameters, as llm-d-router ebab687 spells them
(`tokenProcessorConfig`, `indexerConfig` with its `kvBlockIndexConfig`, `kvEventsConfig`,
`speculativeIndexing`), and what they choose: the index's size, the shared index, the tier weights,
the KV-event subscription (the producer's docstring says what each does)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator

from epick.kvcache import DEFAULT_TIER_WEIGHTS, KVEventsSettings
from epick.plugins.duration import Duration
from epick.plugins.prefix.redis_index import DEFAULT_ADDRESS, DEFAULT_LOOKUP_TIMEOUT, normalize_address
from epick.plugins.registry import Parameters
from epick.plugins.tokens.uds import UDSParameters

BYTES_PER_INDEX_KEY = 200  # measured: benchmarks/bench_precise.py (186 MiB per million keys)


class TokenProcessorParameters(Parameters):
    block_size_tokens: int = Field(default=0, ge=0)
    block_size: int = Field(default=0, ge=0)  # deprecated upstream: blockSizeTokens
    hash_seed: str = ""
    hash_algorithm: Literal["", "cbor-fnv", "xxh64"] = ""

    @field_validator("hash_seed", mode="before")
    @classmethod
    def _seed_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    def effective_block_size(self) -> int:
        return self.block_size_tokens or self.block_size or 16


class InMemoryParameters(Parameters):
    size: int = Field(default=100_000_000, gt=0)
    pod_cache_size: int = Field(default=10, gt=0)


_BYTES = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtpe])(i)?)?b?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """A size as upstream's humanize.ParseBytes reads it: "2GiB", "512 MB", "1e9"-free plain bytes."""
    m = _BYTES.match(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size (write it like '2GiB' or '512MB')")
    number, unit, binary = m.groups()
    scale = 1 if unit is None else (1024 if binary else 1000) ** ("kmgtpe".index(unit.lower()) + 1)
    return int(float(number) * scale)


class CostAwareParameters(Parameters):
    size: str = "2GiB"

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        parse_bytes(v)
        return v


class RedisParameters(Parameters):
    """`redisConfig` / `valkeyConfig`: llm-d-kv-cache v0.9.0's fields (llm-d-router ebab687 keeps only
    `address`), and epick's `lookupTimeout`."""

    address: str = DEFAULT_ADDRESS
    backend_type: Literal["", "redis", "valkey"] = ""
    enable_rdma: bool = False  # upstream's placeholder: TCP is used
    lookup_timeout: Duration = Field(default=DEFAULT_LOOKUP_TIMEOUT, gt=0)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        from redis.asyncio.connection import parse_url

        scheme = v.strip().partition("://")[0] if "://" in v else ""
        if scheme and scheme not in ("redis", "rediss", "unix", "valkey", "valkeys"):
            raise ValueError(
                f"{v!r}: the scheme must be redis://, rediss:// (TLS), unix://, valkey:// or valkeys://"
            )
        url = normalize_address(v)
        try:
            parse_url(url)
        except ValueError as e:
            raise ValueError(f"{v!r} is not a Redis address (redis://, rediss:// or unix://): {e}") from None
        return v


class KVBlockIndexParameters(Parameters):
    in_memory_config: InMemoryParameters | None = None
    cost_aware_memory_config: CostAwareParameters | None = None
    redis_config: RedisParameters | None = None
    valkey_config: RedisParameters | None = None
    enable_metrics: bool = False
    metrics_logging_interval: int = 0  # nanoseconds, as upstream's JSON spells a Go duration
    max_prefix_blocks_to_match: int = Field(default=0, ge=0)  # older llm-d-kv-cache: a cap on blocks


class BackendWeight(Parameters):
    name: str
    weight: float = Field(ge=0.0)


class TokenizersPoolParameters(Parameters):
    """The deprecated scorer's own tokenizer (llm-d-kv-cache pkg/tokenization `Config`): the sidecar
    at `uds`, else (epick's) the model's files. `workersCount` sizes upstream's pool of goroutines;
    epick's calls are asynchronous and need none. `local` and `hf` are llm-d-kv-cache v0.5's
    backends (removed upstream, which now refuses them): accepted, and `hf.tokenizersCacheDir` is
    searched for the model's files."""

    model_name: str = ""
    workers_count: int = Field(default=0, ge=0)
    uds: UDSParameters | None = None
    local: dict[str, Any] | None = None
    hf: dict[str, Any] | None = None

    def search_dirs(self) -> list[str]:
        cache = (self.hf or {}).get("tokenizersCacheDir")
        return [cache] if isinstance(cache, str) and cache else []


class IndexerParameters(Parameters):
    kv_block_index_config: KVBlockIndexParameters = Field(default_factory=KVBlockIndexParameters)
    kv_cache_backend_configs: list[BackendWeight] | None = None
    tokenizers_pool_config: TokenizersPoolParameters | None = None  # the deprecated scorer's own
    token_processor_config: TokenProcessorParameters | None = None  # where older releases had it


class PodDiscoveryParameters(Parameters):
    socket_port: int = Field(default=5557, gt=0, lt=65536)
    pod_label_selector: str = "llm-d.ai/inference-serving=true"
    pod_namespace: str = ""
    replay_socket_port: int = Field(default=0, ge=0, lt=65536)


class KVEventsParameters(Parameters):
    zmq_endpoint: str = ""
    topic_filter: str = "kv@"
    concurrency: int = Field(default=4, gt=0)
    engine_type: Literal["vllm", "sglang"] = "vllm"
    discover_pods: bool = True
    pod_discovery_config: PodDiscoveryParameters | None = None


class PreciseParameters(Parameters):
    token_processor_config: TokenProcessorParameters = Field(default_factory=TokenProcessorParameters)
    indexer_config: IndexerParameters = Field(default_factory=IndexerParameters)
    kv_events_config: KVEventsParameters = Field(default_factory=KVEventsParameters)
    speculative_indexing: bool = False
    speculative_ttl: Duration = Field(
        default=2.0, validation_alias=AliasChoices("speculativeTTL", "speculativeTtl", "speculative_ttl")
    )

    def processor(self) -> TokenProcessorParameters:
        """The block size and seed: `tokenProcessorConfig`, or where older releases put it."""
        older = self.indexer_config.token_processor_config
        if older is not None and "token_processor_config" not in self.model_fields_set:
            return older
        return self.token_processor_config

    def shared_index(self) -> RedisParameters | None:
        """The Redis or Valkey the index is shared through (None: in memory), chosen as upstream's
        NewIndex chooses: cost-aware memory, then valkeyConfig, then redisConfig."""
        config = self.indexer_config.kv_block_index_config
        if config.cost_aware_memory_config is not None:
            return None
        return config.valkey_config or config.redis_config

    def index_size(self) -> tuple[int, int]:
        """(keys, entries per key) the index may hold."""
        config = self.indexer_config.kv_block_index_config
        in_memory = config.in_memory_config or InMemoryParameters()
        if config.cost_aware_memory_config is not None:
            size = parse_bytes(config.cost_aware_memory_config.size)
            return max(1, int(size) // BYTES_PER_INDEX_KEY), in_memory.pod_cache_size
        return in_memory.size, in_memory.pod_cache_size

    def settings(self) -> KVEventsSettings:
        e = self.kv_events_config
        discovery = e.pod_discovery_config or PodDiscoveryParameters()
        return KVEventsSettings(
            zmq_endpoint=e.zmq_endpoint,
            topic_filter=e.topic_filter,
            concurrency=e.concurrency,
            engine_type=e.engine_type,
            discover_pods=e.discover_pods,
            socket_port=discovery.socket_port,
            replay_port=discovery.replay_socket_port,
        )

    def weights(self) -> dict[str, float]:
        backends = self.indexer_config.kv_cache_backend_configs
        if backends is None:
            return dict(DEFAULT_TIER_WEIGHTS)
        return {b.name.lower(): b.weight for b in backends}
