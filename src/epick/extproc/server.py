"""`envoy.service.ext_proc.v3.ExternalProcessor`: the gateway's side of the EPP protocol, on epick's gRPC
server (epick/wire/grpc_server.py), with the gRPC health service on the ext_proc port and on a port of
its own.

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
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError

from epick.extproc.exchange import Exchange
from epick.extproc.health import EXT_PROC, HealthService
from epick.extproc.messages import immediate
from epick.extproc.stream_metrics import StreamMetrics
from epick.requestcontrol.admission import evicted_error
from epick.requestcontrol.director import Director
from epick.wire.budget import BodyBudget
from epick.wire.grpc_call import Call, Limits
from epick.wire.grpc_server import GrpcServer
from epick.wire.h2 import MESSAGE_BYTES, Status

if TYPE_CHECKING:
    from epick.extproc.tls import CertificateStore  # imported on start: cryptography only when serving

log = logging.getLogger(__name__)
SERVICE_NAME = EXT_PROC
DRAIN_POLL_S = 0.05
PROCESS = f"/{SERVICE_NAME}/Process"


class ProcessCall:
    """One ext_proc stream: each of Envoy's messages is handled as it comes and answered at once; a
    routing that waits (flow control, a tokenizer) holds the stream's later messages until it is done."""

    __slots__ = ("_held", "_opened", "_stats", "_watching", "admission", "call", "ended_by_envoy", "exchange")

    def __init__(
        self,
        director: Director,
        call: Call,
        stats: StreamMetrics | None = None,
        budget: BodyBudget | None = None,
    ) -> None:
        self.call = call
        self._stats = stats
        self._opened = stats.opened() if stats is not None else 0.0
        self.exchange = Exchange(director, budget=budget)
        self._held: list[bytes] | None = None  # not None while an admission is pending
        self._watching = False  # registered for flow control's eviction
        self.admission: asyncio.Task[None] | None = None
        self.ended_by_envoy = False

    def received(self, message: bytes) -> None:
        if self._held is not None:
            self._held.append(message)
            return
        try:
            request = pb.ProcessingRequest.FromString(message)
        except DecodeError:
            self._end(Status.INVALID_ARGUMENT, "not an envoy.service.ext_proc.v3.ProcessingRequest")
            return
        exchange = self.exchange
        self._send(exchange.handle(request))
        if exchange.pending is not None:  # waiting in flow control or on a tokenizer
            self._held = []
            self.admission = asyncio.get_running_loop().create_task(self._admit())
            return
        self._watch_eviction()
        if exchange.closed:
            self._end()

    def _send(self, answers: list[pb.ProcessingResponse]) -> None:
        send = self.call.send
        for answer in answers:
            send(answer.SerializeToString())

    async def _admit(self) -> None:
        try:
            answers = await self.exchange.admit()
        except asyncio.CancelledError:
            return  # Envoy closed the stream; `cancelled` abandons the exchange
        except Exception:
            log.exception("ext_proc admission failed")
            self._end(Status.INTERNAL, "epick failed to route the request")
            return
        self._send(answers)
        held, self._held = self._held or [], None
        self.admission = None
        self._watch_eviction()
        if self.exchange.closed:
            self._end()
            return
        for message in held:
            if self.call.done:
                return
            self.received(message)
        if self.ended_by_envoy and not self.call.done:
            self._end()

    def _watch_eviction(self) -> None:
        decision = self.exchange.decision
        if not self._watching and decision is not None and decision.eviction is not None:
            self._watching = True
            decision.eviction.on_evict(self._evicted)

    def _evicted(self) -> None:
        """Flow control evicted the request: Envoy resets the upstream request on the immediate answer."""
        if self.call.done:
            return
        if not self.exchange.completed:
            assert self.exchange.decision is not None
            log.info("request %s evicted by flow control", self.exchange.decision.request.request_id)
            self.call.send(immediate(evicted_error()).SerializeToString())
        self._end()

    def _end(self, status: Status = Status.OK, details: str = "") -> None:
        if self._stats is not None:
            self._stats.closed(self._opened, status)
            self._stats = None  # counted once
        self.call.finish(status, details)
        self.exchange.abandon()

    def ended(self) -> None:
        if self._held is not None:
            self.ended_by_envoy = True  # answered once the admission is done
        else:
            self._end()

    def cancelled(self) -> None:
        if self._stats is not None:
            self._stats.closed(self._opened, Status.CANCELLED)
            self._stats = None
        if self.admission is not None:
            self.admission.cancel()
        self.exchange.abandon()


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
    # The largest gRPC message taken from the gateway (`--grpc-max-recv-msg-size`, gRPC's 4 MiB default).
    max_message_bytes: int = MESSAGE_BYTES
    # Open ext_proc streams (one per request in flight through the gateway); more are refused with
    # RESOURCE_EXHAUSTED, which a fail-closed gateway answers 5xx. None: no limit.
    max_streams: int | None = 10_000
    # On stop: keep serving, new streams too, until no stream has been open for this long (or the
    # drain timeout ends), as the Go EPP keeps serving through its drain window: a gateway may send to
    # this replica until it learns that it is going. 0: stop accepting at once (`epick serve`).
    drain_quiet: float = 0.0
    # With `drain_quiet`: serve at least this long after the stop began, whatever the traffic (a
    # gateway takes a few seconds to learn that a replica is going).
    drain_floor: float = 5.0
    # `--tls-min-version` (a Go name, VersionTLS12) and `--tls-cipher-suites` (Go names); empty: TLS 1.2
    # and later, ECDHE with AES-GCM or ChaCha20.
    tls_min_version: str = ""
    tls_cipher_suites: tuple[str, ...] = ()
    # The request bodies held at once over every stream; past it a body is answered 503 (0: no limit).
    # Set from the service's settings (four times the largest body by default).
    max_bodies_bytes: int = 64 * 1024 * 1024
    # The ext_proc stream metrics (`--enable-grpc-stream-metrics`).
    stream_metrics: bool = False
    # `epick serve --workers`: every worker listens on the ports (SO_REUSEPORT; the kernel spreads
    # Envoy's connections over them), and the supervisor keeps anything else off them.
    shared_ports: bool = False

    def __post_init__(self) -> None:
        if self.client_ca_path is not None and not self.secure:
            raise ValueError("a client CA (mTLS) needs TLS: client_ca_path is set but secure is off")


class ExtProcServer:
    def __init__(
        self, director: Director, options: ExtProcOptions, health: HealthService | None = None
    ) -> None:
        self.director = director
        self.options = options
        self.port = options.port
        self.health_port = options.health_port
        self.health = health or HealthService()
        # The ext_proc streams (Process calls) open now and their lifetimes: what the drain waits on,
        # and, with `stream_metrics`, served on /metrics.
        self.streams = StreamMetrics()
        self.stream_metrics = self.streams if options.stream_metrics else None
        self.bodies = BodyBudget(options.max_bodies_bytes or None)
        self.certificates: CertificateStore | None = None  # with TLS: what both ports serve
        self._server: GrpcServer | None = None
        self._health_server: GrpcServer | None = None

    async def start(self) -> None:
        from epick.extproc.tls import (
            DEFAULT_CIPHERS,
            CertificateStore,
            ServerContexts,
            cipher_string,
            tls_version,
        )

        options = self.options
        store = (
            CertificateStore(options.cert_path, options.client_ca_path, reload=options.cert_reload)
            if options.secure
            else None
        )
        self.certificates = store
        tls = None
        if store is not None:
            minimum = (
                tls_version(options.tls_min_version) if options.tls_min_version else ssl.TLSVersion.TLSv1_2
            )
            ciphers = (
                cipher_string(options.tls_cipher_suites) if options.tls_cipher_suites else DEFAULT_CIPHERS
            )
            tls = ServerContexts(store, minimum=minimum, ciphers=ciphers).context()
        director = self.director
        stats, budget = self.streams, self.bodies
        methods = {PROCESS: lambda call: ProcessCall(director, call, stats, budget), **self.health.methods()}
        # Health on the ext_proc port too: a gateway health-checks the cluster it sends ext_proc to.
        self._server = GrpcServer(
            methods, Limits(max_streams=options.max_streams, max_message_bytes=options.max_message_bytes)
        )
        self.port = await self._server.listen(
            options.host, options.port, tls=tls, reuse_port=options.shared_ports
        )
        self._health_server = GrpcServer(self.health.methods())
        self.health_port = await self._health_server.listen(
            options.host,
            options.health_port,
            tls=None if options.health_plaintext else tls,
            reuse_port=options.shared_ports,
        )

    def not_serving(self) -> None:
        """Stopping: readiness answers NOT_SERVING (a gateway stops sending streams)."""
        self.health.update(draining=True)

    def shed(self) -> None:
        """The gateways' connections get GOAWAY: their open streams finish, and new ones come over
        new connections (`epick serve --workers`: spread over every worker again)."""
        if self._server is not None:
            self._server.shed()

    async def stop(self, drain: float = 1.0) -> None:
        """Stop serving within `drain` seconds: first, with `drain_quiet`, go on serving (at least
        `drain_floor`) until no ext_proc stream has been open for that long; then stop listening and
        let the open streams finish in what is left (at least one second)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain
        quiet = min(self.options.drain_quiet, drain)
        if quiet > 0 and self._server is not None:
            floor = loop.time() + min(self.options.drain_floor, drain)
            idle_since: float | None = None
            while (now := loop.time()) < deadline:
                if self.streams.open or now < floor:
                    idle_since = None
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= quiet:
                    break
                await asyncio.sleep(DRAIN_POLL_S)
        grace = max(deadline - loop.time(), 1.0)
        servers = [s for s in (self._server, self._health_server) if s is not None]
        await asyncio.gather(*(server.stop(grace=grace) for server in servers))
