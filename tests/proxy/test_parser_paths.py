"""The parsers through the standalone proxy: every path a parser claims is served and forwarded to the
same path with the body intact; a path none claims gets a JSON 404 naming the accepted ones; another
method on a claimed path gets 405; a malformed body gets 400 and reaches no backend; and the token usage
of whole and streamed responses reaches the `inference_objective_*_tokens` metrics.

The backend is a small loopback app that records what it receives (path with query, headers, body) and
answers with the bytes a test sets, in the pieces the test sets.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from epick.config import LoadedConfig, load_config_text
from epick.proxy.server import ENDPOINT_HEADER
from epick.service import Service
from tests.conftest import MakeApp
from tests.datalayer.pages import AppServer, vllm_page, wait_until
from tests.proxy.conftest import MODEL, SEED, MakeService, proxy_url

HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


def parsers_config(*refs: str) -> LoadedConfig:
    listed = "".join(f"  - pluginRef: {ref}\n" for ref in refs)
    return load_config_text(HEADER + "requestHandler:\n  parsers:\n" + listed, seed=SEED)


EVERY_PARSER = (
    "openai-parser",
    "anthropic-parser",
    "vllmhttp-parser",
    "sglanghttp-parser",
    "passthrough-parser",
)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str  # with the query, as it came
    headers: dict[str, str]
    body: bytes


class Backend:
    """A model server that accepts a POST on any path, records it, and answers `reply`."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.content_type = "application/json"
        self.chunks: list[bytes] = [b'{"ok": true}']
        self.server: AppServer | None = None

    def reply(self, content_type: str, *chunks: bytes) -> None:
        self.content_type = content_type
        self.chunks = list(chunks)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_route("POST", "/{path:.*}", self._any)
        return app

    @property
    def name(self) -> str:
        assert self.server is not None
        return self.server.host_port

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=vllm_page(model=MODEL), content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "test"}
        return web.json_response({"object": "list", "data": [card]})

    async def _any(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Seen(request.method, request.raw_path, dict(request.headers), body))
        response = web.StreamResponse(headers={"Content-Type": self.content_type})
        await response.prepare(request)
        for chunk in self.chunks:
            await response.write(chunk)  # one write each: the proxy may see them apart
        await response.write_eof()
        return response


@pytest.fixture
async def backend(make_app: MakeApp) -> Backend:
    server = Backend()
    server.server = await make_app(server.app())
    return server


def sse(*events: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


def tokens(service: Service, kind: str, model: str = MODEL) -> tuple[float | None, float | None]:
    """(sum, count) of `inference_objective_{kind}_tokens` for a model (None: never observed)."""
    labels = {"model_name": model, "target_model_name": model}
    registry = service.metrics.registry
    name = f"inference_objective_{kind}"
    return (
        registry.get_sample_value(f"{name}_sum", labels),
        registry.get_sample_value(f"{name}_count", labels),
    )


async def observed(service: Service, model: str = MODEL) -> tuple[float | None, float | None, float | None]:
    """The (input, output, cached) token sums once the response's usage has been observed."""
    await wait_until(lambda: tokens(service, "input_tokens", model)[1] is not None, what="usage observed")
    return (
        tokens(service, "input_tokens", model)[0],
        tokens(service, "output_tokens", model)[0],
        tokens(service, "prompt_cached_tokens", model)[0],
    )


async def error_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    assert response.content_type == "application/json"
    doc = await response.json()
    assert set(doc) == {"error"}
    error: dict[str, Any] = doc["error"]
    assert isinstance(error["message"], str)
    return error


# Every parser's paths, each with a body its parser accepts, spelt with odd spacing and key order so
# that a re-encoded body would differ.
CHAT = b'{"messages": [{"role": "user",   "content": "Hi"}],  "model": "sim-model", "max_tokens": 2}'
SERVED: list[tuple[str, bytes]] = [
    ("/v1/completions", b'{ "prompt": "Say hi",\n "model": "sim-model" , "max_tokens": 2 }'),
    ("/v1/chat/completions", CHAT),
    ("/v1/chat/completions/render", CHAT),
    ("/v1/completions/render", b'{"model":"sim-model","prompt":"hi"}'),
    ("/v1/responses", b'{"input": "Hi",  "model": "sim-model", "instructions": "Be terse."}'),
    ("/v1/embeddings", b'{"input": ["a", "b"],   "model": "sim-model"}'),
    ("/v1/conversations", b'{"model": "sim-model", "items": [{"type": "message", "content": "x"}]}'),
    ("/v1/images/generations", b'{"prompt": "a cat" , "model": "sim-model"}'),
    (
        "/v1/messages",
        b'{"max_tokens": 64, "model": "sim-model",  "messages": [{"role": "user", "content": "Hi"}]}',
    ),
    ("/v1/messages/count_tokens", b'{"model": "sim-model", "messages": [{"role": "user", "content": "Hi"}]}'),
    ("/inference/v1/generate", b'{"token_ids": [1, 2, 3],  "model": "sim-model", "sampling_params": {}}'),
    ("/generate", b'{"input_ids": [5, 6, 7],   "sampling_params": {"max_new_tokens": 4}}'),
    # passthrough-parser, the fallback: any path, any body.
    ("/v1/rerank", b"not json at all \x00\xff"),
    ("/tokenize", b'{"prompt": "no model here"}'),
    # The query is forwarded as sent; the parser is chosen by the path alone.
    ("/v1/chat/completions?api-version=2024-06-01&x=a%26b%3Dc", CHAT),
]


async def test_every_parsers_paths_reach_the_backend_unchanged(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([backend.name], parsers_config(*EVERY_PARSER))
    for path, raw in SERVED:
        url = URL(proxy_url(service) + path, encoded=True)  # the query as spelt, not requoted
        async with http.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 200, (path, await r.text())
            assert r.headers[ENDPOINT_HEADER] == backend.name
            assert await r.json() == {"ok": True}
        seen = backend.requests[-1]
        assert seen.method == "POST"
        assert seen.path == path
        assert seen.body == raw, path
    assert len(backend.requests) == len(SERVED)


async def test_the_default_parsers_serve_openai_anthropic_vllm_and_anything_else(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([backend.name])  # no requestHandler: upstream's default list
    paths = ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/inference/v1/generate", "/generate"]
    bodies = {p: raw for p, raw in SERVED}
    for path in paths:
        async with http.post(proxy_url(service) + path, data=bodies[path]) as r:
            assert r.status == 200, (path, await r.text())
        assert (backend.requests[-1].path, backend.requests[-1].body) == (path, bodies[path])


async def test_an_unclaimed_path_gets_a_json_404_naming_the_accepted_paths(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([backend.name], parsers_config("openai-parser", "anthropic-parser"))
    for path in ("/v1/rerank", "/generate", "/inference/v1/generate", "/"):
        async with http.post(proxy_url(service) + path, data=b'{"model": "sim-model"}') as r:
            assert r.status == 404, path
            error = await error_of(r)
        assert error["code"] == "path_not_served"
        assert repr(path) in error["message"]
        for accepted in (
            "/chat/completions",
            "/completions",
            "/responses",
            "/embeddings",
            "/conversations",
            "/images/generations",
            "/messages",
            "/messages/count_tokens",
        ):
            assert accepted in error["message"]
    assert backend.requests == []


async def test_the_single_gie_parser_serves_only_its_paths(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    config = load_config_text(HEADER + "parser:\n  pluginRef: anthropic-parser\n", seed=SEED)
    service = await make_service([backend.name], config)
    messages = dict(SERVED)["/v1/messages"]
    async with http.post(proxy_url(service) + "/v1/messages", data=messages) as r:
        assert r.status == 200
    async with http.post(proxy_url(service) + "/v1/chat/completions", data=CHAT) as r:
        assert r.status == 404
        error = await error_of(r)
    assert error["message"].endswith("/messages, /messages/count_tokens")
    assert [s.path for s in backend.requests] == ["/v1/messages"]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
async def test_another_method_on_a_claimed_path_gets_405(
    method: str, backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([backend.name], parsers_config(*EVERY_PARSER))
    for path in ("/v1/chat/completions", "/v1/messages", "/inference/v1/generate", "/generate"):
        async with http.request(method, proxy_url(service) + path) as r:
            assert r.status == 405, (method, path)
            assert r.headers["Allow"] == "POST"
            error = await error_of(r)
        assert error["code"] == "method_not_allowed"
        assert method in error["message"] and path in error["message"]
    assert backend.requests == []


async def test_a_get_on_a_path_no_parser_claims_is_404(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    for config in (parsers_config("openai-parser"), parsers_config("openai-parser", "passthrough-parser")):
        service = await make_service([backend.name], config)
        async with http.get(proxy_url(service) + "/v1/rerank") as r:
            assert r.status == 404
            await error_of(r)
        # The proxy's own GET routes stay served.
        async with http.get(proxy_url(service) + "/v1/models") as r:
            assert r.status == 200
    assert backend.requests == []


@pytest.mark.parametrize(
    "case",
    [
        ("/v1/chat/completions", b"{not json", "not valid JSON"),
        ("/v1/chat/completions", b'{"model": "sim-model"}', "'messages'"),
        ("/v1/completions", b'{"prompt": "hi"}', "'model'"),
        ("/v1/embeddings", b'{"model": "sim-model"}', "'input'"),
        ("/v1/messages", b'{"model": "sim-model", "messages": []}', "'messages'"),
        (
            "/v1/messages/",
            b'{"model": "sim-model", "messages": [{"role": "user", "content": "x"}]}',
            "/v1/messages/",
        ),
        ("/inference/v1/generate", b'{"model": "sim-model", "token_ids": []}', "'token_ids'"),
        ("/generate", b'{"input_ids": [[1], [2]]}', "batch"),
        ("/v1/generate", b'{"input_ids": [1]}', "/generate"),
    ],
)
async def test_a_malformed_body_gets_400_and_reaches_no_backend(
    case: tuple[str, bytes, str], backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    path, raw, names = case
    config = parsers_config("openai-parser", "anthropic-parser", "vllmhttp-parser", "sglanghttp-parser")
    service = await make_service([backend.name], config)
    async with http.post(proxy_url(service) + path, data=raw) as r:
        assert r.status == 400
        error = await error_of(r)
    assert error["code"] == "bad_request"
    assert names in error["message"]
    assert backend.requests == []


async def test_an_embeddings_body_without_a_model_gets_400(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([backend.name])
    async with http.post(proxy_url(service) + "/v1/embeddings", json={"input": "hello"}) as r:
        assert r.status == 400
        error = await error_of(r)
    assert "'model'" in error["message"]
    assert backend.requests == []


# Token usage, observed in the metrics.


async def test_openai_streaming_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "usage": None}
    usage_line = sse(
        {
            **chunk,
            "choices": [],
            "usage": {
                "prompt_tokens": 7,
                "completion_tokens": 10,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        }
    )
    cut = len(usage_line) // 2
    pieces = (
        sse({**chunk, "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}),
        usage_line[:cut],  # the usage line split between two writes
        usage_line[cut:] + b"data: [DONE]",
        b"\n\n",
    )
    backend.reply("text/event-stream", *pieces)
    service = await make_service([backend.name])
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(proxy_url(service) + "/v1/chat/completions", json=payload) as r:
        assert r.status == 200
        assert r.content_type == "text/event-stream"
        assert await r.read() == b"".join(pieces)  # relayed untouched
    assert await observed(service) == (7, 10, 4)
    assert tokens(service, "output_tokens")[1] == 1  # one response, one observation


async def test_openai_json_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    answer = json.dumps(
        {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    ).encode()
    backend.reply("application/json", answer[:20], answer[20:])
    service = await make_service([backend.name])
    async with http.post(proxy_url(service) + "/v1/completions", json={"model": MODEL, "prompt": "hi"}) as r:
        assert r.status == 200
        assert await r.read() == answer
    assert await observed(service) == (3, 2, 0)


async def test_responses_api_streaming_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    completed = {
        "type": "response.completed",
        "response": {
            "usage": {"input_tokens": 31, "output_tokens": 12, "input_tokens_details": {"cached_tokens": 8}}
        },
    }
    backend.reply(
        "text/event-stream",
        b"event: response.created\n" + sse({"type": "response.created", "response": {"usage": None}}),
        b"event: response.completed\n" + sse(completed),
    )
    service = await make_service([backend.name])
    payload = {"model": MODEL, "input": "Hi", "stream": True}
    async with http.post(proxy_url(service) + "/v1/responses", json=payload) as r:
        assert r.status == 200
        await r.read()
    assert await observed(service) == (31, 12, 8)


async def test_anthropic_streaming_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    def event(obj: dict[str, Any]) -> bytes:
        return f"event: {obj['type']}\n".encode() + sse(obj)

    start = event(
        {
            "type": "message_start",
            "message": {"id": "m", "usage": {"input_tokens": 25, "cache_read_input_tokens": 10}},
        }
    )
    delta = event(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}}
    )
    backend.reply(
        "text/event-stream",
        start,
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
        delta[:30],
        delta[30:],
        event({"type": "message_stop"}),
    )
    service = await make_service([backend.name])
    payload = {
        "model": MODEL,
        "max_tokens": 32,
        "stream": True,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    async with http.post(proxy_url(service) + "/v1/messages", json=payload) as r:
        assert r.status == 200
        await r.read()
    assert await observed(service) == (25, 15, 10)


async def test_anthropic_count_tokens_response_is_not_read(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    # A body shaped like usage: were it read, it would be observed.
    backend.reply(
        "application/json", b'{"input_tokens": 9, "usage": {"input_tokens": 9, "output_tokens": 1}}'
    )
    service = await make_service([backend.name])
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    async with http.post(proxy_url(service) + "/v1/messages/count_tokens", json=payload) as r:
        assert r.status == 200
        assert (await r.json())["input_tokens"] == 9
    # A later request whose usage is read: once it is observed, the first one's would have been too.
    backend.reply("application/json", b'{"usage": {"prompt_tokens": 3, "completion_tokens": 2}}')
    async with http.post(proxy_url(service) + "/v1/completions", json={"model": MODEL, "prompt": "x"}) as r:
        assert r.status == 200
    assert await observed(service) == (3, 2, 0)
    assert tokens(service, "input_tokens") == (3, 1)
    assert tokens(service, "input_tokens", "") == (None, None)


async def test_vllm_generate_streaming_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    backend.reply(
        "text/event-stream",
        sse({"choices": [{"index": 0, "token_ids": [9]}], "usage": None}),
        sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}) + b"data: [DONE]\n\n",
    )
    service = await make_service([backend.name])
    payload = {"model": MODEL, "token_ids": [1, 2, 3], "stream": True, "sampling_params": {"max_tokens": 1}}
    async with http.post(proxy_url(service) + "/inference/v1/generate", json=payload) as r:
        assert r.status == 200
        await r.read()
    assert await observed(service) == (3, 1, 0)


async def test_sglang_streaming_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    def meta(n: int, finish: Any, **extra: int) -> dict[str, Any]:
        return {
            "text": "x" * n,
            "meta_info": {"prompt_tokens": 12, "completion_tokens": n, "finish_reason": finish, **extra},
        }

    final = sse(meta(3, {"type": "length", "length": 3}, cached_tokens=8))
    backend.reply(
        "text/event-stream",
        sse(meta(1, None)),
        sse(meta(2, None)),
        final[:25],
        final[25:],
        b"data: [DONE]\n\n",
    )
    service = await make_service([backend.name], parsers_config("openai-parser", "sglanghttp-parser"))
    payload = {"input_ids": [5, 6, 7], "stream": True, "sampling_params": {"max_new_tokens": 3}}
    async with http.post(proxy_url(service) + "/generate", json=payload) as r:
        assert r.status == 200
        await r.read()
    # SGLang's body names no model: the usage is observed under the empty model name.
    assert await observed(service, model="") == (12, 3, 8)


async def test_sglang_json_usage_is_observed(
    backend: Backend, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    answer = {"text": "abc", "meta_info": {"prompt_tokens": 4, "completion_tokens": 3, "cached_tokens": 0}}
    backend.reply("application/json", json.dumps(answer).encode())
    service = await make_service([backend.name], parsers_config("sglanghttp-parser"))
    async with http.post(proxy_url(service) + "/generate", json={"input_ids": [1, 2, 3, 4]}) as r:
        assert r.status == 200
        assert await r.json() == answer
    assert await observed(service, model="") == (4, 3, 0)
