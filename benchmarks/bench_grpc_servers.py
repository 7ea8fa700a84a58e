"""gRPC server stacks as Envoy's ext_proc: which Python stack costs what per request.

A minimal ext_proc server (envoy.service.ext_proc.v3.ExternalProcessor/Process) with the same logic
in each stack, under GIE's modes (request and response body FULL_DUPLEX_STREAMED, trailers sent) over
plaintext HTTP/2: the request headers wait; the request body is buffered until end_of_stream and
parsed once (json.loads); then the request headers are answered with header
`x-gateway-destination-endpoint` set to the next of 4 backends in turn (and content-length, the route
cache cleared), and the body with streamed_response chunks echoing it, the last with end_of_stream;
the response headers get an empty answer, and each response body chunk is echoed back with its
end_of_stream (what epick's exchange.py sends under full duplex). Stacks, each its own process (this
script re-invoked with `--serve STACK`): grpc.aio on asyncio's loop; grpc.aio on uvloop (epick's
setting); grpclib (pure Python, on h2) on uvloop; grpcio's sync server with 128 threads; and epick's
own ext_proc (`epick serve --no-proxy --no-secure-serving`, its scrapers included) for reference.

Method (bench_dataplane.py's): one nginx process answering a canned chat completion on 4 ports, one
Envoy (--concurrency 1, tests/extproc/envoy.yaml.tmpl without TLS to ext_proc) per stack routing on
the header through an original-destination cluster, load from `wrk -t1` at 64 connections with 2 KB
chat bodies over 16 shared prefixes, every stack once per round in interleaved rounds (medians over
rounds), every figure also as a ratio to grpc.aio on uvloop within this run:
- requests/s, and p50 / p99 at 64 connections;
- CPU per request of the ext_proc process and of Envoy, separately (user + system time from /proc
  over the run / requests);
- added latency at one connection: p50 through Envoy + the stack minus p50 straight to nginx.
Needs `wrk` and `nginx` on PATH and Envoy (ENVOY, else on PATH, else next to the Python executable);
grpclib's row is skipped, and said, when grpclib is not installed (pip install grpclib).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from concurrent import futures
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import bench_dataplane
import grpc
import uvloop
from bench_dataplane import (
    FULL_DUPLEX,
    PREFIXES,
    Run,
    cpu_seconds,
    process,
    rounds_of,
    run_parser,
    static_backends,
    tools_missing,
    wait_http,
    wrk,
)
from bench_service import free_ports  # this directory is on sys.path when run as a script
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from rich.console import Console
from rich.table import Table

from epick.wire.grpc_call import Call
from epick.wire.grpc_server import GrpcServer

CHUNK_BYTES = 62_000  # epick's (and the Go EPP's) largest streamed chunk
STACKS = ["grpc.aio", "grpc.aio+uvloop", "grpclib+uvloop", "grpc-sync", "epick-grpc+uvloop", "epick"]
SHOWN = {"grpc.aio": "grpc.aio, asyncio", "grpc.aio+uvloop": "grpc.aio on uvloop (epick's setting)",
         "grpclib+uvloop": "grpclib (pure Python, h2) on uvloop",
         "grpc-sync": "grpcio sync server, 128 threads",
         "epick-grpc+uvloop": "epick's gRPC server (asyncio protocol) on uvloop",
         "epick": "epick's ext_proc (reference)"}  # fmt: skip
BASELINE = "grpc.aio+uvloop"
METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def streamed(body: bytes, end: bool) -> list[pb.CommonResponse]:
    pieces = [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
    return [
        pb.CommonResponse(
            body_mutation=pb.BodyMutation(
                streamed_response=pb.StreamedBodyResponse(body=p, end_of_stream=end and i == len(pieces) - 1)
            )
        )
        for i, p in enumerate(pieces)
    ]


def header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


class Exchange:
    """One ext_proc stream (one request and its response): each message in, the answers out."""

    def __init__(self, backends: itertools.cycle[str]) -> None:
        self.backends = backends
        self.pieces: list[bytes] = []
        self.routed = False

    def route(self, body: bytes | None, end: bool) -> list[pb.ProcessingResponse]:
        """The routing answer to the request headers, then (with a body) the body echoed back."""
        self.routed = True
        sets = [header("x-gateway-destination-endpoint", next(self.backends))]
        if body is not None:
            json.loads(body)  # what a picker would read
            sets.append(header("content-length", str(len(body))))
        common = pb.CommonResponse(
            header_mutation=pb.HeaderMutation(set_headers=sets), clear_route_cache=True
        )
        answers = [pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))]
        chunks = streamed(body, end) if body is not None else []
        return answers + [pb.ProcessingResponse(request_body=pb.BodyResponse(response=c)) for c in chunks]

    def handle(self, m: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = m.WhichOneof("request")
        if kind == "request_headers":
            return self.route(None, True) if m.request_headers.end_of_stream else []  # no body: route now
        if kind == "request_body":
            self.pieces.append(m.request_body.body)
            if not m.request_body.end_of_stream:
                return []
            return self.route(b"".join(self.pieces), True)
        if kind == "request_trailers":  # the body ended without end_of_stream
            trailers = [pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
            return trailers if self.routed else self.route(b"".join(self.pieces), False) + trailers
        if kind == "response_headers":
            return [pb.ProcessingResponse(response_headers=pb.HeadersResponse())]
        if kind == "response_body":
            body = m.response_body
            chunks = streamed(body.body, body.end_of_stream)
            return [pb.ProcessingResponse(response_body=pb.BodyResponse(response=c)) for c in chunks]
        if kind == "response_trailers":
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        return []


class AioServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, backends: itertools.cycle[str]) -> None:
        self.backends = backends

    async def Process(self, requests, context):  # type: ignore[no-untyped-def]  # noqa: N802 (gRPC's name)
        exchange = Exchange(self.backends)
        async for message in requests:
            for answer in exchange.handle(message):
                yield answer


class SyncServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, backends: itertools.cycle[str]) -> None:
        self.backends = backends

    def Process(self, requests, context):  # type: ignore[no-untyped-def]  # noqa: N802 (gRPC's name)
        exchange = Exchange(self.backends)
        for message in requests:
            yield from exchange.handle(message)


class GrpclibServicer:
    """grpclib's side: a hand-written `__mapping__` over the protobuf message classes."""

    def __init__(self, backends: itertools.cycle[str]) -> None:
        self.backends = backends

    async def process(self, stream) -> None:  # type: ignore[no-untyped-def]
        exchange = Exchange(self.backends)
        async for message in stream:
            for answer in exchange.handle(message):
                await stream.send_message(answer)

    def __mapping__(self) -> dict[str, object]:  # grpclib's protocol
        from grpclib.const import Cardinality, Handler

        return {
            METHOD: Handler(
                self.process, Cardinality.STREAM_STREAM, pb.ProcessingRequest, pb.ProcessingResponse
            )
        }


class EpickCall:
    """epick's gRPC server's side: a handler told each message as it comes."""

    def __init__(self, backends: itertools.cycle[str], call: Call) -> None:
        self.exchange = Exchange(backends)
        self.call = call

    def received(self, message: bytes) -> None:
        for answer in self.exchange.handle(pb.ProcessingRequest.FromString(message)):
            self.call.send(answer.SerializeToString())

    def ended(self) -> None:
        self.call.finish()

    def cancelled(self) -> None:
        pass


async def serve_epick_grpc(backends: itertools.cycle[str], port: int) -> None:
    server = GrpcServer({METHOD: lambda call: EpickCall(backends, call)})
    await server.listen("127.0.0.1", port)
    await asyncio.Event().wait()


async def serve_aio(backends: itertools.cycle[str], port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(AioServicer(backends), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def serve_grpclib(backends: itertools.cycle[str], port: int) -> None:
    from grpclib.server import Server

    server = Server([GrpclibServicer(backends)])
    await server.start("127.0.0.1", port)
    await server.wait_closed()


def serve(stack: str, port: int, backends: list[str]) -> None:
    """Run one ext_proc server until terminated (the `--serve` side of this script)."""
    cycle = itertools.cycle(backends)
    if stack == "grpc.aio":
        asyncio.run(serve_aio(cycle, port))
    elif stack == "grpc.aio+uvloop":
        uvloop.run(serve_aio(cycle, port))
    elif stack == "grpclib+uvloop":
        uvloop.run(serve_grpclib(cycle, port))
    elif stack == "epick-grpc+uvloop":
        uvloop.run(serve_epick_grpc(cycle, port))
    else:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=128))
        pb_grpc.add_ExternalProcessorServicer_to_server(SyncServicer(cycle), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()


@dataclass
class Stack:
    name: str
    url: str = ""
    server: list[int] = field(default_factory=list)  # the ext_proc process; empty for nginx direct
    envoy: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    envoy_cpu: list[float] = field(default_factory=list)  # µs/request, per round
    single: list[float] = field(default_factory=list)  # p50 at one connection, per round


def plaintext_envoy(tmp: Path, listen: int, admin: int, grpc_port: int) -> Path:
    """bench_dataplane's Envoy config (GIE's modes), without TLS towards ext_proc."""
    if not (bench_dataplane.ROOT / "tests" / "extproc").is_dir():  # a copy outside the repository
        import epick  # here: ruff sorts epick as first-party in the repo only

        bench_dataplane.ROOT = Path(epick.__file__).resolve().parents[2]
    path = bench_dataplane.envoy_config(tmp, listen, admin, grpc_port, modes=(FULL_DUPLEX, FULL_DUPLEX))
    text, n = re.subn(r"\n    transport_socket:\n(?:      .*\n)+", "\n", path.read_text())
    if n != 1:
        raise RuntimeError("the Envoy template's ext_proc transport_socket was not found")
    path.write_text(text)
    return path


def start(stack: Stack, stack_ctx: contextlib.ExitStack, tmp: Path, backends: list[str], envoy: str) -> None:
    grpc_port, health, listen, admin = free_ports(4)
    if stack.name == "epick":
        cmd = [*bench_dataplane.EPICK, "serve", "--workers", "1", "--no-proxy", "--grpc-port", str(grpc_port),
               "--grpc-health-port", str(health), "--no-secure-serving", "--metrics-port", "0",
               "--endpoints", ",".join(backends), "--log-level", "error"]  # fmt: skip
    else:
        cmd = [sys.executable, __file__, "--serve", stack.name, "--port", str(grpc_port),
               "--backends", ",".join(backends)]  # fmt: skip
    log, envoy_log = tmp / f"server-{grpc_port}.log", tmp / f"envoy-{listen}.log"
    server = stack_ctx.enter_context(process(cmd, log))
    config = plaintext_envoy(tmp, listen, admin, grpc_port)
    cmd = [envoy, "-c", str(config), "--concurrency", "1", "--log-level", "error", "--base-id", str(listen)]
    proxy = stack_ctx.enter_context(process(cmd, envoy_log))
    wait_http(f"http://127.0.0.1:{admin}/ready", timeout=60, log=envoy_log)
    stack.url, stack.server, stack.envoy = f"http://127.0.0.1:{listen}", [server.pid], [proxy.pid]
    body = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}'
    wait_http(f"{stack.url}/v1/chat/completions", "POST", body, timeout=60, log=log)


def measure(stack: Stack, script: Path, seconds: float) -> None:
    before = cpu_seconds(stack.envoy)
    run = wrk(stack.url, script, 64, seconds, stack.server)
    stack.runs.append(run)
    if stack.envoy:
        stack.envoy_cpu.append((cpu_seconds(stack.envoy) - before) / run.requests * 1e6)
    stack.single.append(wrk(stack.url, script, 1, max(1, round(seconds / 2)), stack.server).p50)


def main() -> None:
    parser = run_parser(__doc__)
    parser.add_argument("--serve", choices=STACKS[:-1], help=argparse.SUPPRESS)  # an ext_proc server
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backends", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.backends.split(","))
        return
    rounds_of(args)
    console = Console(width=170)
    envoy = os.environ.get("ENVOY") or shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
    if tools_missing(console, "bench_grpc_servers", envoy):
        return
    stacks = []
    for name in STACKS:
        if name == "grpclib+uvloop" and importlib.util.find_spec("grpclib") is None:
            console.print("grpclib on uvloop: skipped, grpclib is not installed (pip install grpclib)")
        else:
            stacks.append(Stack(name))
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as ctx:
        tmp = Path(tmp_name)
        script, backends, _ = static_backends(ctx, tmp)
        direct = Stack("direct (nginx)", f"http://{backends[0]}")
        for stack in stacks:
            start(stack, ctx, tmp, backends, envoy)
        time.sleep(1.0)  # epick's scrapers have read every backend
        for stack in [direct, *stacks]:  # warm-up: connections, first paths
            wrk(stack.url, script, 64, 1.0, stack.server)
        for _ in range(args.rounds):
            for stack in [direct, *stacks]:
                measure(stack, script, args.seconds)
    report(console, direct, stacks, args)


def report(console: Console, direct: Stack, stacks: list[Stack], args: argparse.Namespace) -> None:
    med = statistics.median

    def figures(s: Stack) -> dict[str, float]:
        return {
            "rps": med([r.rps for r in s.runs]),
            "cpu": med([r.cpu / r.requests * 1e6 for r in s.runs]),
            "envoy": med(s.envoy_cpu) if s.envoy_cpu else float("nan"),
            "added": (med(s.single) - med(direct.single)) * 1e3,
            "p50": med([r.p50 for r in s.runs]) * 1e3,
            "p99": med([r.p99 for r in s.runs]) * 1e3,
        }

    base = next((figures(s) for s in stacks if s.name == BASELINE), None)
    t = Table(
        title=f"ext_proc servers behind Envoy (GIE modes, plaintext HTTP/2): static nginx backends, wrk 64 "
        f"connections, 2 KB chat bodies over {PREFIXES} prefixes ({args.rounds} interleaved rounds of "
        f"{args.seconds:g} s; medians; × = ratio to grpc.aio on uvloop)"
    )
    for col in ("ext_proc server", "req/s", "×", "ext_proc CPU µs/req", "×", "Envoy CPU µs/req", "×",
                "p50 ms", "p99 ms", "added p50 at 1 conn (ms)", "×"):  # fmt: skip
        t.add_column(col, justify="left" if col == "ext_proc server" else "right")

    def ratio(f: dict[str, float], key: str) -> str:
        return f"{f[key] / base[key]:.2f}" if base and base[key] else "–"

    d = figures(direct)
    t.add_row(direct.name, f"{d['rps']:,.0f}", *["–"] * 5, f"{d['p50']:.1f}", f"{d['p99']:.1f}", "0", "–")
    for s in stacks:
        f = figures(s)
        t.add_row(SHOWN[s.name], f"{f['rps']:,.0f}", ratio(f, "rps"), f"{f['cpu']:,.0f}", ratio(f, "cpu"),
                  f"{f['envoy']:,.0f}", ratio(f, "envoy"), f"{f['p50']:.1f}", f"{f['p99']:.1f}",
                  f"{f['added']:+.2f}", ratio(f, "added"))  # fmt: skip
    console.print(t)
    versions = []
    for package in ("grpcio", "grpclib", "h2", "uvloop", "protobuf", "xds-protos"):
        with contextlib.suppress(PackageNotFoundError):
            versions.append(f"{package} {version(package)}")
    console.print(f"versions: {', '.join(versions)}; Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
