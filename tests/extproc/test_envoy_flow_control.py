"""Flow control behind a real Envoy, in the body modes GIE's gateways configure: a queued request's
ext_proc stream stays open until it is dispatched, a refusal or expiry comes back as an immediate
response with upstream's status and dropped-reason header, and a client that goes away takes its
request out of the queue."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from epick.requestcontrol.admission import DROPPED_REASON_HEADER
from tests.conftest import MakeApp
from tests.datalayer.pages import wait_until
from tests.extproc.gateway import Gateway, running_gateway
from tests.extproc.test_envoy import GIE
from tests.proxy.conftest import MODEL, FakeModelServer
from tests.proxy.test_flow_control import flow_config


@pytest.fixture
async def gated(make_app: MakeApp) -> AsyncIterator[FakeModelServer]:
    fake = FakeModelServer("gated")
    fake.server = await make_app(fake.app())
    yield fake
    fake.gate.set()


@pytest.fixture
async def hung(make_app: MakeApp) -> AsyncIterator[FakeModelServer]:
    fake = FakeModelServer("hang")
    fake.server = await make_app(fake.app())
    yield fake
    fake.gate.set()


@asynccontextmanager
async def gateway_for(tmp: Path, fake: FakeModelServer, **config: object) -> AsyncIterator[Gateway]:
    host, _, port = fake.name.rpartition(":")
    loaded = flow_config(**config)  # type: ignore[arg-type]
    async with running_gateway(tmp, GIE, backends=[(host, int(port))], config=loaded) as gw:
        yield gw


async def post(session: aiohttp.ClientSession, gw: Gateway, name: str) -> tuple[int, str, str]:
    body = {"model": MODEL, "prompt": name, "max_tokens": 2, "stream": True}
    async with session.post(gw.url + "/v1/completions", json=body, headers={"x-request-id": name}) as r:
        text = await r.text()
        return r.status, r.headers.get(DROPPED_REASON_HEADER, ""), text


def served(fake: FakeModelServer) -> list[str]:
    return [json.loads(raw)["prompt"] for _, raw in fake.requests]


async def test_queued_streams_wait_and_a_full_band_is_refused(tmp_path: Path, gated: FakeModelServer) -> None:
    async with gateway_for(tmp_path, gated, band_limit=1) as gw:
        admission = gw.service.director.admission
        assert admission is not None
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(post(session, gw, "A"))
            await wait_until(lambda: len(gated.requests) == 1, what="A at the model server")
            second = asyncio.create_task(post(session, gw, "B"))
            await wait_until(lambda: admission.queued == 1, what="B queued, its stream open")
            status, reason, text = await post(session, gw, "C")
            assert (status, reason) == (429, "rejected-saturated")
            assert json.loads(text)["error"]["code"] == "rejected-saturated"
            gated.gate.set()
            assert [(await first)[0], (await second)[0]] == [200, 200]
        assert served(gated) == ["A", "B"]


async def test_an_expired_request_gets_429_from_the_gateway(tmp_path: Path, gated: FakeModelServer) -> None:
    async with gateway_for(tmp_path, gated, ttl="200ms") as gw:
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(post(session, gw, "A"))
            await wait_until(lambda: len(gated.requests) == 1, what="A at the model server")
            status, reason, _ = await post(session, gw, "late")
            assert (status, reason) == (429, "rejected-ttl-expired")
            gated.gate.set()
            assert (await first)[0] == 200
        assert served(gated) == ["A"]


async def test_a_client_gone_while_queued_leaves_the_queue(tmp_path: Path, gated: FakeModelServer) -> None:
    async with gateway_for(tmp_path, gated) as gw:
        admission = gw.service.director.admission
        assert admission is not None
        async with aiohttp.ClientSession() as session:
            first = asyncio.create_task(post(session, gw, "A"))
            await wait_until(lambda: len(gated.requests) == 1, what="A at the model server")
            leaving = asyncio.create_task(post(session, gw, "gone"))
            await wait_until(lambda: admission.queued == 1, what="the request to queue")
            leaving.cancel()  # the downstream connection closes: Envoy ends the ext_proc stream
            await wait_until(lambda: admission.queued == 0, what="the queue to forget it")
            gated.gate.set()
            assert (await first)[0] == 200
        assert served(gated) == ["A"]


async def test_an_evicted_request_gets_an_immediate_429(tmp_path: Path, hung: FakeModelServer) -> None:
    async with gateway_for(tmp_path, hung, eviction=True) as gw:
        gw.service.director.set_objectives({"urgent": 10, "batch": -5})
        async with aiohttp.ClientSession() as session:

            async def post_as(name: str, objective: str) -> tuple[int, str]:
                body = {"model": MODEL, "prompt": name, "max_tokens": 2}
                headers = {"x-request-id": name, "x-gateway-inference-objective": objective}
                async with session.post(gw.url + "/v1/completions", json=body, headers=headers) as r:
                    await r.read()
                    return r.status, r.headers.get(DROPPED_REASON_HEADER, "")

            batch = asyncio.create_task(post_as("batch", "batch"))
            await wait_until(lambda: len(hung.requests) == 1, what="the batch request at the model server")
            urgent = asyncio.create_task(post_as("urgent", "urgent"))
            assert await batch == (429, "evicted")
            await wait_until(lambda: len(hung.requests) == 2, what="the urgent request at the model server")
            hung.gate.set()
            assert (await urgent)[0] == 200
        assert served(hung) == ["batch", "urgent"]
