"""End to end through a real Envoy: ext_proc decides, an original-destination cluster routes.

Every body mode a gateway can configure is tried: requests must land on the endpoint epick chose (the
simulator's identity header), streams must pass through, every response must be reported complete,
errors come back as epick's immediate responses, a mode epick cannot serve is named in the answer and
in epick's log, and with epick down a fail-closed gateway answers 5xx.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from epick.extproc import exchange
from epick.sim.server import IDENTITY_HEADER
from tests.extproc.gateway import (
    EXAMPLE,
    FULL_DUPLEX,
    Gateway,
    MessageLog,
    Modes,
    ext_proc_filter,
    running_gateway,
)

BODY_MODES = ("BUFFERED", "STREAMED", FULL_DUPLEX)
RESPONSE_MODES = ("NONE", "STREAMED", FULL_DUPLEX)
# What GIE's and llm-d's gateway manifests configure, as the shipped example has it.
_example_modes = ext_proc_filter(yaml.safe_load(EXAMPLE.read_text()))["processing_mode"]
GIE = Modes(_example_modes["request_body_mode"], _example_modes["response_body_mode"])


@pytest.fixture(params=[Modes(req, resp) for req in BODY_MODES for resp in RESPONSE_MODES], ids=str)
async def any_gateway(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path, request.param) as gw:
        yield gw


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(tmp_path, GIE) as gw:
        yield gw


async def test_plain_and_streamed_requests_land_where_epick_chose(any_gateway: Gateway) -> None:
    gateway = any_gateway
    landed: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        for i in range(8):
            body = {"model": "sim-model", "prompt": f"group {i % 4} " + "shared context " * 40 + str(i),
                    "max_tokens": 3}  # fmt: skip
            headers = {"x-request-id": f"r{i}"}
            async with session.post(gateway.url + "/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["usage"]["completion_tokens"] == 3
                landed[f"r{i}"] = r.headers[IDENTITY_HEADER]
        for i in range(2):
            body = {"model": "sim-model", "messages": [{"role": "user", "content": f"stream {i}"}],
                    "max_tokens": 6, "stream": True}  # fmt: skip
            headers = {"x-request-id": f"s{i}"}
            async with session.post(gateway.url + "/v1/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                events = [line async for line in r.content if line.startswith(b"data: ")]
                landed[f"s{i}"] = r.headers[IDENTITY_HEADER]
            assert events[-1].strip() == b"data: [DONE]"
            chunks = [json.loads(e[6:]) for e in events[:-1]]
            assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 6
    assert set(landed) == set(gateway.decisions)
    for request_id, server in landed.items():
        assert server == gateway.decisions[request_id].targets[0].host_port
    # Whatever the response body mode, every response is reported complete, so in-flight counts
    # cannot leak.
    await gateway.wait_completed(set(landed))


@pytest.mark.parametrize("modes", [GIE, Modes("STREAMED", "STREAMED", early_body=True)], ids=str)
async def test_a_body_in_several_messages_is_routed_whole(
    tmp_path: Path, modes: Modes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client sends the body in two pieces and waits until epick has seen the first on its own, so
    Envoy certainly forwards it in several messages; the body is large enough that epick sends it back
    in several 62,000-byte chunks (full duplex)."""
    seen = MessageLog(monkeypatch)
    raw = json.dumps({"model": "sim-model", "prompt": "long " * 40_000, "max_tokens": 2}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        yield raw[:1000]
        await asyncio.wait_for(seen.body_split.wait(), 10)
        yield raw[1000:]

    async with running_gateway(tmp_path, modes) as gateway, aiohttp.ClientSession() as session:
        headers = {"content-type": "application/json", "x-request-id": "big"}
        async with session.post(gateway.url + "/v1/completions", data=pieces(), headers=headers) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["usage"]["completion_tokens"] == 2
            assert r.headers[IDENTITY_HEADER] == gateway.decisions["big"].targets[0].host_port
        assert gateway.decisions["big"].request.body.prompt == "long " * 40_000
    bodies = [eos for kind, eos in seen.seen if kind == "request_body"]
    assert len(bodies) >= 2 and bodies[-1] and not bodies[0]


async def test_bad_request_is_answered_by_epick(gateway: Gateway) -> None:
    url = gateway.url + "/v1/completions"
    async with aiohttp.ClientSession() as session, session.post(url, json={"prompt": "no model"}) as r:
        assert r.status == 400
        body = await r.json()
    assert "model" in body["error"]["message"]


async def test_client_destination_header_is_not_trusted(gateway: Gateway) -> None:
    victim = gateway.sims[0]
    body = {"model": "sim-model", "prompt": "where do I go", "max_tokens": 1}
    async with aiohttp.ClientSession() as session:
        for i in range(6):
            headers = {"x-gateway-destination-endpoint": f"127.0.0.1:{victim.port}", "x-request-id": f"d{i}"}
            async with session.post(gateway.url + "/v1/completions", json=body, headers=headers) as r:
                assert r.status == 200
                assert r.headers[IDENTITY_HEADER] == gateway.decisions[f"d{i}"].targets[0].host_port


async def test_fail_closed_when_epick_is_down(gateway: Gateway) -> None:
    assert gateway.service.extproc is not None
    await gateway.service.extproc.stop()
    body = {"model": "sim-model", "prompt": "anyone there", "max_tokens": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/completions", json=body) as r,
    ):
        assert r.status >= 500


async def test_a_mode_epick_cannot_serve_is_named_in_the_answer_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(exchange, "_logged_unroutable", set())
    caplog.set_level(logging.ERROR, logger="epick.extproc.exchange")
    body = {"model": "sim-model", "prompt": "no body for epick", "max_tokens": 1}
    async with (
        running_gateway(tmp_path, Modes("NONE", "NONE"), servers=1) as gateway,
        aiohttp.ClientSession() as session,
    ):
        for _ in range(2):
            async with session.post(gateway.url + "/v1/completions", json=body) as r:
                assert r.status == 500
                error = (await r.json())["error"]
            assert error["code"] == "extproc_mode_unsupported"
            assert "request_body_mode NONE" in error["message"]
    logged = [r.getMessage() for r in caplog.records if r.name == "epick.extproc.exchange"]
    assert len(logged) == 1 and "request_body_mode NONE" in logged[0]  # once, not once per request


async def test_a_body_over_the_limit_gets_413_through_the_gateway(tmp_path: Path) -> None:
    raw = json.dumps({"model": "sim-model", "prompt": "big " * 100_000}).encode()
    async with (
        running_gateway(tmp_path, GIE, servers=1, max_body_bytes=64 * 1024) as gateway,
        aiohttp.ClientSession() as session,
        session.post(
            gateway.url + "/v1/completions", data=raw, headers={"content-type": "application/json"}
        ) as r,
    ):
        assert r.status == 413
        assert (await r.json())["error"]["code"] == "body_too_large"
    assert gateway.decisions == {}
