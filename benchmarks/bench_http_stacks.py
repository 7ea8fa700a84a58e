"""HTTP stacks as bare pass-through proxies: which server and which client cost what per request.

Each proxy does nothing but pass through: a POST's body is read whole, forwarded to one of 4 static
backends in turn (round-robin), and the response (status, Content-Type, body) goes back whole. Each
runs as its own process (this script re-invoked with `--serve SERVER --client CLIENT`), on uvloop.
Servers: aiohttp's web server; uvicorn with httptools (an ASGI app); granian (RSGI); a bare
asyncio.Protocol with httptools' parser; epick's own (`epick.wire.http_server.HTTPServer`). Clients:
aiohttp's ClientSession (one, pooled); epick's own (`epick.proxy.upstream.Upstreams`); httpx's
AsyncClient. Each server is measured with epick's client, each client with epick's server, and
aiohttp with aiohttp, the baseline.

Method (bench_dataplane.py's): one nginx process answering any POST with a canned chat completion on
4 ports, load from `wrk -t1` at 64 connections with 2 KB chat bodies over 16 shared prefixes, every
proxy once per round in interleaved rounds (medians over rounds), every figure also as a ratio to
aiohttp + aiohttp within this run:
- requests/s;
- CPU per request: the proxy process's user + system time over the run (from /proc, its workers
  included) / the requests;
- latency p50 and p99 at 64 connections.
httpx's pairs get one short run (they manage about 150 requests/s). Needs `wrk` and `nginx` on PATH;
uvicorn, granian and httpx rows are skipped, and said, when the package is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import httptools
import uvloop
from aiohttp import web
from bench_dataplane import (
    PREFIXES,
    Run,
    process,
    rounds_of,
    run_parser,
    static_backends,
    tools_missing,
    wait_http,
    wrk,
)
from bench_service import free_ports  # this directory is on sys.path when run as a script
from rich.console import Console
from rich.table import Table

SERVERS = ["aiohttp", "uvicorn", "granian", "protocol", "epick"]
OPTIONAL = ("uvicorn", "granian", "httpx")  # stacks that are packages of their own, maybe not installed
# Each server with epick's client, each client with epick's server, and aiohttp with aiohttp (the baseline).
PAIRS = [("aiohttp", "aiohttp"), ("aiohttp", "epick"), ("uvicorn", "epick"), ("granian", "epick"),
         ("protocol", "epick"), ("epick", "epick"), ("epick", "aiohttp"), ("epick", "httpx")]  # fmt: skip
SHOWN = {"protocol": "asyncio protocol", "uvicorn": "uvicorn (httptools)", "granian": "granian (RSGI)"}
Reply = tuple[int, bytes, str]  # status, body, Content-Type


class Client(Protocol):
    async def post(self, host: str, port: int, path: str, body: bytes, ctype: str) -> Reply: ...


class AiohttpClient:
    def __init__(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))

    async def post(self, host: str, port: int, path: str, body: bytes, ctype: str) -> Reply:
        url = f"http://{host}:{port}{path}"
        async with self.session.post(url, data=body, headers={"Content-Type": ctype}) as r:
            return r.status, await r.read(), r.headers.get("Content-Type", "")


class EpickClient:
    def __init__(self) -> None:
        from epick.proxy.upstream import Upstreams  # here: ruff sorts epick as first-party in the repo only

        self.upstreams = Upstreams()

    async def post(self, host: str, port: int, path: str, body: bytes, ctype: str) -> Reply:
        r = await self.upstreams.request(host, port, path, headers=[("content-type", ctype)], body=body)
        data = await r.read()
        r.release()
        return r.status, data, r.header("content-type") or ""


class HttpxClient:
    def __init__(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self.client = httpx.AsyncClient(limits=limits, timeout=30.0)

    async def post(self, host: str, port: int, path: str, body: bytes, ctype: str) -> Reply:
        url = f"http://{host}:{port}{path}"
        r = await self.client.post(url, content=body, headers={"content-type": ctype})
        return r.status_code, r.content, r.headers.get("content-type", "")


CLIENTS: dict[str, type[Client]] = {"aiohttp": AiohttpClient, "epick": EpickClient, "httpx": HttpxClient}


class Proxy:
    """The pass-through: a body to the next backend in turn; its client made on the running loop."""

    def __init__(self, client: str, backends: list[str]) -> None:
        self.make_client = CLIENTS[client]
        self.client: Client | None = None
        self.backends = [(h, int(p)) for h, p in (b.rsplit(":", 1) for b in backends)]
        self.next = 0

    async def forward(self, path: str, body: bytes, ctype: str) -> Reply:
        if self.client is None:
            self.client = self.make_client()
        host, port = self.backends[self.next]
        self.next = (self.next + 1) % len(self.backends)
        return await self.client.post(host, port, path, body, ctype)


async def serve_aiohttp(proxy: Proxy, port: int) -> None:
    async def handle(request: web.Request) -> web.Response:
        ctype = request.headers.get("Content-Type", "")
        status, data, rtype = await proxy.forward(request.path_qs, await request.read(), ctype)
        return web.Response(status=status, body=data, headers={"Content-Type": rtype})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()


def asgi_app(proxy: Proxy) -> Callable[..., Awaitable[None]]:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        ctype = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-type"), "")
        status, data, rtype = await proxy.forward(scope["path"], b"".join(chunks), ctype)
        headers = [(b"content-type", rtype.encode("latin-1")), (b"content-length", b"%d" % len(data))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def rsgi_app() -> Callable[..., Awaitable[None]]:
    """granian's target (a factory, loaded in its worker): the proxy described by the environment."""
    proxy = Proxy(os.environ["BENCH_STACK_CLIENT"], os.environ["BENCH_STACK_BACKENDS"].split(","))

    async def app(scope: Any, protocol: Any) -> None:
        ctype = scope.headers.get("content-type", "")
        status, data, rtype = await proxy.forward(scope.path, await protocol(), ctype)
        protocol.response_bytes(status, [("content-type", rtype)], data)

    return app


class RawProtocol(asyncio.Protocol):
    """The least an HTTP/1.1 server can be: httptools' callbacks, a task per request, the answer
    written whole. (No pipelining order, limits or deadlines: wrk needs none.)"""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.ctype = ""
        self.body: list[bytes] = []
        self.task: asyncio.Task[None] | None = None  # the request being answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.ctype, self.body = b"", "", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.ctype = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        keep = self.parser.should_keep_alive()
        request = self.answer(self.url.decode("latin-1"), b"".join(self.body), self.ctype, keep)
        self.task = asyncio.get_running_loop().create_task(request)

    async def answer(self, path: str, body: bytes, ctype: str, keep: bool) -> None:
        status, data, rtype = await self.proxy.forward(path, body, ctype)
        assert self.transport is not None
        head = f"HTTP/1.1 {status} OK\r\ncontent-type: {rtype}\r\ncontent-length: {len(data)}\r\n"
        end = b"\r\n" if keep else b"connection: close\r\n\r\n"
        self.transport.write(head.encode("latin-1") + end + data)
        if not keep:
            self.transport.close()


async def serve_protocol(proxy: Proxy, port: int) -> None:
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: RawProtocol(proxy), "127.0.0.1", port, backlog=1024)
    await asyncio.Event().wait()


async def serve_epick(proxy: Proxy, port: int) -> None:
    from epick.wire import http_server as http

    async def handle(request: http.Request, reply: http.Reply) -> None:
        ctype = request.headers.get("content-type", "")
        status, data, rtype = await proxy.forward(request.target, await request.read(), ctype)
        reply.send(status, data, [("content-type", rtype)])

    server = http.HTTPServer(handle, max_body_bytes=1 << 20, head_timeout=30.0, keepalive_timeout=75.0)
    await server.start("127.0.0.1", port)
    await asyncio.Event().wait()


def serve(server: str, client: str, port: int, backends: list[str]) -> None:
    """Run one proxy until terminated (the `--serve` side of this script)."""
    proxy = Proxy(client, backends)
    if server == "uvicorn":
        import uvicorn

        config = uvicorn.Config(asgi_app(proxy), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                                lifespan="off", log_level="error", access_log=False)  # fmt: skip
        uvicorn.Server(config).run()
    elif server == "granian":
        from granian.constants import Interfaces, Loops
        from granian.server import Server

        os.environ.update(BENCH_STACK_CLIENT=client, BENCH_STACK_BACKENDS=",".join(backends))
        Server(f"{Path(__file__).stem}:rsgi_app", address="127.0.0.1", port=port, interface=Interfaces.RSGI,
               workers=1, loop=Loops.uvloop, websockets=False, log_enabled=False, factory=True,
               working_dir=Path(__file__).parent).serve()  # fmt: skip
    else:
        runners = {"aiohttp": serve_aiohttp, "protocol": serve_protocol, "epick": serve_epick}
        uvloop.run(runners[server](proxy, port))


@dataclass
class Pair:
    server: str
    client: str
    url: str = ""
    pids: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)


def main() -> None:
    parser = run_parser(__doc__)
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)  # a proxy, for the measurement
    parser.add_argument("--client", choices=CLIENTS, default="epick", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backends", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.client, args.port, args.backends.split(","))
        return
    rounds_of(args)
    console = Console(width=150)
    if tools_missing(console, "bench_http_stacks"):
        return
    pairs: list[Pair] = []
    for server, client in PAIRS:
        absent = [s for s in (server, client) if s in OPTIONAL and importlib.util.find_spec(s) is None]
        if absent:
            console.print(f"{server} + {client}: skipped, {absent[0]} is not installed")
        else:
            pairs.append(Pair(server, client))
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        script, backends, _ = static_backends(stack, tmp)
        direct = Pair("direct (nginx)", "–", f"http://{backends[0]}")
        body = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}'
        for pair in pairs:
            (port,) = free_ports(1)
            log = tmp / f"{pair.server}-{pair.client}.log"
            cmd = [sys.executable, __file__, "--serve", pair.server, "--client", pair.client,
                   "--port", str(port), "--backends", ",".join(backends)]  # fmt: skip
            proc = stack.enter_context(process(cmd, log))
            pair.url, pair.pids = f"http://127.0.0.1:{port}", [proc.pid]
            wait_http(f"{pair.url}/v1/chat/completions", "POST", body, timeout=60, log=log)
        for pair in [direct, *pairs]:  # warm-up: connection pools, first paths
            wrk(pair.url, script, 64, 1.0, pair.pids)
        for i in range(args.rounds):
            for pair in [direct, *pairs]:
                if pair.client == "httpx":  # about 150 requests/s: one short run
                    if i == 0:
                        pair.runs.append(wrk(pair.url, script, 64, min(args.seconds, 3.0), pair.pids))
                    continue
                pair.runs.append(wrk(pair.url, script, 64, args.seconds, pair.pids))
    report(console, direct, pairs, args)


def report(console: Console, direct: Pair, pairs: list[Pair], args: argparse.Namespace) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    def cpu(pair: Pair) -> float:
        return med([r.cpu / r.requests for r in pair.runs]) * 1e6

    base = next((p for p in pairs if (p.server, p.client) == ("aiohttp", "aiohttp")), None)
    base_rps = med([r.rps for r in base.runs]) if base else None
    base_cpu = cpu(base) if base else None
    t = Table(
        title=f"bare pass-through proxies: static nginx backends, wrk 64 connections, 2 KB chat bodies over "
        f"{PREFIXES} prefixes ({args.rounds} interleaved rounds of {args.seconds:g} s; medians)"
    )
    for col in ("server", "client", "req/s", "× aiohttp+aiohttp", "CPU µs/request", "CPU × aiohttp+aiohttp",
                "p50 ms", "p99 ms", "runs"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("server", "client") else "right")
    for pair in [direct, *pairs]:
        rps = med([r.rps for r in pair.runs])
        proxied = pair is not direct
        t.add_row(
            SHOWN.get(pair.server, pair.server),
            pair.client,
            f"{rps:,.0f}",
            f"{rps / base_rps:.2f}" if base_rps else "–",
            f"{cpu(pair):,.0f}" if proxied else "–",
            f"{cpu(pair) / base_cpu:.2f}" if proxied and base_cpu else "–",
            f"{med([r.p50 for r in pair.runs]) * 1e3:.1f}",
            f"{med([r.p99 for r in pair.runs]) * 1e3:.1f}",
            str(len(pair.runs)),
        )
    console.print(t)
    installed = [p for p in ("aiohttp", "uvicorn", "granian", "httpx", "httptools", "uvloop")
                 if importlib.util.find_spec(p) is not None]  # fmt: skip
    versions = ", ".join(f"{p} {version(p)}" for p in installed)
    console.print(f"versions: {versions}; Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
