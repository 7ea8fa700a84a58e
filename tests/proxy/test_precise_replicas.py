"""Two `epick serve` replicas subscribed to the same simulated vLLM engines' KV events hold the same
truth: a prompt whose prefix one engine computed (sent to it directly, behind the routers' backs) goes
to that engine from either replica."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epick.config import load_config_text
from epick.datalayer.datastore import EndpointSpec
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
from epick.plugins.prefix.redis_index import SharedBlockIndex
from epick.proxy.server import ENDPOINT_HEADER, ProxyOptions
from epick.service import Service, Settings
from epick.sim.server import SimServer
from epick.tokenization import load
from tests.datalayer.pages import start_sim, stop_sim

TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
MODEL = "sim-model"
SYSTEM = "You answer questions about routing requests to model servers with a prefix cache. " * 6


def free_consecutive_ports(n: int) -> int:
    """A base port such that base .. base+n-1 are free now."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        try:
            held = []
            for i in range(n):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for t in held:
                t.close()
    raise RuntimeError("no run of free ports")


def config_text(events_base: int) -> str:
    return f"""apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters: {{local: {{path: {TOKENIZER}}}}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: 16}}
    kvEventsConfig: {{podDiscoveryConfig: {{socketPort: {events_base}}}}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: prefix-cache-scorer, weight: 10}}
  - {{pluginRef: queue-scorer, weight: 1}}
  - {{pluginRef: max-score-picker}}
"""


async def until(condition: Callable[[], bool], what: str, act: Callable[[], object] | None = None) -> None:
    for _ in range(400):
        if condition():
            return
        if act is not None:
            result = act()
            if asyncio.iscoroutine(result):
                await result
        await asyncio.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def fleet() -> AsyncIterator[tuple[list[SimServer], list[Service]]]:
    base = free_consecutive_ports(3)
    # One pod's three ranks: rank i (its i-th port) publishes on base + i, as data-parallel vLLM does.
    ports = sorted(free_consecutive_ports(1) for _ in range(3))
    sims = [
        await start_sim(
            port=port, tokenizer=str(TOKENIZER), kv_events_endpoint=f"tcp://127.0.0.1:{base + i}", seed=20 + i
        )
        for i, port in enumerate(ports)
    ]
    specs = tuple(EndpointSpec(f"127.0.0.1:{s.port}", "127.0.0.1", s.port, {}, pod_name="sims") for s in sims)
    services = []
    for seed in (1, 2):
        options = Settings(
            endpoints=specs,
            proxy=ProxyOptions(host="127.0.0.1", port=0, expose_endpoint=True),
            metrics_port=None,
            seed=seed,
            refresh_metrics_interval=0.02,
        )
        service = Service(options, load_config_text(config_text(base), seed=seed))
        await service.start()
        services.append(service)
    yield sims, services
    for service in services:
        await service.stop()
    for sim in sims:
        await stop_sim(sim)


def producer_of(service: Service) -> PrecisePrefixCacheProducer:
    plugin = service.director.config.plugins["precise-prefix-cache-producer"]
    assert isinstance(plugin, PrecisePrefixCacheProducer)
    return plugin


async def test_two_replicas_route_a_prompt_to_the_engine_that_holds_it(
    fleet: tuple[list[SimServer], list[Service]],
) -> None:
    sims, services = fleet
    producers = [producer_of(s) for s in services]
    pods = [f"127.0.0.1:{s.port}" for s in sims]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def direct(sim: SimServer, content: str) -> None:
            body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
            async with http.post(f"http://127.0.0.1:{sim.port}/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()

        # Until both replicas hear every engine (a SUB socket misses what is sent before it joins).
        for n, sim in enumerate(sims):
            pod = pods[n]
            await until(
                lambda pod=pod: all(p.index.blocks_by_pod().get(pod, 0) > 0 for p in producers),
                f"both replicas hearing {pod}",
                lambda sim=sim, n=n: direct(sim, f"warm-up {n}: " + "tokens " * 40),
            )
        # The system prompt is computed on the last engine, behind the routers' backs.
        holder = sims[-1]
        before = [p.index.blocks_by_pod().get(pods[-1], 0) for p in producers]
        await direct(holder, SYSTEM + "First question?")
        await until(
            lambda: all(
                p.index.blocks_by_pod().get(pods[-1], 0) > held + 5
                for p, held in zip(producers, before, strict=True)
            ),
            "the system prompt's blocks on both replicas",
        )
        # What the index says the holder has of the next prompt, before it is sent...
        messages = [{"role": "user", "content": SYSTEM + "Another question?"}]
        tokens = load(str(TOKENIZER)).encode_chat(messages)
        keys = producers[0].processor.keys(tokens, MODEL)
        predicted = producers[0].index.longest_prefix(keys)[1].get(pods[-1], 0) * 16
        assert predicted >= 6 * 16
        served, cached = [], []
        for service in services:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": SYSTEM + "Another question?"}],
                "max_tokens": 2,
            }
            assert service.proxy is not None
            url = f"http://127.0.0.1:{service.proxy.port}/v1/chat/completions"
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                served.append(r.headers[ENDPOINT_HEADER])
                cached.append((await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"])
    assert served == [pods[-1], pods[-1]]
    # ... is what the engine's own prefix cache reports it found for the first of them.
    assert cached[0] == predicted


def shared_config_text(events_base: int, redis_url: str, *, hears_events: bool) -> str:
    """The precise config with the index on Redis; a replica that `hears_events` not subscribes to no
    engine at all: what it knows of the engines' caches, it reads from Redis."""
    events = (
        f"{{podDiscoveryConfig: {{socketPort: {events_base}}}}}" if hears_events else "{discoverPods: false}"
    )
    return config_text(events_base).replace(
        f"    kvEventsConfig: {{podDiscoveryConfig: {{socketPort: {events_base}}}}}\n",
        f"    kvEventsConfig: {events}\n"
        f"    indexerConfig: {{kvBlockIndexConfig: {{redisConfig: {{address: '{redis_url}'}}}}}}\n",
    )


async def through(http: aiohttp.ClientSession, service: Service, messages: list[dict[str, str]]) -> str:
    """One chat through `service`'s proxy: the endpoint that served it."""
    assert service.proxy is not None
    url = f"http://127.0.0.1:{service.proxy.port}/v1/chat/completions"
    async with http.post(url, json={"model": MODEL, "messages": messages, "max_tokens": 2}) as r:
        assert r.status == 200, await r.text()
        return r.headers[ENDPOINT_HEADER]


async def test_a_replica_that_hears_no_events_routes_on_what_another_wrote_to_redis(
    redis_server: Any,
) -> None:
    base = free_consecutive_ports(2)
    ports = sorted(free_consecutive_ports(1) for _ in range(2))
    sims = [
        await start_sim(
            port=port, tokenizer=str(TOKENIZER), kv_events_endpoint=f"tcp://127.0.0.1:{base + i}", seed=30 + i
        )
        for i, port in enumerate(ports)
    ]
    specs = tuple(EndpointSpec(f"127.0.0.1:{s.port}", "127.0.0.1", s.port, {}, pod_name="sims") for s in sims)
    services = []
    try:
        for seed, hears in ((1, True), (2, False)):
            settings = Settings(
                endpoints=specs,
                proxy=ProxyOptions(host="127.0.0.1", port=0, expose_endpoint=True),
                metrics_port=None,
                seed=seed,
                refresh_metrics_interval=0.02,
            )
            config = load_config_text(
                shared_config_text(base, redis_server.url, hears_events=hears), seed=seed
            )
            service = Service(settings, config)
            await service.start()
            services.append(service)
        hearing, deaf = (producer_of(s) for s in services)
        assert isinstance(deaf.index, SharedBlockIndex)
        pods = [f"127.0.0.1:{s.port}" for s in sims]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

            async def direct(sim: SimServer, content: str) -> None:
                body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
                async with http.post(f"http://127.0.0.1:{sim.port}/v1/chat/completions", json=body) as r:
                    assert r.status == 200, await r.text()

            for n, sim in enumerate(sims):
                await until(
                    lambda pod=pods[n]: hearing.index.blocks_by_pod().get(pod, 0) > 0,
                    f"the first replica hearing {pods[n]}",
                    lambda sim=sim, n=n: direct(sim, f"warm-up {n}: " + "tokens " * 40),
                )
            await direct(sims[-1], SYSTEM + "First question?")  # behind both routers' backs
            messages = [{"role": "user", "content": SYSTEM + "Another question?"}]
            keys = deaf.processor.keys(load(str(TOKENIZER)).encode_chat(messages), MODEL)

            async def in_redis() -> bool:
                found = await deaf.index.fetch([keys], None)
                return found is not None and len(found[0]) >= 6

            for _ in range(400):
                if await in_redis():
                    break
                await asyncio.sleep(0.025)
            else:
                raise AssertionError("the system prompt's blocks never reached Redis")
            assert len(deaf.index) == 0  # it heard nothing itself
            served = [await through(http, service, messages) for service in reversed(services)]  # deaf first
            assert served == [pods[-1], pods[-1]]
            assert deaf.index.stats.lookups >= 1 and sum(deaf.index.stats.fallbacks.values()) == 0

            # Redis killed mid-run (an empty one comes back): every request is still served, on each
            # replica's own index meanwhile, and once Redis is back the replica that hears the events
            # writes its index again, so the other routes on it as before.
            redis_server.stop()
            for i in range(6):
                await through(http, services[i % 2], messages)
            assert deaf.index.down and sum(deaf.index.stats.fallbacks.values()) >= 3
            redis_server.start()
            await until(
                lambda: not hearing.index.down and not deaf.index.down, "both replicas finding Redis back"
            )
            for _ in range(400):
                if await in_redis():
                    break
                await asyncio.sleep(0.025)
            else:
                raise AssertionError("the hearing replica never wrote its index again")
            assert await through(http, services[1], messages) == pods[-1]
    finally:
        for service in services:
            await service.stop()
        for sim in sims:
            await stop_sim(sim)
