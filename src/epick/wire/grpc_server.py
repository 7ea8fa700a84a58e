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
import ssl
from collections.abc import Mapping

from epick.wire.grpc_call import Call, Limits, Method
from epick.wire.h2 import Status
from epick.wire.h2_connection import Connection

log = logging.getLogger(__name__)


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

    def shed(self) -> None:
        """GOAWAY on every connection: no new streams on it, those open finish, and the client opens
        a new connection (`epick serve --workers`: which the kernel may hand to another worker)."""
        for conn in list(self.connections):
            conn.go_away()

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
