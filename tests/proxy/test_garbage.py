"""A request through the proxy leaves nothing for the cyclic garbage collector (as an ext_proc stream,
tests/extproc/test_garbage.py): what serving it built goes by reference counting, so no collector
pass stalls the event loop under load. The simulated servers run in this process too; only epick's
request path is checked."""

from __future__ import annotations

import gc

import aiohttp

from tests.conftest import MakeSim
from tests.proxy.conftest import MODEL, MakeService, proxy_url
from tests.proxy.test_proxy import three_sims

REQUEST_PATH = ("epick.proxy.", "epick.requestcontrol.", "epick.framework.", "epick.plugins.")


async def test_requests_through_the_proxy_leave_no_cyclic_garbage(
    make_sim: MakeSim, make_service: MakeService
) -> None:
    service = await make_service(await three_sims(make_sim))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a joke."}], "max_tokens": 3}
    async with aiohttp.ClientSession() as session:

        async def one(stream: bool) -> None:
            async with session.post(
                f"{proxy_url(service)}/v1/chat/completions", json={**body, "stream": stream}
            ) as response:
                assert response.status == 200
                await response.read()

        for i in range(4):  # warm: connection pools, first paths
            await one(stream=i % 2 == 0)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for i in range(30):
                await one(stream=i % 2 == 0)
            gc.collect()
            left = sorted(
                {type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith(REQUEST_PATH)}
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    assert left == []
