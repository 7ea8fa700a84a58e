"""One gRPC call: its handler (the receiving side) and the `Call` it answers through."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from epick.wire.h2 import (
    DATA,
    END_HEADERS,
    END_STREAM,
    HEADERS,
    MESSAGE_BYTES,
    OK_TRAILERS,
    RESPONSE_HEADERS,
    STREAM_WINDOW,
    Status,
    frame_bytes,
    trailers,
)

if TYPE_CHECKING:
    from epick.wire.h2_connection import Connection

log = logging.getLogger(__name__)


class Handler(Protocol):
    """One call's receiving side; every method runs on the event loop and must not block."""

    def received(self, message: bytes) -> None: ...

    def ended(self) -> None:
        """The client sent its last message (half-close); the call may still answer."""

    def cancelled(self) -> None:
        """The call ended without `finish`: reset by the client, or its connection closed."""


Method = Callable[["Call"], Handler]


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
            conn.emit(frame_bytes(HEADERS, END_HEADERS, self.id, RESPONSE_HEADERS))
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
            conn.emit(frame_bytes(DATA, 0, self.id, data))
        if self._trailers is not None:
            conn.emit(frame_bytes(HEADERS, END_HEADERS | END_STREAM, self.id, self._trailers))
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
