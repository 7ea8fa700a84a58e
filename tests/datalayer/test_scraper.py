"""Scrapers: /metrics into the datastore, errors logged once per change, health after failures."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.scraper import Scraper, ScraperPool
from epick.datalayer.traffic import Traffic
from epick.plugins.datalayer.engines import ENGINE_LABEL, ENGINES
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer
from tests.datalayer.pages import AppServer, core_plan, core_polled, free_port, vllm_page, wait_until

MakeSim = Callable[..., Awaitable[SimServer]]
MakeApp = Callable[[web.Application], Awaitable[AppServer]]
MakeScraper = Callable[..., Scraper]
LOGGER = "epick.datalayer.scraper"


class MetricsApp:
    """A /metrics endpoint whose page, status and hanging the test changes as it goes."""

    def __init__(self, page: str = "") -> None:
        self.page = page or vllm_page(waiting=2, running=1, kv=0.5)
        self.status = 200
        self.hang = False
        self.release = asyncio.Event()
        self.hits = 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.hang:
            await self.release.wait()
        return web.Response(text=self.page, status=self.status, content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        return app


@pytest.fixture
async def make_scraper() -> AsyncIterator[Callable[..., Scraper]]:
    """Scrapers whose connections are closed at teardown, whatever the test did."""
    scrapers: list[Scraper] = []

    def make(spec: EndpointSpec, datastore: Datastore, **kw: Any) -> Scraper:
        scraper = Scraper(spec, datastore, polled=core_polled(), **kw)
        scrapers.append(scraper)
        return scraper

    yield make
    for scraper in scrapers:
        with contextlib.suppress(Exception):
            await scraper.stop()


def spec_for(host_port: str, name: str | None = None, **labels: str) -> EndpointSpec:
    host, _, port = host_port.rpartition(":")
    return EndpointSpec(name or host_port, host, int(port), labels)


def warnings_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and name in r.getMessage()
    ]


def infos_about(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.INFO and name in r.getMessage()
    ]


async def test_metrics_of_sim_servers_land_in_the_datastore(make_sim: MakeSim) -> None:
    a = await make_sim(engine=ServerOptions.engine_config(num_gpu_blocks=500))
    b = await make_sim(engine=ServerOptions.engine_config(num_gpu_blocks=700, block_size=32))
    ds = Datastore()
    ds.replace_all([spec_for(f"127.0.0.1:{a.port}", "a"), spec_for(f"127.0.0.1:{b.port}", "b")])
    pool = ScraperPool(ds, interval=0.01, plan=core_plan())
    started = time.time()
    await pool.start()
    try:
        await wait_until(lambda: all(ep.metrics.update_time is not None for ep in ds.snapshot()))
        ma, mb = ds.get("a"), ds.get("b")
        assert ma is not None and mb is not None
        assert (ma.metrics.cache_block_size, ma.metrics.cache_num_blocks) == (16, 500)
        assert (mb.metrics.cache_block_size, mb.metrics.cache_num_blocks) == (32, 700)
        assert ma.metrics.waiting_queue_size == ma.metrics.running_requests_size == 0
        first = ma.metrics.update_time
        assert first is not None and started - 0.01 <= first <= time.time()
        # The scrapes go on: the update time moves forward.
        await wait_until(lambda: (ds.get("a").metrics.update_time or 0) > first)  # type: ignore[union-attr]
        assert pool.scraper("a").scrapes >= 2 and pool.scraper("a").failures == 0
    finally:
        await pool.stop()


async def test_garbage_metrics_warn_once_keep_old_metrics_and_turn_unhealthy(
    make_app: MakeApp, make_scraper: MakeScraper, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = MetricsApp()
    server = await make_app(fake.app())
    ds = Datastore()
    spec = spec_for(server.host_port, "flaky")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, interval=0.01, timeout=1.0)

    await scraper.scrape_once()
    good = ds.get("flaky")
    assert good is not None and good.metrics.waiting_queue_size == 2 and good.metrics.update_time
    assert warnings_about(caplog, "flaky") == []

    fake.page = "vllm:num_requests_waiting 1\nvllm:num_requests_running one\nvllm:kv_cache_usage_perc 0\n"
    for _ in range(2):
        await scraper.scrape_once()
    assert ds.is_healthy("flaky") and [ep.name for ep in ds.snapshot()] == ["flaky"]
    await scraper.scrape_once()  # the third failure in a row
    assert not ds.is_healthy("flaky") and ds.snapshot().endpoints == ()
    for _ in range(10):
        await scraper.scrape_once()
    assert (scraper.failures, scraper.consecutive_failures, scraper.scrapes) == (13, 13, 1)
    # Kept: the last good metrics, with their old update time (so they go stale).
    kept = ds.get("flaky")
    assert kept is not None and kept.metrics is good.metrics
    [warning] = warnings_about(caplog, "flaky")
    assert f"http://{server.host_port}/metrics" in warning
    assert "line 2: vllm:num_requests_running has value 'one', not a number" in warning

    # Good again: healthy, fresh metrics, one "back" message.
    fake.page = vllm_page(waiting=7)
    await scraper.scrape_once()
    await scraper.scrape_once()
    back = ds.get("flaky")
    assert ds.is_healthy("flaky") and ds.snapshot().endpoints == (back,)
    assert back is not None and back.metrics.waiting_queue_size == 7
    assert (back.metrics.update_time or 0) > (good.metrics.update_time or 0)
    assert scraper.consecutive_failures == 0
    assert len(infos_about(caplog, "flaky")) == 1

    # Each change of error is logged once: garbage, then an HTTP error, then garbage again.
    fake.page = "<html>oops</html>"
    for _ in range(3):
        await scraper.scrape_once()
    fake.status = 500
    for _ in range(3):
        await scraper.scrape_once()
    fake.status = 200
    for _ in range(3):
        await scraper.scrape_once()
    warnings = warnings_about(caplog, "flaky")
    assert len(warnings) == 4
    assert "missing metrics: vllm:num_requests_waiting" in warnings[1]
    assert warnings[2].endswith("HTTP 500")
    assert "missing metrics" in warnings[3]


async def test_running_scraper_logs_one_warning_across_many_scrapes(
    make_app: MakeApp, make_scraper: MakeScraper, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = MetricsApp("this is not a metrics page\n")
    server = await make_app(fake.app())
    ds = Datastore()
    spec = spec_for(server.host_port, "garbage")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, interval=0.01, timeout=1.0)
    scraper.start()
    try:
        await wait_until(lambda: scraper.failures >= 15, what="15 failed scrapes")
        assert not ds.is_healthy("garbage")
        assert ds.get("garbage").metrics.update_time is None  # type: ignore[union-attr]
        assert len(warnings_about(caplog, "garbage")) == 1
        fake.page = vllm_page(running=3)
        await wait_until(lambda: ds.is_healthy("garbage"), what="recovery")
        assert ds.snapshot()[0].metrics.running_requests_size == 3
        # (A scrape in flight when the page changed may also log that it asks for whole pages now.)
        assert len([m for m in infos_about(caplog, "garbage") if m.endswith("are back")]) == 1
    finally:
        await scraper.stop()
    assert fake.hits >= 16


async def test_hanging_endpoint_is_cut_by_the_timeout(
    make_app: MakeApp, make_scraper: MakeScraper, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = MetricsApp()
    server = await make_app(fake.app())
    ds = Datastore()
    spec = spec_for(server.host_port, "slow")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, interval=0.01, timeout=0.2)
    await scraper.scrape_once()
    good = ds.get("slow")
    assert good is not None and good.metrics.waiting_queue_size == 2

    fake.hang = True
    loop = asyncio.get_running_loop()
    start = loop.time()
    await scraper.scrape_once()
    took = loop.time() - start
    assert 0.15 <= took < 1.0
    assert scraper.failures == 1 and ds.is_healthy("slow")
    [warning] = warnings_about(caplog, "slow")
    assert "TimeoutError" in warning

    scraper.start()
    try:
        await wait_until(lambda: not ds.is_healthy("slow"), what="unhealthy after 3 timeouts")
        assert scraper.consecutive_failures >= 3
        assert ds.get("slow").metrics is good.metrics  # type: ignore[union-attr]
        assert len(warnings_about(caplog, "slow")) == 1
        fake.hang = False
        fake.release.set()
        await wait_until(lambda: ds.is_healthy("slow"), what="recovery")
    finally:
        await scraper.stop()
        fake.release.set()


async def test_unreachable_endpoint_becomes_unhealthy(
    make_scraper: MakeScraper, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    ds = Datastore()
    spec = spec_for(f"127.0.0.1:{free_port()}", "down")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, interval=0.01, timeout=0.5)
    for _ in range(3):
        await scraper.scrape_once()
    assert not ds.is_healthy("down") and ds.snapshot().endpoints == ()
    [warning] = warnings_about(caplog, "down")
    assert "Connect" in warning


async def test_engine_label_chooses_the_metric_names() -> None:
    ds = Datastore()
    for engine in ("sglang", "trtllm-serve", "triton-tensorrt-llm", "vllm"):
        spec = spec_for("127.0.0.1:1", engine, **{ENGINE_LABEL: engine})
        assert Scraper(spec, ds, polled=core_polled()).names is ENGINES[engine]
    assert Scraper(spec_for("127.0.0.1:1"), ds, polled=core_polled()).names is ENGINES["vllm"]


async def test_an_unknown_engine_fails_every_scrape_with_its_name_and_leaves_the_candidates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ds = Datastore()
    spec = spec_for("127.0.0.1:1", "odd", **{ENGINE_LABEL: "tgi"})
    ds.upsert(spec)
    scraper = Scraper(spec, ds, polled=core_polled())
    for _ in range(3):
        await scraper.scrape_once()
    assert not ds.is_healthy("odd")
    [warning] = warnings_about(caplog, "odd")
    assert "engine type 'tgi'" in warning and "known: vllm" in warning


async def test_sglang_endpoint_scraped_with_sglang_names(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    page = "sglang:num_queue_reqs 3\nsglang:num_running_reqs 9\nsglang:token_usage 0.5\n"
    server = await make_app(MetricsApp(page).app())
    ds = Datastore()
    spec = spec_for(server.host_port, "sg", **{ENGINE_LABEL: "sglang"})
    ds.upsert(spec)
    await make_scraper(spec, ds).scrape_once()
    m = ds.get("sg").metrics  # type: ignore[union-attr]
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (3, 9, 0.5)


async def test_pool_follows_the_datastore(make_sim: MakeSim) -> None:
    a = await make_sim()
    b = await make_sim()
    ds = Datastore()
    ds.upsert(spec_for(f"127.0.0.1:{a.port}", "a"))
    pool = ScraperPool(ds, interval=0.01, plan=core_plan())
    await pool.start()
    try:
        assert set(pool.scrapers) == {"a"}
        await wait_until(lambda: ds.get("a").metrics.update_time is not None)  # type: ignore[union-attr]

        ds.upsert(spec_for(f"127.0.0.1:{b.port}", "b"))
        assert set(pool.scrapers) == {"a", "b"}
        await wait_until(lambda: ds.get("b").metrics.update_time is not None)  # type: ignore[union-attr]

        old_a = pool.scraper("a")
        ds.remove("a")
        assert set(pool.scrapers) == {"b"}
        await wait_until(lambda: old_a._task is not None and old_a._task.done(), what="a's scraper stops")

        # A changed spec gets a new scraper (with the names its engine label asks for).
        old_b = pool.scraper("b")
        ds.upsert(spec_for(f"127.0.0.1:{b.port}", "b", **{ENGINE_LABEL: "sglang"}))
        new_b = pool.scraper("b")
        assert new_b is not old_b and new_b.names is ENGINES["sglang"]
        await wait_until(lambda: old_b._task is not None and old_b._task.done(), what="old b stops")
        # The sim speaks vLLM: read as sglang its page is missing metrics, and b turns unhealthy.
        await wait_until(lambda: not ds.is_healthy("b"))
        assert new_b.last_error is not None and "missing metrics: sglang:num_queue_reqs" in new_b.last_error
    finally:
        await pool.stop()
    assert pool.scrapers == {}
    assert new_b._task is not None and new_b._task.done()


async def test_overflowing_info_label_is_a_failed_scrape(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    page = vllm_page() + 'vllm:cache_config_info{block_size="16",num_gpu_blocks="1e999"} 1.0\n'
    server = await make_app(MetricsApp(page).app())
    ds = Datastore()
    spec = spec_for(server.host_port, "odd")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, interval=0.01, timeout=1.0)
    await scraper.scrape_once()
    assert scraper.failures == 1


async def test_stopped_pool_no_longer_follows_the_datastore() -> None:
    ds = Datastore()
    pool = ScraperPool(ds, interval=0.01, plan=core_plan())
    await pool.start()
    await pool.stop()
    ds.upsert(spec_for("127.0.0.1:1", "late"))
    try:
        assert pool.scrapers == {}
    finally:
        for scrapers in pool.scrapers.values():
            for scraper in scrapers:
                with contextlib.suppress(Exception):
                    await scraper.stop()


async def test_endpoint_that_closes_without_answering_is_a_failed_scrape(make_scraper: MakeScraper) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # read the request, then close without a word
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        ds = Datastore()
        spec = spec_for(f"127.0.0.1:{port}", "mute")
        ds.upsert(spec)
        scraper = make_scraper(spec, ds, interval=0.01, timeout=0.5)
        for _ in range(3):
            await scraper.scrape_once()
        assert scraper.failures == 3 and not ds.is_healthy("mute")
    finally:
        server.close()
        await server.wait_closed()


async def test_scrape_after_a_timeout_reads_the_current_page(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    release = asyncio.Event()
    state = {"page": vllm_page(waiting=2), "hang": True}

    async def metrics(request: web.Request) -> web.Response:
        page = state["page"]  # the page as it is when the request arrives
        if state["hang"]:
            await release.wait()
        return web.Response(text=str(page))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = await make_app(app)
    ds = Datastore()
    spec = spec_for(server.host_port, "slow")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, interval=0.01, timeout=0.2)
    try:
        await scraper.scrape_once()
        assert scraper.failures == 1  # timed out
        state.update(page=vllm_page(waiting=9), hang=False)
        release.set()
        await scraper.scrape_once()
        assert ds.get("slow").metrics.waiting_queue_size == 9  # type: ignore[union-attr]
    finally:
        release.set()


class FilteringApp(MetricsApp):
    """prometheus_client's exposition: `?name[]=` keeps only those samples' lines (with `refuse`, any
    query is answered 400, as a server that takes none)."""

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.refuse = refuse
        self.queries: list[list[str]] = []

    async def metrics(self, request: web.Request) -> web.Response:
        self.hits += 1
        wanted = request.query.getall("name[]", [])
        self.queries.append(wanted)
        if wanted and self.refuse:
            return web.Response(text="no queries here", status=400)
        if not wanted:
            return web.Response(text=self.page, content_type="text/plain")
        kept = "".join(
            line + "\n" for line in self.page.splitlines() if line.split("{")[0].split(" ")[0] in wanted
        )
        return web.Response(text=kept, content_type="text/plain")


async def test_only_the_samples_the_extractors_read_are_asked_for(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    fake = FilteringApp()
    server = await make_app(fake.app())
    ds = Datastore()
    spec = spec_for(server.host_port, "a")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, timeout=1.0)
    await scraper.scrape_once()
    await scraper.scrape_once()
    assert fake.queries[0] == sorted(fake.queries[0]) and "vllm:num_requests_waiting" in fake.queries[0]
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} <= set(fake.queries[0])
    assert len(fake.queries) == 2 and fake.queries[1] == fake.queries[0]  # one GET each, filtered
    got = ds.get("a")
    assert got is not None and (got.metrics.waiting_queue_size, got.metrics.running_requests_size) == (2, 1)


async def test_a_server_refusing_the_filter_is_asked_for_the_whole_page_from_then_on(
    make_app: MakeApp, make_scraper: MakeScraper, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    fake = FilteringApp(refuse=True)
    server = await make_app(fake.app())
    ds = Datastore()
    spec = spec_for(server.host_port, "b")
    ds.upsert(spec)
    scraper = make_scraper(spec, ds, timeout=1.0)
    for _ in range(3):
        await scraper.scrape_once()
    assert [bool(q) for q in fake.queries] == [True, False, False, False]
    assert scraper.failures == 0 and scraper.scrapes == 3 and scraper.filtered is None
    assert any("asking for the whole page" in m for m in infos_about(caplog, "b"))


# --- quiet scraping (idle_interval with Traffic)


async def one_endpoint(make_app: MakeApp, page: str) -> tuple[MetricsApp, Datastore, EndpointSpec]:
    """A /metrics server answering `page`, and a datastore holding it as endpoint "a"."""
    metrics = MetricsApp(page)
    server = await make_app(metrics.app())
    ds = Datastore()
    spec = spec_for(server.host_port, "a")
    ds.upsert(spec)
    return metrics, ds, spec


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_quiet_endpoint_is_not_scraped_until_traffic_or_the_idle_interval(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    metrics, ds, spec = await one_endpoint(make_app, vllm_page(waiting=0, running=0, kv=0.0))
    clock = FakeClock()
    traffic = Traffic(clock)
    scraper = make_scraper(
        spec, ds, interval=0.01, idle_interval=1.0, traffic=traffic, wall_clock=traffic.clock
    )

    published: list[str] = []
    ds.on_metrics = lambda name, _: published.append(name)  # what goes to the other workers
    await scraper.tick()
    assert metrics.hits == 1 and published == ["a"]  # the first tick always scrapes
    stamped = ds.get("a").metrics.update_time  # type: ignore[union-attr]
    clock.now += 0.05
    await scraper.tick()
    assert metrics.hits == 1 and scraper.skipped == 1  # idle, and nothing sent: not scraped
    assert published == ["a"]  # a quiet tick sends the other workers nothing
    restamped = ds.get("a").metrics.update_time  # type: ignore[union-attr]
    assert stamped is not None and restamped is not None and restamped >= stamped  # kept fresh

    traffic.sent("a")  # a request goes to it: the next tick scrapes
    clock.now += 0.05
    await scraper.tick()
    assert metrics.hits == 2
    traffic.done("a")
    clock.now += 0.05
    await scraper.tick()
    assert metrics.hits == 2  # it ended before this tick, and was seen by the last scrape's metrics

    clock.now += 1.0  # the idle interval has passed since the last scrape
    await scraper.tick()
    assert metrics.hits == 3

    # A request sent just before a scrape (within an interval) may not have reached the engine when
    # it was read: the tick after scrapes once more.
    traffic.sent("a")
    clock.now += 0.005
    await scraper.tick()
    traffic.done("a")
    clock.now += 0.007
    await scraper.tick()
    assert metrics.hits == 5
    clock.now += 0.05
    await scraper.tick()
    assert metrics.hits == 5  # quiet again


async def test_a_busy_or_failing_endpoint_is_scraped_every_tick(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    # Running a request from elsewhere.
    metrics, ds, spec = await one_endpoint(make_app, vllm_page(waiting=0, running=1, kv=0.2))
    traffic = Traffic(FakeClock())
    scraper = make_scraper(spec, ds, idle_interval=1.0, traffic=traffic, wall_clock=traffic.clock)
    for _ in range(3):
        await scraper.tick()
    assert metrics.hits == 3 and scraper.skipped == 0
    metrics.page = vllm_page(waiting=0, running=0)
    metrics.status = 500
    for _ in range(2):
        await scraper.tick()
    # A failed scrape proves nothing: each tick tries again (the filtered page, then the whole one).
    assert scraper.failures == 2 and scraper.skipped == 0
    metrics.status = 200
    hits = metrics.hits
    await scraper.tick()
    await scraper.tick()
    assert metrics.hits == hits + 1 and scraper.skipped == 1  # read idle once, then quiet


async def test_without_an_idle_interval_every_tick_scrapes(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    metrics, ds, spec = await one_endpoint(make_app, vllm_page(waiting=0, running=0))
    scraper = make_scraper(spec, ds, traffic=Traffic(FakeClock()))  # upstream's default: no idle interval
    for _ in range(3):
        await scraper.tick()
    assert metrics.hits == 3 and scraper.skipped == 0


def test_traffic_counts_each_endpoints_requests() -> None:
    clock = FakeClock()
    traffic = Traffic(clock)
    traffic.sent("a")
    traffic.sent("a")
    assert traffic.in_flight("a") == 2 and not traffic.quiet_since("a", 0.0)
    traffic.done("a")
    traffic.done("a")
    traffic.done("a")  # one too many (a response reported twice) does not go below zero
    assert traffic.in_flight("a") == 0
    assert not traffic.quiet_since("a", clock.now)  # sent at this moment, not before it
    assert traffic.quiet_since("a", clock.now + 0.001)
    assert traffic.quiet_since("b", 0.0)
    traffic.forget("a")
    assert traffic.quiet_since("a", 0.0)


async def test_under_workers_only_the_first_rescrapes_an_idle_endpoint(
    make_app: MakeApp, make_scraper: MakeScraper
) -> None:
    metrics, ds, spec = await one_endpoint(make_app, vllm_page(waiting=0, running=0))
    clock = FakeClock()
    first = make_scraper(spec, ds, idle_interval=1.0, traffic=Traffic(clock), share=(0, 2), wall_clock=clock)
    second_traffic = Traffic(clock)
    second = make_scraper(spec, ds, idle_interval=1.0, traffic=second_traffic, share=(1, 2), wall_clock=clock)
    await first.tick()
    await second.tick()
    assert metrics.hits == 2  # each one's first tick scrapes
    clock.now += 5.0  # long past the idle interval
    await first.tick()
    await second.tick()
    assert metrics.hits == 3 and second.skipped == 1  # the fleet is refreshed once, by the first
    second_traffic.sent("a")
    clock.now += 0.1
    await second.tick()
    assert metrics.hits == 4  # its own traffic: the second scrapes
    second_traffic.done("a")
    clock.now += 1.5
    await second.tick()
    assert metrics.hits == 4  # quiet: the first refreshes an idle fleet
    clock.now += 1.0  # no worker has scraped it for two idle intervals: the first is gone or slow
    await second.tick()
    assert metrics.hits == 5
