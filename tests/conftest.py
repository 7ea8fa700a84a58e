"""Fixtures shared by every test package: simulated model servers and small throwaway HTTP apps."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from epick.sim.server import SimServer
from tests.datalayer.pages import AppServer, start_sim, stop_sim

SIM_SEED = 11  # failure injection draws from it: fixed, so a test's failures repeat

MakeSim = Callable[..., Awaitable[SimServer]]
MakeApp = Callable[[web.Application], Awaitable[AppServer]]


@pytest.fixture
async def make_sim() -> AsyncIterator[MakeSim]:
    """`make_sim(**ServerOptions fields)`: a started simulated server, stopped at teardown."""
    servers: list[SimServer] = []

    async def start(**kw: Any) -> SimServer:
        kw.setdefault("seed", SIM_SEED + len(servers))
        server = await start_sim(**kw)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await stop_sim(server)


@pytest.fixture
async def make_app() -> AsyncIterator[MakeApp]:
    """`make_app(app)`: an aiohttp app served on a free loopback port, stopped at teardown."""
    apps: list[AppServer] = []

    async def start(app: web.Application) -> AppServer:
        server = await AppServer(app).start()
        apps.append(server)
        return server

    yield start
    for server in apps:
        await server.stop()


@pytest.fixture
async def fake() -> AsyncIterator[Any]:
    """The Kubernetes API double (tests/kubernetes/fake_apiserver.py), started and stopped."""
    from tests.kubernetes.fake_apiserver import FakeApiServer

    server = await FakeApiServer().start()
    yield server
    await server.stop()


@pytest.fixture
async def api(fake: Any) -> AsyncIterator[Any]:
    """A kubernetes-asyncio API client on the double (no credentials: a plain HTTP server)."""
    from kubernetes_asyncio import client

    async with client.ApiClient(client.Configuration(host=fake.url)) as api_client:
        yield api_client


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Any]:
    """A real redis-server on a free loopback port (tests/redis_server.py), killed at the end."""
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path).start()
    yield server
    server.stop()
