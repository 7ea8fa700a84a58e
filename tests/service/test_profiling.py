"""`--enable-pprof`: the profiling endpoints on the metrics port, and their absence without it."""

from __future__ import annotations

import aiohttp

from epick.datalayer.datastore import EndpointSpec
from epick.service import Service, Settings


async def started(pprof: bool) -> Service:
    service = Service(
        Settings(
            endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}),),
            proxy=None,
            metrics_port=0,
            metrics_host="127.0.0.1",
            pprof=pprof,
        )
    )
    await service.start()
    return service


async def test_the_profiling_endpoints_answer_with_profiles() -> None:
    service = await started(True)
    base = f"http://127.0.0.1:{service.metrics_bound_port}/debug/pprof"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/") as r:
                assert r.status == 200 and "/debug/pprof/profile" in await r.text()
            async with http.get(f"{base}/profile?seconds=0.2") as r:
                assert r.status == 200 and "function calls" in await r.text()
            async with http.get(f"{base}/profile?seconds=0.1&format=pstats") as r:
                assert r.status == 200 and len(await r.read()) > 0
            async with http.get(f"{base}/goroutine") as r:
                text = await r.text()
                assert r.status == 200 and "asyncio tasks" in text and "thread MainThread" in text
            async with http.get(f"{base}/heap") as r:
                assert r.status == 200 and "objects tracked by the garbage collector" in await r.text()
            async with http.get(f"{base}/heap?seconds=0.1") as r:
                assert r.status == 200 and "allocated in 0.1s and still alive" in await r.text()
            async with http.get(f"{base}/profile?seconds=-1") as r:
                assert r.status == 400
    finally:
        await service.stop()


async def test_without_the_flag_there_is_nothing_to_profile() -> None:
    service = await started(False)
    try:
        url = f"http://127.0.0.1:{service.metrics_bound_port}/debug/pprof/goroutine"
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            assert r.status == 404
    finally:
        await service.stop()
