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

from epick.datalayer.discovery.kubernetes.client import load_client
from epick.service.metrics_server import MetricsAuth, MetricsServer, metrics_tls
from epick.service.plugin_state import PATH as PLUGIN_STATE_PATH
from epick.service.settings import Settings, WorkerScaling
from epick.service.workers.frames import UPDATES, frame, read_frame, read_raw_frame
from epick.service.workers.merge import MergedPages, WorkerCount, carried_page
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
    # Linked and accepting (it said "serving" once its proxy and ext_proc run): only then does it
    # take sockets, scrape turns and count in the load.
    ready: bool = False
    cpu_s: float | None = None  # its CPU time at the last sample
    keeper: asyncio.Task[None] | None = None  # `Supervisor._keep`, while it runs
    finals: int = 0  # the last pages it left when it retired (`Supervisor.carried`)
    last_page: str = ""  # its /metrics page as last read
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
        worker.keeper = self._start(self._keep(worker), f"worker {worker.index}")

    def _start(self, work: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
            worker.cpu_s = None  # a new process: its CPU counts from its first sample
            worker.process = await asyncio.create_subprocess_exec(*args, pass_fds=fds)
            code = await worker.process.wait()
            backoff = restart_delay(backoff, loop.time() - started)
            if self.stopping:
                return
            if not worker.wanted:
                if code != 0:
                    log.error("worker %d exited with status %s while retiring", worker.index, code)
                return
            if worker.index >= self.least:
                # Started for the load: not started again here (a worker that cannot start would
                # hold the scaling still); the load decides whether another starts.
                worker.wanted = False
                log.error(
                    "worker %d exited with status %s; the load decides whether another starts",
                    worker.index, code,
                )  # fmt: skip
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
        """Every `sample_s`: the serving workers' CPU since the last sample decides whether one more
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
            if not complete or any(w.wanted and not w.ready for w in self.workers):
                self.decision.restart()  # a worker is starting: samples in a row count from its start
                continue
            step = self.decision.sample(len(running), spent, elapsed, now, room=self._idle() is not None)
            if step > 0:
                self._add(spent / elapsed)
            elif step < 0:
                self._retire(spent / elapsed)

    def _idle(self) -> _Worker | None:
        """The first worker that may start: not wanted, its last process gone and its link closed."""
        for worker in self.workers:
            done = worker.keeper is None or worker.keeper.done()
            if not worker.wanted and done and worker.unlinked.is_set():
                return worker
        return None

    def _add(self, cores: float) -> None:
        worker = self._idle()
        if worker is None:
            return
        worker.wanted = True
        self.scaled["up"] += 1
        log.info("starting worker %d: the serving workers use %.2f cores", worker.index, cores)
        self._spawn(worker)

    def _retire(self, cores: float) -> None:
        """The last worker added drains its requests and exits; its socket goes to the others first."""
        worker = max((w for w in self.workers if w.wanted), key=lambda w: w.index)
        worker.wanted = False
        self.scaled["down"] += 1
        log.info("retiring worker %d: the serving workers use %.2f cores", worker.index, cores)
        self._assign()
        self._tell_active()
        self._tell(worker, {"t": "retire"})

    def _serving(self) -> list[_Worker]:
        """The workers that are to run, linked to the hub and accepting."""
        return [w for w in self.workers if w.wanted and w.ready and w.writer is not None]

    def _tell(self, worker: _Worker, message: dict[str, Any]) -> None:
        if worker.writer is not None:
            worker.writer.write(frame(message))

    def _tell_active(self) -> None:
        """Each linked worker: its place among those serving (-1: none, it is starting or retiring),
        their number (their turns to scrape) and how many are linked (a worker alone publishes
        nothing; one that joins makes the others publish before they answer its snapshot)."""
        serving = self._serving()
        linked = [w for w in self.workers if w.writer is not None]
        for worker in linked:
            position = serving.index(worker) if worker in serving else -1
            message = {"t": "active", "position": position, "count": len(serving), "linked": len(linked)}
            self._tell(worker, message)

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
        # A peer that serves answers first (one starting may not have loaded its own snapshot yet,
        # one retiring may be gone before its snapshot leaves).
        peers = sorted(
            (w for w in self.workers if w.writer is not None and w is not worker),
            key=lambda w: (not (w.wanted and w.ready), w.index),
        )
        worker.writer, worker.ready = writer, False
        worker.unlinked.clear()
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
                elif kind == "serving":  # its proxy and ext_proc accept: it takes its socket and turns
                    worker.metrics_port, worker.ready = int(message["metrics_port"]), True
                    self._assign()
                    self._tell_active()
                    self.decision.settle(asyncio.get_running_loop().time())
                elif kind == "final-metrics":  # a retiring worker's last page: its counts stay
                    self._carry(worker, str(message["page"]))
                    worker.metrics_port = 0
        finally:
            if worker.writer is writer:
                worker.writer, worker.ready = None, False
                # What it alone held (its requests in flight) ended with it; its updates are all
                # forwarded by now, as they came before this on its link.
                worker.metrics_port = 0
                if worker.last_page:  # gone without a last page: its counts as last read stay
                    self._carry(worker, worker.last_page)
                for other in self.workers:
                    if other is not worker and other.writer is not None:
                        other.writer.write(frame({"t": "left", "worker": worker.index}))
                self._assign()
                self._tell_active()
                worker.unlinked.set()
            writer.close()

    def _carry(self, worker: _Worker, page: str) -> None:
        """`page`, a worker's last, joins the counts the merged page keeps adding (`carried`)."""
        self.carried = carried_page([self.carried, page])
        worker.finals += 1
        worker.last_page = ""

    # --- the proxy sockets of workers not serving, accepted on by others ----------------------

    def _assign(self) -> None:
        """Every proxy socket whose worker is not serving (starting, down, retiring, or not wanted)
        is accepted on by a serving worker, so no connection waits in its queue; a worker back
        serving takes its socket back; and the sockets are spread evenly, each serving worker
        accepting on at most one more than any other (the kernel spreads connections evenly over
        the sockets, not over the workers)."""
        if not self.sockets or self.stopping:
            return
        serving = self._serving()
        for index, cover in list(self.covered.items()):
            if self.workers[index] in serving or self.workers[cover] not in serving:
                del self.covered[index]
                self._tell(self.workers[cover], {"t": "release", "socket": index})
        if not serving:
            return
        load = {w.index: 1 for w in serving}  # its own socket
        for cover in self.covered.values():
            load[cover] += 1

        def lightest() -> _Worker:
            return min(serving, key=lambda w: (load[w.index], w.index))

        for index in range(len(self.sockets)):
            if self.workers[index] not in serving and index not in self.covered:
                chosen = lightest()
                self.covered[index] = chosen.index
                load[chosen.index] += 1
                self._tell(chosen, {"t": "accept", "socket": index})
        while True:
            heaviest = max(serving, key=lambda w: (load[w.index], -w.index))
            light = lightest()
            if load[heaviest.index] - load[light.index] <= 1:
                return
            index = max(i for i, by in self.covered.items() if by == heaviest.index)
            self.covered[index] = light.index
            load[heaviest.index] -= 1
            load[light.index] += 1
            self._tell(heaviest, {"t": "release", "socket": index})
            self._tell(light, {"t": "accept", "socket": index})

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
        read: list[tuple[_Worker, int, str]] = []
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for worker in self.workers:
                if not worker.metrics_port:
                    continue
                finals = worker.finals
                try:
                    async with session.get(f"http://127.0.0.1:{worker.metrics_port}/metrics") as r:
                        r.raise_for_status()
                        worker.last_page = await r.text()
                except (aiohttp.ClientError, TimeoutError) as e:
                    if worker.writer is None or worker.wanted or not worker.last_page:
                        log.warning("worker %d's metrics could not be read: %s", worker.index, e)
                        continue
                    # Retiring: its /metrics closed as it drained; its last page stands in until
                    # the page it leaves arrives (a counter that went down would read as a reset).
                read.append((worker, finals, worker.last_page))
        # A worker whose last page arrived while the pages were read is in `carried` now: not twice.
        pages = [page for worker, finals, page in read if worker.finals == finals]
        registry = CollectorRegistry()
        registry.register(MergedPages([*pages, self.carried]))
        registry.register(WorkerCount(lambda: len(self._serving()), len(self.workers), self.scaled))
        return bytes(generate_latest(registry))


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
