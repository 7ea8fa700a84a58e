"""The proxy's HTTP server plumbing on aiohttp: every error as an OpenAI-shaped JSON body, and
connections that cannot hold the server hostage.

- Errors aiohttp raises itself (404 no route, 405 wrong method, 413 too large) pass through a
  middleware that answers them in JSON; errors of the HTTP parser (a malformed request line or
  header, 400) go through the connection handler's `handle_error`, also in JSON.
- A request head (request line and headers) must arrive within `head_timeout` seconds of its first
  byte, or of the connection: a slowloris client that trickles its headers is disconnected.
- An idle keep-alive connection is closed after `keepalive_timeout` seconds; beyond
  `max_connections` open connections, a new one is answered 503 and closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from epick.requestcontrol.errors import RequestError

log = logging.getLogger(__name__)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def error_body(status: int, message: str, code: str) -> bytes:
    return RequestError(status, message, code).body()


def json_error(status: int, message: str, code: str, **headers: str) -> web.Response:
    body = error_body(status, message, code)
    return web.Response(status=status, body=body, content_type="application/json", headers=headers)


@web.middleware
async def json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own HTTP errors (no route, wrong method, ...) as JSON bodies."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        phrase = _phrase(e.status)
        if e.status == 404:
            message = f"no such path: {request.method} {request.path}"
        elif e.status == 405:
            allowed = sorted(getattr(e, "allowed_methods", ()) or ())
            message = f"method {request.method} not allowed on {request.path}" + (
                f"; allowed: {', '.join(allowed)}" if allowed else ""
            )
        else:
            message = e.text or phrase
        headers = {k: v for k, v in e.headers.items() if k.lower() in ("allow", "retry-after")}
        return json_error(e.status, message, phrase.lower().replace(" ", "_"), **headers)


class _GuardedHandler(RequestHandler):
    """aiohttp's connection handler, with JSON parser errors and a deadline on each request head."""

    __slots__ = ("_head_deadline", "_last_payload")
    head_timeout: float = 10.0
    max_connections: int = 0  # 0: no limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._last_payload: Any = None  # the body of the last request parsed, read or not
        limit = self.max_connections
        manager = self._manager
        if limit and manager is not None and len(manager.connections) > limit:
            log.warning("refusing a connection: the limit of %d open connections is reached", limit)
            message = f"too many open connections (the limit is {limit}); retry later"
            writer = cast(asyncio.WriteTransport, transport)  # uvloop's: not asyncio's classes
            writer.write(_raw_error(503, message, "too_many_connections"))
            writer.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        heads = self._request_count
        # Bytes that arrive while the last request's body is unfinished are that body, even when its
        # request was already answered without reading it: they start no head deadline.
        last = self._last_payload
        in_body = last is not None and not last.is_eof()
        super().data_received(data)
        if self._request_count > heads:
            self._disarm()
            if self._messages:
                self._last_payload = self._messages[-1][1]
        elif (
            data
            and not in_body
            and self._head_deadline is None
            and self._current_request is None
            and not self._messages
        ):
            self._arm()  # the first bytes of a new request on a kept-alive connection

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _process_keepalive(self) -> None:
        """aiohttp's idle timeout (also armed when a connection opens), except that a request waiting
        unread in the socket (the event loop stalled) is no idle connection: the timer is re-armed."""
        transport = self.transport
        if transport is not None and not transport.is_closing() and _unread(transport):
            self._keepalive_handle = asyncio.get_running_loop().call_later(
                self._keepalive_timeout, self._process_keepalive
            )
            return
        super()._process_keepalive()

    def _arm(self) -> None:
        self._head_deadline = asyncio.get_running_loop().call_later(self.head_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _too_slow(self) -> None:
        self._head_deadline = None
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if _unread(transport):
            # Bytes wait in the socket that the event loop has not read yet: the server is late (a
            # stalled loop), not the client. Reading them will disarm the deadline; until then, arm it.
            self._arm()
            return
        peer = transport.get_extra_info("peername")
        log.warning("closing a connection from %s: no complete request head in %gs", peer, self.head_timeout)
        message = f"no complete request head within {self.head_timeout:g}s"
        transport.write(_raw_error(408, message, "head_timeout"))
        transport.close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
            text = "internal error in epick (its log has the details)"
        else:
            text = message or _phrase(status)
        response = json_error(
            status, f"malformed HTTP request: {text}" if status == 400 else text, "bad_http"
        )
        response.force_close()
        return response


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


class _GuardedServer(web.Server):
    def __call__(self) -> RequestHandler:
        return self.handler_class(self, loop=self._loop, **self._kwargs)

    handler_class: type[RequestHandler] = _GuardedHandler


class AppRunner(web.AppRunner):
    """`web.AppRunner` whose connections are `_GuardedHandler`s with this head timeout and limit."""

    def __init__(
        self, app: web.Application, *, head_timeout: float, max_connections: int = 0, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        attrs = {"__slots__": (), "head_timeout": head_timeout, "max_connections": max_connections}
        self._handler_class: type[RequestHandler] = type("GuardedHandler", (_GuardedHandler,), attrs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _GuardedServer  # the same server; its connections get the guarded handler
        guarded = cast(_GuardedServer, server)
        guarded.handler_class = self._handler_class
        return guarded
