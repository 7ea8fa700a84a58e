"""`epick serve --workers 2` (`--min-workers 1`): one worker while it keeps up, a second while it is
busy (taking kept-alive clients too), and back to one when the load falls, answering every request
throughout and keeping every count on the merged /metrics page."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epick.datalayer.datastore import EndpointSpec
from epick.proxy.server import WORKER_HEADER, ProxyOptions
from epick.service.settings import Settings, WorkerScaling
from epick.service.workers import Supervisor
from tests.conftest import MakeSim
from tests.datalayer.pages import free_port, wait_until

# Low thresholds, so that the test's own traffic makes one worker busy; quiet scraping, so that two
# idle workers use well under `down_cpu` (their scrapes would otherwise).
SCALING = WorkerScaling(up_cpu=0.1, down_cpu=0.04, sample_s=0.25, up_samples=2, down_samples=4, settle_s=1.0)


async def _metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(url) as r:
        page = await r.text()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if not s.labels or s.name == "inference_objective_request_total"
    } | {
        "requests": sum(
            s.value
            for family in text_string_to_metric_families(page)
            if family.name == "inference_objective_request"
            for s in family.samples
            if s.name.endswith("_total")
        )
    }


async def test_a_second_worker_serves_while_the_first_is_busy_and_retires_after(make_sim: MakeSim) -> None:
    sims = [await make_sim() for _ in range(2)]
    port, metrics_port = free_port(), free_port()
    settings = Settings(
        endpoints=tuple(EndpointSpec(f"sim-{i}", "127.0.0.1", s.port, {}) for i, s in enumerate(sims)),
        proxy=ProxyOptions(host="127.0.0.1", port=port, expose_endpoint=True),
        extproc=None,
        metrics_host="127.0.0.1",
        metrics_port=metrics_port,
        idle_scrape_interval=1.0,
        workers=2,
        min_workers=1,
        worker_scaling=SCALING,
    )
    settings.check()
    supervisor = Supervisor(settings, 2, settings.min_workers, settings.worker_scaling)
    running = asyncio.ensure_future(supervisor.run())
    url, metrics = f"http://127.0.0.1:{port}/v1/completions", f"http://127.0.0.1:{metrics_port}/metrics"
    sent, answered_by = 0, set()
    try:
        # Kept-alive connections, as clients keep them: the second worker gets its share only because
        # the first closes them after their next response once it serves (`HTTPServer.shed`).
        async with aiohttp.ClientSession() as session:

            async def ask(i: int) -> None:
                nonlocal sent
                payload = {"model": "sim-model", "prompt": f"question {i}", "max_tokens": 1}
                async with session.post(url, json=payload) as r:
                    assert r.status == 200, await r.text()
                    answered_by.add(r.headers[WORKER_HEADER])
                sent += 1

            async def serving(count: int) -> bool:
                with contextlib.suppress(aiohttp.ClientError):
                    return (await _metrics(metrics)).get("epick_workers_serving") == count
                return False

            await wait_until(lambda: len(supervisor._serving()) == 1, timeout=30, what="worker 0")
            await wait_until(lambda: _answers_on(port), timeout=30, what="the proxy")
            assert await serving(1)
            # Busy: requests back to back, 8 at a time, until the second worker serves and answers.
            while not (len(supervisor._serving()) == 2 and "1" in answered_by):
                await asyncio.gather(*(ask(sent + i) for i in range(8)))
                assert sent < 20_000, "no second worker"
            assert supervisor.scaled["up"] == 1
            # Idle: the second worker retires; the first answers on both sockets.
            await wait_until(lambda: supervisor.scaled["down"] == 1, timeout=60, what="a retirement")
            await wait_until(lambda: supervisor.workers[1].process is not None
                             and supervisor.workers[1].process.returncode is not None,
                             timeout=30, what="the retired worker's exit")  # fmt: skip
            assert supervisor.workers[1].process is not None and supervisor.workers[1].process.returncode == 0
            answered_by.clear()
            for i in range(16):
                await ask(sent + i)
            assert answered_by == {"0"}
            page = await _metrics(metrics)
            # Every request counted, the retired worker's included (a lower count would read as a reset).
            assert page["requests"] == sent
            assert page["epick_workers_serving"] == 1 and page["epick_workers_max"] == 2
    finally:
        supervisor._stopped.set()
        await asyncio.wait_for(running, 30)


def _answers_on(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False
