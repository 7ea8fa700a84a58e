"""The data layer's polling: one async scraper per endpoint and polled source, as the config's
`dataLayer` section says (by default a `metrics-data-source` read by a `core-metrics-extractor`).

A scraper GETs its source's target every interval, hands the payload (Prometheus text, or decoded
JSON) to the source's extractors, and stores what they read: core metrics replace the endpoint's,
attributes merge into its. Errors are logged once per change.

A failed or garbage scrape of the core metrics leaves the endpoint's last metrics in place with their
old update time, so they go stale and the saturation detector treats the endpoint as saturated (as
the Go EPP's utilization detector counts a stale endpoint). After `unhealthy_after` failures in a row
the endpoint leaves the scheduling candidates until a scrape succeeds again. Other sources (DCGM,
/v1/models) never make an endpoint unhealthy: their attributes just stop changing.
Extractors of endpoint notifications (`topology-extractor`) run as endpoints appear and change.

A Prometheus source whose extractors all say which samples they read (`FamilyReader`: the core
metrics extractor does) asks for those alone: `/metrics?name[]=vllm:num_requests_waiting&...`, which
prometheus_client's exposition (vLLM's, SGLang's) answers with those families only, a page of a few
hundred bytes instead of tens of kilobytes, cheaper for the server to write and for epick to read. A
server that ignores the query answers the whole page, read as before; one that refuses it (an error
status), or whose filtered page lacks what the extractors need, is asked without the query from then
on (logged once). Upstream's EPP always reads the whole page.

Under `epick serve --workers N` the workers take turns (`ScraperPool.share`): worker k scrapes an
endpoint's core metrics in the k-th of every N intervals, slots set on the wall clock that every
worker reads, so the model server is scraped once per interval as by one process, not N times. Each
scrape's outcome reaches every worker (epick.datalayer.shared): its metrics, or its failure, which
counts towards `unhealthy_after` in every worker as the worker's own would. A source whose extractors
read more than the shared core metrics (custom metrics, DCGM, /v1/models) is scraped by every worker
every interval, as before.

Quiet scraping (`idle_interval`, `--idle-scrape-interval`; off by default, as upstream scrapes every
interval): a tick finds an endpoint quiet when its last scrape read an idle engine (nothing running,
nothing waiting), scraped without failure, and this router has sent it nothing since (`Traffic`). A
quiet endpoint is not scraped: its metrics are kept, stamped fresh, until `idle_interval` has passed
since the last scrape; the first request sent to it makes the next tick scrape again. What the
endpoint receives from elsewhere (another router that shares no state, clients that bypass the
router) goes unseen for up to `idle_interval`. Under `--workers` a worker judges by its own traffic:
when another worker's turn finds the endpoint quiet while this one has sent to it, this worker's next
turn scrapes it; the idle fleet's scrape every `idle_interval` is the first worker's alone, its
outcome shared as any scrape's, and another worker scrapes when none has for twice that.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import ssl
import time
from collections.abc import Callable
from urllib.parse import quote

from epick.config.datalayer import DataLayerPlan, PolledSource
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.http import HTTPError, MetricsClient, tls_context
from epick.datalayer.traffic import Traffic
from epick.framework import Endpoint
from epick.framework.datalayer import (
    CoreMetricsReader,
    Extracted,
    ExtractError,
    FamilyReader,
    MissingDataError,
    PollTarget,
)

log = logging.getLogger(__name__)


def endpoint_of(spec: EndpointSpec) -> Endpoint:
    """The endpoint as extractors see it (no metrics)."""
    return Endpoint(
        spec.name,
        spec.address,
        spec.port,
        spec.labels,
        pod_name=spec.pod_name,
        node_address=spec.node_address,
    )


# How long after a tick's GETs their answers are read together: a metrics page answers in about a
# millisecond; a slower answer is waited for as it comes.
GATHER_AFTER = 0.005
_TLS: dict[tuple[bool, str, str, str], ssl.SSLContext] = {}  # shared by every scraper of a source


def _tls(target: PollTarget) -> ssl.SSLContext | None:
    if target.scheme != "https":
        return None
    key = (target.insecure_skip_verify, target.ca_cert_path, target.client_cert_path, target.client_key_path)
    if key not in _TLS:
        _TLS[key] = tls_context(*key)
    return _TLS[key]


class ScrapeErrors:
    """Failed scrapes, as upstream counts them: a poll that got no usable answer, by source type, and
    an answer an extractor could not read, by source and extractor type."""

    def __init__(self) -> None:
        self.poll: dict[str, int] = {}
        self.extract: dict[tuple[str, str], int] = {}

    def polled(self, source: str) -> None:
        self.poll[source] = self.poll.get(source, 0) + 1

    def extracted(self, source: str, extractor: str) -> None:
        key = (source, extractor)
        self.extract[key] = self.extract.get(key, 0) + 1


# What a scrape may meet: no answer, a bad answer, or one its extractors cannot read.
_SCRAPE_ERRORS = (
    TimeoutError,
    OSError,
    EOFError,
    HTTPError,
    ExtractError,
    ValueError,
    asyncio.LimitOverrunError,  # a response head longer than the client reads
    OverflowError,
)


class _UnreadError(Exception):
    """An answer came and could not be read: `error`, by `extractor` (None: an error status)."""

    def __init__(self, error: BaseException, extractor: str | None) -> None:
        super().__init__(str(error))
        self.error = error
        self.extractor = extractor

    @property
    def blames_filter(self) -> bool:
        """Whether asking for the whole page may help: an error status, or a page lacking what is read."""
        return self.extractor is None or isinstance(self.error, MissingDataError)


class Scraper:
    def __init__(
        self,
        spec: EndpointSpec,
        datastore: Datastore,
        *,
        interval: float = 0.05,
        timeout: float = 1.0,
        unhealthy_after: int = 3,
        polled: PolledSource,
        share: tuple[int, int] | None = None,
        on_failure: Callable[[str], None] | None = None,
        errors: ScrapeErrors | None = None,
        idle_interval: float = 0.0,
        traffic: Traffic | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`share` = (k, n): scrape in the k-th of every n intervals (the workers' turns);
        `on_failure` hears the endpoint's name after each failed scrape of its core metrics;
        `idle_interval` > 0 with `traffic`: quiet scraping (the module's docstring); `wall_clock`
        stamps the metrics (`update_time`)."""
        self.wall_clock = wall_clock
        self.spec = spec
        self.datastore = datastore
        self.polled = polled
        self.endpoint = endpoint_of(spec)
        source = self.polled.source
        self.interval = source.interval if source.interval is not None else interval
        self.target = source.target(self.endpoint)
        self.url = self.target.url
        self.client: MetricsClient | None = None
        self.setup_error: str | None = None
        self.filtered = self._filtered_path()  # the path with `?name[]=` (None: the whole page)
        try:
            self.client = MetricsClient(
                self.target.host,
                self.target.port,
                self.filtered or self.target.path,
                timeout,
                tls=_tls(self.target),
                accept="application/json" if source.payload == "json" else "text/plain",
                # A tick's answers read together, a little after it (`epick.datalayer.http`).
                gather_after=min(GATHER_AFTER, self.interval / 10) if self.interval > 0 else None,
            )
        except (OSError, ssl.SSLError, ValueError) as e:  # an unreadable CA or client certificate
            self.setup_error = f"cannot set up TLS for {self.url}: {e}"
        self.drives_health = self.polled.reads_core_metrics
        # An engine epick cannot read: every scrape fails with this (named, logged once), and the
        # endpoint leaves the candidates as any endpoint whose metrics cannot be read.
        self.names: object = None
        core = next((e for e in self.polled.extractors if isinstance(e, CoreMetricsReader)), None)
        if core is not None:
            try:
                self.names = core.reads_endpoint(self.endpoint)
            except ExtractError as e:
                self.setup_error = str(e)
        self.unhealthy_after = unhealthy_after
        self.share = share
        self.on_failure = on_failure
        self.errors = errors or ScrapeErrors()
        self.last_error: str | None = None
        self.scrapes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.idle_interval = idle_interval if traffic is not None and self.drives_health else 0.0
        self.traffic = traffic
        self.skipped = 0  # ticks that found the endpoint quiet
        self._last_scrape = -math.inf  # the traffic clock when the last scrape began
        self._task: asyncio.Task[None] | None = None

    def _filtered_path(self) -> str | None:
        """The source's path asking for only the samples its extractors read, when all of them say."""
        if self.polled.source.payload != "prometheus" or not self.polled.extractors:
            return None
        names: set[str] = set()
        for extractor in self.polled.extractors:
            if not isinstance(extractor, FamilyReader):
                return None
            wanted = extractor.families(self.endpoint)
            if wanted is None:
                return None
            names |= wanted
        if not names:
            return None
        query = "&".join(f"name[]={quote(n, safe=':_')}" for n in sorted(names))
        path = self.target.path
        return f"{path}{'&' if '?' in path else '?'}{query}"

    def start(self) -> None:
        name = f"scrape {self.spec.name} {self.polled.source.typed_name}"
        self._task = asyncio.create_task(self._run(), name=name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.client is not None:
            self.client.close()

    def quiet(self) -> bool:
        """Whether this tick may skip the scrape: see the module's docstring (quiet scraping)."""
        traffic = self.traffic
        if self.idle_interval <= 0 or traffic is None or self.consecutive_failures or self.last_error:
            return False
        scraped = self.datastore.scraped_at(self.spec.name)
        if scraped is None:
            return False
        # Under --workers one worker (the first) scrapes an idle fleet every idle interval for all;
        # the others keep quiet until their own traffic or the shared metrics say otherwise, or
        # until no worker has scraped it for two idle intervals (the first one is gone, or slow).
        refresher = self.share is None or self.share[0] == 0
        bound = self.idle_interval if refresher else 2 * self.idle_interval
        if self.wall_clock() - scraped >= bound:
            return False
        # A request sent just before the last scrape began may not have reached the engine when it
        # was read (ext_proc can report one done as soon as it is routed): one interval of margin.
        if not traffic.quiet_since(self.spec.name, self._last_scrape - self.interval):
            return False
        endpoint = self.datastore.get(self.spec.name)
        metrics = endpoint.metrics if endpoint is not None else None
        return (
            metrics is not None
            and metrics.update_time is not None
            and metrics.waiting_queue_size == 0
            and metrics.running_requests_size == 0
        )

    def _skip(self) -> None:
        """A quiet tick: the endpoint's metrics, unchanged, count as read now (they do not go stale),
        while another worker's scrape made since the last real one still replaces them. Only here:
        under --workers each worker's own quiet turns keep its copy fresh, and nothing travels
        between them while the fleet is idle."""
        self.skipped += 1
        self.datastore.refresh_metrics(self.spec.name, self.wall_clock())

    async def tick(self) -> None:
        """What a tick does: scrape, or skip a quiet endpoint."""
        if self.quiet():
            self._skip()
            return
        if self.traffic is not None:
            self._last_scrape = self.traffic.clock()
        await self.scrape_once()

    async def scrape_once(self) -> None:
        started = self.wall_clock()
        marks = self.datastore.health_marks
        try:
            if self.setup_error is not None or self.client is None:
                raise ExtractError(self.setup_error or "no client")
            try:
                results = await self._read(self.client, started)
            except _UnreadError as e:
                if not e.blames_filter or self.filtered is None or self.client.path != self.filtered:
                    raise
                # Asked for the whole page: when that reads, the server is asked so from then on.
                # (Read as it comes: the less time between the two pages, the less a page that
                # changed meanwhile passes for a server that mis-answers filters.)
                self.client.path = self.target.path
                try:
                    results = await self._read(self.client, started, gathered=False)
                except BaseException:
                    self.client.path = self.filtered
                    raise
                log.info(
                    "%s (%s) refuses or mis-answers a filtered scrape (%s); asking for the whole page",
                    self.spec.name, self.url, e,
                )  # fmt: skip
                self.filtered = None
        except _UnreadError as e:  # an answer came, and `e.extractor` could not read it
            self._failed(e.error, e.extractor)
            return
        except _SCRAPE_ERRORS as e:
            self._failed(e, None)
            return
        self.scrapes += 1
        for result in results:
            if result.metrics is not None:
                self.datastore.update_metrics(self.spec.name, result.metrics)
            if result.attributes:
                self.datastore.update_attributes(self.spec.name, result.attributes)
        self.succeeded(marks)
        self._report(None)

    async def _read(self, client: MetricsClient, started: float, *, gathered: bool = True) -> list[Extracted]:
        """One GET and what the extractors read of it. An answer they cannot read raises `_UnreadError`
        naming which (an HTTP error status is a failed poll, as upstream counts it)."""
        status, text = await client.get(gathered=gathered)
        if status != 200:
            raise _UnreadError(ExtractError(f"HTTP {status}"), None)
        payload: str | object = text
        if self.polled.source.payload == "json":
            try:
                payload = json.loads(text)
            except ValueError as e:
                source = self.polled.source.typed_name.type
                raise _UnreadError(ExtractError(f"not JSON: {e}"), source) from None
        results = []
        for each in self.polled.extractors:
            try:
                results.append(each.extract(payload, self.endpoint, started))
            except _SCRAPE_ERRORS as e:
                raise _UnreadError(e, each.typed_name.type) from None
        return results

    def _failed(self, error: BaseException, extractor: str | None) -> None:
        self.failures += 1
        source = self.polled.source.typed_name.type
        if extractor is None:
            self.errors.polled(source)
        else:
            self.errors.extracted(source, extractor)
        self.failed()
        if self.drives_health and self.on_failure is not None:
            self.on_failure(self.spec.name)
        self._report(
            f"{type(error).__name__}: {error}" if not isinstance(error, ExtractError) else str(error)
        )

    def failed(self) -> None:
        """A scrape of the endpoint failed, this worker's or another's: after `unhealthy_after` in a
        row the endpoint leaves the candidates."""
        self.consecutive_failures += 1
        if self.drives_health and self.consecutive_failures >= self.unhealthy_after:
            self.datastore.set_healthy(self.spec.name, False)

    def succeeded(self, seen_after: int | None = None) -> None:
        """A scrape of the endpoint succeeded, this worker's or another's. `seen_after`: the
        datastore's `health_marks` when this worker's scrape began (an endpoint the request path
        found unreachable after that stays out: the answer is older than the failure)."""
        self.consecutive_failures = 0
        if self.drives_health:
            self.datastore.set_healthy(self.spec.name, True, seen_after=seen_after)

    def _report(self, error: str | None) -> None:
        if error == self.last_error:
            return
        if error is None:
            log.info("%s of %s (%s) are back", self.polled.source.typed_name.type, self.spec.name, self.url)
        else:
            log.warning("cannot scrape %s (%s): %s", self.spec.name, self.url, error)
        self.last_error = error

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        if self.share is not None:
            await asyncio.sleep(self.until_turn(time.time()))
        while True:
            started = loop.time()
            try:
                await self.tick()
            except Exception as e:  # a scraper must outlive anything an endpoint sends it
                self.failures += 1
                self._report(f"unexpected {type(e).__name__}: {e}")
            if self.share is not None:
                await asyncio.sleep(self.until_turn(time.time()))
            else:
                await asyncio.sleep(self.until_tick(loop.time(), started))

    def until_tick(self, now: float, started: float) -> float:
        """Seconds from `now` (the loop's clock) to the next tick: ticks fall on the multiples of the
        interval, the same for every scraper of the interval, so the scrapes of a pool go out in one
        turn of the event loop and their answers are read in few (one wake-up for many scrapes, not
        one each); a scrape that ran past a tick waits for the next."""
        interval = self.interval
        if interval <= 0:
            return 0.0
        wait = interval - (now % interval)
        if now - started + wait < interval / 2:  # this scrape began just before the tick it would meet
            wait += interval
        return wait

    def until_turn(self, now: float) -> float:
        """Seconds from `now` (wall clock) to this worker's next turn to scrape the endpoint: turns
        come every n intervals, worker k's k intervals into each round, every endpoint's at the
        same moment: the worker's scrapes go out in one turn of its event loop, and their outcomes
        reach the other workers as one batch, one wake-up each, not one per endpoint. A turn less
        than half an interval away is skipped: the scrape just made was that turn's."""
        assert self.share is not None
        worker, workers = self.share
        period = self.interval * workers
        if period <= 0:
            return 0.0
        turn = worker * self.interval
        wait = (turn - now) % period
        return wait if wait >= self.interval / 2 else wait + period


class ScraperPool:
    """The scrapers of every endpoint in the datastore, for each polled source of the plan, started
    and stopped as endpoints come and go; and the plan's endpoint extractors, run as they do."""

    def __init__(
        self,
        datastore: Datastore,
        *,
        interval: float = 0.05,
        timeout: float = 1.0,
        plan: DataLayerPlan,
        idle_interval: float = 0.0,
        traffic: Traffic | None = None,
    ) -> None:
        """`plan`: the config's data layer (`LoadedConfig.data_layer`), defaults injected;
        `idle_interval` and `traffic`: quiet scraping (the module's docstring)."""
        self.datastore = datastore
        self.idle_interval = idle_interval
        self.traffic = traffic
        self.errors = ScrapeErrors()  # every scraper's failures
        self.interval = interval
        self.timeout = timeout
        self.plan = plan
        self.scrapers: dict[str, list[Scraper]] = {}
        # (k, n): this is worker k of n, and the workers take turns scraping core metrics (set
        # before `start`); `on_failure` hears each failed scrape of an endpoint's core metrics.
        self.share: tuple[int, int] | None = None
        self.on_failure: Callable[[str], None] | None = None
        self._started = False
        self._subscribed = False
        self._stopping: set[asyncio.Task[None]] = set()

    def set_share(self, share: tuple[int, int]) -> None:
        """The workers serving changed: this one is now worker k of n in the turns (from each
        scraper's next turn on; a scraper asleep until its old turn keeps that one)."""
        self.share = share
        for scrapers in self.scrapers.values():
            for scraper in scrapers:
                if scraper.share is not None:
                    scraper.share = share

    async def start(self) -> None:
        self._started = True
        for spec in self.datastore.specs():
            self._changed(spec.name, spec)
        if not self._subscribed:
            self.datastore.subscribe(self._changed)
            self._subscribed = True

    def set_plan(self, plan: DataLayerPlan) -> None:
        """A reloaded config's plan: scrapers restart only when what it polls changed."""
        changed = plan.fingerprint != self.plan.fingerprint
        self.plan = plan
        if changed and self._started:
            for spec in self.datastore.specs():
                # What the old plan's sources set goes; the new plan's sources set it again. Without a
                # core-metrics source no scrape can make an endpoint healthy again: it is healthy.
                self.datastore.clear_attributes(spec.name)
                if not plan.scrapes_core_metrics:
                    self.datastore.set_healthy(spec.name, True)
                self._changed(spec.name, spec)

    def scraper(self, name: str) -> Scraper | None:
        """The core-metrics scraper of endpoint `name` (or its first scraper)."""
        found = self.scrapers.get(name) or []
        return next((s for s in found if s.drives_health), found[0] if found else None)

    def _changed(self, name: str, spec: EndpointSpec | None) -> None:
        for old in self.scrapers.pop(name, []):
            task = asyncio.get_running_loop().create_task(old.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        if spec is None and self.traffic is not None:
            self.traffic.forget(name)
        if spec is None or not self._started:
            return
        endpoint = endpoint_of(spec)
        for extractor in self.plan.endpoint_extractors:
            try:
                attributes = extractor.endpoint_changed(endpoint)
            except Exception:
                log.exception("endpoint extractor %s failed on %s", extractor.typed_name, name)
                continue
            self.datastore.update_attributes(name, attributes)
        scrapers = self.build(spec)
        self.scrapers[name] = scrapers
        for scraper in scrapers:
            scraper.start()

    def build(self, spec: EndpointSpec) -> list[Scraper]:
        """The endpoint's scrapers as the pool runs them, one per polled source (not started)."""
        return [
            Scraper(
                spec,
                self.datastore,
                interval=self.interval,
                timeout=self.timeout,
                polled=polled,
                share=self.share if _shared_whole(polled) else None,
                on_failure=self._failed,
                errors=self.errors,
                idle_interval=self.idle_interval,
                traffic=self.traffic,
            )
            for polled in self.plan.polled
        ]

    def _failed(self, name: str) -> None:
        if self.on_failure is not None:
            self.on_failure(name)

    def outcome(self, name: str, ok: bool) -> None:
        """Another worker scraped endpoint `name`'s core metrics: they came (`ok`), or the scrape
        failed; counted as this worker's own scrape would be."""
        scraper = self.scraper(name)
        if scraper is None or not scraper.drives_health:
            return
        if ok:
            scraper.succeeded()
        else:
            scraper.failed()

    async def stop(self) -> None:
        for scrapers in list(self.scrapers.values()):
            for scraper in scrapers:
                await scraper.stop()
        self.scrapers.clear()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)
        self._started = False


def _shared_whole(polled: PolledSource) -> bool:
    """Whether everything `polled`'s extractors read is shared between workers (the core metrics
    alone, no custom metrics): then the workers can take turns scraping it."""
    return bool(polled.extractors) and all(
        isinstance(e, CoreMetricsReader) and e.only_shared_fields() for e in polled.extractors
    )
