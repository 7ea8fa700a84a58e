"""Loading a precise-prefix config whose index is shared through Redis or Valkey: upstream's fields,
its choice between backends, llm-d's keys, and the read-ahead hook."""

from __future__ import annotations

from pathlib import Path

import pytest

from epick.config import ConfigError, load_config_text
from epick.framework import BatchingProducer
from epick.kvcache.index import BlockIndex
from epick.kvcache.upstream_keys import UpstreamTokenProcessor
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer, SharedPrecisePrefixCacheProducer
from epick.plugins.prefix.redis_index import SharedBlockIndex

GUIDE = (
    Path(__file__).parents[1] / "config" / "upstream" / "llm-d-guides" / "precise-prefix-cache-routing.yaml"
)


def guide_with(index_config: str) -> str:
    """llm-d's precise-prefix-cache-routing guide's config, its kvBlockIndexConfig given `index_config`."""
    text = GUIDE.read_text()
    old = "        kvBlockIndexConfig:\n          enableMetrics: true\n"
    assert old in text
    return text.replace(old, f"        kvBlockIndexConfig:\n          enableMetrics: true\n{index_config}")


def producer(text: str) -> PrecisePrefixCacheProducer:
    config = load_config_text(text)
    plugin = config.plugins["precise-prefix-cache-producer"]
    assert isinstance(plugin, PrecisePrefixCacheProducer)
    return plugin


async def test_the_guides_config_with_redis_config_loads_on_a_shared_index() -> None:
    text = guide_with("          redisConfig:\n            address: redis://redis.llm-d.svc:6379/2\n")
    config = load_config_text(text)
    plugin = config.plugins["precise-prefix-cache-producer"]
    assert isinstance(plugin, SharedPrecisePrefixCacheProducer) and isinstance(plugin, BatchingProducer)
    assert plugin in config.hooks.batching  # read ahead before each request is scheduled
    assert isinstance(plugin.index, SharedBlockIndex)
    assert plugin.index.address == "redis://redis.llm-d.svc:6379/2"
    assert plugin.index.lookup_timeout == 0.05
    assert isinstance(plugin.processor, UpstreamTokenProcessor)  # llm-d's keys, to meet Go EPPs on
    assert (plugin.processor.block_size, plugin.processor.algorithm) == (64, "cbor-fnv")
    await plugin.aclose()


async def test_valkey_config_and_epicks_lookup_timeout() -> None:
    text = guide_with(
        "          valkeyConfig:\n            address: valkey://valkey:6379\n"
        "            backendType: valkey\n            lookupTimeout: 20ms\n"
    )
    plugin = producer(text)
    assert isinstance(plugin.index, SharedBlockIndex)
    assert plugin.index.address == "redis://valkey:6379" and plugin.index.lookup_timeout == 0.02
    await plugin.aclose()


def test_cost_aware_memory_wins_over_redis_as_upstream() -> None:
    text = guide_with(
        "          costAwareMemoryConfig: {size: 1GiB}\n          redisConfig: {address: 'redis://r:6379'}\n"
    )
    plugin = producer(text)
    assert type(plugin.index) is BlockIndex and type(plugin) is PrecisePrefixCacheProducer


@pytest.mark.parametrize(
    ("index_config", "message"),
    [
        ("          redisConfig: {address: 'http://r:6379'}\n", "redisConfig.address"),
        ("          redisConfig: {address: 'r:6379', db: 3}\n", "db"),
        ("          redisConfig: {lookupTimeout: 0s}\n", "lookupTimeout"),
    ],
)
def test_a_bad_redis_config_names_the_field(index_config: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config_text(guide_with(index_config))
