"""HTTP/1.1 messages as the proxy's server reads and writes them: headers, a request with its body
(decoded from its Content-Encoding), and the reply a handler writes, whole or streamed."""

from __future__ import annotations

import asyncio
import logging
import socket
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

from epick.requestcontrol.errors import RequestError
from epick.wire.budget import BodiesHeldError, BodyBudget

if TYPE_CHECKING:
    from epick.wire.http_server import _Connection

log = logging.getLogger(__name__)

try:  # aiohttp decodes br when brotli is installed; so does this server
    import brotli  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    brotli = None

MAX_QUEUED = 16  # pipelined requests read ahead of the one being answered; more pause reading
HIGH_WATER = 256 * 1024  # bytes the transport may buffer before writes wait for the client


def phrase(status: int) -> str:
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
        "_budget",
        "_chunks",
        "_conn",
        "_decoder",
        "_done",
        "_error",
        "_held",
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
        budget: BodyBudget | None = None,
    ) -> None:
        self._conn = conn
        self._budget = budget  # the bytes every connection's bodies hold at once
        self._held = 0
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
            self.release()
            return
        if self._budget is not None:
            if not self._budget.take(len(data)):
                self._error = BodiesHeldError
                self._chunks = []
                self.release()
                return
            self._held += len(data)
        self._chunks.append(data)

    def release(self) -> None:
        """Give back what the body held of the budget (once it is no longer needed)."""
        if self._budget is not None and self._held:
            self._budget.give(self._held)
            self._held = 0

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
        if self._error is BodiesHeldError:
            raise BodiesHeldError()
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


def decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """A whole body decoded from its Content-Encoding (gzip, deflate, br): `BodyDecodeError` when it
    is not what the label says, or the label is one epick cannot decode; `BodyTooLargeError` past
    `limit` bytes decoded."""
    decoder = _decoder(encoding, limit)
    if decoder is None:
        return body
    if decoder.failed:
        raise BodyDecodeError(decoder.failed)
    decoded = decoder.decode(body)
    decoder.flush()
    if len(decoded) > limit:
        raise BodyTooLargeError(len(decoded))
    return decoded


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
        # unread, or a handler said so, or the server sheds its connections and no request waits
        # behind this one: a pipelined one would go unanswered).
        self.close = not request.keep_alive or (conn.shed and conn.nothing_after(request))

    def _head(self, status: int, headers: Iterable[tuple[str, str]], length: int | None) -> bytearray:
        out = bytearray(f"HTTP/1.1 {status} {phrase(status)}\r\n".encode())
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
        self.push(chunk)
        await self._conn.drain()

    def push(self, chunk: bytes) -> bool:
        """Write a chunk of the body without waiting: False when the client's buffer is full, and the
        writer should `drain` before it pushes more (ConnectionResetError once the client has left)."""
        if not chunk or self._head_only:
            return True
        conn = self._conn
        if self._chunked:
            conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            conn.write(chunk)
        return not conn.write_paused

    async def drain(self) -> None:
        """Wait until the client's buffer has room (ConnectionResetError once the client has left)."""
        await self._conn.drain()

    async def end(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self._chunked and not self._head_only:
            self._conn.write(b"0\r\n\r\n")
        await self._conn.drain()


Handler = Callable[[Request, Reply], Awaitable[None]]


def unread_bytes(transport: asyncio.BaseTransport) -> bool:
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


def raw_error(status: int, message: str, code: str) -> bytes:
    body = error_body(status, message, code)
    head = (
        f"HTTP/1.1 {status} {phrase(status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body
