"""What a request holds in the in-flight producer is released however the proxy's answer ends: a
served response, every endpoint failing, a retry on another endpoint (the load moves with it)."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from epick.config import load_config_text
from epick.plugins.load.inflight import InFlightLoadProducer
from tests.conftest import MakeApp
from tests.datalayer.pages import vllm_page
from tests.proxy.conftest import MODEL, SEED, MakeService, proxy_url

CONFIG = (
    "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
    "- type: active-request-scorer\n- type: max-score-picker\n"
)


def server(status: int) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=vllm_page(model=MODEL), content_type="text/plain")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def complete(request: web.Request) -> web.Response:
        await request.read()
        if status != 200:
            return web.json_response({"error": "down"}, status=status)
        return web.json_response({"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 1}})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", complete)
    return app


def producer_of(service: object) -> InFlightLoadProducer:
    plugin = service.director.config.plugins["inflight-load-producer"]  # type: ignore[attr-defined]
    assert isinstance(plugin, InFlightLoadProducer)
    return plugin


async def test_a_request_every_endpoint_failed_releases_its_load(
    make_app: MakeApp, make_service: MakeService
) -> None:
    down = await make_app(server(503))
    service = await make_service([down.host_port], load_config_text(CONFIG, seed=SEED))
    async with aiohttp.ClientSession() as http:
        for _ in range(5):
            body = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
            async with http.post(proxy_url(service) + "/v1/completions", json=body) as r:
                assert r.status == 503
    load = producer_of(service).load(down.host_port)
    assert (load.requests, load.tokens) == (0, 0)


async def test_a_retry_moves_the_load_to_the_endpoint_that_serves(
    make_app: MakeApp, make_service: MakeService
) -> None:
    down, up = await make_app(server(503)), await make_app(server(200))
    service = await make_service([down.host_port, up.host_port], load_config_text(CONFIG, seed=SEED))
    async with aiohttp.ClientSession() as http:
        for _ in range(4):
            body = {"model": MODEL, "prompt": "hello there", "max_tokens": 2}
            async with http.post(proxy_url(service) + "/v1/completions", json=body) as r:
                assert r.status == 200
    producer = producer_of(service)
    assert producer.load(down.host_port).requests == 0
    assert producer.load(up.host_port).requests == 0
