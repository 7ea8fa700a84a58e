"""A minimal keep-alive HTTP/1.1 GET client for /metrics, on an asyncio protocol.

Scraping hundreds of endpoints every 50 ms is thousands of GETs a second; aiohttp's client costs
about 0.3 ms of CPU per GET there (benchmarks/bench_service.py), asyncio's streams about 60 µs of
their own machinery, this one less: the answer is gathered in the protocol's `data_received` (no
reader, no buffer copies beyond one join) and framed as it comes. It does only what a scrape needs:
GET one path on a persistent connection, read a Content-Length or chunked body, reconnect when the
server closes. Anything else about HTTP is out of scope on purpose.

Gathered answers (`gather_after`, plain HTTP): the scrapers of a tick send their GETs together, and
each answer would wake the event loop on its own as it arrives (one wake-up per scrape, the largest
part of a scrape's CPU). A gathered client's socket is not watched while its answer is expected:
one timer, `gather_after` after the first GET of the tick, reads every answer that has come, and only
an answer still incomplete then is waited for as usual. A tick's scrapes cost two wake-ups, not one
per endpoint; their metrics land `gather_after` later.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import weakref
from typing import Any, cast


class HTTPError(Exception):
    """The server answered something a scrape cannot use; the message says what."""


def tls_context(
    insecure_skip_verify: bool, ca_cert_path: str = "", client_cert_path: str = "", client_key_path: str = ""
) -> ssl.SSLContext:
    """A client TLS context as upstream's HTTP data sources build it: verification off with
    `insecureSkipVerify`, else against `caCertPath` (or the system roots); a client certificate for mTLS."""
    context = ssl.create_default_context(cafile=ca_cert_path or None)
    if insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert_path:
        context.load_cert_chain(client_cert_path, client_key_path or None)
    return context


MAX_HEAD = 1 << 16  # bytes: a response head longer than this is not a metrics server's
MAX_BODY = 1 << 26  # bytes: nor is a body longer than this


class _Assembly:
    """The bytes of one answer as they arrive, framed each time more come."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    @property
    def started(self) -> bool:
        return bool(self._parts)

    def feed(self, data: bytes) -> tuple[int, bytes, bool] | None:
        """The whole answer once `data` completes it; None while it does not. Raises HTTPError."""
        self._parts.append(data)
        self._size += len(data)
        answer = _framed(b"".join(self._parts) if len(self._parts) > 1 else data)
        if answer is None:
            if self._size > MAX_HEAD + MAX_BODY:
                raise HTTPError(f"an answer longer than {MAX_HEAD + MAX_BODY} bytes")
            if len(self._parts) > 1:
                self._parts = [b"".join(self._parts)]  # joined once per read, not once per part
            return None
        self._parts, self._size = [], 0
        return answer

    def ended(self) -> tuple[int, bytes, bool] | None:
        """The server closed the connection: the answer it ends (None: nothing had come). Raises
        HTTPError for an answer cut short."""
        if not self._parts:
            return None
        answer = _framed(b"".join(self._parts), eof=True)
        self._parts, self._size = [], 0
        return answer


class _Answer(asyncio.Protocol):
    """One connection: collects each answer as it arrives and resolves the waiting `get`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.lost = False
        self._assembly = _Assembly()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            self._fail(HTTPError("data the client did not ask for"))
            return
        try:
            answer = self._assembly.feed(data)
        except HTTPError as e:
            self._fail(e)
            return
        if answer is not None:
            waiter.set_result(answer)

    def eof_received(self) -> bool | None:
        waiter = self.waiter
        if waiter is not None and not waiter.done() and self._assembly.started:
            try:
                answer = self._assembly.ended()
            except HTTPError as e:
                waiter.set_exception(e)
                return None
            if answer is not None:
                waiter.set_result(answer)
        return None  # the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(
                ConnectionResetError("the server closed the connection") if exc is None else exc
            )

    def _fail(self, error: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()


class _Gathered:
    """A plain connection whose answer is read when the gatherer says (or, still incomplete then,
    as it comes)."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = sock
        self.loop = loop
        self.waiter: asyncio.Future[tuple[int, bytes, bool]] | None = None
        self.closed = False
        self._assembly = _Assembly()
        self._watched = False

    def stale(self) -> bool:
        """Before a GET: whether the server closed the connection, or sent what was not asked for,
        since the last answer (then it is not reused)."""
        try:
            self.sock.recv(1)  # EOF (no bytes), or bytes nobody asked for
        except BlockingIOError:
            return False
        except OSError:
            pass
        return True

    def read(self) -> None:
        """Read what has come; resolve the waiter once the answer is whole (or failed), else watch the
        socket for the rest."""
        waiter = self.waiter
        if waiter is None or waiter.done():
            self.unwatch()
            return
        try:
            chunks, ended = [], False
            while True:  # all that has come, framed once (not once per piece: a large page)
                try:
                    data = self.sock.recv(1 << 18)
                except BlockingIOError:
                    break
                if not data:
                    ended = True
                    break
                chunks.append(data)
                if len(data) < 1 << 18:
                    break  # the kernel had no more: no recv to learn it (what follows, when it comes)
            answer = (
                self._assembly.feed(b"".join(chunks) if len(chunks) > 1 else chunks[0]) if chunks else None
            )
            if answer is None and ended:
                answer = self._assembly.ended()
                if answer is None:
                    raise ConnectionResetError("the server closed the connection")
            if answer is not None:
                self._resolve(answer)
                return
        except Exception as e:  # whatever an answer does, it fails this GET alone
            self.unwatch()
            waiter.set_exception(e)
            return
        if not self._watched:
            self._watched = True
            self.loop.add_reader(self.sock.fileno(), self.read)

    def _resolve(self, answer: tuple[int, bytes, bool]) -> None:
        self.unwatch()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(answer)

    def unwatch(self) -> None:
        if self._watched:
            self._watched = False
            self.loop.remove_reader(self.sock.fileno())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.unwatch()
            self.sock.close()
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(ConnectionResetError("the connection was closed"))


class _Gatherer:
    """One per event loop: reads the gathered connections' answers together, `after` seconds after
    the first GET since its last reading."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: list[_Gathered] = []
        self._timer: asyncio.TimerHandle | None = None

    def expect(self, conn: _Gathered, after: float) -> None:
        self.waiting.append(conn)
        if self._timer is None:
            self._timer = self.loop.call_later(after, self._read)

    def _read(self) -> None:
        self._timer = None
        waiting, self.waiting = self.waiting, []
        for conn in waiting:
            if not conn.closed:
                conn.read()  # never raises: an answer's error is its own GET's


_GATHERERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Gatherer] = weakref.WeakKeyDictionary()


def _gatherer(loop: asyncio.AbstractEventLoop) -> _Gatherer:
    gatherer = _GATHERERS.get(loop)
    if gatherer is None:
        gatherer = _GATHERERS[loop] = _Gatherer(loop)
    return gatherer


def _framed(data: bytes, *, eof: bool = False) -> tuple[int, bytes, bool] | None:
    """(status, body, keep-alive) once `data` holds a whole answer; None while it does not yet."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) > MAX_HEAD:
            raise HTTPError(f"a response head longer than {MAX_HEAD} bytes")
        if eof:
            raise HTTPError("the server closed the connection mid-head")
        return None
    lines = data[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if (
        len(parts) < 2
        or not parts[0].startswith("HTTP/1.")
        or not (parts[1].isascii() and parts[1].isdigit())
    ):
        raise HTTPError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    status = int(parts[1])
    length = -1
    chunked = False
    keep_alive = True
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise HTTPError(f"bad Content-Length {value.strip()[:40]!r}") from None
        elif name == "transfer-encoding":
            chunked = "chunked" in value.lower()
        elif name == "connection":
            keep_alive = "close" not in value.lower()
    start = end + 4
    if chunked:
        body = _dechunked(data, start, eof)
        return None if body is None else (status, body, keep_alive)
    if length >= 0:
        if length > MAX_BODY:
            raise HTTPError(f"a body of {length} bytes")
        if len(data) - start < length:
            if eof:
                raise HTTPError(f"the server closed the connection {length - len(data) + start} bytes short")
            return None
        return status, data[start : start + length], keep_alive
    if not eof:
        return None  # delimited by the connection's end
    return status, data[start:], False


def _dechunked(data: bytes, at: int, eof: bool) -> bytes | None:
    """A chunked body from `at`; None while incomplete."""
    out: list[bytes] = []
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            break
        try:
            size = int(data[at:line_end].split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise HTTPError(f"bad chunk size {data[at:line_end][:40]!r}") from None
        if size == 0:
            if data.find(b"\r\n", line_end + 2) < 0:
                break  # the (empty) trailer section's end has not come
            return b"".join(out)
        start = line_end + 2
        if len(data) < start + size + 2:
            break
        out.append(data[start : start + size])
        at = start + size + 2
    if eof:
        raise HTTPError("the server closed the connection mid-body")
    return None


class MetricsClient:
    def __init__(
        self,
        host: str,
        port: int,
        path: str = "/metrics",
        timeout: float = 1.0,
        *,
        tls: ssl.SSLContext | None = None,
        accept: str = "text/plain",
        gather_after: float | None = None,
    ) -> None:
        """`gather_after` (plain HTTP only): answers are read together, this long after the first GET
        of a tick (the module's docstring); None: each as it comes."""
        self.host = host
        self.port = port
        self.timeout = timeout
        self.tls = tls
        self.accept = accept
        self.gather_after = gather_after if tls is None else None
        self._request = b""
        self.path = path
        self._conn: _Answer | None = None
        self._gathered: _Gathered | None = None
        # The loop of the connection's first GET, looked up once per connection:
        # asyncio.get_running_loop is a getpid system call on Python 3.11 (measurable at thousands of
        # scrapes a second).
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def path(self) -> str:
        return self._path

    @path.setter
    def path(self, path: str) -> None:
        """The path (and query) each GET asks for, from the next one on."""
        self._path = path
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nAccept: {self.accept}\r\n"
            "Accept-Encoding: identity\r\nUser-Agent: epick\r\n\r\n"
        ).encode()

    async def get(self, *, gathered: bool = True) -> tuple[int, str]:
        """(status, body text). Raises OSError, TimeoutError or HTTPError. `gathered=False`: this
        answer is read as it comes even by a gathering client (a GET that follows another at once)."""
        loop = self._loop
        if loop is None or (self._conn is None and self._gathered is None) or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()  # again with each new connection
        deadline = loop.time() + self.timeout
        gathering = self.gather_after is not None
        try:
            try:
                if gathering:
                    return await self._exchange_gathered(loop, deadline, gathered)
                return await self._exchange(loop, deadline)
            except (ConnectionError, HTTPError):
                if loop.time() >= deadline:
                    raise
                # A kept-alive connection the server dropped: one fresh attempt, read as it comes.
                self.close()
                if gathering:
                    return await self._exchange_gathered(loop, deadline, False)
                return await self._exchange(loop, deadline)
        except BaseException:
            # Never reuse a connection in an unknown state: a late answer would be read as the next one.
            self.close()
            raise

    async def _exchange(self, loop: asyncio.AbstractEventLoop, deadline: float) -> tuple[int, str]:
        conn = self._conn
        if conn is None or conn.lost or conn.transport is None or conn.transport.is_closing():
            connecting = loop.create_connection(
                _Answer, self.host, self.port, ssl=self.tls, server_hostname=self.host if self.tls else None
            )
            async with asyncio.timeout_at(deadline):
                _, conn = await connecting
            self._conn = conn
        assert conn.transport is not None
        waiter: asyncio.Future[tuple[int, bytes, bool]] = loop.create_future()
        conn.waiter = waiter
        conn.transport.write(self._request)
        status, body, keep_alive = await _answer(loop, deadline, waiter, conn)
        if not keep_alive:
            self.close()
        return status, body.decode("utf-8", "replace")

    async def _exchange_gathered(
        self, loop: asyncio.AbstractEventLoop, deadline: float, gathered: bool
    ) -> tuple[int, str]:
        assert self.gather_after is not None
        conn = self._gathered
        if conn is not None and (conn.closed or conn.stale()):
            self.close()  # the server closed it between scrapes (or spoke out of turn): a new one
            conn = None
        if conn is None:
            async with asyncio.timeout_at(deadline):
                conn = self._gathered = await self._connect(loop)
        waiter: asyncio.Future[tuple[int, bytes, bool]] = loop.create_future()
        conn.waiter = waiter
        request = self._request
        try:
            sent = conn.sock.send(request)
        except BlockingIOError:
            sent = 0
        if sent < len(request):  # a full send buffer: rare for a few hundred bytes
            async with asyncio.timeout_at(deadline):
                await loop.sock_sendall(conn.sock, request[sent:])
        if gathered:
            _gatherer(loop).expect(conn, self.gather_after)
        else:
            conn.read()  # what has come, then as it comes
        status, body, keep_alive = await _answer(loop, deadline, waiter, conn)
        if not keep_alive:
            self.close()
            # A server that closes after each answer: a connection per scrape costs more set up by
            # hand than through the loop's transport, so its answers are read as they come.
            self.gather_after = None
        return status, body.decode("utf-8", "replace")

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Gathered:
        """A connection to the first of the host's addresses that accepts one (as the loop's
        `create_connection` tries them); an IP address is not looked up."""
        try:
            ip = ipaddress.ip_address(self.host)
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            addresses: list[tuple[Any, Any, int, str, Any]] = [
                (family, socket.SOCK_STREAM, 0, "", (self.host, self.port))
            ]
        except ValueError:
            addresses = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        error: OSError = OSError(f"{self.host} has no address")
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
            except OSError as e:
                sock.close()
                error = e
                continue
            except BaseException:
                sock.close()
                raise
            return _Gathered(sock, loop)
        raise error

    def close(self) -> None:
        if self._conn is not None and self._conn.transport is not None:
            self._conn.transport.close()
        self._conn = None
        if self._gathered is not None:
            self._gathered.close()
        self._gathered = None


async def _answer(
    loop: asyncio.AbstractEventLoop,
    deadline: float,
    waiter: asyncio.Future[tuple[int, bytes, bool]],
    conn: _Answer | _Gathered,
) -> tuple[int, bytes, bool]:
    """What `waiter` gets by `deadline` (else TimeoutError); then `conn` waits for nothing more."""
    timer = loop.call_at(deadline, _expire, waiter)
    try:
        return await waiter
    finally:
        timer.cancel()
        conn.waiter = None
        if isinstance(conn, _Gathered):
            conn.unwatch()


def _expire(waiter: asyncio.Future[tuple[int, bytes, bool]]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())
