"""Fixtures for the end-to-end tests: simulated model servers behind a running epick Service.

Everything listens on free loopback ports. Simulated time runs fast (time_scale 1000). Every server,
service, client and session a test opens is closed at teardown, so `filterwarnings = error` sees no
unclosed resources.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from epick.config import LoadedConfig, load_config_text
from epick.datalayer.datastore import EndpointSpec
from epick.proxy.server import ProxyOptions
from epick.service import Service, Settings
from tests.conftest import MakeApp
from tests.datalayer.pages import AppServer, vllm_page, wait_until

SEED = 11
MODEL = "sim-model"
SESSION_HEADER = "x-session-token"

MakeService = Callable[..., Awaitable[Service]]
MakeClient = Callable[[Service], AsyncOpenAI]


def steering_config(fallbacks: int = 1) -> LoadedConfig:
    """A config that sends a request to the endpoint its x-session-token names (others tie)."""
    return load_config_text(
        f"""\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-scorer
- type: max-score-picker
  parameters: {{maxNumOfEndpoints: {fallbacks}}}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
  - pluginRef: max-score-picker
""",
        seed=SEED,
    )


def to(name: str) -> dict[str, str]:
    """Headers that steer a request to endpoint `name` under `steering_config`."""
    return {SESSION_HEADER: base64.b64encode(name.encode()).decode()}


def endpoint(host_port: str) -> EndpointSpec:
    host, _, port = host_port.rpartition(":")
    return EndpointSpec(host_port, host, int(port), {})


def proxy_url(service: Service) -> str:
    assert service.proxy is not None
    return f"http://127.0.0.1:{service.proxy.port}"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def completion_chunk(i: int, model: str = MODEL) -> dict[str, Any]:
    return {
        "id": "cmpl-fake",
        "object": "text_completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "text": f"tok{i} ", "logprobs": None, "finish_reason": None}],
    }


FLOOD_EVENTS = 1024


def flood_event(i: int) -> bytes:
    """Event `i` of a "flood" stream: 32 KiB, numbered."""
    head = b"data: %06d " % i
    return head + b"x" * (32 * 1024 - len(head) - 2) + b"\n\n"


class FakeModelServer:
    """A model server that misbehaves on purpose.

    mode "die": streams two SSE chunks, then drops the connection (and its /metrics fails from then on);
    "gated": streams one chunk, waits for `gate`, then the rest; "echo": answers with what it received;
    "gzip": the same, compressed when the client accepts it; "ratelimit": 429 with Retry-After;
    "unavailable": 503 to every generation request (its /metrics is fine); "hang": accepts a request
    and sends nothing until `gate` (a hung server); "flood": streams FLOOD_EVENTS events of 32 KiB
    as fast as it may write them, counting the bytes written (`sent`).
    """

    def __init__(self, mode: str, model: str = MODEL) -> None:
        self.mode = mode
        self.model = model
        self.alive = True
        self.gate = asyncio.Event()
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.server: AppServer | None = None
        self.sent = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        return app

    @property
    def name(self) -> str:
        assert self.server is not None
        return self.server.host_port

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.alive:
            return web.Response(status=500, text="engine dead")
        return web.Response(text=vllm_page(model=self.model), content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}
        return web.json_response({"object": "list", "data": [card]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append((dict(request.headers), body))
        if self.mode == "unavailable":
            return web.json_response({"error": {"message": "overloaded", "type": "server_error"}}, status=503)
        if self.mode == "hang":
            await self.gate.wait()
        if self.mode == "ratelimit":
            error = {"error": {"message": "slow down", "type": "rate_limit_error", "code": None}}
            return web.json_response(error, status=429, headers={"Retry-After": "7", "x-fake": self.mode})
        if self.mode in ("echo", "gzip"):
            # Connection names x-hop as hop-by-hop: a proxy must not pass it on.
            extra = {"x-fake": self.mode, "Connection": "x-hop", "x-hop": "1"}
            answer = web.json_response(
                {"headers": dict(request.headers), "body": json.loads(body)}, headers=extra
            )
            if self.mode == "gzip":
                answer.enable_compression()  # as a server behind GZip middleware does
            return answer
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-fake": self.mode})
        await response.prepare(request)
        if self.mode == "flood":
            for i in range(FLOOD_EVENTS):
                event = flood_event(i)
                await response.write(event)
                self.sent += len(event)
            await response.write_eof()
            return response
        await response.write(sse(completion_chunk(0, self.model)))
        if self.mode == "gated":
            await self.gate.wait()
        await response.write(sse(completion_chunk(1, self.model)))
        if self.mode == "die":
            self.alive = False
            assert request.transport is not None
            request.transport.close()  # abruptly, mid-stream: no terminating chunk
            return response
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@pytest.fixture
async def make_fake(make_app: MakeApp) -> AsyncIterator[Callable[..., Awaitable[FakeModelServer]]]:
    fakes: list[FakeModelServer] = []

    async def start(mode: str, model: str = MODEL) -> FakeModelServer:
        fake = FakeModelServer(mode, model)
        fake.server = await make_app(fake.app())
        fakes.append(fake)
        return fake

    yield start
    for fake in fakes:
        fake.gate.set()  # let a gated handler finish before its app shuts down


@pytest.fixture
async def make_service() -> AsyncIterator[MakeService]:
    """`make_service(["host:port", ...], config=None, wait=True, **Settings/ProxyOptions fields)`."""
    services: list[Service] = []

    async def start(
        endpoints: list[str], config: LoadedConfig | None = None, *, wait: bool = True, **kw: Any
    ) -> Service:
        proxy_fields = {
            k: kw.pop(k)
            for k in (
                "max_body_bytes",
                "connect_timeout",
                "read_timeout",
                "expose_endpoint",
                "head_timeout",
                "body_timeout",
                "keepalive_timeout",
                "max_connections",
                "first_byte_timeout",
                "request_timeout",
            )
            if k in kw
        }
        proxy_fields.setdefault("expose_endpoint", True)  # tests check where a request went
        kw.setdefault("refresh_metrics_interval", 0.02)
        options = Settings(
            endpoints=tuple(endpoint(e) for e in endpoints),
            proxy=ProxyOptions(host="127.0.0.1", port=0, **proxy_fields),
            metrics_port=None,
            seed=SEED,
            **kw,
        )
        service = Service(options, config)
        await service.start()
        services.append(service)
        if wait:  # every endpoint scraped once: the scheduler sees real metrics from the start
            await wait_until(
                lambda: all(
                    ep.metrics.update_time is not None or not service.datastore.is_healthy(ep.name)
                    for ep in service.datastore.all_endpoints()
                ),
                what="first scrapes",
            )
        return service

    yield start
    for service in services:
        await service.stop()


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    clients: list[AsyncOpenAI] = []

    def make(service: Service) -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=proxy_url(service) + "/v1", api_key="x", max_retries=0, timeout=10.0)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session
