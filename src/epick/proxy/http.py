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
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from epick.proxy.deadlines import Deadline, Deadlines
from epick.requestcontrol.errors import RequestError

log = logging.getLogger(__name__)

try:  # aiohttp decodes br when brotli is installed; so does this server
    import brotli  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    brotli = None

MAX_QUEUED = 16  # pipelined requests read ahead of the one being answered; more pause reading
HIGH_WATER = 256 * 1024  # bytes the transport may buffer before writes wait for the client


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def error_body(status: int, message: str, code: str) -> bytes:
    return RequestError(status, message, code).body()


class BodyTooLargeError(Exception):
    pass


class BodyDecodeError(Exception):
    pass


class Headers(Mapping[str, str]):
    """A request's headers: `pairs` as sent (names lower-cased, repeats kept, in order), and a
    case-insensitive mapping over them (a repeated header's values joined with ", ")."""

    __slots__ = ("_index", "pairs")

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self.pairs = pairs
        index: dict[str, str] = {}
        for name, value in pairs:
            index[name] = f"{index[name]}, {value}" if name in index else value
        self._index = index

    def __getitem__(self, name: str) -> str:
        return self._index[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:
        return self._index.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


class Request:
    """One request: its line and headers, and its body as it arrives."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_decoder",
        "_done",
        "_error",
        "_size",
        "_waiter",
        "expect_continue",
        "headers",
        "keep_alive",
        "method",
        "path",
        "target",
        "version",
    )

    def __init__(
        self,
        conn: _Connection,
        method: str,
        target: str,
        headers: Headers,
        *,
        version: str,
        keep_alive: bool,
        limit: int,
    ) -> None:
        self._conn = conn
        self.method = method
        self.target = target  # the request target as sent: path and query
        raw_path = target.partition("?")[0]
        self.path = unquote(raw_path) if "%" in raw_path else raw_path
        self.headers = headers
        self.version = version
        self.keep_alive = keep_alive
        self.expect_continue = headers.get("expect", "").lower() == "100-continue"
        self._chunks: list[bytes] = []
        self._size = 0
        self._done = False
        self._error: type[Exception] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder = _decoder(headers.get("content-encoding", ""), limit)
        length = headers.get("content-length", "")
        if self._decoder is None and length.isdigit() and int(length) > limit:
            self._error = BodyTooLargeError  # refused before a byte of it is read
        elif self._decoder is not None and self._decoder.failed:
            self._error = BodyDecodeError

    @property
    def body_error(self) -> str:
        if self._decoder is not None and self._decoder.failed:
            return self._decoder.failed
        return ""

    def feed(self, data: bytes, limit: int) -> None:
        if self._error is not None:
            return
        if self._decoder is not None:
            try:
                data = self._decoder.decode(data)
            except BodyDecodeError:
                self._error = BodyDecodeError
                return
        self._size += len(data)
        if self._size > limit:
            self._error = BodyTooLargeError
            self._chunks = []
            return
        self._chunks.append(data)

    def finish(self) -> None:
        if self._decoder is not None and self._error is None:
            try:
                self._decoder.flush()
            except BodyDecodeError:
                self._error = BodyDecodeError
        self._done = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def fail(self) -> None:
        """The connection closed before the body was whole."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionResetError("the client closed the connection"))

    async def read(self) -> bytes:
        """The whole body, decoded. Raises `BodyTooLargeError`, `BodyDecodeError` (the message says
        why), or ConnectionResetError when the client leaves first."""
        if self._error is BodyTooLargeError:
            raise BodyTooLargeError()
        if self._error is BodyDecodeError:
            raise BodyDecodeError(self.body_error or "the body does not decode")
        if not self._done:
            if self.expect_continue:
                self.expect_continue = False
                self._conn.send_continue()
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self._error is BodyTooLargeError:
            raise BodyTooLargeError()
        if self._error is BodyDecodeError:
            raise BodyDecodeError(self.body_error or "the body does not decode")
        chunks = self._chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    @property
    def body_complete(self) -> bool:
        return self._done


class _Decoder:
    __slots__ = ("_brotli", "_zlib", "failed", "limit")

    def __init__(self, encoding: str, limit: int) -> None:
        self.limit = limit
        self.failed = ""
        self._zlib: Any = None
        self._brotli: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS)
        elif encoding == "br" and brotli is not None:
            self._brotli = brotli.Decompressor()
        else:
            self.failed = f"unsupported Content-Encoding {encoding!r}"

    def decode(self, data: bytes) -> bytes:
        try:
            if self._zlib is not None:
                # At most one byte past the limit: enough for the caller to refuse the body.
                return cast(bytes, self._zlib.decompress(data, self.limit + 1))
            return cast(bytes, self._brotli.process(data))
        except Exception as e:  # zlib.error, brotli.error: a body that is not what it says
            self.failed = str(e) or type(e).__name__
            raise BodyDecodeError(self.failed) from None

    def flush(self) -> None:
        if self._zlib is not None and not self._zlib.eof:
            self.failed = "the compressed body ends early"
            raise BodyDecodeError(self.failed)


def _decoder(encoding: str, limit: int) -> _Decoder | None:
    encoding = encoding.strip().lower()
    if not encoding or encoding == "identity":
        return None
    return _Decoder(encoding, limit)


class Reply:
    """The answer to one request: whole (`send`) or streamed (`start`, `write`, `end`), once."""

    __slots__ = ("_chunked", "_conn", "_head_only", "_version", "close", "finished", "started")

    def __init__(self, conn: _Connection, request: Request) -> None:
        self._conn = conn
        self._version = request.version
        self._head_only = request.method == "HEAD"
        self._chunked = False
        self.started = False
        self.finished = False
        # Whether the connection closes after this response (the client asked, or a body was left
        # unread, or a handler said so).
        self.close = not request.keep_alive

    def _head(self, status: int, headers: Iterable[tuple[str, str]], length: int | None) -> bytearray:
        out = bytearray(f"HTTP/1.1 {status} {_phrase(status)}\r\n".encode())
        for name, value in headers:
            # Latin-1, as the upstream client decodes the model server's headers: passed byte for byte.
            out += f"{name}: {value}\r\n".encode("latin-1", "replace")
        if length is not None:
            out += b"content-length: %d\r\n" % length
        elif self._version == "1.1":
            self._chunked = True
            out += b"transfer-encoding: chunked\r\n"
        else:
            self.close = True  # an HTTP/1.0 client reads the body to the connection's end
        if self.close:
            out += b"connection: close\r\n"
        elif self._version == "1.0":
            out += b"connection: keep-alive\r\n"
        out += b"\r\n"
        return out

    def send(
        self,
        status: int,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        *,
        content_type: str | None = None,
        close: bool = False,
    ) -> None:
        """The whole response at once."""
        assert not self.started, "a reply is sent once"
        self.started = self.finished = True
        self.close = self.close or close
        if content_type is not None:
            headers = [*headers, ("content-type", content_type)]
        head = self._head(status, headers, len(body))
        if not self._head_only:
            head += body
        self._conn.write(bytes(head))

    def json(
        self, status: int, body: bytes, headers: Iterable[tuple[str, str]] = (), *, close: bool = False
    ) -> None:
        self.send(status, body, headers, content_type="application/json", close=close)

    def error(self, e: RequestError, *, close: bool = False) -> None:
        self.json(e.status, e.body(), e.headers, close=close)

    def start(self, status: int, headers: Iterable[tuple[str, str]] = ()) -> None:
        """The head of a response whose body follows in `write`s."""
        assert not self.started, "a reply is started once"
        self.started = True
        self._conn.write(bytes(self._head(status, headers, None)))

    async def write(self, chunk: bytes) -> None:
        if not chunk or self._head_only:
            return
        conn = self._conn
        if self._chunked:
            conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            conn.write(chunk)
        await conn.drain()

    async def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._chunked and not self._head_only:
            self._conn.write(b"0\r\n\r\n")
        await self._conn.drain()


Handler = Callable[[Request, Reply], Awaitable[None]]


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
    ) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.head_timeout = head_timeout
        self.keepalive_timeout = keepalive_timeout
        self.idle_deadlines = Deadlines(keepalive_timeout)  # one per kept-alive connection between requests
        self.max_connections = max_connections
        self.connections: set[_Connection] = set()
        self.draining = False  # stopping: a connection closes once its request is answered
        self._server: asyncio.Server | None = None
        self._adopted: dict[int, asyncio.Future[asyncio.Server]] = {}  # by key: other listening sockets
        self.port = 0

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> None:
        """Listen on `host:port`, or accept on `sock`, a socket already listening (`epick serve
        --workers`: the supervisor binds it once and every worker accepts on it)."""
        loop = asyncio.get_running_loop()
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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        self.draining = True
        while True:
            busy = [c.task for c in self.connections if c.task is not None and not c.task.done()]
            for conn in list(self.connections):
                if conn.task is None or conn.task.done():
                    conn.close_when_idle()
            remaining = deadline - loop.time()
            if not busy or remaining <= 0:
                return
            await asyncio.wait(busy, timeout=remaining)


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
        self._url = b""
        self._pairs: list[tuple[str, str]] = []
        self._parsing: Request | None = None  # the request whose body is arriving
        self._in_head = False  # between a request's first byte and the end of its headers
        self._head_deadline: asyncio.TimerHandle | None = None
        self._idle: Deadline | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: not asyncio's classes
        server = self.server
        limit = server.max_connections
        if limit and len(server.connections) >= limit:
            log.warning("refusing a connection: the limit of %d open connections is reached", limit)
            message = f"too many open connections (the limit is {limit}); retry later"
            self.transport.write(_raw_error(503, message, "too_many_connections"))
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
        self.server.connections.discard(self)
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
        if self.transport is not None:
            self.transport.close()

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
            self.transport.write(_raw_error(400, f"malformed HTTP request: {self._broken}", "bad_http"))
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
        if _unread(self.transport):  # a request waits unread: the loop was late, not the client
            self._arm_idle()
            return
        self._close_after_write()

    def _too_slow(self) -> None:
        self._head_deadline = None
        transport = self.transport
        if self.closed or transport is None or not self._in_head:
            return
        if _unread(transport):
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
            transport.write(_raw_error(408, f"no complete request head within {timeout:g}s", "head_timeout"))
        self._close_after_write()


def _unread(transport: asyncio.BaseTransport) -> bool:
    """Whether the connection's socket holds bytes not read yet."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        # asyncio's TransportSocket has no recv: peek through a duplicate descriptor.
        with socket.fromfd(sock.fileno(), sock.family, sock.type) as dup:
            return bool(dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False


def _raw_error(status: int, message: str, code: str) -> bytes:
    body = error_body(status, message, code)
    head = (
        f"HTTP/1.1 {status} {_phrase(status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body
