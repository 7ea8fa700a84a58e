"""Fixtures for talking to in-process sim servers the way real clients do.

Servers listen on a free loopback port (port 0) and run simulated time fast (time_scale 1000)
unless a test asks otherwise. Every server, HTTP session, OpenAI client and ZMQ context a test
opens is closed at teardown, so `filterwarnings = error` sees no unclosed resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from epick.sim.engine import RequestOutput
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer

FAST = 1000.0  # simulated seconds per wall second
BLOCK = 16

ServerFactory = Callable[..., Awaitable[SimServer]]


def options(*, time_scale: float = FAST, engine: dict[str, Any] | None = None, **kw: Any) -> ServerOptions:
    """ServerOptions on a free port; `engine` holds ServerOptions.engine_config keywords."""
    kw.setdefault("port", 0)
    return ServerOptions(time_scale=time_scale, engine=ServerOptions.engine_config(**(engine or {})), **kw)


def finish_in_flight(server: SimServer) -> None:
    """Hand every request still waiting for the engine a final (empty) output, so its handler returns."""
    for pending in list(server._pending.values()):
        pending.queue.put_nowait(RequestOutput(pending.request, [], True))


@pytest.fixture
async def make_server() -> AsyncIterator[ServerFactory]:
    """Start servers with `make_server(**ServerOptions fields, engine={...})`; all stop at teardown."""
    servers: list[SimServer] = []

    async def start(**kw: Any) -> SimServer:
        server = SimServer(options(**kw), index=0)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def server(make_server: ServerFactory) -> SimServer:
    return await make_server()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def make_client() -> AsyncIterator[Callable[[SimServer], AsyncOpenAI]]:
    """The official OpenAI client pointed at a server's /v1 (no retries, so errors surface as-is)."""
    clients: list[AsyncOpenAI] = []

    def make(server: SimServer, **kw: Any) -> AsyncOpenAI:
        kw.setdefault("timeout", 10.0)
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, **kw)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def client(server: SimServer, make_client: Callable[[SimServer], AsyncOpenAI]) -> AsyncOpenAI:
    return make_client(server)


# Helpers.


class Metrics:
    """One /metrics scrape, parsed with prometheus_client's text parser."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, sample_name: str, **labels: str) -> list[Sample]:
        family = sample_name
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            if family not in self.families and family.endswith(suffix):
                family = family.removesuffix(suffix)
        if family not in self.families:
            return []
        return [
            s
            for s in self.families[family].samples
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, sample_name: str, **labels: str) -> float:
        """The value of the one sample with this name and these labels (0 when absent)."""
        found = self.samples(sample_name, **labels)
        assert len(found) <= 1, f"{sample_name} {labels}: {len(found)} samples"
        return found[0].value if found else 0.0


async def scrape(http: aiohttp.ClientSession, server: SimServer) -> Metrics:
    async with http.get(server.url + "/metrics") as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        return Metrics(await r.text())


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll a condition on the event loop until it holds (fails after `timeout` wall seconds)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_consecutive_ports(n: int, attempts: int = 50) -> int:
    """A port p such that p .. p+n-1 are free right now on 127.0.0.1."""
    for _ in range(attempts):
        base = free_port()
        if base + n > 65535:
            continue
        with contextlib.ExitStack() as stack:
            try:
                for p in range(base, base + n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {n} consecutive free ports")


def token_prompt(start: int, n: int) -> list[int]:
    """A prompt of n token ids start, start+1, ... (ids pass through the server unchanged)."""
    assert start >= 0 and start + n < 32_000
    return list(range(start, start + n))
