"""The sim server as users see it: the official OpenAI client, plain HTTP, /metrics, LoRA, P/D, serve()."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from epick.sim import tokenizer
from epick.sim.engine import CostModel
from epick.sim.server import IDENTITY_HEADER, SimServer, serve
from tests.sim.conftest import (
    BLOCK,
    ServerFactory,
    finish_in_flight,
    free_consecutive_ports,
    options,
    scrape,
    token_prompt,
    wait_until,
)

MODEL = "sim-model"
LONG_PROMPT = "The quick brown fox jumps over the lazy dog near the river bank. " * 12  # ~170 tokens
WORD = re.compile(r"^ [a-z]+$")
MakeClient = Callable[..., AsyncOpenAI]


# OpenAI client: completions and chat.


async def test_completion(client: AsyncOpenAI) -> None:
    r = await client.completions.create(model=MODEL, prompt="Hello, world!", max_tokens=5)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.model == MODEL
    [choice] = r.choices
    assert choice.index == 0
    assert choice.finish_reason == "length"
    assert len(choice.text.split()) == 5
    assert r.usage is not None
    assert r.usage.prompt_tokens == tokenizer.count_tokens("Hello, world!")
    assert r.usage.completion_tokens == 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 5
    assert r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0


async def test_completion_with_token_ids(client: AsyncOpenAI) -> None:
    r = await client.completions.create(model=MODEL, prompt=token_prompt(100, 37), max_tokens=3)
    assert r.usage is not None
    assert r.usage.prompt_tokens == 37
    assert r.usage.completion_tokens == 3


async def test_default_max_tokens(make_server: ServerFactory, make_client: MakeClient) -> None:
    server = await make_server(default_max_tokens=9)
    r = await make_client(server).completions.create(model=MODEL, prompt="hi")
    assert r.usage is not None
    assert r.usage.completion_tokens == 9


async def test_chat(client: AsyncOpenAI) -> None:
    messages: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something."},
    ]
    r = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    [choice] = r.choices
    assert choice.message.role == "assistant"
    assert choice.message.content is not None
    assert len(choice.message.content.split()) == 4
    assert choice.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.prompt_tokens == tokenizer.count_tokens(tokenizer.render_chat(messages))
    assert r.usage.completion_tokens == 4


async def test_chat_max_completion_tokens(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_completion_tokens=6
    )
    assert r.usage is not None
    assert r.usage.completion_tokens == 6


async def test_completion_stream_token_by_token(client: AsyncOpenAI) -> None:
    stream = await client.completions.create(
        model=MODEL,
        prompt="Count to seven.",
        max_tokens=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(text_chunks) == 7
    assert len({c.id for c in chunks}) == 1
    for c in text_chunks:
        [choice] = c.choices
        assert WORD.match(choice.text), choice.text
    assert [c.choices[0].finish_reason for c in text_chunks] == [None] * 6 + ["length"]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 7
    assert usage_chunk.usage.prompt_tokens == tokenizer.count_tokens("Count to seven.")


async def test_stream_without_include_usage_has_no_usage_chunk(client: AsyncOpenAI) -> None:
    stream = await client.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True)
    chunks = [c async for c in stream]
    assert len(chunks) == 3
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)


async def test_chat_stream_token_by_token(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    opening, deltas, usage_chunk = chunks[0], chunks[1:-1], chunks[-1]
    assert opening.choices[0].delta.role == "assistant"
    assert len(deltas) == 5
    for c in deltas:
        assert WORD.match(c.choices[0].delta.content or ""), c
    assert deltas[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in deltas[:-1])
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.completion_tokens == 5
    assert usage_chunk.usage.total_tokens == usage_chunk.usage.prompt_tokens + 5


async def test_repeated_long_prompt_reports_cached_tokens(client: AsyncOpenAI) -> None:
    first = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    second = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    assert first.usage is not None and second.usage is not None
    n = first.usage.prompt_tokens
    assert n > 4 * BLOCK
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details is not None
    # Whole blocks, and at least the last prompt token is always recomputed (as vLLM).
    assert second.usage.prompt_tokens_details.cached_tokens == (n - 1) // BLOCK * BLOCK


async def test_repeated_chat_reports_cached_tokens_in_stream_usage(client: AsyncOpenAI) -> None:
    messages: Any = [{"role": "user", "content": LONG_PROMPT}]
    await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=1, stream=True, stream_options={"include_usage": True}
    )
    usage = [c async for c in stream][-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == (usage.prompt_tokens - 1) // BLOCK * BLOCK


async def test_without_prefix_caching_nothing_is_cached(
    make_server: ServerFactory, make_client: MakeClient
) -> None:
    client = make_client(await make_server(engine={"enable_prefix_caching": False}))
    for _ in range(2):
        r = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        assert r.usage.prompt_tokens_details.cached_tokens == 0


async def test_models_lists_base_and_lora_adapters(
    make_server: ServerFactory, make_client: MakeClient
) -> None:
    server = await make_server(model="my-model", lora_modules=("alpha=/adapters/alpha",))
    models = [m.model_dump() async for m in make_client(server).models.list()]
    assert [m["id"] for m in models] == ["my-model", "alpha"]
    base, alpha = models
    assert base["object"] == "model"
    assert base["owned_by"] == "vllm"
    assert base["parent"] is None
    assert base["max_model_len"] == server.options.engine.max_model_len
    assert alpha["parent"] == "my-model"


async def test_concurrent_requests_all_complete(client: AsyncOpenAI) -> None:
    results = await asyncio.gather(
        *(client.completions.create(model=MODEL, prompt=f"request {i}", max_tokens=3 + i) for i in range(20))
    )
    assert [r.usage.completion_tokens for r in results if r.usage] == [3 + i for i in range(20)]
    assert len({r.id for r in results}) == 20


# Errors, as the client's exception classes.


async def test_unknown_model_is_not_found(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        await client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
    assert "no-such-model" in e.value.message
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )


@pytest.mark.parametrize("chat", [False, True])
async def test_context_length_exceeded(
    make_server: ServerFactory, make_client: MakeClient, *, chat: bool
) -> None:
    client = make_client(await make_server(engine={"max_model_len": 64}))
    if chat:
        messages: Any = [{"role": "user", "content": "hi"}]
        n = tokenizer.count_tokens(tokenizer.render_chat(messages))
        ok = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=64 - n)
        over = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=65 - n)
    else:
        n = 14
        ok = client.completions.create(model=MODEL, prompt=token_prompt(1, n), max_tokens=64 - n)
        over = client.completions.create(model=MODEL, prompt=token_prompt(1, n), max_tokens=65 - n)
    r = await ok  # exactly max_model_len is allowed
    assert r.usage is not None and r.usage.total_tokens == 64
    with pytest.raises(openai.BadRequestError) as e:
        await over
    assert e.value.status_code == 400
    assert "maximum context length is 64 tokens" in e.value.message
    assert e.value.code == "context_length_exceeded"


async def test_streaming_error_is_a_json_error_not_a_stream(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="nope", prompt="hi", max_tokens=1, stream=True)


@pytest.mark.parametrize(
    ("kind", "status", "exc", "code"),
    [
        ("rate_limit", 429, openai.RateLimitError, "rate_limit_exceeded"),
        ("server_error", 503, openai.InternalServerError, "service_unavailable"),
        ("invalid_request", 400, openai.BadRequestError, None),
        ("context_length", 400, openai.BadRequestError, "context_length_exceeded"),
        ("model_not_found", 404, openai.NotFoundError, "model_not_found"),
    ],
)
async def test_failure_injection(
    make_server: ServerFactory,
    make_client: MakeClient,
    http: aiohttp.ClientSession,
    *,
    kind: str,
    status: int,
    exc: type[openai.APIStatusError],
    code: str | None,
) -> None:
    server = await make_server(failure_rate=1.0, failure_types=(kind,))
    client = make_client(server)
    for _ in range(3):
        with pytest.raises(exc) as e:
            await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
        assert e.value.status_code == status
        assert e.value.code == code
        assert e.value.response.headers[IDENTITY_HEADER] == server.name
        body = e.value.response.json()
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert isinstance(body["error"]["message"], str) and body["error"]["message"]
        assert isinstance(body["error"]["type"], str) and body["error"]["type"]
    with pytest.raises(exc):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1, stream=True
        )
    # Failures never reach the engine; the rest of the API is unaffected.
    metrics = await scrape(http, server)
    assert metrics.value("vllm:request_success_total", finished_reason="length") == 0
    assert metrics.value("vllm:prompt_tokens_total") == 0
    async with http.get(server.url + "/health") as r:
        assert r.status == 200


async def test_partial_failure_rate_is_seeded(make_server: ServerFactory, make_client: MakeClient) -> None:
    async def outcomes() -> list[bool]:
        client = make_client(await make_server(failure_rate=0.5, seed=7))
        out = []
        for _ in range(40):
            try:
                await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
                out.append(True)
            except (openai.RateLimitError, openai.InternalServerError):
                out.append(False)
        return out

    first, second = await outcomes(), await outcomes()
    assert first == second
    assert 0 < sum(first) < 40


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        (b"this is not json", "application/json"),
        (b"", "application/json"),
        (b'{"model": "sim-model", "prompt": ', "application/json"),
        (b"\xff\xfe\x00garbage", "application/json"),
        (b"[1, 2, 3]", "application/json"),
        (b'"a string"', "text/plain"),
    ],
)
async def test_non_json_body_is_a_400_json_error(
    server: SimServer, http: aiohttp.ClientSession, data: bytes, content_type: str
) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/load_lora_adapter"):
        async with http.post(server.url + path, data=data, headers={"Content-Type": content_type}) as r:
            assert r.status == 400
            assert r.content_type == "application/json"
            assert r.headers[IDENTITY_HEADER] == server.name
            body = await r.json()
            assert body["error"]["type"] == "BadRequestError"
            assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_unknown_charset_is_a_400_json_error(server: SimServer, http: aiohttp.ClientSession) -> None:
    async with http.post(
        server.url + "/v1/completions",
        data=b'{"model": "sim-model", "prompt": "hi", "max_tokens": 1}',
        headers={"Content-Type": "application/json; charset=no-such-charset"},
    ) as r:
        assert r.headers.get(IDENTITY_HEADER) == server.name
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "BadRequestError"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi"}, "model"),
        ({"model": MODEL}, "prompt"),
        ({"model": MODEL, "prompt": ""}, "prompt"),
        ({"model": MODEL, "prompt": ["a", "b"]}, "prompt"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 1.5}, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": True}, "max_tokens"),
    ],
)
async def test_invalid_completion_requests(
    server: SimServer, http: aiohttp.ClientSession, body: dict[str, Any], param: str
) -> None:
    async with http.post(server.url + "/v1/completions", json=body) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert error["type"] == "BadRequestError"
        assert error["param"] == param
    assert server.engine.num_running == server.engine.num_waiting == 0


async def test_chat_without_messages_is_400(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model=MODEL, messages=[], max_tokens=1)
    assert e.value.param == "messages"


async def test_request_larger_than_the_kv_cache_is_400(
    make_server: ServerFactory, make_client: MakeClient
) -> None:
    client = make_client(await make_server(engine={"num_gpu_blocks": 4}))
    await client.completions.create(model=MODEL, prompt=token_prompt(0, 60), max_tokens=4)  # 4 blocks
    with pytest.raises(openai.BadRequestError) as e:
        await client.completions.create(model=MODEL, prompt=token_prompt(0, 60), max_tokens=5)
    assert "KV blocks" in e.value.message


async def test_unknown_route_is_404_json(server: SimServer, http: aiohttp.ClientSession) -> None:
    async with http.get(server.url + "/v1/nothing-here") as r:
        assert r.status == 404
        assert r.headers[IDENTITY_HEADER] == server.name
        assert (await r.json())["error"]["type"] == "NotFoundError"
    async with http.get(server.url + "/v1/completions") as r:
        assert r.status == 405
        assert r.headers[IDENTITY_HEADER] == server.name


# Identity header.


async def test_identity_header_on_every_response(
    server: SimServer, http: aiohttp.ClientSession, client: AsyncOpenAI
) -> None:
    name = f"127.0.0.1:{server.port}"
    assert server.name == name
    calls: list[tuple[str, str, Any]] = [
        ("GET", "/health", None),
        ("GET", "/metrics", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}),
        ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
        ("POST", "/v1/completions", {"model": "unknown", "prompt": "hi"}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),  # 400
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "a"}),  # 404
        ("POST", "/reset_prefix_cache", None),
    ]
    statuses = []
    for method, path, body in calls:
        async with http.request(method, server.url + path, json=body) as r:
            await r.read()
            statuses.append(r.status)
            assert r.headers.get(IDENTITY_HEADER) == name, (method, path, r.status)
    assert statuses == [200, 200, 200, 200, 200, 404, 200, 400, 200, 404, 200]

    stream_body = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}
    async with http.post(server.url + "/v1/completions", json=stream_body) as r:
        assert r.status == 200
        assert r.content_type == "text/event-stream"
        assert r.headers[IDENTITY_HEADER] == name
        events = [line async for line in r.content if line.strip()]
    assert events[-1] == b"data: [DONE]\n"
    assert len(events) == 4

    raw = await client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=1)
    assert raw.headers[IDENTITY_HEADER] == name
    assert raw.parse().usage is not None


async def test_identity_header_uses_name_option(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await make_server(name="pod-a")
    for path in ("/health", "/v1/models"):
        async with http.get(server.url + path) as r:
            assert r.headers[IDENTITY_HEADER] == "pod-a"


# /metrics.

LABELLED = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:cache_config_info",
)
COUNTERS = (
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
)
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
)


async def test_metrics_honours_name_filters_as_prometheus_client_does(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """vLLM's /metrics (prometheus_client's exposition) answers `?name[]=` with those samples only."""
    server = await make_server(model="m1")
    query = "name[]=vllm:num_requests_waiting&name[]=vllm:prompt_tokens_total&name[]=vllm:cache_config_info"
    async with http.get(f"{server.url}/metrics?{query}") as r:
        assert r.status == 200
        text = await r.text()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    assert names == {"vllm:num_requests_waiting", "vllm:prompt_tokens_total", "vllm:cache_config_info"}
    async with http.get(f"{server.url}/metrics") as r:
        assert len(await r.text()) > 5 * len(text)


async def test_a_filtered_page_runs_only_the_collectors_it_asks_for(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """As prometheus_client's exposition answers vLLM's scrapes: a page of six samples does not
    build the rest (the server's cost of being watched)."""
    from prometheus_client.core import GaugeMetricFamily

    calls: list[int] = []

    class Spy:
        def describe(self) -> list[GaugeMetricFamily]:
            return [GaugeMetricFamily("spy_gauge", "a spy")]

        def collect(self) -> list[GaugeMetricFamily]:
            calls.append(1)
            return [GaugeMetricFamily("spy_gauge", "a spy", value=1.0)]

    server = await make_server(model="m1")
    server.metrics.registry.register(Spy())  # type: ignore[arg-type]
    async with http.get(f"{server.url}/metrics?name[]=vllm:num_requests_waiting") as r:
        assert "vllm:num_requests_waiting" in await r.text()
    assert calls == []
    async with http.get(f"{server.url}/metrics") as r:
        assert "spy_gauge 1.0" in await r.text()
    assert calls == [1]


async def test_metrics_names_types_and_labels(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await make_server(model="m1", engine={"num_gpu_blocks": 1234, "max_loras": 3})
    async with http.post(
        server.url + "/v1/completions", json={"model": "m1", "prompt": "hello there", "max_tokens": 3}
    ) as r:
        assert r.status == 200
    metrics = await scrape(http, server)
    for name in LABELLED:
        assert metrics.families[name].type == "gauge", name
    for name in COUNTERS:
        family = metrics.families[name]  # the parser strips `_total` from counter families
        assert family.type == "counter", name
        assert {s.name for s in family.samples} == {name + "_total"}
    for name in HISTOGRAMS:
        family = metrics.families[name]
        assert family.type == "histogram", name
        assert {s.name for s in family.samples} == {name + "_bucket", name + "_count", name + "_sum"}
        assert metrics.value(name + "_bucket", le="+Inf") == metrics.value(name + "_count")
    for family in metrics.families.values():
        if family.name.startswith("vllm:"):
            for s in family.samples:
                assert s.labels["model_name"] == "m1", s
    [cache] = metrics.samples("vllm:cache_config_info")
    assert cache.labels["block_size"] == "16"
    assert cache.labels["num_gpu_blocks"] == "1234"
    [lora] = metrics.samples("vllm:lora_requests_info")
    assert lora.labels["max_lora"] == "3"
    assert lora.labels["running_lora_adapters"] == lora.labels["waiting_lora_adapters"] == ""
    assert metrics.value("vllm:num_requests_running") == 0
    assert metrics.value("vllm:num_requests_waiting") == 0
    assert metrics.value("vllm:kv_cache_usage_perc") == 0
    assert metrics.value("vllm:gpu_cache_usage_perc") == 0


async def test_metrics_counters_follow_usage(
    server: SimServer, client: AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    before = await scrape(http, server)
    for name in COUNTERS:
        assert before.value(name + "_total") == 0, name
    usages = []
    r1 = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=4)
    usages.append(r1.usage)
    r2 = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "short question"}], max_tokens=6
    )
    usages.append(r2.usage)
    stream = await client.completions.create(
        model=MODEL,
        prompt="streamed prompt",
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    usages.append([c async for c in stream][-1].usage)
    r3 = await client.completions.create(model=MODEL, prompt="one token out", max_tokens=1)
    usages.append(r3.usage)

    m1 = await scrape(http, server)
    prompt = sum(u.prompt_tokens for u in usages if u)
    generated = sum(u.completion_tokens for u in usages if u)
    assert m1.value("vllm:prompt_tokens_total") == prompt
    assert m1.value("vllm:generation_tokens_total") == generated == 4 + 6 + 5 + 1
    assert m1.value("vllm:request_success_total", finished_reason="length") == 4
    assert m1.value("vllm:prefix_cache_queries_total") == prompt
    assert m1.value("vllm:prefix_cache_hits_total") == 0
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert m1.value(name + "_count") == 4
        assert m1.value(name + "_sum") > 0
    assert m1.value("vllm:request_queue_time_seconds_count") == 4
    assert m1.value("vllm:inter_token_latency_seconds_count") == generated - 4

    # The same long prompt again: hits move by the cached tokens, queries by the prompt.
    r4 = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    assert r4.usage is not None and r4.usage.prompt_tokens_details is not None
    cached = r4.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached > 0
    m2 = await scrape(http, server)
    assert m2.value("vllm:prefix_cache_hits_total") == cached
    assert m2.value("vllm:prefix_cache_queries_total") == prompt + r4.usage.prompt_tokens
    assert m2.value("vllm:prompt_tokens_total") == prompt + r4.usage.prompt_tokens
    assert m2.value("vllm:generation_tokens_total") == generated + 2
    assert m2.value("vllm:request_success_total", finished_reason="length") == 5


async def test_metrics_gauges_while_requests_run(
    make_server: ServerFactory, make_client: MakeClient, http: aiohttp.ClientSession
) -> None:
    # Slow time and one sequence at a time: the first request runs, the second waits.
    server = await make_server(time_scale=1.0, engine={"max_num_seqs": 1, "num_gpu_blocks": 1000})
    client = make_client(server)
    stream = await client.completions.create(
        model=MODEL, prompt=token_prompt(0, 100), max_tokens=5000, stream=True
    )
    await stream.__anext__()  # the first token: the request is running
    second = asyncio.create_task(client.completions.create(model=MODEL, prompt="queued", max_tokens=2))
    await wait_until(lambda: server.engine.num_waiting == 1)
    m = await scrape(http, server)
    assert m.value("vllm:num_requests_running") == 1
    assert m.value("vllm:num_requests_waiting") == 1
    # The running request holds its prompt's blocks and more as it decodes; the waiting one holds none.
    assert math.ceil(101 / BLOCK) / 1000 <= m.value("vllm:kv_cache_usage_perc") < 0.1
    assert m.value("vllm:gpu_cache_usage_perc") == m.value("vllm:kv_cache_usage_perc")
    await stream.close()  # the client goes away: the server aborts it and admits the next
    r = await asyncio.wait_for(second, 5)
    assert r.usage is not None and r.usage.completion_tokens == 2
    m = await scrape(http, server)
    assert m.value("vllm:num_requests_running") == m.value("vllm:num_requests_waiting") == 0
    assert m.value("vllm:kv_cache_usage_perc") == 0
    assert m.value("vllm:request_success_total", finished_reason="length") == 1  # the abort is no success


async def test_reset_prefix_cache(
    server: SimServer, client: AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1)
    async with http.post(server.url + "/reset_prefix_cache") as r:
        assert r.status == 200
    again = await client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=1)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 0


async def test_reset_prefix_cache_refused_while_running(
    make_server: ServerFactory, make_client: MakeClient, http: aiohttp.ClientSession
) -> None:
    server = await make_server(time_scale=1.0)
    stream = await make_client(server).completions.create(
        model=MODEL, prompt="long running", max_tokens=5000, stream=True
    )
    await stream.__anext__()
    async with http.post(server.url + "/reset_prefix_cache") as r:
        assert r.status == 400
        assert (await r.json())["error"]["type"] == "BadRequestError"
    await stream.close()


# LoRA adapters.


async def test_load_use_and_unload_lora(
    server: SimServer, client: AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        server.url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": "/adapters/sql"}
    ) as r:
        assert r.status == 200
    models = {m.id: m.model_dump() async for m in client.models.list()}
    assert models["sql"]["parent"] == MODEL
    assert models["sql"]["root"] == "sql"
    r1 = await client.completions.create(model="sql", prompt="SELECT", max_tokens=3)
    assert r1.model == "sql"
    assert r1.usage is not None and r1.usage.completion_tokens == 3
    chat = await client.chat.completions.create(
        model="sql", messages=[{"role": "user", "content": "q"}], max_tokens=2
    )
    assert chat.model == "sql"

    async with http.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "sql"}) as r:
        assert r.status == 400
        error = (await r.json())["error"]
        assert "already been loaded" in error["message"]
    async with http.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}) as r:
        assert r.status == 200
    assert [m.id async for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="sql", prompt="SELECT", max_tokens=1)
    async with http.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "sql"}) as r:
        assert r.status == 404
        assert (await r.json())["error"]["type"] == "NotFoundError"


async def test_unload_unknown_lora_is_404(server: SimServer, http: aiohttp.ClientSession) -> None:
    async with http.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "ghost"}) as r:
        assert r.status == 404
        body = await r.json()
        assert "ghost" in body["error"]["message"]


async def test_load_lora_requires_a_name_and_lora_enabled(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await make_server()
    async with http.post(server.url + "/v1/load_lora_adapter", json={"lora_path": "/x"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "lora_name"
    disabled = await make_server(engine={"max_loras": 0})
    async with http.post(disabled.url + "/v1/load_lora_adapter", json={"lora_name": "a"}) as r:
        assert r.status == 400


async def test_lora_prefix_cache_is_per_adapter(make_server: ServerFactory, make_client: MakeClient) -> None:
    server = await make_server(lora_modules=("a=/a", "b=/b"))
    client = make_client(server)
    prompt = token_prompt(500, 100)

    async def cached(model: str) -> int:
        r = await client.completions.create(model=model, prompt=prompt, max_tokens=1)
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    assert await cached("a") == 0
    assert await cached(MODEL) == 0  # the base model does not share the adapter's KV
    assert await cached("b") == 0
    assert await cached("a") == 96


async def test_lora_ids_stay_distinct_after_unload(
    server: SimServer, client: AsyncOpenAI, http: aiohttp.ClientSession
) -> None:
    for name in ("a", "b"):
        async with http.post(server.url + "/v1/load_lora_adapter", json={"lora_name": name}) as r:
            assert r.status == 200
    async with http.post(server.url + "/v1/unload_lora_adapter", json={"lora_name": "a"}) as r:
        assert r.status == 200
    async with http.post(server.url + "/v1/load_lora_adapter", json={"lora_name": "c"}) as r:
        assert r.status == 200
    prompt = token_prompt(1000, 200)
    await client.completions.create(model="b", prompt=prompt, max_tokens=1)
    r = await client.completions.create(model="c", prompt=prompt, max_tokens=1)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # c never saw this prompt


async def test_lora_running_and_waiting_with_one_slot(
    make_server: ServerFactory, make_client: MakeClient, http: aiohttp.ClientSession
) -> None:
    # One LoRA slot, slow time: adapter a's long request runs, adapter b's must wait for the slot.
    server = await make_server(time_scale=1.0, lora_modules=("a=/a", "b=/b"), engine={"max_loras": 1})
    client = make_client(server)
    stream = await client.completions.create(model="a", prompt="adapter a", max_tokens=5000, stream=True)
    await stream.__anext__()
    b_task = asyncio.create_task(client.completions.create(model="b", prompt="adapter b", max_tokens=2))
    await wait_until(lambda: server.engine.num_waiting == 1)
    assert server.engine.running_loras() == ["a"]
    assert server.engine.waiting_loras() == ["b"]

    m = await scrape(http, server)
    [info] = m.samples("vllm:lora_requests_info")
    assert info.labels["running_lora_adapters"] == "a"
    assert info.labels["waiting_lora_adapters"] == "b"
    assert info.labels["max_lora"] == "1"
    assert m.value("vllm:num_requests_running") == 1
    assert m.value("vllm:num_requests_waiting") == 1
    # A base-model request is not held back by the LoRA slot.
    base = await asyncio.wait_for(client.completions.create(model=MODEL, prompt="base", max_tokens=1), 5)
    assert base.usage is not None
    assert server.engine.waiting_loras() == ["b"]

    await stream.close()  # a goes away: b gets the slot
    b = await asyncio.wait_for(b_task, 5)
    assert b.model == "b" and b.usage is not None and b.usage.completion_tokens == 2
    [info] = (await scrape(http, server)).samples("vllm:lora_requests_info")
    assert info.labels["running_lora_adapters"] == info.labels["waiting_lora_adapters"] == ""


async def test_lora_module_without_lora_slots_does_not_hang(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    try:
        server = await make_server(lora_modules=("a=/a",), engine={"max_loras": 0})
    except Exception:
        return  # refusing the configuration at start is a fine fix
    body = {"model": "a", "prompt": "hi", "max_tokens": 1}
    try:
        async with http.post(
            server.url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=1)
        ) as r:
            await r.read()
    except TimeoutError:
        pytest.fail("the request for adapter 'a' hangs")


# Prefill/decode disaggregation.


async def test_prefill_role_returns_one_token_and_transfer_params(
    make_server: ServerFactory, make_client: MakeClient
) -> None:
    server = await make_server(role="prefill")
    client = make_client(server)
    prompt = token_prompt(0, 70)
    r = await client.completions.create(model=MODEL, prompt=prompt, max_tokens=50)
    assert r.usage is not None and r.usage.completion_tokens == 1
    assert r.choices[0].finish_reason == "length"
    params = r.model_dump()["kv_transfer_params"]
    assert params["do_remote_prefill"] is True
    assert params["do_remote_decode"] is False
    assert params["remote_host"] == "127.0.0.1"
    assert params["remote_port"] == server.port
    assert params["remote_engine_id"] == server.name
    assert len(params["remote_block_ids"]) == math.ceil(70 / BLOCK)

    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=9, stream=True
    )
    chunks = [c async for c in stream]
    assert len(chunks) == 2  # the role chunk, then the only token
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_dump()["kv_transfer_params"]["remote_port"] == server.port


async def test_decode_role_receives_kv_instead_of_computing_it(
    make_server: ServerFactory, make_client: MakeClient, http: aiohttp.ClientSession
) -> None:
    # Same settings on each server (`plain` gets no kv_transfer_params), time slow enough that the
    # TTFT histograms reflect step costs rather than event-loop latency.
    n = 2000
    prompt = token_prompt(0, n)
    prefill = await make_server(role="prefill", time_scale=2.0)
    decode = await make_server(role="decode", time_scale=2.0)
    plain = await make_server(role="decode", time_scale=2.0)

    p = await make_client(prefill).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    params = p.model_dump()["kv_transfer_params"]
    d = await make_client(decode).completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, extra_body={"kv_transfer_params": params}
    )
    assert d.usage is not None and d.usage.prompt_tokens == n and d.usage.completion_tokens == 1
    assert "kv_transfer_params" not in d.model_dump()
    q = await make_client(plain).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
    assert q.usage is not None and q.usage.completion_tokens == 1

    cost = CostModel()
    # One step each: the decode server was charged transfer for the prompt, the plain one prefill.
    assert decode.engine.busy_time == pytest.approx(cost.step_time(0, 0, n, transfer_tokens=n))
    assert plain.engine.busy_time == pytest.approx(cost.step_time(n, 0, n))
    assert prefill.engine.busy_time == pytest.approx(cost.step_time(n, 0, n))
    ttft_decode = (await scrape(http, decode)).value("vllm:time_to_first_token_seconds_sum")
    ttft_plain = (await scrape(http, plain)).value("vllm:time_to_first_token_seconds_sum")
    assert ttft_plain >= cost.step_time(n, 0, n)
    assert ttft_decode < ttft_plain


async def test_decode_role_continues_generation(make_server: ServerFactory, make_client: MakeClient) -> None:
    decode = await make_server(role="decode")
    client = make_client(decode)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": LONG_PROMPT}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1"}},
    )
    chunks = [c async for c in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert len(chunks) == 1 + 12 + 1
    # Without kv_transfer_params a decode server computes the prompt itself.
    r = await client.completions.create(model=MODEL, prompt="plain", max_tokens=3)
    assert r.usage is not None and r.usage.completion_tokens == 3


# serve(): several servers in one process.


@pytest.mark.parametrize("name", [None, "sim"])
async def test_serve_count_three_on_consecutive_ports(http: aiohttp.ClientSession, name: str | None) -> None:
    for _ in range(5):
        base = free_consecutive_ports(3)
        ready: asyncio.Future[list[SimServer]] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve(options(port=base, count=3, name=name), ready=ready.set_result))
        await asyncio.wait({ready, task}, return_when=asyncio.FIRST_COMPLETED, timeout=5)
        if ready.done():
            break
        if task.done() and isinstance(task.exception(), OSError):
            continue  # a port was taken in between: try others
        task.cancel()
        pytest.fail("serve() did not become ready")
    else:
        pytest.fail("no free consecutive ports for serve()")
    servers = ready.result()
    try:
        assert [s.port for s in servers] == [base, base + 1, base + 2]
        expected = [f"127.0.0.1:{base + i}" if name is None else f"sim-{i}" for i in range(3)]
        seen = []
        for s in servers:
            async with http.get(f"http://127.0.0.1:{s.port}/health") as r:
                assert r.status == 200
                seen.append(r.headers[IDENTITY_HEADER])
        assert seen == expected
        # Independent engines: a request to the second server shows only in its metrics.
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
        async with http.post(servers[1].url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert r.headers[IDENTITY_HEADER] == expected[1]
        generated = [(await scrape(http, s)).value("vllm:generation_tokens_total") for s in servers]
        assert generated == [0, 2, 0]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.get(f"http://127.0.0.1:{base}/health"):
            pass


# Lifecycle.


async def test_stop_with_request_in_flight_returns_promptly(http: aiohttp.ClientSession) -> None:
    server = SimServer(options(time_scale=1.0), index=0)
    await server.start()
    body = json.dumps({"model": MODEL, "prompt": "long", "max_tokens": 100_000})
    request = asyncio.create_task(http.post(server.url + "/v1/completions", data=body))
    await wait_until(lambda: server.engine.num_running == 1)
    stop = asyncio.create_task(server.stop())
    done, _ = await asyncio.wait({stop}, timeout=1.0)
    if not done:
        finish_in_flight(server)  # let the handler return so that stop() can complete
        await stop
    with contextlib.suppress(aiohttp.ClientError):  # a fixed stop() may cut the connection
        (await request).release()
    assert done, "stop() was still waiting after 1 s"


def test_the_simulator_leaves_other_registries_as_they_are() -> None:
    """Its /metrics drops `_created` series itself; other registries in the process keep theirs."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    import epick.sim.metrics  # noqa: F401 (imported for the check: importing it changes nothing)

    registry = CollectorRegistry()
    Counter("epick_test_things", "Things.", registry=registry).inc()
    assert b"epick_test_things_created" in generate_latest(registry)
