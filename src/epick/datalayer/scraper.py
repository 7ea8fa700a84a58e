"""One async scraper per endpoint: GET /metrics every interval, parse, store; errors logged once per change.

A failed or garbage scrape leaves the endpoint's last metrics in place with their old update time,
so they go stale and the saturation detector treats the endpoint as saturated (as the Go EPP's
utilization detector counts a stale endpoint). After
`unhealthy_after` failures in a row the endpoint leaves the scheduling candidates until a scrape
succeeds again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.engines import EngineMetricNames, UnknownEngineError, engine_names, engine_type
from epick.datalayer.http import HTTPError, MetricsClient
from epick.datalayer.parse import MetricsParseError, parse_metrics

log = logging.getLogger(__name__)


class Scraper:
    def __init__(
        self,
        spec: EndpointSpec,
        datastore: Datastore,
        *,
        interval: float = 0.05,
        timeout: float = 1.0,
        unhealthy_after: int = 3,
        path: str = "/metrics",
    ) -> None:
        self.spec = spec
        self.datastore = datastore
        self.interval = interval
        self.client = MetricsClient(spec.address, spec.port, path, timeout)
        self.url = f"http://{spec.host_port}{path}"
        # An engine epick cannot read: every scrape fails with this (named, logged once), and the
        # endpoint leaves the candidates as any endpoint whose metrics cannot be read.
        self.names: EngineMetricNames | None = None
        self.engine_error: str | None = None
        try:
            self.names = engine_names(engine_type(spec.labels))
        except UnknownEngineError as e:
            self.engine_error = str(e)
        self.unhealthy_after = unhealthy_after
        self.last_error: str | None = None
        self.scrapes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"scrape {self.spec.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.client.close()

    async def scrape_once(self) -> None:
        started = time.time()
        try:
            if self.names is None:
                raise MetricsParseError(self.engine_error or "no engine")
            status, text = await self.client.get()
            if status != 200:
                raise MetricsParseError(f"HTTP {status}")
            metrics = parse_metrics(text, self.names, update_time=started)
        except (
            TimeoutError,
            OSError,
            EOFError,
            HTTPError,
            MetricsParseError,
            ValueError,
            asyncio.LimitOverrunError,  # a response head longer than the client reads
            OverflowError,
        ) as e:
            self.failures += 1
            self.consecutive_failures += 1
            if self.consecutive_failures >= self.unhealthy_after:
                self.datastore.set_healthy(self.spec.name, False)
            self._report(f"{type(e).__name__}: {e}" if not isinstance(e, MetricsParseError) else str(e))
            return
        self.scrapes += 1
        self.consecutive_failures = 0
        self.datastore.update_metrics(self.spec.name, metrics)
        self.datastore.set_healthy(self.spec.name, True)
        self._report(None)

    def _report(self, error: str | None) -> None:
        if error == self.last_error:
            return
        if error is None:
            log.info("metrics of %s (%s) are back", self.spec.name, self.url)
        else:
            log.warning("cannot scrape %s (%s): %s", self.spec.name, self.url, error)
        self.last_error = error

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                await self.scrape_once()
            except Exception as e:  # a scraper must outlive anything an endpoint sends it
                self.failures += 1
                self._report(f"unexpected {type(e).__name__}: {e}")
            await asyncio.sleep(max(0.0, self.interval - (loop.time() - started)))


class ScraperPool:
    """One scraper per endpoint in the datastore, started and stopped as endpoints come and go."""

    def __init__(self, datastore: Datastore, *, interval: float = 0.05, timeout: float = 1.0) -> None:
        self.datastore = datastore
        self.interval = interval
        self.timeout = timeout
        self.scrapers: dict[str, Scraper] = {}
        self._started = False
        self._stopping: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._started = True
        for spec in self.datastore.specs():
            self._changed(spec.name, spec)
        self.datastore.subscribe(self._changed)

    def _changed(self, name: str, spec: EndpointSpec | None) -> None:
        old = self.scrapers.pop(name, None)
        if old is not None:
            task = asyncio.get_running_loop().create_task(old.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        if spec is not None and self._started:
            scraper = Scraper(spec, self.datastore, interval=self.interval, timeout=self.timeout)
            self.scrapers[name] = scraper
            scraper.start()

    async def stop(self) -> None:
        for scraper in list(self.scrapers.values()):
            await scraper.stop()
        self.scrapers.clear()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        self._started = False
