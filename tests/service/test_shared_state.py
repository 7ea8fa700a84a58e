"""`--shared-state`: replicas on different hosts sharing the approximate prefix index, the requests in
flight and the LRU order through a real Redis (epick.service.shared_state), and two services routing
one conversation to one endpoint whichever replica a request goes through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from epick.config import LoadedConfig, load_config_text
from epick.datalayer.datastore import EndpointSpec
from epick.framework import CycleState, Response
from epick.plugins.load.inflight import InFlightLoad, InFlightLoadProducer
from epick.plugins.prefix.producer import ApproxPrefixCacheProducer
from epick.plugins.scorers.no_hit_lru import NoHitLruScorer
from epick.proxy.server import ENDPOINT_HEADER, ProxyOptions
from epick.service import Service, Settings
from epick.service.shared_state import SharedState
from tests.builders import make_endpoint, make_request
from tests.plugins.test_inflight_load import decided

CONFIG = """apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: inflight-load-producer
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}
- type: no-hit-lru-scorer
  parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}
- type: active-request-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: no-hit-lru-scorer, weight: 1}
  - {pluginRef: active-request-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""
SCOPE = "epick:test/pool"


async def eventually(check: Callable[[], bool], what: Callable[[], object], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out; now: {what()}")
        await asyncio.sleep(0.01)


class Replica:
    def __init__(self, url: str, name: str) -> None:
        self.config: LoadedConfig = load_config_text(CONFIG, seed=0)
        self.shared = SharedState(
            url, SCOPE, f"{name}/0", lambda: self.config, interval=0.05, ttl=0.5, snapshot_interval=0.1
        )

    def plugin(self, kind: type[Any]) -> Any:
        return next(p for p in self.config.plugins.values() if isinstance(p, kind))

    @property
    def inflight(self) -> InFlightLoadProducer:
        return self.plugin(InFlightLoadProducer)  # type: ignore[no-any-return]

    @property
    def prefix(self) -> ApproxPrefixCacheProducer:
        return self.plugin(ApproxPrefixCacheProducer)  # type: ignore[no-any-return]


@pytest.fixture
async def replicas(redis_server: Any) -> AsyncIterator[Callable[[str], Any]]:
    started: list[Replica] = []

    async def start(name: str) -> Replica:
        replica = Replica(redis_server.url, name)
        await replica.shared.start(replicate=True)
        started.append(replica)
        return replica

    yield start
    for replica in started:
        await replica.shared.stop()


async def test_blocks_in_flight_and_lru_order_reach_the_other_replica(replicas: Callable[[str], Any]) -> None:
    a, b = await replicas("a"), await replicas("b")
    assert a.shared.up and b.shared.up
    a.prefix.index.add("E1", [11, 12, 13])
    request = make_request("x" * 400, request_id="r1")
    a.inflight.pre_request(request, decided(("decode", "E1")), CycleState())
    a.plugin(NoHitLruScorer).apply_update("E2", 0)  # as if a touched E2 (applied locally only)
    await eventually(lambda: b.prefix.index.blocks("E1") == 3, lambda: b.prefix.index.blocks("E1"))
    await eventually(lambda: b.inflight.load("E1") == InFlightLoad(1, 100), lambda: b.inflight.load("E1"))
    # the request ends on a: b's view follows with the next write of a's values
    a.inflight.response_complete(request, Response("x"), make_endpoint("E1"))
    await eventually(lambda: b.inflight.load("E1") == InFlightLoad(0, 0), lambda: b.inflight.load("E1"))
    assert b.shared.stats.received > 0 and a.shared.stats.sent > 0


async def test_a_replica_that_starts_later_restores_the_snapshots_before_it_serves(
    replicas: Callable[[str], Any],
) -> None:
    a = await replicas("a")
    a.prefix.index.add("E1", [21, 22])
    await asyncio.sleep(0.3)  # a's snapshot is written (every 0.1 s here)
    c = await replicas("c")
    assert c.prefix.index.blocks("E1") == 2  # restored in start(), before anything is served
    assert c.shared.stats.restored >= 1


async def test_a_replica_that_goes_away_is_forgotten_after_the_ttl(replicas: Callable[[str], Any]) -> None:
    a, b = await replicas("a"), await replicas("b")
    request = make_request("x" * 400, request_id="r1")
    a.inflight.pre_request(request, decided(("decode", "E1")), CycleState())
    await eventually(lambda: b.inflight.load("E1").requests == 1, lambda: b.inflight.load("E1"))
    for task in a.shared._tasks:  # a dies: it writes nothing more (and does not say goodbye)
        task.cancel()
    await eventually(lambda: b.inflight.load("E1").requests == 0, lambda: b.inflight.load("E1"))


async def test_redis_down_keeps_each_replica_deciding_and_it_converges_when_back(
    replicas: Callable[[str], Any], redis_server: Any
) -> None:
    a, b = await replicas("a"), await replicas("b")
    request = make_request("x" * 400, request_id="r1")
    a.inflight.pre_request(request, decided(("decode", "E1")), CycleState())
    await eventually(lambda: b.inflight.load("E1").requests == 1, lambda: b.inflight.load("E1"))
    redis_server.stop()
    await eventually(lambda: not a.shared.up and not b.shared.up, lambda: (a.shared.up, b.shared.up))
    a.prefix.index.add("E3", [31, 32])  # recorded while Redis is away
    # past the ttl, b no longer counts a's request: a stale count would keep E1 looking busy
    await eventually(lambda: b.inflight.load("E1").requests == 0, lambda: b.inflight.load("E1"))
    assert a.inflight.load("E1").requests == 1  # a's own count is its own
    redis_server.start()
    await eventually(lambda: a.shared.up and b.shared.up, lambda: (a.shared.up, b.shared.up))
    await eventually(lambda: b.inflight.load("E1").requests == 1, lambda: b.inflight.load("E1"))
    # what a recorded while away reaches b through a's next snapshot
    await eventually(lambda: b.prefix.index.blocks("E3") == 2, lambda: b.prefix.index.blocks("E3"))
    assert a.shared.stats.outages == 1 and b.shared.stats.outages == 1


async def test_two_services_send_each_conversation_to_one_endpoint(redis_server: Any, make_sim: Any) -> None:
    """Requests of a conversation alternate between two replicas, one after another with no pause:
    every conversation stays on the one endpoint its first request went to."""
    sims = [await make_sim(port=0, time_scale=100) for _ in range(4)]
    specs = tuple(EndpointSpec(f"sim-{i}", "127.0.0.1", s.port, {}) for i, s in enumerate(sims))
    services = []
    try:
        for seed in (1, 2):
            settings = Settings(
                endpoints=specs,
                proxy=ProxyOptions(host="127.0.0.1", port=0, expose_endpoint=True),
                metrics_port=None,
                seed=seed,
                shared_state=redis_server.url,
            )
            service = Service(settings, load_config_text(CONFIG, seed=seed))
            await service.start()
            assert service.shared_state is not None and service.shared_state.up
            services.append(service)
        served: dict[int, set[str]] = {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for turn in range(4):
                for group in range(6):
                    service = services[(turn + group) % 2]
                    assert service.proxy is not None
                    text = f"conversation {group}: " + " ".join(
                        f"turn {t} says hello" for t in range(turn + 1)
                    )
                    body = {
                        "model": "sim-model",
                        "prompt": "shared system prompt " * 20 + text,
                        "max_tokens": 1,
                    }
                    url = f"http://127.0.0.1:{service.proxy.port}/v1/completions"
                    async with http.post(url, json=body) as r:
                        assert r.status == 200, await r.text()
                        served.setdefault(group, set()).add(r.headers[ENDPOINT_HEADER])
            assert all(len(endpoints) == 1 for endpoints in served.values()), served

            # The second replica stops and another starts: it catches up from the first before
            # long, and each conversation's next turn through it goes where the others went.
            await services.pop().stop()
            settings = Settings(
                endpoints=specs,
                proxy=ProxyOptions(host="127.0.0.1", port=0, expose_endpoint=True),
                metrics_port=None,
                seed=3,
                shared_state=redis_server.url,
            )
            late = Service(settings, load_config_text(CONFIG, seed=3))
            await late.start()
            services.append(late)
            producer = next(
                p for p in late.director.config.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)
            )
            await eventually(lambda: len(producer.index) > 0, lambda: len(producer.index))
            assert late.proxy is not None
            for group in range(6):
                text = f"conversation {group}: " + " ".join(f"turn {t} says hello" for t in range(5))
                body = {"model": "sim-model", "prompt": "shared system prompt " * 20 + text, "max_tokens": 1}
                async with http.post(f"http://127.0.0.1:{late.proxy.port}/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    assert {r.headers[ENDPOINT_HEADER]} == served[group], group
    finally:
        for service in services:
            await service.stop()


async def test_the_configs_cross_replica_syncer_starts_the_shared_state(redis_server: Any) -> None:
    """`dataLayer.crossReplicaSyncerPluginRef` naming a shared-state-syncer does what
    `--shared-state` does, at the config's `crossReplicaSyncInterval`; the flag wins over it."""

    def config(address: str) -> str:
        plugins, _, profiles = CONFIG.partition("schedulingProfiles:")
        return (
            f"{plugins}- name: shared\n  type: shared-state-syncer\n  parameters: {{address: '{address}'}}\n"
            f"schedulingProfiles:{profiles}"
            "dataLayer:\n  crossReplicaSyncerPluginRef: shared\n  crossReplicaSyncInterval: 50ms\n"
        )

    specs = (EndpointSpec("a", "127.0.0.1", 1, {}), EndpointSpec("b", "127.0.0.1", 2, {}))
    services = []
    try:
        first = Service(
            Settings(endpoints=specs, proxy=None, metrics_port=None, replica_id="first"),
            load_config_text(config(redis_server.url), seed=0),
        )
        await first.start()
        services.append(first)
        assert first.shared_state is not None and first.shared_state.up
        assert first.shared_state.url == redis_server.url and first.shared_state.interval == 0.05
        # the flag wins: this config's syncer points nowhere
        second = Service(
            Settings(
                endpoints=specs,
                proxy=None,
                metrics_port=None,
                replica_id="second",
                shared_state=redis_server.url,
            ),
            load_config_text(config("redis://127.0.0.1:1"), seed=1),
        )
        await second.start()
        services.append(second)
        assert second.shared_state is not None and second.shared_state.url == redis_server.url
        ours, theirs = (
            next(p for p in s.director.config.plugins.values() if isinstance(p, InFlightLoadProducer))
            for s in (first, second)
        )
        ours.pre_request(make_request("x" * 400), decided(("default", "a")), CycleState())
        await eventually(lambda: theirs.load("a").requests == 1, lambda: theirs.load("a"))
    finally:
        for service in services:
            await service.stop()
