"""A gRPC server on an asyncio protocol: HTTP/2 (RFC 9113) framing and flow control, gRPC's message
framing, and calls handed to handlers as callbacks, for the ext_proc and health ports.

Why not grpc.aio: Envoy's ext_proc exchanges four to eight small messages per HTTP request, and
grpc.aio's machinery (its C core's threads handing each message to the event loop, an awaitable per
message) cost more than epick's whole decision; measured in docs/performance.md ("Serving the ext_proc
stream"). Here a message costs a frame header, a protobuf parse and a callback, and the answers to
everything read at once leave in one write.

What is served: cleartext HTTP/2 with prior knowledge (how Envoy and gRPC clients speak to a plaintext
port) and HTTP/2 over TLS (ALPN `h2`); any number of concurrent streams per connection; flow control in
both directions; HEADERS with CONTINUATION, padding and priority; PING, SETTINGS, WINDOW_UPDATE,
RST_STREAM and GOAWAY. HPACK decoding is the `hpack` library's; responses are encoded without the
dynamic table. Message compression (`grpc-encoding` other than identity) is refused with UNIMPLEMENTED,
as epick never advertises an encoding. `grpc-timeout` is not enforced: Envoy's ext_proc filter keeps
its own per-message deadline and resets the stream.

A method is a factory `(Call) -> Handler`; the handler is told each message, the client's half-close and
a cancellation, synchronously on the event loop, and answers through the `Call` (`send`, `finish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol
from urllib.parse import quote

from hpack import Decoder
from hpack.exceptions import HPACKError

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6) and flags.
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings (section 6.5.2).
SETTINGS_HEADER_TABLE_SIZE = 1
SETTINGS_MAX_CONCURRENT_STREAMS = 3
SETTINGS_INITIAL_WINDOW_SIZE = 4
SETTINGS_MAX_FRAME_SIZE = 5
SETTINGS_MAX_HEADER_LIST_SIZE = 6

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME = 16_384
MAX_WINDOW = 2**31 - 1
# What epick offers: large windows and frames, so that a body chunk of Envoy's comes in one frame and
# window updates are rare; the peer is bounded by the message limit, not by the window.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024
FRAME_SIZE = 1024 * 1024
HEADER_LIST_BYTES = 64 * 1024
MAX_CACHED_BLOCKS = 64  # distinct header blocks remembered per connection
MESSAGE_BYTES = 4 * 1024 * 1024  # grpc's default receive limit


class H2Error(IntEnum):
    """HTTP/2 error codes (section 7)."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9


class Status(IntEnum):
    """The gRPC status codes epick answers with."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


PROTOCOL = H2Error.PROTOCOL_ERROR


class H2ConnectionError(Exception):
    """A connection error (RFC 9113 section 5.4.1): the connection ends with GOAWAY and the code."""

    def __init__(self, code: H2Error, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class Handler(Protocol):
    """One call's receiving side; every method runs on the event loop and must not block."""

    def received(self, message: bytes) -> None: ...

    def ended(self) -> None:
        """The client sent its last message (half-close); the call may still answer."""

    def cancelled(self) -> None:
        """The call ended without `finish`: reset by the client, or its connection closed."""


Method = Callable[["Call"], Handler]


def _int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1) with the given prefix and first-byte flags."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("latin-1")
    return _int(len(raw), 7) + raw


def _literal(name: str, value: str) -> bytes:
    """A header field literal without indexing, with a new name (the dynamic table stays empty)."""
    return b"\x00" + _string(name) + _string(value)


# ":status: 200" is static entry 8; "content-type" is static entry 31, given as a literal without indexing.
RESPONSE_HEADERS = b"\x88" + _int(31, 4) + _string("application/grpc")
OK_TRAILERS = _literal("grpc-status", "0")


def trailers(status: Status | int, details: str = "") -> bytes:
    block = _literal("grpc-status", str(int(status)))
    if details:
        block += _literal("grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"))
    return block


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def _settings(values: Mapping[int, int]) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return _frame(SETTINGS, 0, 0, payload)


def _window_update(stream_id: int, increment: int) -> bytes:
    return _frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def _rst(stream_id: int, code: H2Error) -> bytes:
    return _frame(RST_STREAM, 0, stream_id, int(code).to_bytes(4, "big"))


_SETTINGS_ACK = _frame(SETTINGS, ACK, 0)


class Call:
    """One stream: its request headers, and the answering side a handler writes to."""

    __slots__ = (
        "_conn",
        "_headers_sent",
        "_pending",
        "_trailers",
        "buffer",
        "done",
        "handler",
        "headers",
        "id",
        "need",
        "path",
        "receive_window",
        "remote_closed",
        "send_window",
        "unacknowledged",
    )

    def __init__(self, conn: Connection, stream_id: int, headers: dict[str, str], send_window: int) -> None:
        self._conn = conn
        self.id = stream_id
        self.headers = headers
        self.path = headers.get(":path", "")
        self.handler: Handler | None = None
        self.buffer = bytearray()  # a gRPC message arriving in pieces
        self.need = 0  # bytes `buffer` must hold before the message in it can be read
        self.send_window = send_window
        self.receive_window = STREAM_WINDOW
        self.unacknowledged = 0  # bytes read and not yet returned to the peer's window
        self.remote_closed = False
        self.done = False  # finished, reset or its connection lost: nothing more is sent or told
        self._headers_sent = False
        self._pending: deque[bytes] = deque()  # DATA payload waiting for flow-control window
        self._trailers: bytes | None = None  # waiting behind _pending

    def send(self, message: bytes) -> None:
        """Send one gRPC message (serialized protobuf); dropped once the call is done."""
        if self.done:
            return
        conn = self._conn
        if not self._headers_sent:
            self._headers_sent = True
            conn.emit(_frame(HEADERS, END_HEADERS, self.id, RESPONSE_HEADERS))
        data = b"\x00" + len(message).to_bytes(4, "big") + message
        n = len(data)
        if not self._pending and n <= self.send_window and n <= conn.send_window and n <= conn.peer_frame:
            self.send_window -= n
            conn.send_window -= n
            conn.emit(len(data).to_bytes(3, "big") + b"\x00\x00" + self.id.to_bytes(4, "big") + data)
        else:
            self._pending.append(data)
            self.drain()
        conn.flush_soon()

    def finish(self, status: Status | int = Status.OK, details: str = "") -> None:
        """End the call with a status (the trailers). The handler is told nothing more."""
        if self.done:
            return
        self.done = True
        if status == Status.OK and not details:
            block = OK_TRAILERS
        else:
            block = trailers(status, details)
            if status != Status.OK:
                log.debug("gRPC call %s ends with status %d: %s", self.path, int(status), details)
        if not self._headers_sent:  # a trailers-only response
            self._headers_sent = True
            block = RESPONSE_HEADERS + block
        self._trailers = block
        self.drain()
        self._conn.flush_soon()

    def drain(self) -> None:
        """Send what the windows allow of the pending data, then the trailers once nothing is pending."""
        conn = self._conn
        pending = self._pending
        while pending:
            room = min(self.send_window, conn.send_window, conn.peer_frame)
            if room <= 0:
                conn.blocked.add(self)
                return
            data = pending[0]
            if len(data) > room:
                pending[0] = data[room:]
                data = data[:room]
            else:
                pending.popleft()
            self.send_window -= len(data)
            conn.send_window -= len(data)
            conn.emit(_frame(DATA, 0, self.id, data))
        if self._trailers is not None:
            conn.emit(_frame(HEADERS, END_HEADERS | END_STREAM, self.id, self._trailers))
            self._trailers = None
            conn.closed_locally(self)

    @property
    def waiting(self) -> bool:
        """Whether data or trailers wait for flow-control window."""
        return bool(self._pending) or self._trailers is not None


@dataclass(frozen=True, slots=True)
class Limits:
    max_streams: int | None = None  # open calls over all connections; more get RESOURCE_EXHAUSTED
    max_message_bytes: int = MESSAGE_BYTES


class Connection(asyncio.Protocol):
    """One HTTP/2 connection, server side."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self._in = bytearray()
        self._need = 0  # bytes _in must hold before the next frame can be read
        self._preface_seen = False
        self._out: list[bytes] = []
        self._reading = False  # inside data_received: writes are batched until it returns
        self._flush_scheduled = False
        self.calls: dict[int, Call] = {}
        self.blocked: set[Call] = set()  # calls waiting for window
        self.last_stream = 0
        self.send_window = DEFAULT_WINDOW
        self.peer_window = DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE for our streams
        self.peer_frame = DEFAULT_FRAME
        self.receive_window = CONNECTION_WINDOW
        self.unacknowledged = 0
        self._decoder = Decoder()
        self._decoder.max_header_list_size = HEADER_LIST_BYTES
        # Header blocks decoded while the dynamic table stayed as it is: Envoy sends the same block
        # (indexed fields, literals not indexed) for every stream, so most are decoded once.
        self._blocks: dict[bytes, dict[str, str]] = {}
        # (stream, flags, block) of a header block until its END_HEADERS
        self._header_block: tuple[int, int, bytearray] | None = None
        self.going_away = False
        self.closed = False

    # -- the transport's callbacks --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TLS transport is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        settings = {
            SETTINGS_INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            SETTINGS_MAX_FRAME_SIZE: FRAME_SIZE,
            SETTINGS_MAX_HEADER_LIST_SIZE: HEADER_LIST_BYTES,
        }
        self.emit(_settings(settings))
        self.emit(_window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW))
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        calls, self.calls = self.calls, {}
        for call in calls.values():
            self._cancel(call)
            call.handler = None
        self.blocked.clear()

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            self._read(data)
        except H2ConnectionError as e:
            self.abort(e.code, str(e))
        finally:
            self._reading = False
            self.flush()

    def pause_writing(self) -> None:  # the peer reads slowly; HTTP/2 windows bound what waits
        pass

    def resume_writing(self) -> None:
        pass

    # -- writing --

    def emit(self, frame: bytes) -> None:
        self._out.append(frame)

    def flush_soon(self) -> None:
        """Flush now unless inside `data_received` (which flushes once at its end)."""
        if not self._reading:
            self.flush()

    def flush(self) -> None:
        out = self._out
        if out and self.transport is not None and not self.closed:
            self._out = []
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
        else:
            out.clear()

    def abort(self, code: H2Error, reason: str) -> None:
        """A connection error: GOAWAY with the code, then close."""
        log.warning("HTTP/2 connection error (%s): %s; closing the connection", code.name, reason)
        self.emit(_frame(GOAWAY, 0, 0, self.last_stream.to_bytes(4, "big") + int(code).to_bytes(4, "big")))
        self.flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def go_away(self) -> None:
        """Refuse new streams; those open may finish (graceful shutdown)."""
        if self.going_away or self.closed:
            return
        self.going_away = True
        self.emit(_frame(GOAWAY, 0, 0, self.last_stream.to_bytes(4, "big") + b"\x00\x00\x00\x00"))
        self.flush()
        if not self.calls and self.transport is not None:
            self.transport.close()

    def closed_locally(self, call: Call) -> None:
        """The call's trailers are out: the stream ends (with RST_STREAM NO_ERROR when the client is still
        sending, so that it stops, as RFC 9113 section 8.1 allows)."""
        if not call.remote_closed:
            self.emit(_rst(call.id, H2Error.NO_ERROR))
        self._forget(call)

    def _forget(self, call: Call) -> None:
        if self.calls.pop(call.id, None) is not None:
            self.server.open_calls -= 1
        self.blocked.discard(call)
        # A handler usually holds its call: without this cycle both go by reference counting, at once,
        # instead of waiting (with all they reference) for a pass of the cyclic collector.
        call.handler = None
        if self.going_away and not self.calls and self.transport is not None:
            self.flush()
            self.transport.close()

    def _cancel(self, call: Call) -> None:
        if call.done:
            return
        call.done = True
        handler = call.handler
        if handler is not None:
            try:
                handler.cancelled()
            except Exception:
                log.exception("gRPC handler for %s failed on cancellation", call.path)

    # -- reading --

    def _read(self, data: bytes) -> None:
        if self._in:  # the rest of a frame that came in pieces
            self._in += data
            if len(self._in) < self._need:
                return
            buf = bytes(self._in)
            self._in.clear()
        else:
            buf = data
        pos = 0
        if not self._preface_seen:
            if len(buf) < len(PREFACE):
                if not PREFACE.startswith(buf):
                    raise H2ConnectionError(PROTOCOL, "not an HTTP/2 client (no connection preface)")
                self._in += buf
                return
            if buf[: len(PREFACE)] != PREFACE:
                raise H2ConnectionError(PROTOCOL, "not an HTTP/2 client (no connection preface)")
            self._preface_seen = True
            pos = len(PREFACE)
        end = len(buf)
        while end - pos >= 9 and not self.closed:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if length > FRAME_SIZE:
                raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, f"a {length}-byte frame")
            if end - pos - 9 < length:
                break
            kind = buf[pos + 3]
            flags = buf[pos + 4]
            stream_id = int.from_bytes(buf[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
            payload = buf[pos + 9 : pos + 9 + length]
            pos += 9 + length
            self._dispatch(kind, flags, stream_id, payload)
        if pos < end and not self.closed:
            self._in += buf[pos:]
            # A frame's header tells how much must come before it can be read.
            self._need = 9 + int.from_bytes(buf[pos : pos + 3], "big") if end - pos >= 9 else 9

    def _dispatch(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._header_block is not None and kind != CONTINUATION:
            raise H2ConnectionError(PROTOCOL, "a header block interrupted before END_HEADERS")
        if kind == DATA:
            self._data(stream_id, flags, payload)
        elif kind == HEADERS:
            self._headers(stream_id, flags, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(stream_id, flags, payload)
        elif kind == PING:
            if stream_id != 0 or len(payload) != 8:
                raise H2ConnectionError(PROTOCOL, "a malformed PING")
            if not flags & ACK:
                self.emit(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            self._reset(stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(stream_id, flags, payload)
        elif kind == GOAWAY:
            self.going_away = True  # the client opens no new streams; those open run to their end
        elif kind == PUSH_PROMISE:
            raise H2ConnectionError(PROTOCOL, "PUSH_PROMISE from a client")
        elif kind == PRIORITY and (stream_id == 0 or len(payload) != 5):
            raise H2ConnectionError(PROTOCOL, "a malformed PRIORITY frame")
        # Unknown frame types are ignored (section 4.1).

    @staticmethod
    def _unpad(flags: int, payload: bytes, what: str) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload or payload[0] >= len(payload):
            raise H2ConnectionError(PROTOCOL, f"a {what} frame's padding exceeds the frame")
        return payload[1 : len(payload) - payload[0]]

    def _data(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise H2ConnectionError(PROTOCOL, "DATA on stream 0")
        size = len(payload)
        self.receive_window -= size
        if self.receive_window < 0:
            raise H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self.unacknowledged += size
        if self.unacknowledged >= CONNECTION_WINDOW // 2:
            self.emit(_window_update(0, self.unacknowledged))
            self.receive_window += self.unacknowledged
            self.unacknowledged = 0
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream:
                raise H2ConnectionError(PROTOCOL, f"DATA on idle stream {stream_id}")
            return  # a stream that ended here; its data still counted against the connection's window
        if call.remote_closed:
            self.emit(_rst(stream_id, H2Error.STREAM_CLOSED))
            self._cancel(call)
            self._forget(call)
            return
        call.receive_window -= size
        if call.receive_window < 0:
            self.emit(_rst(stream_id, H2Error.FLOW_CONTROL_ERROR))
            self._cancel(call)
            self._forget(call)
            return
        data = self._unpad(flags, payload, "DATA")
        if flags & END_STREAM:
            call.remote_closed = True
        else:
            call.unacknowledged += size
            if call.unacknowledged >= STREAM_WINDOW // 2:
                self.emit(_window_update(stream_id, call.unacknowledged))
                call.receive_window += call.unacknowledged
                call.unacknowledged = 0
        if not call.done:
            self._messages(call, data)
        if call.remote_closed and not call.done:
            if call.buffer:
                self._fail(call, Status.INTERNAL, "the stream ended inside a gRPC message")
            elif call.handler is not None:
                self._tell(call, call.handler.ended)

    def _messages(self, call: Call, data: bytes) -> None:
        """Split gRPC's length-prefixed messages out of a DATA payload and hand each to the handler."""
        buf = call.buffer
        if buf:
            buf += data
            if len(buf) < call.need:
                return
            data = bytes(buf)
            buf.clear()
        pos, end = 0, len(data)
        limit = self.server.limits.max_message_bytes
        while end - pos >= 5:
            if data[pos]:
                self._fail(call, Status.UNIMPLEMENTED, "compressed gRPC messages are not accepted")
                return
            n = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if n > limit:
                self._fail(call, Status.RESOURCE_EXHAUSTED, f"a message of {n} bytes (limit {limit})")
                return
            if end - pos - 5 < n:
                break
            message = data[pos + 5 : pos + 5 + n] if pos or n + 5 != end else data[5:]
            pos += 5 + n
            handler = call.handler
            if handler is None or call.done:
                return
            self._tell(call, handler.received, message)
        if pos < end:
            buf += data[pos:]
            call.need = 5 + int.from_bytes(data[pos + 1 : pos + 5], "big") if end - pos >= 5 else 5

    def _tell(self, call: Call, method: Callable[..., None], *args: bytes) -> None:
        try:
            method(*args)
        except Exception:
            log.exception("gRPC handler for %s failed", call.path)
            call.finish(Status.INTERNAL, "the handler failed")

    def _fail(self, call: Call, status: Status, details: str) -> None:
        """End a call the peer broke: the handler hears no more (told it was cancelled), the peer gets
        the status."""
        log.warning("gRPC call %s refused: %s", call.path, details)
        handler, call.handler = call.handler, None
        call.finish(status, details)
        if handler is not None:
            try:
                handler.cancelled()
            except Exception:
                log.exception("gRPC handler for %s failed on cancellation", call.path)

    def _headers(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id == 0:
            raise H2ConnectionError(PROTOCOL, "HEADERS on stream 0")
        block = self._unpad(flags, payload, "HEADERS")
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise H2ConnectionError(PROTOCOL, "a HEADERS frame too short for its priority")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block_done(stream_id, flags, block)
        else:
            self._header_block = (stream_id, flags, bytearray(block))

    def _continuation(self, stream_id: int, flags: int, payload: bytes) -> None:
        pending = self._header_block
        if pending is None or pending[0] != stream_id:
            raise H2ConnectionError(PROTOCOL, "CONTINUATION without its HEADERS")
        pending[2].extend(payload)
        if len(pending[2]) > HEADER_LIST_BYTES * 2:
            raise H2ConnectionError(PROTOCOL, "a header block larger than the header list limit")
        if flags & END_HEADERS:
            self._header_block = None
            self._header_block_done(stream_id, pending[1], bytes(pending[2]))

    def _header_block_done(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client: they end its side
            if not flags & END_STREAM:
                raise H2ConnectionError(PROTOCOL, f"a second header block on stream {stream_id}")
            if call.remote_closed:
                return
            call.remote_closed = True
            if not call.done and call.handler is not None:
                if call.buffer:
                    self._fail(call, Status.INTERNAL, "the stream ended inside a gRPC message")
                else:
                    self._tell(call, call.handler.ended)
            return
        if stream_id <= self.last_stream or stream_id % 2 == 0:
            raise H2ConnectionError(PROTOCOL, f"HEADERS open stream {stream_id}, not a new client stream")
        self.last_stream = stream_id
        if self.going_away:
            self.emit(_rst(stream_id, H2Error.REFUSED_STREAM))
            return
        call = Call(self, stream_id, headers, self.peer_window)
        call.remote_closed = bool(flags & END_STREAM)
        self.calls[stream_id] = call
        self.server.open_calls += 1
        self.server.start_call(call)
        if call.remote_closed and not call.done and call.handler is not None:
            self._tell(call, call.handler.ended)

    def _decode(self, block: bytes) -> dict[str, str]:
        """The header block's fields (a dict of its own). Every block is decoded while the peer
        changes the dynamic table, since later blocks refer to it; one that leaves the table as it
        was means the same fields each time it comes again, until the table changes."""
        cached = self._blocks.get(block)
        if cached is not None:
            return dict(cached)
        table = self._decoder.header_table
        entries = table.dynamic_entries
        count, newest, size = len(entries), entries[0] if entries else None, table.maxsize
        try:
            fields = self._decoder.decode(block)
        except HPACKError as e:
            raise H2ConnectionError(H2Error.COMPRESSION_ERROR, f"an undecodable header block ({e})") from None
        headers = {str(k): str(v) for k, v in fields}
        # An entry added is a new tuple at the front (even when it equals the one before).
        if len(entries) == count and table.maxsize == size and (entries[0] if entries else None) is newest:
            if len(self._blocks) >= MAX_CACHED_BLOCKS:
                self._blocks.clear()
            self._blocks[block] = headers
        else:
            self._blocks.clear()
        return dict(headers)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise H2ConnectionError(PROTOCOL, "a WINDOW_UPDATE of 0 for the connection")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, "the connection's window overflowed")
            self._unblock()
            return
        call = self.calls.get(stream_id)
        if call is None:
            return  # a stream that ended
        if increment == 0:
            self.emit(_rst(stream_id, H2Error.PROTOCOL_ERROR))
            self._cancel(call)
            self._forget(call)
            return
        call.send_window += increment
        if call.send_window > MAX_WINDOW:
            self.emit(_rst(stream_id, H2Error.FLOW_CONTROL_ERROR))
            self._cancel(call)
            self._forget(call)
            return
        if call.waiting:
            call.drain()

    def _unblock(self) -> None:
        for call in list(self.blocked):
            if self.send_window <= 0:
                return
            self.blocked.discard(call)
            call.drain()

    def _settings(self, stream_id: int, flags: int, payload: bytes) -> None:
        if stream_id != 0:
            raise H2ConnectionError(PROTOCOL, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise H2ConnectionError(H2Error.FRAME_SIZE_ERROR, "a SETTINGS frame not a multiple of 6 bytes")
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i : i + 2], "big")
            value = int.from_bytes(payload[i + 2 : i + 6], "big")
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ConnectionError(H2Error.FLOW_CONTROL_ERROR, f"initial window size {value}")
                delta = value - self.peer_window
                self.peer_window = value
                for call in self.calls.values():
                    call.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME <= value <= 16_777_215:
                    raise H2ConnectionError(PROTOCOL, f"SETTINGS_MAX_FRAME_SIZE {value}")
                self.peer_frame = value
            # The others do not bind a server that never pushes and never indexes its responses' headers.
        self.emit(_SETTINGS_ACK)
        self._unblock()
        for call in list(self.calls.values()):
            if call.waiting and call.send_window > 0:
                call.drain()

    def _reset(self, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or len(payload) != 4:
            raise H2ConnectionError(PROTOCOL, "a malformed RST_STREAM")
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream:
                raise H2ConnectionError(PROTOCOL, f"RST_STREAM on idle stream {stream_id}")
            return
        self._cancel(call)
        self._forget(call)


class GrpcServer:
    """Listens on ports and serves `methods` (full method path, as `/package.Service/Method`) on each."""

    def __init__(self, methods: Mapping[str, Method], limits: Limits | None = None) -> None:
        self.methods = dict(methods)
        self.limits = limits or Limits()
        self.connections: set[Connection] = set()
        self.open_calls = 0
        self._servers: list[asyncio.Server] = []

    def start_call(self, call: Call) -> None:
        headers = call.headers
        method = self.methods.get(call.path)
        grpc = headers.get("content-type", "").startswith("application/grpc")
        if headers.get(":method") != "POST" or not grpc:
            call.finish(Status.UNIMPLEMENTED, "not a gRPC request (POST with content-type application/grpc)")
        elif method is None:
            call.finish(Status.UNIMPLEMENTED, f"unknown method {call.path}")
        elif headers.get("grpc-encoding", "identity") != "identity":
            call.finish(Status.UNIMPLEMENTED, f"message encoding {headers['grpc-encoding']} is not supported")
        elif self.limits.max_streams is not None and self.open_calls > self.limits.max_streams:
            call.finish(Status.RESOURCE_EXHAUSTED, f"more than {self.limits.max_streams} calls open")
        else:
            try:
                call.handler = method(call)
            except Exception:
                log.exception("gRPC method %s failed to start", call.path)
                call.finish(Status.INTERNAL, "the handler failed")

    async def listen(
        self, host: str, port: int, *, tls: ssl.SSLContext | None = None, reuse_port: bool = False
    ) -> int:
        """Listen on `host:port` (0: a free port); returns the port. Without `reuse_port` a port another
        process holds fails with OSError, as does a second epick on the same port."""
        loop = asyncio.get_running_loop()
        try:
            server = await loop.create_server(
                lambda: Connection(self), host, port, ssl=tls, reuse_port=reuse_port or None, backlog=1024
            )
        except OSError as e:
            why = "the port is in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise OSError(e.errno, f"cannot listen on {host}:{port} for gRPC: {why}") from None
        self._servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    async def stop(self, grace: float = 1.0) -> None:
        """Stop listening, let open calls finish for `grace` seconds, then close every connection."""
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.go_away()
        if grace > 0 and self.connections:
            deadline = asyncio.get_running_loop().time() + grace
            while self.connections and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()
