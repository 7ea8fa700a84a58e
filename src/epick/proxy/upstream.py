"""The proxy's HTTP/1.1 client to the model servers: pooled keep-alive connections on asyncio
protocols, responses parsed by httptools (the parser uvicorn uses).

aiohttp's client spends about 250 µs of CPU per proxied request on this machine, most of it in
request and response objects, timeouts and tracing hooks the proxy does not use; a protocol that
writes the request in one buffer and hands the parser's callbacks straight to the caller spends
about 40 µs (benchmarks/bench_dataplane.py, docs/performance.md). What it does:

- `Upstreams.request` sends one request on an idle connection to the server, or a new one
  (`connect_timeout`), and returns once the response's status and headers have arrived.
- The body is read whole (`read`), chunk by chunk as it arrives (`chunks`), or relayed (`relay`):
  each piece handed to a callback from the connection's own `data_received`, so a streamed response
  wakes no task per chunk. A silence longer than `read_timeout` between two chunks raises
  TimeoutError. Content-Length, chunked and
  close-delimited bodies are understood; the connection goes back to the pool only when its
  response was read to the end and both sides keep it alive (`release`).
- A connection that sat idle may have been closed by the server just as the request went out: when
  one fails before any byte of the response, the request is sent once more on a new connection (the
  server never saw it, or closed without answering).
- Reading pauses while more than 256 KiB of body wait unread, so a slow client slows the server
  instead of filling memory.

Errors: `UpstreamError` for what the network or the server did wrong (refused, reset, closed
early, a malformed response), TimeoutError for silences.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import cast

import httptools

from epick.wire.deadlines import Deadlines

HIGH_WATER = 256 * 1024  # body bytes buffered unread before reading pauses
IDLE_PER_SERVER = 256  # idle connections kept per server; more are closed once their response is read
# An idle connection older than this is not reused: servers close theirs (uvicorn, vLLM's server,
# after 5 s by default), and one closing just as a request goes out costs a retry.
IDLE_SECONDS = 4.0


class UpstreamError(ConnectionError):
    """The server could not be reached, or broke the exchange (reset, closed early, bad HTTP)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0  # to open a connection
    read: float = 600.0  # the longest silence between two chunks of a response


class _Connection(asyncio.Protocol):
    """One TCP connection and the response in progress on it."""

    def __init__(self, pool: Upstreams, key: tuple[str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.lost: BaseException | None = None  # why the connection ended, once it did
        self.closed = False
        self.idle_since = 0.0  # event-loop time it went back to the pool
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.head: asyncio.Future[None] | None = None  # set once the response's head has arrived
        self.body: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False  # the whole response has been parsed
        self.keep_alive = False  # both sides keep the connection open after it
        self.received = False  # any byte of the response arrived
        self.waiter: asyncio.Future[None] | None = None  # a reader waiting for body
        self.paused = False
        # While relaying: takes each piece of body as it arrives, False when its reader is full.
        self.sink: Callable[[bytes], bool] | None = None
        self.last_body = 0.0  # event-loop time the sink last took a piece

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio's classes: no isinstance check here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(UpstreamError(f"malformed HTTP response: {e}"))
            self.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if not self.complete:
            # A close-delimited body ends with the connection; anything else ended early.
            if self.head is not None and self.head.done() and not self._length_known():
                self._on_complete()
                return
            reason = f"connection {'reset' if exc else 'closed'} by the server"
            if exc is not None:
                reason += f": {exc}"
            self._fail(UpstreamError(reason))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status < 200:  # an interim response (100 Continue): the real one follows
            self.headers = []
            return
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None:
            self.last_body = self.loop.time()
            try:
                keeping_up = sink(body)
            except Exception as e:  # the relay's own failure, not the server's: not an UpstreamError
                self.sink = None
                self._fail(e)
                self.close()
                return
            if not keeping_up and not self.paused and self.transport is not None:
                self.paused = True  # until the relay has drained the sink's reader
                self.transport.pause_reading()
                self._wake()
            return
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:
            return  # the interim response ended; the parser goes on with the real one
        self._on_complete()

    # The response, for its reader.
    def _on_complete(self) -> None:
        self.complete = True
        # Asked here: once the parser has moved on to the next message it no longer knows.
        self.keep_alive = bool(self.parser.should_keep_alive()) and not self.closed
        if self.head is not None and not self.head.done():
            self.head.set_result(None)
        self._wake()

    def _length_known(self) -> bool:
        names = {name.lower() for name, _ in self.headers}
        return "content-length" in names or "transfer-encoding" in names

    def _fail(self, error: BaseException) -> None:
        self.lost = error
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def send(self, data: bytes) -> asyncio.Future[None]:
        """Write a request; the future resolves once its response's head has arrived."""
        assert self.transport is not None
        self.head = self.loop.create_future()
        self.transport.write(data)
        return self.head

    async def next_chunk(self, silence: Deadlines) -> bytes | None:
        """The next piece of body, None at its end; TimeoutError when none comes within `silence`."""
        while not self.body:
            if self.complete:
                return None
            if self.lost is not None:
                raise self.lost
            self.waiter = self.loop.create_future()
            try:
                with silence.scope():
                    await self.waiter
            finally:
                self.waiter = None
        chunk = self.body.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered <= HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed

    def recycle(self) -> None:
        self._reset()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True


class UpstreamResponse:
    """A response whose head has arrived; its body is read with `read` or `chunks`, then `release`."""

    __slots__ = ("_conn", "_done", "_silence", "headers", "status")

    def __init__(self, conn: _Connection, silence: Deadlines) -> None:
        self._conn = conn
        self._silence = silence
        self._done = False
        self.status = conn.status
        self.headers = conn.headers  # (name, value) pairs as received

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while (chunk := await conn.next_chunk(self._silence)) is not None:
            if chunk:
                yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def relay(self, sink: Callable[[bytes], bool], drained: Callable[[], Awaitable[None]]) -> None:
        """Hand the body to `sink` piece by piece as it arrives, until its end. `sink` is called from
        the connection's callbacks, so it must not raise; it returns False when its reader is full,
        and reading pauses until `drained()` returns. UpstreamError when the server breaks off,
        TimeoutError after a silence longer than the read timeout."""
        conn = self._conn
        silence = self._silence
        while conn.body:  # what arrived before the relay began
            chunk = await conn.next_chunk(silence)
            if chunk and not sink(chunk):
                await drained()
        conn.sink = sink
        conn.last_body = conn.loop.time()
        try:
            while True:
                if conn.paused and conn.transport is not None:
                    if not conn.complete and conn.lost is None:
                        await drained()
                    conn.paused = False
                    conn.transport.resume_reading()
                if conn.complete:
                    return
                if conn.lost is not None:
                    raise conn.lost
                conn.waiter = conn.loop.create_future()
                try:
                    # One timer per wait, not per chunk: the chunks go to the sink, the wait lasts
                    # until the body ends (or the sink is full). The silence counts from the last piece.
                    async with asyncio.timeout_at(conn.last_body + silence.seconds):
                        await conn.waiter
                except TimeoutError:
                    if conn.loop.time() - conn.last_body < silence.seconds:
                        continue  # pieces came meanwhile: wait out the silence since the last one
                    raise
                finally:
                    conn.waiter = None
        finally:
            conn.sink = None

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool when it was read whole and
        stays open, else it is closed."""
        if self._done:
            return
        self._done = True
        self._conn.pool._release(self._conn)


class Upstreams:
    """Keep-alive connections to the model servers, by (host, port)."""

    def __init__(self, timeouts: Timeouts | None = None) -> None:
        self.timeouts = timeouts or Timeouts()
        self._silences = Deadlines(self.timeouts.read)  # between two chunks of a response
        # The loop of the first request, looked up once: asyncio.get_running_loop is a getpid system
        # call on Python 3.11 (5% of the proxy's CPU under load when called per request).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self.opened = 0  # connections opened (for tests and benchmarks)

    async def request(
        self,
        host: str,
        port: int,
        target: str,
        *,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        method: str = "POST",
    ) -> UpstreamResponse:
        """Send a request with a Content-Length body; the response once its head arrived."""
        data = _encode(method, target, host, port, headers=headers, body=body)
        key = (host, port)
        while True:
            conn, reused = await self._acquire(key)
            try:
                await conn.send(data)
            except UpstreamError:
                conn.close()
                if reused and not conn.received:
                    continue  # an idle connection the server had closed: once more on a new one
                raise
            except BaseException:
                conn.close()  # cancelled or timed out waiting for the head: the connection is spent
                raise
            return UpstreamResponse(conn, self._silences)

    async def _acquire(self, key: tuple[str, int]) -> tuple[_Connection, bool]:
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        idle = self._idle.get(key)
        if idle:
            now = loop.time()
            while idle:
                conn = idle.pop()  # the most recently used first
                if conn.closed:
                    continue
                if now - conn.idle_since > IDLE_SECONDS:
                    # The rest are older still: none is reused.
                    for stale in (conn, *idle):
                        stale.close()
                    idle.clear()
                    break
                return conn, True
        try:
            async with asyncio.timeout(self.timeouts.connect):
                _, conn = await loop.create_connection(lambda: _Connection(self, key, loop), key[0], key[1])
        except TimeoutError:
            raise UpstreamError(
                f"no connection to {key[0]}:{key[1]} within {self.timeouts.connect:g}s"
            ) from None
        except OSError as e:
            raise UpstreamError(f"cannot connect to {key[0]}:{key[1]}: {e.strerror or e}") from None
        self.opened += 1
        self._open.add(conn)
        return conn, False

    def _release(self, conn: _Connection) -> None:
        if conn.reusable():
            idle = self._idle.setdefault(conn.key, [])
            if len(idle) < IDLE_PER_SERVER:
                conn.recycle()
                conn.idle_since = conn.loop.time()
                idle.append(conn)
                return
        conn.close()

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    @property
    def idle(self) -> int:
        return sum(len(v) for v in self._idle.values())

    async def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing


def _encode(
    method: str, target: str, host: str, port: int, *, headers: Iterable[tuple[str, str]], body: bytes
) -> bytes:
    """The request in one buffer. Header names and values with a CR or LF are refused (they would
    split the request)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 address in brackets
    lines = [f"{method} {target} HTTP/1.1", f"host: {authority}", f"content-length: {len(body)}"]
    for name, value in headers:
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
            raise ValueError(f"header {name!r} has a line break")
        lines.append(f"{name}: {value}")
    head = "\r\n".join(lines) + "\r\n\r\n"
    # Header text is what the client sent, decoded as aiohttp decodes it: encoded back byte for byte.
    return head.encode("utf-8", "surrogateescape") + body
