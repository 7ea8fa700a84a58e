"""`epick serve --workers N`: N processes serve the proxy, every one deciding on the same state.

One Python process decides and relays on one core. With N workers:
- The supervisor (the process `epick serve` starts) binds one listening socket per worker on the
  proxy's port (SO_REUSEPORT: the kernel spreads new connections over them evenly) and starts N
  worker processes, each accepting on its own. It holds a lock file for the port, so a second epick
  on the same port fails to start, naming the port (as does anything else binding it). It keeps the
  sockets open and gives every worker all of them: while a worker is down, the hub has a running
  worker accept on its socket too, until the successor joins.
- Each worker is a whole `epick serve`: its own data layer (discovery, scrapes, KV events) and its own
  copy of the config. Scheduling state lives in plugins; those that record what decisions did
  implement `epick.framework.replication.Replicated`: the prefix index (`prefix-cache-scorer`,
  `approx-prefix-cache-producer`), the requests and tokens in flight (`inflight-load-producer`, which
  `active-request-scorer`, `token-load-scorer`, `concurrency-detector` and the affinity and
  utilization filters read), `no-hit-lru-scorer`'s order, and the endpoints' scraped metrics
  (`epick.datalayer.shared`: the freshest scrape of any worker). What one worker records, it publishes
  to the supervisor's hub, which forwards it to every other worker (msgpack frames over a Unix
  socket), so each worker decides on every worker's decisions, the few hundred microseconds an
  update travels aside. Other stateful plugins keep their state per worker (`worker_state`; a warning
  names them); flow control, whose queues cannot be split, is refused with `--workers` above 1. Where
  either would split the service, the default count (`default_workers`) is one.
- A worker that dies is started again (after 0.5 s, doubling to 8 s while it keeps dying). The hub
  forwards what it had published, then tells the others it left (its requests in flight ended with
  its connections, which are reset: their clients see the error). The new one loads a snapshot of a
  running worker's replicated state, so no decision recorded before is lost.
- Every worker serves ext_proc too, on the same ports (SO_REUSEPORT; the supervisor holds each port
  with a lock and a bound, non-listening socket, so nothing else binds it). The supervisor serves
  `/metrics`, the workers' series merged: counters and histograms summed, gauges the largest.
- SIGHUP is passed on to every worker (each reloads its config); SIGTERM and SIGINT stop them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import math
import os
import signal
import socket
import struct
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from epick.framework.replication import Replicated, WorkerAware, unshared_state

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!IB")  # payload length, kind
UPDATES, CONTROL = ord("u"), ord("c")  # the hub forwards updates unread; it reads control messages
FIRST_BACKOFF, MAX_BACKOFF = 0.5, 8.0


def frame(message: dict[str, Any]) -> bytes:
    """A message on the hub: its kind (updates when `t` is "u"), then msgpack."""
    payload: bytes = msgpack.packb(message, use_bin_type=True)
    return _HEAD.pack(len(payload), UPDATES if message.get("t") == "u" else CONTROL) + payload


async def read_raw_frame(reader: asyncio.StreamReader) -> tuple[int, bytes, bytes] | None:
    """(kind, the whole frame, its payload), or None at the end of the stream (a worker that exits
    may reset its link rather than close it)."""
    try:
        head = await reader.readexactly(_HEAD.size)
        length, kind = _HEAD.unpack(head)
        payload = await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return kind, head + payload, payload


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message, decoded, or None at the end of the stream."""
    raw = await read_raw_frame(reader)
    return None if raw is None else msgpack.unpackb(raw[2], raw=False, strict_map_key=False)


def bind_proxy(host: str, port: int, count: int) -> tuple[list[socket.socket], Any]:
    """One listening socket per worker on the proxy's port (SO_REUSEPORT: the kernel spreads new
    connections over them evenly), and the lock that keeps another epick from joining them. A port
    another process holds fails here, naming it."""
    where = f"{host}:{port}"
    lock = open(Path(tempfile.gettempdir()) / f"epick-proxy-{host}-{port}.lock", "w")  # noqa: SIM115
    if port:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            raise OSError(f"cannot listen on {where} for the proxy: another epick serves it") from None
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sockets.append(socket.create_server((host, port), backlog=4096, reuse_port=True))
            port = sockets[0].getsockname()[1]
    except OSError as e:
        for sock in sockets:
            sock.close()
        lock.close()
        raise OSError(f"cannot listen on {where} for the proxy: {e.strerror or e}") from None
    return sockets, lock


def reserve_grpc(host: str, port: int) -> tuple[Any, socket.socket]:
    """Keep a gRPC port for the workers: a lock (against another epick) and a socket bound with
    SO_REUSEPORT but not listening (against anything binding it without; it takes no connections)."""
    lock = open(Path(tempfile.gettempdir()) / f"epick-grpc-{host}-{port}.lock", "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise OSError(f"cannot listen on {host}:{port} for gRPC: another epick serves it") from None
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        lock.close()
        raise OSError(f"cannot listen on {host}:{port} for gRPC: {e.strerror or e}") from None
    return lock, sock


# --- how many ---------------------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cores_available(cgroup: Path = CGROUP_ROOT) -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a
    container's CPU limit, rounded up), cgroup v2's `cpu.max` or v1's `cpu.cfs_quota_us`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota: float | None = None
    with contextlib.suppress(OSError, ValueError):
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]
        if limit != "max":
            quota = int(limit) / int(period)
    if quota is None:
        with contextlib.suppress(OSError, ValueError):
            limit_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
            if limit_us > 0 and period_us > 0:
                quota = limit_us / period_us
    if quota is not None and quota > 0:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def default_workers(cores: int, plugins: Mapping[str, object], *, flow_control: bool,
                    grpc_ports_fixed: bool) -> tuple[int, str]:  # fmt: skip
    """How many workers `epick serve` runs when `--workers` is not given, and why: one per core,
    unless something would be lost by splitting the service (then one, saying what)."""
    if cores <= 1:
        return 1, "one core is available"
    if flow_control:
        return 1, "flow control's queues are one process's"
    if not grpc_ports_fixed:
        return 1, "ext_proc's gRPC ports are chosen by the kernel (0), and workers share fixed ones"
    unshared = unshared_plugins(plugins)
    if unshared:
        return 1, "these plugins would keep their state per worker: " + "; ".join(unshared)
    return cores, f"{cores} cores are available"


# --- the supervisor -------------------------------------------------------------------------------


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
    def __init__(
        self,
        serve_args: Sequence[str],
        workers: int,
        *,
        host: str,
        port: int | None,
        metrics_host: str,
        metrics_port: int | None,
        extproc_ports: tuple[int, ...] = (),
    ) -> None:
        self.serve_args = list(serve_args)
        self.workers = [_Worker(i) for i in range(workers)]
        self.host, self.port = host, port
        self.metrics_host, self.metrics_port = metrics_host, metrics_port
        self.extproc_ports = extproc_ports
        self._held: list[Any] = []  # the gRPC ports' reservations and locks
        self.stopping = False
        self.sockets: list[socket.socket] = []
        self.covered: dict[int, int] = {}  # a dead worker's proxy socket -> the worker accepting on it
        self._lock: Any = None
        self.hub_path = ""
        self._hub: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._metrics: web.AppRunner | None = None
        self._stopped = asyncio.Event()

    async def run(self) -> None:
        if self.port is not None:
            self.sockets, self._lock = bind_proxy(self.host, self.port, len(self.workers))
        self._held = [hold for port in self.extproc_ports for hold in reserve_grpc(self.host, port)]
        with tempfile.TemporaryDirectory(prefix="epick-hub-") as tmp:
            self.hub_path = str(Path(tmp) / "hub.sock")
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
            args = [sys.executable, "-m", "epick.cli.main", "serve", *self.serve_args, "--worker-index",
                    str(worker.index), "--worker-count", str(len(self.workers)),
                    "--worker-hub", self.hub_path]  # fmt: skip
            fds: tuple[int, ...] = ()
            if self.sockets:
                # Every worker gets every socket, and accepts on its own; while a worker is down,
                # another accepts on its socket too (the hub says which), so no connection waits
                # for the restart. The supervisor keeps them all open.
                fds = tuple(s.fileno() for s in self.sockets)
                args += ["--proxy-fds", ",".join(map(str, fds))]
            worker.process = await asyncio.create_subprocess_exec(*args, pass_fds=fds)
            code = await worker.process.wait()
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
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        for task in list(self._tasks):
            task.cancel()
        if self._metrics is not None:
            await self._metrics.cleanup()
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
        app = web.Application()
        app.router.add_get("/metrics", self._metrics_page)
        self._metrics = web.AppRunner(app, access_log=None)
        await self._metrics.setup()
        await web.TCPSite(self._metrics, self.metrics_host, self.metrics_port).start()

    async def _metrics_page(self, request: web.Request) -> web.Response:
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
        registry.register(_Merged(pages))
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": "text/plain; version=0.0.4"}
        )


class _Merged(Collector):
    """Prometheus pages merged: samples of one name and label set summed across pages (a gauge:
    the largest value, as for a pool's endpoint count every worker reports alike)."""

    def __init__(self, pages: Sequence[str]) -> None:
        self.pages = pages

    def collect(self) -> Any:
        families: dict[str, Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for page in self.pages:
            for family in text_string_to_metric_families(page):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                    values[family.name] = {}
                samples = values[family.name]
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    if key not in samples:
                        samples[key] = sample.value
                    elif family.type == "gauge":
                        samples[key] = max(samples[key], sample.value)
                    else:
                        samples[key] += sample.value
        for name, family in families.items():
            for (sample_name, labels), value in values[name].items():
                family.add_sample(sample_name, dict(labels), value)
            yield family


# --- a worker's end of the hub ----------------------------------------------------------------------


class WorkerLink:
    """Connects a worker's replicated plugins to the hub: publishes what they record, applies what
    the other workers' record, and answers and loads snapshots.

    The link is a plain non-blocking socket, read when the event loop sees data and also by
    `catch_up`, which the director calls before each scheduling: a burst of requests decided in one
    turn of the loop still sees the updates that reached the socket meanwhile."""

    def __init__(
        self,
        hub_path: str,
        index: int,
        plugins: Any,
        shared: Mapping[str, Replicated] | None = None,
        workers: int = 0,
    ) -> None:
        self.hub_path = hub_path
        self.index = index
        self.workers = workers  # how many there are (0: not known)
        self.plugins = plugins  # () -> Mapping[str, Plugin]: the running config's plugins
        self.shared = dict(shared or {})  # replicated state outside the config (endpoint metrics)
        self._sock: socket.socket | None = None
        self._in = bytearray()
        self._out = bytearray()  # what the socket did not take yet
        self._outbox: list[list[object]] = []
        self._flush_pending = False
        self._snapshot: asyncio.Future[None] | None = None  # set once the snapshot has come
        self._early: list[Any] | None = []  # what came before the plugins were attached
        self._replicated: dict[str, Replicated] = {}  # by name, as of the last attach
        self.applied = 0
        # Other workers' proxy sockets this one is to accept on while they are down: kept until
        # `serve_sockets` hands them to the running proxy, then passed on as the hub says.
        self.covering: set[int] = set()
        self._accept: Callable[[int], None] | None = None  # by socket index, once serving
        self._release: Callable[[int], None] | None = None

    def serve_sockets(self, accept: Callable[[int], None], release: Callable[[int], None]) -> None:
        """Once the proxy runs: accept on the sockets the hub gives this worker (`accept(i)`) until
        it says to stop (`release(i)`), starting with those it gave already."""
        self._accept, self._release = accept, release
        for index in sorted(self.covering):
            accept(index)

    async def connect(self, timeout: float = 10.0) -> None:
        """Join the hub and load the running workers' shared state (before this worker serves, so
        its first decision already knows theirs); then publish and apply updates."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await loop.sock_connect(sock, self.hub_path)
        self._sock = sock
        self._snapshot = loop.create_future()
        loop.add_reader(sock.fileno(), self.read_available)
        self._send(frame({"t": "hello", "worker": self.index}))
        try:
            await asyncio.wait_for(asyncio.shield(self._snapshot), timeout)
        except TimeoutError:
            log.warning(
                "worker %d: no snapshot of the shared state within %gs; starting empty", self.index, timeout
            )
        self.attach()
        early, self._early = self._early or [], None
        for message in early:  # in the order they came: updates that crossed the snapshot included
            self._handle(message)

    def report_metrics(self, port: int) -> None:
        """Where this worker serves its /metrics (the supervisor merges every worker's)."""
        self._send(frame({"t": "metrics", "port": port}))

    def attach(self) -> None:
        """(Again, after a config reload) hand every replicated plugin its publisher, and tell the
        plugins that make random choices how many workers make them."""
        self._replicated = {}
        for name, plugin in [*self.shared.items(), *self.plugins().items()]:
            if isinstance(plugin, Replicated) and name not in self._replicated:
                plugin.replicate(self._publisher(name), self.index)
                self._replicated[name] = plugin
            if self.workers > 1 and isinstance(plugin, WorkerAware):
                plugin.set_workers(self.workers)
        unshared = unshared_plugins(self.plugins())
        if unshared and self.index == 0:
            log.warning("with --workers, each worker keeps its own: %s", "; ".join(unshared))

    def catch_up(self) -> None:
        """Before a decision: apply what has arrived. (What this worker recorded leaves at the end
        of the loop's turn, one frame for all of it: a frame per decision cost a quarter of the
        throughput of two workers, in the hub's forwarding and the other worker's wake-ups.)"""
        if self._sock is not None:
            self.read_available()

    def _publisher(self, name: str) -> Any:
        def publish(update: object) -> None:
            self._outbox.append([name, update])
            if not self._flush_pending:
                self._flush_pending = True
                asyncio.get_running_loop().call_soon(self._flush)

        return publish

    def _flush(self) -> None:
        self._flush_pending = False
        items, self._outbox = self._outbox, []
        if items:
            self._send(frame({"t": "u", "from": self.index, "items": items}))

    # --- the socket ---------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            return
        if not self._out:
            try:
                sent = sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._lost()
                return
            if sent == len(data):
                return
            data = data[sent:]
            asyncio.get_running_loop().add_writer(sock.fileno(), self._write_pending)
        self._out += data

    def _write_pending(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            return
        except OSError:
            self._lost()
            return
        del self._out[:sent]
        if not self._out:
            asyncio.get_running_loop().remove_writer(sock.fileno())

    def read_available(self) -> None:
        """Read and handle every whole frame the socket holds now."""
        sock = self._sock
        while sock is not None:
            try:
                chunk = sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self._lost()
                return
            self._in += chunk
            if len(chunk) < 1 << 20:
                break
        buf, pos = self._in, 0
        while len(buf) - pos >= _HEAD.size:
            length, _ = _HEAD.unpack_from(buf, pos)
            if len(buf) - pos - _HEAD.size < length:
                break
            start = pos + _HEAD.size
            message = msgpack.unpackb(buf[start : start + length], raw=False, strict_map_key=False)
            pos = start + length
            if self._early is None:
                self._handle(message)
                continue
            self._early.append(message)
            if message.get("t") == "snapshot" and self._snapshot is not None and not self._snapshot.done():
                self._snapshot.set_result(None)
        del buf[:pos]

    def _lost(self) -> None:
        if self._sock is None:
            return
        self._close()
        log.error("worker %d lost the supervisor's hub; exiting", self.index)
        os.kill(os.getpid(), signal.SIGTERM)  # an orphan must not serve on alone

    def _close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(sock.fileno())
            loop.remove_writer(sock.fileno())
            sock.close()

    def _handle(self, message: Any) -> None:
        kind = message.get("t")
        replicated = self._replicated
        if kind == "u":
            origin = int(message["from"])
            for name, update in message["items"]:
                plugin = replicated.get(name)
                if plugin is not None:
                    plugin.apply_update(update, origin)
                    self.applied += 1
        elif kind == "left":
            for plugin in replicated.values():
                plugin.worker_left(int(message["worker"]))
        elif kind == "accept":
            index = int(message["socket"])
            if index not in self.covering:
                self.covering.add(index)
                log.info("worker %d accepts on worker %d's socket while it is down", self.index, index)
                if self._accept is not None:
                    self._accept(index)
        elif kind == "release":
            index = int(message["socket"])
            if index in self.covering:
                self.covering.discard(index)
                log.info("worker %d stops accepting on worker %d's socket: it is back", self.index, index)
                if self._release is not None:
                    self._release(index)
        elif kind == "snapshot?":
            items = {name: p.snapshot() for name, p in replicated.items()}
            self._send(frame({"t": "snapshot", "for": message["for"], "items": items}))
        elif kind == "snapshot":
            for name, state in message["items"].items():
                plugin = replicated.get(name)
                if plugin is not None:
                    plugin.restore(state)
            if message["items"]:
                log.info("worker %d loaded the shared state of a running worker", self.index)

    async def stop(self) -> None:
        self._close()


def unshared_plugins(plugins: Mapping[str, object]) -> list[str]:
    """The plugins whose state from earlier requests stays per worker, each as "name (type): what"."""
    found = []
    for name, plugin in plugins.items():
        state = unshared_state(plugin)
        if state:
            found.append(f"{name} ({plugin.typed_name.type}): {state}")  # type: ignore[attr-defined]
    return found
