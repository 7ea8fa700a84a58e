"""A worker's end of the hub: its replicated plugins' updates out, the other workers' in."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Mapping
from typing import Any

import msgpack

from epick.config import LoadedConfig
from epick.framework.replication import Replicated
from epick.service.workers.count import unshared_plugins
from epick.service.workers.frames import HEAD, frame

log = logging.getLogger(__name__)

LAZY_FLUSH_S = 0.01  # how long a lazy update may wait for others to leave with


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
        config: Callable[[], LoadedConfig],
        shared: Mapping[str, Replicated] | None = None,
        *,
        lazy: frozenset[str] = frozenset(),
    ) -> None:
        self.hub_path = hub_path
        self.index = index
        self.config = config  # the running config (replaced on reload)
        self.shared = dict(shared or {})  # replicated state outside the config (endpoint metrics)
        # Whose updates may wait up to LAZY_FLUSH_S to leave with others (the endpoint metrics: one
        # frame for a tick's scrapes, one wake-up of the hub and of each worker, not one per scrape).
        self.lazy = lazy
        self._lazy_timer: asyncio.TimerHandle | None = None
        self._sock: socket.socket | None = None
        self._in = bytearray()
        self._out = bytearray()  # what the socket did not take yet
        self._outbox: list[list[object]] = []
        self._sent: asyncio.Future[None] | None = None  # set once `_out` is all sent (`leave`)
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
        # Also told of each update this worker's plugins record (`--shared-state`: other hosts).
        self.tee: Callable[[str, object], None] | None = None
        # Whether another worker is linked: alone, nothing is published (a worker that joins loads a
        # snapshot, and the hub says "active" before it asks for one).
        self.peers = True
        # Told this worker's place among those serving, (position, count), as the hub says.
        self.on_active: Callable[[int, int], None] | None = None
        # Called when the hub retires this worker (the load no longer needs it).
        self.on_retire: Callable[[], None] | None = None

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

    def serving(self, metrics_port: int) -> None:
        """This worker accepts now (its proxy and ext_proc run): the hub gives it its socket and its
        turns. `metrics_port`: where it serves its /metrics (the supervisor merges every worker's)."""
        self._send(frame({"t": "serving", "metrics_port": metrics_port}))

    def attach(self) -> None:
        """(Again, after a config reload) hand every replicated plugin its publisher. (Plugins that
        choose at random between equals learned the worker count from their factory's handle.)"""
        self._replicated = {}
        config = self.config()
        for name, plugin in [*self.shared.items(), *config.plugins.items()]:
            if isinstance(plugin, Replicated) and name not in self._replicated:
                plugin.replicate(self._publisher(name), self.index)
                self._replicated[name] = plugin
        unshared = unshared_plugins(config)
        if unshared and self.index == 0:
            log.warning("with --workers, each worker keeps its own: %s", "; ".join(unshared))

    def catch_up(self) -> None:
        """Before a decision: apply what has arrived. (What this worker recorded leaves at the end
        of the loop's turn, one frame for all of it: a frame per decision cost a quarter of the
        throughput of two workers, in the hub's forwarding and the other worker's wake-ups.)"""
        if self._sock is not None and self.peers:
            self.read_available()

    def _publisher(self, name: str) -> Any:
        def publish(update: object) -> None:
            if self.tee is not None:
                self.tee(name, update)
            if not self.peers:
                return
            self._outbox.append([name, update])
            if self._flush_pending:
                return
            loop = asyncio.get_running_loop()
            if name in self.lazy:
                if self._lazy_timer is None:
                    self._lazy_timer = loop.call_later(LAZY_FLUSH_S, self._flush)
            else:
                self._flush_pending = True
                loop.call_soon(self._flush)

        return publish

    def _flush(self) -> None:
        self._flush_pending = False
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
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
            if self._sent is not None and not self._sent.done():
                self._sent.set_result(None)

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
        while len(buf) - pos >= HEAD.size:
            length, _ = HEAD.unpack_from(buf, pos)
            if len(buf) - pos - HEAD.size < length:
                break
            start = pos + HEAD.size
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
        elif kind == "active":
            position, count = int(message["position"]), int(message["count"])
            self.peers = int(message["linked"]) > 1
            if position >= 0 and self.on_active is not None:
                self.on_active(position, count)
        elif kind == "retire":
            if self.on_retire is not None:
                self.on_retire()
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

    async def leave(self, final_metrics: bytes, timeout: float = 5.0) -> None:
        """A retiring worker's goodbye: what it still had to publish, its last /metrics page (the
        supervisor keeps adding its counts), then the link closes once all of it is sent."""
        self._flush()
        self._send(frame({"t": "final-metrics", "page": final_metrics.decode()}))
        if self._out and self._sock is not None:
            self._sent = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sent, timeout)
        self._close()

    async def stop(self) -> None:
        self._close()
