"""Fixtures for the data-layer tests: simulated model servers, misbehaving apps, an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from epick.sim.server import SimServer
from tests.datalayer.pages import AppServer, start_sim, stop_sim


@pytest.fixture
async def make_sim() -> AsyncIterator[Callable[..., Awaitable[SimServer]]]:
    servers: list[SimServer] = []

    async def start(**kw: Any) -> SimServer:
        server = await start_sim(**kw)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await stop_sim(server)


@pytest.fixture
async def make_app() -> AsyncIterator[Callable[[web.Application], Awaitable[AppServer]]]:
    apps: list[AppServer] = []

    async def start(app: web.Application) -> AppServer:
        server = await AppServer(app).start()
        apps.append(server)
        return server

    yield start
    for server in apps:
        await server.stop()
