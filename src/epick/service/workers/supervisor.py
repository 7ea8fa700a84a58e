"""The supervisor: starts the workers and keeps them running, relays their updates (the hub) and
serves their merged /metrics. See `epick.service.workers` for the whole scheme."""

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
from epick.service.settings import Settings
from epick.service.workers.frames import UPDATES, frame, read_frame, read_raw_frame
from epick.service.workers.merge import MergedPages
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
    # Set while no link of this worker's is open: its successor starts only once the others have
    # been told it left (else they could drop what the successor publishes).
    unlinked: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.unlinked.set()


class Supervisor:
    def __init__(self, settings: Settings, workers: int) -> None:
        self.settings = settings
        self.workers = [_Worker(i) for i in range(workers)]
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
            for worker in self.workers:
                self._spawn(worker)
            if self.metrics_port is not None:
                await self._serve_metrics()
            served = [f"the proxy on {self.host}:{self.sockets[0].getsockname()[1]}"] if self.sockets else []
            served += [f"ext_proc on {self.host}:{self.extproc_ports[0]}"] if self.extproc_ports else []
            log.info("epick: %d workers serve %s", len(self.workers), " and ".join(served))
            try:
                await self._stopped.wait()
            finally:
                await self.stop()

    def _spawn(self, worker: _Worker) -> None:
        task = asyncio.get_running_loop().create_task(self._keep(worker), name=f"worker {worker.index}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, worker: _Worker) -> None:
        """Run the worker; start it again whenever it exits, until the supervisor stops."""
        backoff = FIRST_BACKOFF
        while not self.stopping:
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
            with contextlib.suppress(TimeoutError):  # its last frames are read and forwarded first
                await asyncio.wait_for(worker.unlinked.wait(), 5)
            worker.restarts += 1
            log.error(
                "worker %d exited with status %s; starting it again in %gs", worker.index, code, backoff
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

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
        peers = [w for w in self.workers if w.writer is not None and w is not worker]
        worker.writer = writer
        worker.unlinked.clear()
        self._give_back(worker.index)
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
        finally:
            if worker.writer is writer:
                worker.writer = None
                # What it alone held (its requests in flight) ended with it; its updates are all
                # forwarded by now, as they came before this on its link.
                for other in self.workers:
                    if other is not worker and other.writer is not None:
                        other.writer.write(frame({"t": "left", "worker": worker.index}))
                self._cover(worker.index)
                worker.unlinked.set()
            writer.close()

    # --- a dead worker's proxy socket, accepted on by another ------------------------------------

    def _cover(self, gone: int) -> None:
        """Worker `gone` left: its socket, and those it covered, go to a running worker."""
        if not self.sockets or self.stopping:
            return
        running = [w for w in self.workers if w.writer is not None and w.index != gone]
        for sock in [gone, *(s for s, by in self.covered.items() if by == gone)]:
            self.covered.pop(sock, None)
            if running:
                cover = running[sock % len(running)]
                self.covered[sock] = cover.index
                cover.writer.write(frame({"t": "accept", "socket": sock}))  # type: ignore[union-attr]

    def _give_back(self, index: int) -> None:
        """Worker `index` is back: whoever covered its socket stops accepting on it."""
        cover = self.covered.pop(index, None)
        if cover is not None and self.workers[cover].writer is not None:
            self.workers[cover].writer.write(frame({"t": "release", "socket": index}))  # type: ignore[union-attr]

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
        registry.register(MergedPages(pages))
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
