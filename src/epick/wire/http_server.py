"""The proxy's HTTP/1.1 server: an asyncio protocol over httptools (the parser uvloop's and uvicorn's
servers use), with every error as an OpenAI-shaped JSON body and connections that cannot hold the
server hostage.

aiohttp's server spent about 110 µs of CPU per proxied request on this machine, a third of the
proxy's total (docs/performance.md, "Data plane"); this one does what the proxy needs and no more:
- Requests on a connection are answered in order (pipelining); a handler runs for one at a time.
- A body is read whole, at most `max_body_bytes` after decoding its Content-Encoding (gzip, deflate,
  br when the brotli module is installed); `Expect: 100-continue` is answered when the handler
  reads the body.
- A response goes out whole (with its length) or streamed (chunked; close-delimited to HTTP/1.0).
  Writes wait while the client reads slowly (flow control).
- A request head must arrive within `head_timeout` seconds of its first byte (a slowloris client is
  answered 408 and closed); an idle kept-alive connection is closed after `keepalive_timeout`; beyond
  `max_connections` open connections a new one is answered 503 and closed. A deadline that fires
  while a request waits unread in the socket (the event loop stalled) is the server's lateness, not
  the client's: it is re-armed.
- A malformed request gets a JSON 400 and the connection closes; a client that disconnects (or
  half-closes, as aiohttp's server reads it) cancels its handler (a request waiting in flow control
  leaves its queue, a relay stops reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import cast

import httptools

from epick.wire.budget import BodyBudget
from epick.wire.deadlines import Deadline, Deadlines
from epick.wire.http_messages import (
    HIGH_WATER,
    MAX_QUEUED,
    Handler,
    Headers,
    Reply,
    Request,
    error_body,
    raw_error,
    unread_bytes,
)

# Closing lingeringly after answering a request whose body is still arriving: at most this long, and
# this many bytes dropped.
LINGER_S = 2.0
LINGER_BYTES = 32 * 1024 * 1024

log = logging.getLogger(__name__)


class HTTPServer:
    """Serves `handler` on a listening socket: the connections, their limits and their deadlines."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body_bytes: int,
        head_timeout: float,
        keepalive_timeout: float,
        max_connections: int = 0,
        bodies: BodyBudget | None = None,
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.bodies = bodies  # the bytes all connections' request bodies hold at once
        self.head_timeout = head_timeout
        self.keepalive_timeout = keepalive_timeout
        self.idle_deadlines = Deadlines(keepalive_timeout)  # one per kept-alive connection between requests
        self.max_connections = max_connections
        self.connections: set[_Connection] = set()
        self.draining = False  # stopping: a connection closes once its request is answered
        self._drained: asyncio.Future[None] | None = None  # set once the last connection is gone
        self._server: asyncio.Server | None = None
        self._adopted: dict[int, asyncio.Future[asyncio.Server]] = {}  # by key: other listening sockets
        self.port = 0

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> None:
        """Listen on `host:port`, or accept on `sock`, a socket already listening (`epick serve
        --workers`: the supervisor binds it once and every worker accepts on it)."""
        loop = asyncio.get_running_loop()
        self.draining = False
        if sock is not None:
            self._server = await loop.create_server(lambda: _Connection(self), sock=sock, backlog=1024)
        else:
            self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=1024)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def accept_also(self, key: int, sock: socket.socket) -> None:
        """Accept on another listening socket too, until `stop_accepting(key)` (`epick serve
        --workers`: a dead worker's socket, whose connections would wait for its successor)."""
        if key not in self._adopted:
            loop = asyncio.get_running_loop()
            started = asyncio.ensure_future(
                loop.create_server(lambda: _Connection(self), sock=sock, backlog=1024)
            )
            started.add_done_callback(_report_failure)
            self._adopted[key] = started

    def shed(self) -> None:
        """Every open connection closes after its next response, which says so (`connection:
        close`): its client connects again, and the kernel may hand the new connection to another
        listening socket (`epick serve --workers`: a worker just started gets its share of clients
        that keep their connections alive). Nothing in flight is cut."""
        for conn in self.connections:
            conn.shed = True

    def stop_accepting(self, key: int) -> None:
        """No more connections from `key`'s socket; those accepted from it are served to their end."""
        adopted = self._adopted.pop(key, None)
        if adopted is not None:
            adopted.add_done_callback(_close_server)

    async def stop(self, drain: float = 0.0) -> None:
        """Stop accepting; connections idle between requests close at once, those answering a
        request get `drain` seconds to finish it (then close), and the rest are reset."""
        for key in list(self._adopted):
            self.stop_accepting(key)
        if self._server is not None:
            self._server.close()
        if drain > 0:
            await self._drain(drain)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        self._server = None

    async def _drain(self, seconds: float) -> None:
        """Until `seconds` pass: requests being answered finish, then every connection closes once
        what it has written has gone out (a closed transport flushes before `connection_lost`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        self.draining = True
        self._drained = loop.create_future()
        while self.connections:
            busy = [c.task for c in self.connections if c.task is not None and not c.task.done()]
            for conn in list(self.connections):
                if conn.task is None or conn.task.done():
                    conn.close_when_idle()
            remaining = deadline - loop.time()
            if remaining <= 0 or not self.connections:
                return
            if busy:
                await asyncio.wait(busy, timeout=remaining)
            else:  # all closing: wait for their last bytes to leave
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._drained), remaining)
                return

    def _connection_gone(self) -> None:
        """A connection was lost: while draining, the last one's loss ends the wait."""
        drained = self._drained
        if self.draining and not self.connections and drained is not None and not drained.done():
            drained.set_result(None)


def _report_failure(started: asyncio.Future[asyncio.Server]) -> None:
    if not started.cancelled() and started.exception() is not None:
        log.error("cannot accept on another listening socket: %s", started.exception())


def _close_server(started: asyncio.Future[asyncio.Server]) -> None:
    if not started.cancelled() and started.exception() is None:
        started.result().close()


class _Connection(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive, answers them in order."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        # Looked up once: asyncio.get_running_loop is a getpid system call on Python 3.11.
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: list[Request] = []
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.shed = False  # close after the next response (`HTTPServer.shed`)
        self._url = b""
        self._pairs: list[tuple[str, str]] = []
        self._parsing: Request | None = None  # the request whose body is arriving
        self._in_head = False  # between a request's first byte and the end of its headers
        self._head_deadline: asyncio.TimerHandle | None = None
        self._idle: Deadline | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False
        self._lingering = 0  # closing lingeringly: the bytes still to drop before closing
        self._linger_deadline: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not asyncio's classes
        server = self.server
        limit = server.max_connections
        if limit and len(server.connections) >= limit:
            log.warning("refusing a connection: the limit of %d open connections is reached", limit)
            message = f"too many open connections (the limit is {limit}); retry later"
            self.transport.write(raw_error(503, message, "too_many_connections"))
            self.closed = True
            self.transport.close()
            return
        server.connections.add(self)
        self.transport.set_write_buffer_limits(high=HIGH_WATER)
        with contextlib.suppress(OSError, AttributeError):
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._lingering -= min(len(data), self._lingering)
            if not self._lingering:
                self._stop_lingering()  # enough dropped: the client has had its answer's time
            return
        if self.closed or self._broken:
            return
        self._disarm_idle()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._bad("protocol upgrades are not supported")
            return
        except httptools.HttpParserError as e:
            self._bad(str(e) or "unparsable request")
            return
        if self._in_head:
            if self._head_deadline is None:
                self._head_deadline = asyncio.get_running_loop().call_later(
                    self.server.head_timeout, self._too_slow
                )
        elif self.task is None and not self.queue and self._parsing is None:
            self._arm_idle()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._lingering = 0
        if self._linger_deadline is not None:
            self._linger_deadline.cancel()
        self.server.connections.discard(self)
        self.server._connection_gone()
        self._disarm_head()
        self._disarm_idle()
        if self._parsing is not None:
            self._parsing.fail()
        for request in self.queue:
            request.fail()
        self.queue.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client left: its handler stops
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionResetError("the client closed the connection"))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # --- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._url = b""
        self._pairs = []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._pairs.append((name.decode("latin-1").lower(), value.decode("utf-8", "surrogateescape")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head()
        parser = self.parser
        request = Request(
            self,
            parser.get_method().decode("latin-1"),
            self._url.decode("utf-8", "surrogateescape"),
            Headers(self._pairs),
            version=parser.get_http_version(),
            keep_alive=parser.should_keep_alive(),
            limit=self.server.max_body_bytes,
            budget=self.server.bodies,
        )
        self._parsing = request
        self.queue.append(request)
        if self.task is None:
            self._next()
        elif len(self.queue) > MAX_QUEUED and self.transport is not None and not self._paused_reading:
            self._pause_reading()

    def on_body(self, body: bytes) -> None:
        if self._parsing is not None:
            self._parsing.feed(body, self.server.max_body_bytes)

    def on_message_complete(self) -> None:
        if self._parsing is not None:
            self._parsing.finish()
            self._parsing = None

    # --- serving ----------------------------------------------------------------------------------

    _paused_reading = False
    _broken = ""  # why the parser refused the bytes after the queued requests

    def _pause_reading(self) -> None:
        assert self.transport is not None
        self._paused_reading = True
        self.transport.pause_reading()

    def _next(self) -> None:
        if not self.queue or self.closed:
            self.task = None
            return
        request = self.queue.pop(0)
        if (
            self._paused_reading
            and not self._broken
            and len(self.queue) <= MAX_QUEUED // 2
            and self.transport is not None
        ):
            self._paused_reading = False
            self.transport.resume_reading()
        self.task = self.loop.create_task(self._serve(request))

    async def _serve(self, request: Request) -> None:
        try:
            await self._answer(request)
        finally:
            request.release()  # its body is no longer held

    async def _answer(self, request: Request) -> None:
        reply = Reply(self, request)
        try:
            await self.server.handler(request, reply)
        except asyncio.CancelledError:
            return  # the client left (connection_lost cancelled it): nothing to answer
        except (ConnectionError, RuntimeError) as e:
            if self.closed:
                return
            log.debug("connection error while answering: %s", e)
            self.abort()
            return
        except Exception:
            log.exception("error answering %s %s", request.method, request.target[:200])
            if not reply.started:
                reply.json(
                    500,
                    error_body(500, "internal error in epick (its log has the details)", "internal"),
                    close=True,
                )
            else:
                self.abort()
                return
        if self.closed:
            return
        if not reply.finished:
            if reply.started:
                self.abort()  # a stream the handler left unfinished: the client must not wait on it
                return
            reply.json(500, error_body(500, "no answer was produced", "internal"), close=True)
        if reply.close:
            self._close_after_write()
            return
        self.task = None
        if self._broken and not self.queue:
            self._answer_broken()
            return
        self._next()
        if self.task is None and self._parsing is None and not self._in_head:
            if self.server.draining:
                self._close_after_write()
                return
            self._arm_idle()

    # --- writing ----------------------------------------------------------------------------------

    @property
    def write_paused(self) -> bool:
        """The transport holds more than its high-water mark unsent: the client is not keeping up."""
        return self._paused

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise ConnectionResetError("the client closed the connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if self.closed:
            raise ConnectionResetError("the client closed the connection")
        if not self._paused:
            return
        self._writable = asyncio.get_running_loop().create_future()
        try:
            await self._writable
        finally:
            self._writable = None

    def send_continue(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _close_after_write(self) -> None:
        self.closed = True
        transport = self.transport
        if transport is None:
            return
        if self._parsing is not None and transport.can_write_eof():
            # The client is still sending a body (one refused, say, as too large): closing now, with its
            # bytes unread, would reset the connection before it reads the answer (clients that write the
            # whole body first, as urllib does, would see a reset, not the 413). Close lingeringly (RFC
            # 9112, section 9.6): end our side, read and drop what still comes for a while, then close.
            transport.write_eof()
            self._lingering = LINGER_BYTES
            self._linger_deadline = self.loop.call_later(LINGER_S, self._stop_lingering)
            return
        transport.close()

    def _stop_lingering(self) -> None:
        self._lingering = 0
        if self.transport is not None:
            self.transport.close()

    def nothing_after(self, request: Request) -> bool:
        """Whether no request follows `request` on this connection yet (none queued, none arriving)."""
        return not self.queue and not self._in_head and self._parsing in (None, request)

    def close_when_idle(self) -> None:
        """Stopping: close now if no request is being answered or waits (else after it)."""
        if not self.queue and self._parsing is None and (self.task is None or self.task.done()):
            self._close_after_write()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _bad(self, reason: str) -> None:
        """A request the parser refuses: a JSON 400 once the requests before it are answered, and the
        connection closes (nothing after the bad bytes is read)."""
        self._disarm_head()
        self._in_head = False
        self._broken = reason
        if self.transport is not None and not self._paused_reading:
            self._paused_reading = True
            self.transport.pause_reading()
        if self.task is None:
            self._answer_broken()

    def _answer_broken(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(raw_error(400, f"malformed HTTP request: {self._broken}", "bad_http"))
        self._close_after_write()

    # --- deadlines --------------------------------------------------------------------------------

    def _disarm_head(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _arm_idle(self) -> None:
        if self._idle is None and not self.closed:
            self._idle = self.server.idle_deadlines.set(self._idle_out)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_out(self) -> None:
        self._idle = None
        if self.closed or self.transport is None or self.task is not None:
            return
        if unread_bytes(self.transport):  # a request waits unread: the loop was late, not the client
            self._arm_idle()
            return
        self._close_after_write()

    def _too_slow(self) -> None:
        self._head_deadline = None
        transport = self.transport
        if self.closed or transport is None or not self._in_head:
            return
        if unread_bytes(transport):
            # Bytes wait in the socket that the event loop has not read yet: the server is late (a
            # stalled loop), not the client. Reading them will disarm the deadline; until then, arm it.
            self._head_deadline = asyncio.get_running_loop().call_later(
                self.server.head_timeout, self._too_slow
            )
            return
        peer = transport.get_extra_info("peername")
        timeout = self.server.head_timeout
        log.warning("closing a connection from %s: no complete request head in %gs", peer, timeout)
        if self.task is None:
            transport.write(raw_error(408, f"no complete request head within {timeout:g}s", "head_timeout"))
        self._close_after_write()
