"""The proxy on uvloop, as `epick serve` runs it: the rest of the suite runs on asyncio's own loop,
and uvloop's transports differ (they are not `asyncio.Transport` instances, which two code paths once
assumed). Plain and streamed requests through the upstream client, connection reuse, and the
connection limit's refusal."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import uvloop

from epick.datalayer.datastore import EndpointSpec
from epick.proxy.server import ProxyOptions
from epick.service import Service, Settings
from epick.sim.options import ServerOptions
from epick.sim.server import IDENTITY_HEADER, SimServer
from tests.proxy.test_hostile import json_error_of, raw_exchange


async def scenario() -> None:
    sims = [SimServer(ServerOptions(port=0, time_scale=100), i) for i in range(2)]
    for sim in sims:
        await sim.start()
    options = Settings(
        endpoints=tuple(EndpointSpec(f"sim-{i}", "127.0.0.1", s.port, {}) for i, s in enumerate(sims)),
        proxy=ProxyOptions(host="127.0.0.1", port=0, max_connections=8),
        metrics_port=None,
        refresh_metrics_interval=0.02,
        seed=1,
    )
    service = Service(options)
    await service.start()
    assert service.proxy is not None
    url = f"http://127.0.0.1:{service.proxy.port}"
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(6):
                body = {"model": "sim-model", "prompt": f"uvloop {i % 2} " + "words " * 30, "max_tokens": 3}
                async with http.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["usage"]["completion_tokens"] == 3
            body = {"model": "sim-model", "messages": [{"role": "user", "content": "stream"}],
                    "max_tokens": 5, "stream": True}  # fmt: skip
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                assert r.headers[IDENTITY_HEADER] in {f"127.0.0.1:{sim.port}" for sim in sims}
                events = [line async for line in r.content if line.startswith(b"data: ")]
            assert events[-1].strip() == b"data: [DONE]"
            words = [json.loads(e[6:]) for e in events[:-1]]
            assert sum(1 for w in words if w["choices"] and w["choices"][0]["delta"].get("content")) == 5
        upstreams = service.proxy.upstreams
        assert upstreams.opened <= 4  # kept alive and reused (one request at a time: about one per server)
        # The connection limit's refusal writes through uvloop's transport.
        held = [await asyncio.open_connection("127.0.0.1", service.proxy.port) for _ in range(8)]
        try:
            status, error = json_error_of(await raw_exchange(service.proxy.port, b""))
            assert status == 503 and error["code"] == "too_many_connections"
        finally:
            for _, writer in held:
                writer.close()
    finally:
        await service.stop()
        for sim in sims:
            await sim.stop()


def test_the_proxy_serves_on_uvloop() -> None:
    uvloop.run(scenario())
