"""`envoy.service.ext_proc.v3.ExternalProcessor` on grpc.aio: the gateway's side of the EPP protocol.

Each gRPC stream is one request and its response, handled by an `Exchange` (exchange.py, which says
what each body mode needs). The routing answer sets header `x-gateway-destination-endpoint` to the
primary `ip:port` (what an original-destination cluster routes on), `x-prefiller-host-port` for P/D,
removes the control headers and any client-supplied routing header, rewrites the body if the model was
rewritten, sets dynamic metadata `envoy.lb/x-gateway-destination-endpoint` = primary then fallbacks,
comma-separated, and clears the route cache. An error is an `ImmediateResponse` with its status and a
JSON body. Response headers, body chunks and the end of the stream run the director's response hooks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epick.extproc.exchange import Exchange
from epick.extproc.messages import immediate
from epick.requestcontrol.admission import evicted_error
from epick.requestcontrol.director import Director

if TYPE_CHECKING:
    from epick.extproc.tls import CertificateStore  # imported on start: cryptography only when serving

log = logging.getLogger(__name__)
# gRPC binds with SO_REUSEPORT by default: a second epick on the same port would start without error
# and take half of Envoy's streams into a prefix index of its own. Off, the second bind fails.
_EXCLUSIVE_PORT = [("grpc.so_reuseport", 0)]
_SHARED_PORT = [("grpc.so_reuseport", 1)]
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, director: Director) -> None:
        self.director = director

    async def Process(  # noqa: N802 (the gRPC method name)
        self, requests: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        exchange = Exchange(self.director)
        messages = aiter(requests)
        evicted: asyncio.Event | None = None
        try:
            while True:
                decision = exchange.decision
                if evicted is None and decision is not None and decision.eviction is not None:
                    evicted = asyncio.Event()
                    decision.eviction.on_evict(evicted.set)
                try:
                    if evicted is None:
                        message = await anext(messages)
                    else:
                        message = await _next_unless(messages, evicted)
                except StopAsyncIteration:
                    return
                if message is None:  # evicted by flow control: Envoy resets the upstream request
                    if not exchange.completed:
                        assert exchange.decision is not None
                        log.info("request %s evicted by flow control", exchange.decision.request.request_id)
                        yield immediate(evicted_error())
                    return
                for answer in exchange.handle(message):
                    yield answer
                if exchange.pending is not None:  # waiting in flow control or on a tokenizer
                    for answer in await exchange.admit():
                        yield answer
                if exchange.closed:
                    return
        finally:
            exchange.abandon()


async def _next_unless(
    messages: AsyncIterator[pb.ProcessingRequest], event: asyncio.Event
) -> pb.ProcessingRequest | None:
    """The stream's next message, or None once `event` is set first."""
    if event.is_set():
        return None
    receive = asyncio.ensure_future(anext(messages))
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({receive, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not receive.done():
            receive.cancel()
    if receive.done() and not receive.cancelled():
        return receive.result()  # raises StopAsyncIteration at the stream's end
    return None


@dataclass(frozen=True, slots=True)
class ExtProcOptions:
    """The ext_proc server's ports and TLS. TLS (`secure`) covers the ext_proc and the health port alike."""

    host: str = "0.0.0.0"
    port: int = 9002
    health_port: int = 9003
    secure: bool = True
    cert_path: str | None = None  # a directory with tls.crt and tls.key; self-signed when unset
    # A PEM CA bundle: when set, clients must present a certificate it signed (mTLS), on both ports.
    client_ca_path: str | None = None
    # Re-read tls.crt, tls.key and the client CA when they change (checked before each new connection's
    # handshake); established connections keep their certificate.
    cert_reload: bool = True
    # The health port without TLS even when `secure` (Kubernetes' grpc probes cannot speak TLS).
    health_plaintext: bool = False
    # Open ext_proc streams (one per request in flight through the gateway); more are refused with
    # RESOURCE_EXHAUSTED, which a fail-closed gateway answers 5xx. None: no limit.
    max_streams: int | None = 10_000
    # `epick serve --workers`: every worker listens on the ports (SO_REUSEPORT; the kernel spreads
    # Envoy's connections over them), and the supervisor keeps anything else off them.
    shared_ports: bool = False

    def __post_init__(self) -> None:
        if self.client_ca_path is not None and not self.secure:
            raise ValueError("a client CA (mTLS) needs TLS: client_ca_path is set but secure is off")


class ExtProcServer:
    def __init__(self, director: Director, options: ExtProcOptions) -> None:
        self.director = director
        self.options = options
        self.port = options.port
        self.health_port = options.health_port
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.certificates: CertificateStore | None = None  # with TLS: what both ports serve

    async def start(self) -> None:
        from epick.extproc.tls import CertificateStore

        options = self.options
        store = (
            CertificateStore(options.cert_path, options.client_ca_path, reload=options.cert_reload)
            if options.secure
            else None
        )
        self.certificates = store

        def listen(server: grpc.aio.Server, port: int, plaintext: bool = False) -> int:
            address = f"{options.host}:{port}"
            try:
                if store is None or plaintext:
                    return int(server.add_insecure_port(address))
                return int(server.add_secure_port(address, store.credentials()))  # one credentials per port
            except RuntimeError as e:  # grpc's way of saying the bind failed
                raise OSError(f"cannot listen on {address} for gRPC: the port is in use ({e})") from None

        binding = _SHARED_PORT if options.shared_ports else _EXCLUSIVE_PORT
        self._server = grpc.aio.server(maximum_concurrent_rpcs=options.max_streams, options=binding)
        pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.director), self._server)
        # Health on the ext_proc port too: a gateway health-checks the cluster it sends ext_proc to.
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        self.port = listen(self._server, options.port)
        await self._server.start()
        self._health_server = grpc.aio.server(options=binding)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
        self.health_port = listen(self._health_server, options.health_port, options.health_plaintext)
        await self._health_server.start()
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self) -> None:
        for server in (self._server, self._health_server):
            if server is not None:
                await server.stop(grace=1.0)
