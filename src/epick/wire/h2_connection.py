"""One HTTP/2 connection, server side: reading frames, flow control both ways, streams as gRPC calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

from epick.wire.grpc_call import Call
from epick.wire.h2 import (
    ACK,
    CONNECTION_WINDOW,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FRAME_SIZE,
    GOAWAY,
    HEADER_LIST_BYTES,
    HEADERS,
    MAX_WINDOW,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ACK_FRAME,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    STREAM_WINDOW,
    WINDOW_UPDATE,
    H2ConnectionError,
    H2Error,
    Status,
    frame_bytes,
    rst_frame,
    settings_frame,
    window_update_frame,
)
from epick.wire.header_blocks import HeaderBlocks

if TYPE_CHECKING:
    from epick.wire.grpc_server import GrpcServer

log = logging.getLogger(__name__)


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
        self._header_blocks = HeaderBlocks()
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
        self.emit(settings_frame(settings))
        self.emit(window_update_frame(0, CONNECTION_WINDOW - DEFAULT_WINDOW))
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
        self.emit(
            frame_bytes(GOAWAY, 0, 0, self.last_stream.to_bytes(4, "big") + int(code).to_bytes(4, "big"))
        )
        self.flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def go_away(self) -> None:
        """Refuse new streams; those open may finish (graceful shutdown)."""
        if self.going_away or self.closed:
            return
        self.going_away = True
        self.emit(frame_bytes(GOAWAY, 0, 0, self.last_stream.to_bytes(4, "big") + b"\x00\x00\x00\x00"))
        self.flush()
        if not self.calls and self.transport is not None:
            self.transport.close()

    def closed_locally(self, call: Call) -> None:
        """The call's trailers are out: the stream ends (with RST_STREAM NO_ERROR when the client is still
        sending, so that it stops, as RFC 9113 section 8.1 allows)."""
        if not call.remote_closed:
            self.emit(rst_frame(call.id, H2Error.NO_ERROR))
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
                self.emit(frame_bytes(PING, ACK, 0, payload))
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
            self.emit(window_update_frame(0, self.unacknowledged))
            self.receive_window += self.unacknowledged
            self.unacknowledged = 0
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream:
                raise H2ConnectionError(PROTOCOL, f"DATA on idle stream {stream_id}")
            return  # a stream that ended here; its data still counted against the connection's window
        if call.remote_closed:
            self.emit(rst_frame(stream_id, H2Error.STREAM_CLOSED))
            self._cancel(call)
            self._forget(call)
            return
        call.receive_window -= size
        if call.receive_window < 0:
            self.emit(rst_frame(stream_id, H2Error.FLOW_CONTROL_ERROR))
            self._cancel(call)
            self._forget(call)
            return
        data = self._unpad(flags, payload, "DATA")
        if flags & END_STREAM:
            call.remote_closed = True
        else:
            call.unacknowledged += size
            if call.unacknowledged >= STREAM_WINDOW // 2:
                self.emit(window_update_frame(stream_id, call.unacknowledged))
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
        headers = self._header_blocks.decode(block)
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
            self.emit(rst_frame(stream_id, H2Error.REFUSED_STREAM))
            return
        call = Call(self, stream_id, headers, self.peer_window)
        call.remote_closed = bool(flags & END_STREAM)
        self.calls[stream_id] = call
        self.server.open_calls += 1
        self.server.start_call(call)
        if call.remote_closed and not call.done and call.handler is not None:
            self._tell(call, call.handler.ended)

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
            self.emit(rst_frame(stream_id, H2Error.PROTOCOL_ERROR))
            self._cancel(call)
            self._forget(call)
            return
        call.send_window += increment
        if call.send_window > MAX_WINDOW:
            self.emit(rst_frame(stream_id, H2Error.FLOW_CONTROL_ERROR))
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
        self.emit(SETTINGS_ACK_FRAME)
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
