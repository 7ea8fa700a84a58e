"""The supervisor: starts the workers and keeps them running, as many as the load needs
(`epick.service.workers.scaling`), relays their updates (the hub) and serves their merged /metrics.
See `epick.service.workers` for the whole scheme."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import pickle
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from epick.datalayer.discovery.kubernetes.client import load_client
from epick.service.metrics_server import MetricsAuth, MetricsServer, metrics_tls
from epick.service.plugin_state import PATH as PLUGIN_STATE_PATH
from epick.service.settings import Settings, WorkerScaling
from epick.service.workers.frames import UPDATES, frame, read_frame, read_raw_frame
from epick.service.workers.merge import MergedPages, carried_page
from epick.service.workers.scaling import ScalingDecision, cpu_seconds, measurable
from epick.service.workers.sockets import bind_proxy, reserve_grpc

log = logging.getLogger(__name__)

FIRST_BACKOFF, MAX_BACKOFF = 0.5, 8.0
# A worker that ran this long before exiting was healthy: its restart waits the first backoff again.
HEALTHY_RUN_S = 30.0


def restart_delay(backoff: float, ran: float) -> float:
    """How long to wait before starting a worker that exited after running `ran` seconds, given the
    backoff its last restarts reached: the first backoff again after a healthy run."""
    return FIRST_BACKOFF if ran >= HEALTHY_RUN_S else backoff


@dataclasses.dataclass(slots=True)
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    metrics_port: int = 0
    restarts: int = 0
    # Whether it is to run: the first `least` always, the others while the load needs them. A worker
    # no longer wanted drains and exits, and is not started again.
    wanted: bool = False
    cpu_s: float | None = None  # its CPU time at the last sample
    # Set while no link of this worker's is open: its successor starts only once the others have
    # been told it left (else they could drop what the successor publishes).
    unlinked: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.unlinked.set()


class Supervisor:
    def __init__(
        self, settings: Settings, workers: int, least: int | None = None, scaling: WorkerScaling | None = None
    ) -> None:
        """`workers` at most, `least` at least (default: all of them, always running); between the
        two, as `scaling` says (`epick.service.workers.scaling`)."""
        self.settings = settings
        self.workers = [_Worker(i) for i in range(workers)]
        self.least = workers if least is None else max(1, min(least, workers))
        self.scaling = scaling or WorkerScaling()
        self.decision = ScalingDecision(self.scaling, self.least, workers)
        self.scaled = {"up": 0, "down": 0}
        self.carried = ""  # retired workers' counters and histograms, as a page (`carried_page`)
        proxy, extproc = settings.proxy, settings.extproc
        host = proxy.host if proxy else extproc.host if extproc else settings.metrics_host
        self.host, self.port = host, proxy.port if proxy else None
        self.metrics_host, self.metrics_port = settings.metrics_host, settings.metrics_port
        self.extproc_ports = (extproc.port, extproc.health_port) if extproc else ()
        self._held: list[Any] = []  # the gRPC ports' reservations and locks
        self.stopping = False
        self.sockets: list[socket.socket] = []
        self.covered: dict[int, int] = {}  # a dead worker's proxy socket -> the worker accepting on it
        self._lock: Any = None
        self.hub_path = ""
        self.settings_path = ""
        self._hub: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._metrics: MetricsServer | None = None
        self._api: Any = None  # the Kubernetes client /metrics authentication asks
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        if self.port is not None:
            self.sockets, self._lock = bind_proxy(self.host, self.port, len(self.workers))
        self._held = [hold for port in self.extproc_ports for hold in reserve_grpc(self.host, port)]
        with tempfile.TemporaryDirectory(prefix="epick-hub-") as tmp:
            self.hub_path = str(Path(tmp) / "hub.sock")
            self.settings_path = str(Path(tmp) / "settings.pickle")
            self.settings = _one_certificate(self.settings, Path(tmp))
            Path(self.settings_path).write_bytes(pickle.dumps(self.settings))
            self._hub = await asyncio.start_unix_server(self._link, self.hub_path)
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stopped.set)
            loop.add_signal_handler(signal.SIGHUP, self._reload)
            for worker in self.workers[: self.least]:
                worker.wanted = True
                self._spawn(worker)
            if self.metrics_port is not None:
                await self._serve_metrics()
            served = [f"the proxy on {self.host}:{self.sockets[0].getsockname()[1]}"] if self.sockets else []
            served += [f"ext_proc on {self.host}:{self.extproc_ports[0]}"] if self.extproc_ports else []
            if self.least < len(self.workers):
                if measurable():
                    self._start(self._follow_load(), "worker scaling")
                    log.info(
                        "epick: %d to %d workers serve %s, as many as the load needs",
                        self.least, len(self.workers), " and ".join(served),
                    )  # fmt: skip
                else:
                    log.warning(
                        "no /proc to read the workers' CPU from: all %d workers run", len(self.workers)
                    )
                    for worker in self.workers[self.least :]:
                        worker.wanted = True
                        self._spawn(worker)
            else:
                log.info("epick: %d workers serve %s", len(self.workers), " and ".join(served))
            try:
                await self._stopped.wait()
            finally:
                await self.stop()

    def _spawn(self, worker: _Worker) -> None:
        self._start(self._keep(worker), f"worker {worker.index}")

    def _start(self, work: Any, name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, worker: _Worker) -> None:
        """Run the worker; start it again whenever it exits, until the supervisor stops or the
        worker is no longer wanted."""
        backoff = FIRST_BACKOFF
        while not self.stopping and worker.wanted:
            args = [sys.executable, "-m", "epick.service.workers.process", "--settings", self.settings_path,
                    "--index", str(worker.index), "--count", str(len(self.workers)),
                    "--hub", self.hub_path]  # fmt: skip
            fds: tuple[int, ...] = ()
            if self.sockets:
                # Every worker gets every socket, and accepts on its own; while a worker is down,
                # another accepts on its socket too (the hub says which), so no connection waits
                # for the restart. The supervisor keeps them all open.
                fds = tuple(s.fileno() for s in self.sockets)
                args += ["--proxy-fds", ",".join(map(str, fds))]
            loop = asyncio.get_running_loop()
            started = loop.time()
            worker.process = await asyncio.create_subprocess_exec(*args, pass_fds=fds)
            code = await worker.process.wait()
            backoff = restart_delay(backoff, loop.time() - started)
            if self.stopping:
                return
            if not worker.wanted:
                if code != 0:
                    log.error("worker %d exited with status %s while retiring", worker.index, code)
                return
            with contextlib.suppress(TimeoutError):  # its last frames are read and forwarded first
                await asyncio.wait_for(worker.unlinked.wait(), 5)
            worker.restarts += 1
            log.error(
                "worker %d exited with status %s; starting it again in %gs", worker.index, code, backoff
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    # --- following the load -----------------------------------------------------------------

    async def _follow_load(self) -> None:
        """Every `sample_s`: the running workers' CPU since the last sample decides whether one more
        starts or the last one retires (`ScalingDecision`)."""
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self.stopping:
            await asyncio.sleep(self.scaling.sample_s)
            now = loop.time()
            elapsed, last = now - last, now
            running = self._serving()
            spent, complete = 0.0, True
            for worker in running:
                seen = cpu_seconds(worker.process.pid) if worker.process is not None else None
                if seen is None or worker.cpu_s is None:
                    complete = False  # just started (or gone): a whole sample from the next one
                else:
                    spent += seen - worker.cpu_s
                worker.cpu_s = seen
            starting = any(w.wanted and w.writer is None for w in self.workers)
            if not complete or starting:
                continue
            step = self.decision.sample(len(running), spent, elapsed, now)
            if step > 0:
                self._add(spent / elapsed)
            elif step < 0:
                self._retire(spent / elapsed)

    def _add(self, cores: float) -> None:
        idle = [
            w
            for w in self.workers
            if not w.wanted and (w.process is None or w.process.returncode is not None)
        ]
        if not idle:
            return  # the last one retired is still draining
        worker = idle[0]
        worker.wanted, worker.cpu_s = True, None
        self.scaled["up"] += 1
        log.info("starting worker %d: the running workers use %.2f cores", worker.index, cores)
        self._spawn(worker)

    def _retire(self, cores: float) -> None:
        """The last worker added drains its requests and exits; its socket goes to the others first."""
        worker = max((w for w in self.workers if w.wanted), key=lambda w: w.index)
        worker.wanted = False
        self.scaled["down"] += 1
        log.info("retiring worker %d: the running workers use %.2f cores", worker.index, cores)
        self._assign()
        self._tell_active()
        self._tell(worker, {"t": "retire"})

    def _serving(self) -> list[_Worker]:
        """The workers that are to run and are linked to the hub (serving, or about to)."""
        return [w for w in self.workers if w.wanted and w.writer is not None]

    def _tell(self, worker: _Worker, message: dict[str, Any]) -> None:
        if worker.writer is not None:
            worker.writer.write(frame(message))

    def _tell_active(self) -> None:
        """Each serving worker's place among them: their turns to scrape, and whether anyone hears
        their updates (a worker alone publishes none)."""
        serving = self._serving()
        for position, worker in enumerate(serving):
            self._tell(worker, {"t": "active", "position": position, "count": len(serving)})

    def _reload(self) -> None:
        for worker in self.workers:
            if worker.process is not None and worker.process.returncode is None:
                worker.process.send_signal(signal.SIGHUP)

    async def stop(self) -> None:
        self.stopping = True
        running = [w.process for w in self.workers if w.process is not None and w.process.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in running:
            try:
                await asyncio.wait_for(
                    process.wait(), self.settings.drain_timeout + 10
                )  # its own drain first
            except TimeoutError:
                process.kill()
                await process.wait()
        for task in list(self._tasks):
            task.cancel()
        if self._metrics is not None:
            await self._metrics.stop()
        if self._api is not None:
            await self._api.close()
        if self._hub is not None:
            self._hub.close()
        for held in [*self.sockets, *self._held]:
            held.close()
        if self._lock is not None:
            self._lock.close()

    # --- the hub: replicated updates between workers ------------------------------------------

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = await read_frame(reader)
        if not isinstance(hello, dict) or hello.get("t") != "hello":
            writer.close()
            return
        worker = self.workers[int(hello["worker"])]
        # Joined first, then the snapshot: updates that cross it are applied on top of it.
        # A peer that serves answers first (one retiring may be gone before its snapshot leaves).
        peers = sorted(
            (w for w in self.workers if w.writer is not None and w is not worker), key=lambda w: not w.wanted
        )
        worker.writer = writer
        worker.unlinked.clear()
        self._assign()
        self._tell_active()  # before the snapshot is asked for: the peer publishes from then on
        if peers:
            peers[0].writer.write(frame({"t": "snapshot?", "for": worker.index}))  # type: ignore[union-attr]
        else:
            writer.write(
                frame({"t": "snapshot", "for": worker.index, "items": {}})
            )  # the first: nothing to load
        try:
            while (raw := await read_raw_frame(reader)) is not None:
                kind, data, payload = raw
                if kind == UPDATES:  # forwarded as it came, not decoded
                    for other in self.workers:
                        if other is not worker and other.writer is not None:
                            other.writer.write(data)
                    continue
                message = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                kind = message.get("t")
                if kind == "snapshot":
                    target = self.workers[int(message["for"])]
                    if target.writer is not None:
                        target.writer.write(frame(message))
                elif kind == "metrics":
                    worker.metrics_port = int(message["port"])
                elif kind == "final-metrics":  # a retiring worker's last page: its counts stay
                    self.carried = carried_page([self.carried, str(message["page"])])
        finally:
            if worker.writer is writer:
                worker.writer = None
                # What it alone held (its requests in flight) ended with it; its updates are all
                # forwarded by now, as they came before this on its link.
                worker.metrics_port = 0
                for other in self.workers:
                    if other is not worker and other.writer is not None:
                        other.writer.write(frame({"t": "left", "worker": worker.index}))
                self._assign()
                self._tell_active()
                worker.unlinked.set()
            writer.close()

    # --- the proxy sockets of workers not serving, accepted on by others ----------------------

    def _assign(self) -> None:
        """Every proxy socket whose worker is not serving (down, starting, retiring, or not wanted)
        is accepted on by a serving worker, so no connection waits in its queue; a worker back
        serving takes its socket back from whoever covered it."""
        if not self.sockets or self.stopping:
            return
        serving = self._serving()
        for index in range(len(self.sockets)):
            owner, cover = self.workers[index], self.covered.get(index)
            if owner in serving or (cover is not None and self.workers[cover] in serving):
                if owner in serving and cover is not None:
                    del self.covered[index]
                    self._tell(self.workers[cover], {"t": "release", "socket": index})
                continue
            if cover is not None:
                del self.covered[index]
                self._tell(self.workers[cover], {"t": "release", "socket": index})
            if serving:
                chosen = serving[index % len(serving)]
                self.covered[index] = chosen.index
                self._tell(chosen, {"t": "accept", "socket": index})

    # --- metrics: the workers' series, merged -------------------------------------------------

    async def _serve_metrics(self) -> None:
        """The merged page, behind the settings' authentication (a client of the supervisor's own)
        and TLS."""
        settings, auth = self.settings, None
        if settings.metrics_auth and settings.kubernetes is not None:
            self._api = await load_client(settings.kubernetes.kubeconfig)
            auth = MetricsAuth(lambda: self._api)
        self._metrics = MetricsServer(
            self._metrics_page,
            "text/plain; version=0.0.4",
            auth=auth,
            tls=metrics_tls(settings.metrics_cert_dir, settings.metrics_client_ca),
            routes={PLUGIN_STATE_PATH: self._plugin_states},
        )
        assert self.metrics_port is not None
        await self._metrics.start(self.metrics_host, self.metrics_port)

    async def _plugin_states(self, request: web.Request) -> web.StreamResponse:
        """`/debug/plugins/state` of every worker: the first answering worker's page, and under
        `workers` each worker's plugins (a worker that does not answer: its error)."""
        page: dict[str, Any] = {}
        workers: list[dict[str, Any]] = []
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for worker in self.workers:
                if not worker.metrics_port:
                    continue
                url = f"http://127.0.0.1:{worker.metrics_port}{PLUGIN_STATE_PATH}"
                try:
                    async with session.get(url) as r:
                        answer = await r.json()
                except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                    workers.append({"worker": worker.index, "error": f"{type(e).__name__}: {e}"})
                    continue
                page = page or answer
                workers.append({"worker": worker.index, "plugins": answer.get("plugins", {})})
        return web.json_response({**page, "workers": workers})

    async def _metrics_page(self) -> bytes:
        pages: list[str] = []
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for worker in self.workers:
                if not worker.metrics_port:
                    continue
                try:
                    async with session.get(f"http://127.0.0.1:{worker.metrics_port}/metrics") as r:
                        pages.append(await r.text())
                except (aiohttp.ClientError, TimeoutError) as e:
                    log.warning("worker %d's metrics could not be read: %s", worker.index, e)
        registry = CollectorRegistry()
        registry.register(MergedPages([*pages, self.carried]))
        registry.register(WorkerCount(self))
        return bytes(generate_latest(registry))


class WorkerCount(Collector):
    """The supervisor's own series: how many workers serve, how many may, and how often the count
    followed the load."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Any:
        supervisor = self.supervisor
        serving = GaugeMetricFamily("epick_workers_serving", "Worker processes serving now")
        serving.add_metric([], len(supervisor._serving()))
        most = GaugeMetricFamily("epick_workers_max", "The most worker processes that may serve (--workers)")
        most.add_metric([], len(supervisor.workers))
        scaled = CounterMetricFamily(
            "epick_workers_scaled", "Workers started or retired as the load changed", labels=["direction"]
        )
        for direction, count in supervisor.scaled.items():
            scaled.add_metric([direction], count)
        yield from (serving, most, scaled)


def _one_certificate(settings: Settings, tmp: Path) -> Settings:
    """With TLS and no certificate given, one self-signed pair for every worker (in `tmp`), so that a
    gateway sees the same certificate whichever worker its connection lands on."""
    extproc = settings.extproc
    if extproc is None or not extproc.secure or extproc.cert_path is not None:
        return settings
    from epick.extproc.tls import CERT_FILE, KEY_FILE, self_signed

    key, cert = self_signed()
    directory = tmp / "self-signed"
    directory.mkdir(mode=0o700)
    (directory / KEY_FILE).touch(mode=0o600)
    (directory / KEY_FILE).write_bytes(key)
    (directory / CERT_FILE).write_bytes(cert)
    shared = dataclasses.replace(extproc, cert_path=str(directory), cert_reload=False)
    return dataclasses.replace(settings, extproc=shared)
