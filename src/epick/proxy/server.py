"""The proxy: an OpenAI-compatible HTTP server in front of the model servers.

It serves every POST path a configured parser accepts (OpenAI's, Anthropic's `/v1/messages`, vLLM's and
SGLang's generate endpoints, or any path when `passthrough-parser` is the fallback) and forwards the
request to the same path, query included; a path no parser accepts gets a JSON 404 naming the
accepted ones. Each request is decided by the director, then forwarded to the primary target; a connection
failure or a 5xx before the first byte moves on to the next fallback target (and, when those run
out, to one fresh decision without the endpoints that failed). Responses stream through chunk by
chunk as they arrive; nothing is buffered. A response that breaks mid-stream ends with an SSE error
event (or a 502 if nothing was sent yet), and the endpoint leaves the candidates until its metrics
answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epick.datalayer.datastore import Datastore
from epick.datalayer.models import ModelCatalog
from epick.framework import Endpoint, Response
from epick.proxy.upstream import Timeouts, UpstreamError, UpstreamResponse, Upstreams
from epick.requestcontrol import errors
from epick.requestcontrol.admission import evicted_error
from epick.requestcontrol.director import (
    CONTROL_HEADERS,
    PREFILL_HEADER,
    REQUEST_ID_HEADER,
    UNTRUSTED_HEADERS,
    Director,
    RequestCycle,
)
from epick.requestcontrol.errors import RequestError
from epick.wire.budget import BodiesHeldError, BodyBudget
from epick.wire.deadlines import Deadlines, Scope
from epick.wire.http_messages import BodyDecodeError, BodyTooLargeError, Reply, Request
from epick.wire.http_server import HTTPServer

log = logging.getLogger(__name__)

ENDPOINT_HEADER = "x-epick-endpoint"
WORKER_HEADER = "x-epick-worker"
# Hop-by-hop headers (RFC 9110 section 7.6.1) and those the relay sets itself (host, length); the
# headers a message's own `Connection` names are hop-by-hop too (`_dropped`).
_HOP_BY_HOP = frozenset(
    {"connection", "proxy-connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
     "trailer", "transfer-encoding", "upgrade", "host", "content-length"}
)  # fmt: skip
# The body is forwarded as read, decompressed: the client's Content-Encoding does not apply to it.
_NOT_FORWARDED = _HOP_BY_HOP | CONTROL_HEADERS | UNTRUSTED_HEADERS | {"content-encoding"}
_NOT_RETURNED = _HOP_BY_HOP | CONTROL_HEADERS | UNTRUSTED_HEADERS | {ENDPOINT_HEADER, WORKER_HEADER}


def _dropped(headers: Mapping[str, str], always: frozenset[str]) -> frozenset[str]:
    """`always`, plus the headers this message's `Connection` header names (lower-case)."""
    named = headers.get("connection") or headers.get("Connection")
    if not named:
        return always
    return always | {token.strip().lower() for token in named.split(",") if token.strip()}


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    host: str = "0.0.0.0"
    port: int = 8080
    connect_timeout: float = 5.0
    read_timeout: float = 600.0  # longest silence between two chunks of a response
    max_body_bytes: int = 16 * 1024 * 1024
    # Name the endpoint that served a response (header x-epick-endpoint) and failed ones in error
    # bodies; off, clients learn nothing of the pool's internal addresses.
    expose_endpoint: bool = False
    head_timeout: float = 10.0  # a request's line and headers must arrive within this
    body_timeout: float = 30.0  # and its body within this after them (a short body: 408)
    keepalive_timeout: float = 75.0  # an idle client connection is closed after this
    max_connections: int = 10_000  # open client connections; more are answered 503 (0: no limit)
    # The request bodies held at once, over every connection; a body past it is answered 503 (None:
    # four times `max_body_bytes`; 0: no limit).
    max_bodies_bytes: int | None = None

    @property
    def bodies_limit(self) -> int | None:
        if self.max_bodies_bytes is None:
            return 4 * self.max_body_bytes
        return self.max_bodies_bytes or None

    # An attempt that has no response headers after this moves on to the next endpoint (a hung
    # server); a request as a whole, attempts and streaming included, ends after request_timeout.
    first_byte_timeout: float = 120.0
    request_timeout: float = 3600.0
    worker: int | None = None  # `epick serve --workers`: this process's index (x-epick-worker when exposed)


class _AttemptFailedError(Exception):
    """An attempt failed before anything reached the client; try the next endpoint."""

    def __init__(self, reason: str, status: int = 502, body: bytes = b"") -> None:
        super().__init__(reason)
        self.status = status
        self.body = body


class Proxy:
    def __init__(
        self,
        director: Director,
        datastore: Datastore,
        catalog: ModelCatalog | None,
        options: ProxyOptions,
    ) -> None:
        """What each attempt finds (an endpoint unreachable, answering 5xx or hanging) goes to the
        request's cycle, which tells the data layer; the datastore is only read here."""
        self.director = director
        self.datastore = datastore
        self.catalog = catalog
        self.options = options
        self.port = options.port
        self.upstreams = Upstreams(Timeouts(connect=options.connect_timeout, read=options.read_timeout))
        self._body_deadlines = Deadlines(options.body_timeout)
        self._first_byte_deadlines = Deadlines(options.first_byte_timeout)
        self._request_deadlines = Deadlines(options.request_timeout)
        self.server = HTTPServer(
            self._serve,
            max_body_bytes=options.max_body_bytes,
            head_timeout=options.head_timeout,
            keepalive_timeout=options.keepalive_timeout,
            max_connections=options.max_connections,
            bodies=BodyBudget(options.bodies_limit),
        )

    async def start(self, sock: socket.socket | None = None) -> None:
        """Listen on the options' host and port, or accept on `sock` (already listening)."""
        try:
            await self.server.start(self.options.host, self.options.port, sock=sock)
        except OSError as e:
            where = f"{self.options.host}:{self.options.port}"
            raise OSError(e.errno, f"cannot listen on {where} for the proxy: {e.strerror or e}") from None
        self.port = self.server.port

    async def stop(self, drain: float = 0.0) -> None:
        """Stop accepting; requests in flight get `drain` seconds to finish, then every connection
        closes."""
        await self.server.stop(drain)
        await self.upstreams.close()

    async def _serve(self, http: Request, reply: Reply) -> None:
        if http.method in ("GET", "HEAD") and http.path in ("/health", "/v1/models"):
            if http.path == "/health":
                document: dict[str, Any] = {"status": "ok", "endpoints": len(self.datastore.snapshot())}
            else:
                document = {
                    "object": "list",
                    "data": self.catalog.cards() if self.catalog is not None else [],
                }
            reply.json(200, json.dumps(document).encode())
            return
        if http.method != "POST":
            parsers = self.director.config.parsers
            parser = parsers.resolve(http.path)
            if parser is not None and parser is not parsers.fallback:
                message = f"method {http.method} not allowed on {http.path}; allowed: POST"
                reply.error(RequestError(405, message, "method_not_allowed", (("allow", "POST"),)))
            else:
                reply.error(RequestError(404, f"no such path: {http.method} {http.path}", "not_found"))
            return
        await self._handle(http, reply)

    async def _handle(self, http: Request, reply: Reply) -> None:
        arrived = self.director.clock()  # the request's latencies count from here, the body's upload in
        try:
            if http.body_complete:
                body = await http.read()  # decoded when the client sent Content-Encoding
            else:
                with self._body_deadlines.scope():
                    body = await http.read()
        except BodyTooLargeError:
            # The rest of the body is never read: the connection cannot carry another request.
            reply.error(errors.too_large(None, self.options.max_body_bytes), close=True)
            return
        except BodyDecodeError as e:  # a body its Content-Encoding cannot decode
            reply.error(errors.bad_request(f"request body cannot be decoded: {e}"), close=True)
            return
        except BodiesHeldError:  # the bodies held at once are at the budget: this one is not read
            reply.error(errors.bodies_held(), close=True)
            return
        except TimeoutError:
            timeout = self.options.body_timeout
            message = f"request body incomplete after {timeout:g}s (Content-Length longer than the body?)"
            reply.error(RequestError(408, message, "body_timeout"), close=True)
            return
        if not http.target.startswith("/"):  # an absolute-form target: not what a client of a proxy sends
            reply.error(errors.bad_request(f"request target {http.target[:200]!r} is not a path"))
            return
        try:
            decision = self.director.begin(body, http.headers, http.path, arrived=arrived)
            await decision.admit()
        except RequestError as e:
            reply.error(e)
            return
        deadline = self._request_deadlines.scope()
        state = _Request(deadline)
        try:
            with deadline:
                if decision.eviction is not None:
                    await self._evictable(http, reply, decision, state)
                else:
                    await self._attempts(http, reply, decision, http.target, state)
        except TimeoutError:
            timeout = self.options.request_timeout
            log.warning("request %s passed its %gs deadline", decision.request.request_id, timeout)
            if not reply.started:
                reply.error(RequestError(504, f"no answer within the request deadline of {timeout:g}s",
                                         "request_timeout"))  # fmt: skip
            else:
                await _end_with_error(reply, f"the request passed its deadline of {timeout:g}s")
        finally:
            # Every attempt failed, the deadline passed, or the client left: the hooks must still
            # release what the request held (in-flight counts), once.
            decision.end("no response completed")

    async def _evictable(self, http: Request, reply: Reply, decision: RequestCycle, state: _Request) -> None:
        """The attempts, unless flow control evicts the request first: then they stop (the model
        server's connection closes) and the client gets 429 `evicted`, or, mid-stream, an error
        event that ends the stream."""
        assert decision.eviction is not None
        attempt: asyncio.Future[None] = asyncio.ensure_future(
            self._attempts(http, reply, decision, http.target, state)
        )
        evicted: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def evict() -> None:
            if not evicted.done():
                evicted.set_result(None)

        decision.eviction.on_evict(evict)
        try:
            waiting: set[asyncio.Future[Any]] = {attempt, evicted}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the client left, or the deadline passed
            attempt.cancel()
            evicted.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await attempt
            raise
        if attempt.done():
            evicted.cancel()
            attempt.result()
            return
        attempt.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await attempt
        log.info("request %s evicted by flow control", decision.request.request_id)
        if not reply.started:
            reply.error(evicted_error())
        else:
            await _end_with_error(reply, "request evicted by flow control")

    async def _attempts(
        self, http: Request, reply: Reply, decision: RequestCycle, path: str, state: _Request
    ) -> None:
        """The decision's targets in turn, then one fresh decision without those that failed; only
        attempts that sent the client nothing are retried."""
        tried: set[str] = set()
        targets = list(decision.targets)
        last = _AttemptFailedError("no endpoint answered", 503)
        for round_ in range(2):
            for endpoint in targets:
                if endpoint.name in tried:
                    continue
                tried.add(endpoint.name)
                try:
                    await self._forward(http, reply, decision, endpoint, path=path, state=state)
                    return
                except _AttemptFailedError as failure:
                    last = failure
                    log.warning(
                        "request %s to %s failed: %s", decision.request.request_id, endpoint.name, failure
                    )
            if round_ == 0:
                try:
                    targets = list(decision.reschedule(frozenset(tried)).targets)
                except RequestError:
                    break
        if last.body:
            reply.json(last.status, last.body)
            return
        if self.options.expose_endpoint:
            message = f"no endpoint could serve the request: {last}"
        else:
            message = f"no endpoint could serve the request ({len(tried)} tried; epick's log says why)"
        reply.error(RequestError(last.status, message, "upstream_failed"))

    async def _forward(
        self, http: Request, reply: Reply, d: RequestCycle, endpoint: Endpoint, *, path: str, state: _Request
    ) -> None:
        dropped = _dropped(http.headers, _NOT_FORWARDED)
        headers = {k: v for k, v in http.headers.pairs if k not in dropped}
        headers[REQUEST_ID_HEADER] = d.request.request_id
        prefill = d.prefill
        if prefill is not None:
            headers[PREFILL_HEADER] = prefill.host_port
            d.dispatching(prefill)
        headers.update(d.result.forwarded_headers)
        response = Response(d.request.request_id, streaming=d.request.body.stream)
        d.dispatching(endpoint)
        first_byte = self.options.first_byte_timeout
        try:
            with self._first_byte_deadlines.scope():
                upstream = await self.upstreams.request(
                    endpoint.address, endpoint.port, path, headers=headers.items(), body=d.body
                )
        except TimeoutError:
            reason = f"no response within {first_byte:g}s"
            d.attempt_failed(endpoint, reason)
            raise _AttemptFailedError(reason, 504) from None
        except UpstreamError as e:
            reason = f"cannot connect: {e}"
            d.attempt_failed(endpoint, reason, connected=False)
            raise _AttemptFailedError(reason) from None
        try:
            if upstream.status >= 500:
                d.attempt_failed(endpoint, f"answered {upstream.status}", status=upstream.status)
                try:
                    error_body = await upstream.read()
                except (TimeoutError, UpstreamError):
                    error_body = b""
                raise _AttemptFailedError(f"answered {upstream.status}", upstream.status, error_body)
            response.status = upstream.status
            response.headers = dict(upstream.headers)
            # A body forwarded unread may ask for a stream: relay it as it comes.
            if not (d.request.body.stream or d.request.body.kind == "raw"):
                await self._whole(reply, d, endpoint, upstream, response)
                return
            d.received(response, endpoint)
            await self._relay(reply, d, endpoint, upstream, response, state=state)
        finally:
            upstream.release()

    async def _whole(
        self,
        reply: Reply,
        d: RequestCycle,
        endpoint: Endpoint,
        upstream: UpstreamResponse,
        response: Response,
    ) -> None:
        """A non-streaming response is small: read it whole, so a break can still go to another endpoint."""
        try:
            body = await upstream.read()
        except (TimeoutError, UpstreamError) as e:
            reason = f"response broke off: {type(e).__name__}: {e}"
            d.attempt_failed(endpoint, reason, connected=False)
            raise _AttemptFailedError(reason) from None
        d.received(response, endpoint)
        d.body_seen(len(body))
        response.chunk = body
        response.end_of_stream = True
        if self.director.config.hooks.response_complete:
            d.completed(response, endpoint)
            sent_first = False
        else:
            # Nothing left can add to the headers: the client gets its answer first, and the usage
            # is read after (in the same turn of the loop: the next request sees it recorded).
            sent_first = True
        headers = self._copy_headers(upstream, response, endpoint)
        headers += _metadata_headers(response)  # what the hooks reported, while the headers can still go
        reply.send(upstream.status, body, headers)
        if sent_first:
            d.completed(response, endpoint)

    def _copy_headers(
        self, upstream: UpstreamResponse, response: Response, endpoint: Endpoint
    ) -> list[tuple[str, str]]:
        """Everything the model server said, but hop-by-hop headers and the length (the relay decides
        it), with what the hooks added (replacing the server's of the same name)."""
        dropped = _dropped(response.headers, _NOT_RETURNED)
        added = response.add_headers
        if added:
            dropped = dropped | {name.lower() for name in added}
        headers = [(key, value) for key, value in upstream.headers if key.lower() not in dropped]
        headers += added.items()
        if self.options.expose_endpoint:
            headers.append((ENDPOINT_HEADER, endpoint.name))
            if self.options.worker is not None:
                headers.append((WORKER_HEADER, str(self.options.worker)))
        return headers

    async def _relay(
        self,
        reply: Reply,
        d: RequestCycle,
        endpoint: Endpoint,
        upstream: UpstreamResponse,
        response: Response,
        *,
        state: _Request,
    ) -> None:
        started = time.monotonic()
        # Each chunk goes to the hooks only when something reads chunks (a hook, or the usage).
        chunks_read = d.usage is not None or bool(self.director.config.hooks.response_streaming)

        def sink(chunk: bytes) -> bool:
            # Called from the model server's connection as each chunk arrives: no task wakes per chunk.
            try:
                keeping_up = reply.push(chunk)
            except ConnectionResetError:
                return False  # the client left: the relay's drain says so
            try:
                if chunks_read:
                    response.chunk = chunk
                    d.streamed(response, endpoint)
                else:
                    d.body_seen(len(chunk))
            except Exception:  # what observes the response must not break it
                log.exception("request %s: observing a response chunk failed", d.request.request_id)
            return keeping_up

        try:
            reply.start(upstream.status, self._copy_headers(upstream, response, endpoint))
            await upstream.relay(sink, reply.drain)
            response.chunk = b""
            response.end_of_stream = True
            await reply.end()
        except (TimeoutError, UpstreamError) as e:
            # The model server broke off mid-response: tell the client cleanly, stop choosing the endpoint.
            response.error = f"{type(e).__name__}: {e}"
            d.attempt_failed(endpoint, f"response broke off: {response.error}", connected=False)
            log.warning(
                "response from %s broke after %.2fs: %s", endpoint.name, time.monotonic() - started, e
            )
            which = f"upstream {endpoint.name}" if self.options.expose_endpoint else "the model server"
            await _end_with_error(reply, f"{which} failed mid-response")
        except (ConnectionResetError, asyncio.CancelledError):
            past_deadline = state.deadline.expired
            response.error = "request deadline passed" if past_deadline else "client disconnected"
            raise
        finally:
            d.completed(response, endpoint)
            if response.dynamic_metadata:  # too late for headers (no trailers are sent)
                log.debug(
                    "request %s: dynamic metadata %s not sent (the response streamed)",
                    d.request.request_id,
                    response.dynamic_metadata,
                )


@dataclass(slots=True)
class _Request:
    """One client request across its attempts: its deadline."""

    deadline: Scope


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Headers the relay owns, or that describe the body: a metadata key of one of these names is not sent.
_NOT_METADATA = _NOT_RETURNED | {"content-type", "content-encoding"}


def _metadata_headers(response: Response) -> list[tuple[str, str]]:
    """The standalone proxy's stand-in for ext_proc dynamic metadata: each key hooks reported (e.g.
    request-attribute-reporter's `x-gateway-inference-request-cost`) as a response header of that
    name, a whole number without a fraction. The namespace is not sent; a key that is not a valid
    header name, or names a header the relay owns, is left out."""
    found: dict[str, str] = {}
    for values in response.dynamic_metadata.values():
        for name, value in values.items():
            if not _TOKEN.fullmatch(name) or name.lower() in _NOT_METADATA:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, int | float):
                text = str(int(value)) if float(value).is_integer() else repr(float(value))
            else:
                text = str(value)
            if "\r" in text or "\n" in text:
                continue
            found[name] = text
    return list(found.items())


async def _end_with_error(reply: Reply, message: str) -> None:
    """End a started stream with an SSE error event (what an OpenAI client reads as an error)."""
    event = {"error": {"message": message, "type": "upstream_error"}}
    try:
        await reply.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await reply.end()
    except (ConnectionResetError, RuntimeError):
        pass
