"""epick end to end: the Service's proxy in front of simulated model servers, driven by real clients."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from epick.datalayer.health import OutlierPolicy
from epick.proxy.server import ENDPOINT_HEADER
from epick.sim.server import IDENTITY_HEADER
from tests.conftest import MakeSim
from tests.datalayer.pages import free_port, wait_until
from tests.proxy.conftest import (
    FLOOD_EVENTS,
    MODEL,
    SESSION_HEADER,
    MakeClient,
    MakeService,
    flood_event,
    proxy_url,
    steering_config,
    to,
)

FAST = 1000.0


async def three_sims(make_sim: MakeSim, **kw: Any) -> list[str]:
    servers = [await make_sim(time_scale=FAST, **kw) for _ in range(3)]
    return [f"127.0.0.1:{s.port}" for s in servers]


async def sse_events(response: aiohttp.ClientResponse) -> list[bytes]:
    """The `data:` lines of an SSE response, as they come."""
    return [line.rstrip(b"\n") async for line in response.content if line.startswith(b"data:")]


# Happy paths with the official OpenAI client.


async def test_completion_through_the_proxy(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    names = await three_sims(make_sim)
    client = make_client(await make_service(names))
    chosen = set()
    for i in range(6):
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt=f"Request {i}: say something.", max_tokens=5
        )
        assert raw.status_code == 200
        served_by = raw.headers[IDENTITY_HEADER]
        assert served_by == raw.headers[ENDPOINT_HEADER]
        assert served_by in names
        chosen.add(served_by)
        completion = raw.parse()
        assert completion.object == "text_completion" and completion.model == MODEL
        assert completion.choices[0].finish_reason == "length"
        assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert chosen <= set(names)


async def test_chat_through_the_proxy(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    names = await three_sims(make_sim)
    client = make_client(await make_service(names))
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a joke."}], max_tokens=7
    )
    assert (
        raw.headers[IDENTITY_HEADER] == raw.headers[ENDPOINT_HEADER] and raw.headers[ENDPOINT_HEADER] in names
    )
    chat = raw.parse()
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 7


async def test_streaming_completion_event_by_event(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    names = await three_sims(make_sim)
    service = await make_service(names)
    payload = {
        "model": MODEL,
        "prompt": "Count to nine.",
        "max_tokens": 9,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 200
        assert r.content_type == "text/event-stream"
        assert r.headers[IDENTITY_HEADER] == r.headers[ENDPOINT_HEADER] in names
        events = await sse_events(r)
    # One event per token, then the usage chunk, then [DONE].
    assert len(events) == 9 + 2
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert [len(c["choices"]) for c in chunks] == [1] * 9 + [0]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:9]] == [None] * 8 + ["length"]
    assert chunks[-1]["usage"]["completion_tokens"] == 9


async def test_streaming_chat_with_the_openai_client(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    names = await three_sims(make_sim)
    client = make_client(await make_service(names))
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a haiku."}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    opening, deltas, usage = chunks[0], chunks[1:-1], chunks[-1]
    assert opening.choices[0].delta.role == "assistant"
    assert len(deltas) == 6 and all(c.choices[0].delta.content for c in deltas)
    assert deltas[-1].choices[0].finish_reason == "length"
    assert usage.usage is not None and usage.usage.completion_tokens == 6


async def test_stream_is_relayed_chunk_by_chunk(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    """The first event reaches the client while the server is still holding back the second."""
    fake = await make_fake("gated")
    service = await make_service([fake.name])
    payload = {"model": MODEL, "prompt": "hi", "stream": True}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 200 and r.headers[ENDPOINT_HEADER] == fake.name
        assert r.headers["x-fake"] == "gated"  # the server's own x- headers come through
        first = await asyncio.wait_for(r.content.readline(), timeout=5)
        assert json.loads(first.removeprefix(b"data: "))["choices"][0]["text"] == "tok0 "
        assert not fake.gate.is_set()
        fake.gate.set()
        rest = await sse_events(r)
    assert len(rest) == 2 and rest[-1] == b"data: [DONE]"


async def test_a_client_that_stops_reading_stops_the_server(
    make_fake: Any, make_service: MakeService
) -> None:
    """The relay writes each chunk as it arrives; when the client does not read, the server is made to
    wait (its writes block) instead of the proxy holding the stream, and nothing is lost."""
    flood = await make_fake("flood")
    service = await make_service([flood.name])
    assert service.proxy is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", service.proxy.port)
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": True}).encode()
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%b" % (len(body), body)
    )
    total = sum(len(flood_event(i)) for i in range(FLOOD_EVENTS))

    async def stalled() -> int:
        """What the server had written once it stopped making progress."""
        last = -1
        while flood.sent != last:
            last = flood.sent
            await asyncio.sleep(0.1)
        return last

    async with asyncio.timeout(20):
        await wait_until(lambda: flood.sent > 0)
        held = await stalled()
    assert held < total / 2  # the client read nothing: socket buffers hold what was written, no more
    data = await asyncio.wait_for(reader.read(), timeout=20)  # now read it all: the stream resumes
    writer.close()
    head, _, chunked = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    events = b""
    while True:
        size_line, _, chunked = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        events += chunked[:size]
        chunked = chunked[size + 2 :]
    assert events == b"".join(flood_event(i) for i in range(FLOOD_EVENTS))
    assert flood.sent == total
    # Read to its end after the pause, the model server's connection goes back to the pool reading.
    upstreams = service.proxy.upstreams
    await wait_until(lambda: upstreams.idle == 1)
    pooled = [conn for idle in upstreams._idle.values() for conn in idle]
    assert [conn.paused for conn in pooled] == [False]
    assert pooled[0].transport is not None and pooled[0].transport.is_reading()


async def test_a_client_leaving_mid_stream_ends_the_relay_and_closes_the_servers_connection(
    make_fake: Any, make_service: MakeService
) -> None:
    gated = await make_fake("gated")  # one event, then it waits
    service = await make_service([gated.name], idle_scrape_interval=30.0)
    assert service.proxy is not None and service.traffic is not None
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": True}).encode()
    for _ in range(2):
        gated.gate.clear()
        reader, writer = await asyncio.open_connection("127.0.0.1", service.proxy.port)
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (len(body), body)
        )
        await asyncio.wait_for(reader.readuntil(b"data: "), timeout=10)  # the relay is running
        assert service.traffic.in_flight(gated.name) == 1
        writer.transport.abort()  # the client leaves
        await wait_until(lambda: service.traffic.in_flight(gated.name) == 0)  # the request ended
        assert service.proxy.upstreams.idle == 0  # half a response on it: closed, not pooled
        gated.gate.set()
    # The client's leaving is not the server's fault: nothing counts against it.
    assert service.datastore.is_healthy(gated.name) and not service.datastore.is_ejected(gated.name)


async def test_quiet_scraping_hears_of_each_request_and_spares_an_idle_server(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    """With --idle-scrape-interval, each request's target is told to the data layer as it goes and as
    it ends: an idle server is not scraped while nothing goes to it, and is scraped once one does."""
    sim = await make_sim(time_scale=FAST)
    name = f"127.0.0.1:{sim.port}"
    service = await make_service([name], idle_scrape_interval=30.0)
    assert service.traffic is not None
    scraper = service.scrapers.scraper(name)
    assert scraper is not None
    await wait_until(lambda: scraper.skipped > 0)  # scraped idle once; quiet since
    scrapes = scraper.scrapes
    client = make_client(service)
    answer = await client.completions.create(model=MODEL, prompt="hello", max_tokens=4)
    assert answer.choices[0].text
    assert service.traffic.in_flight(name) == 0  # it went, and it ended
    await wait_until(lambda: scraper.scrapes > scrapes)  # sent to since the last scrape: scraped


async def test_quiet_scraping_hears_of_the_endpoint_a_retry_went_to(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    """A request whose first target fails goes to the next: the data layer hears of both, so the one
    serving it is not taken for idle while it streams."""
    bad = await make_fake("unavailable")
    good = await make_fake("gated")
    service = await make_service([bad.name, good.name], steering_config(2), idle_scrape_interval=30.0)
    assert service.traffic is not None
    payload = {"model": MODEL, "prompt": "hi", "stream": True}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload, headers=to(bad.name)) as r:
        assert r.status == 200 and r.headers[ENDPOINT_HEADER] == good.name
        await r.content.readline()  # the gated server has sent its first chunk and waits
        assert len(bad.requests) == 1
        assert service.traffic.in_flight(good.name) == 1  # being served there
        assert service.traffic.in_flight(bad.name) == 1  # tried first; the request is not over
        good.gate.set()
        await r.read()
    assert service.traffic.in_flight(good.name) == service.traffic.in_flight(bad.name) == 0


async def test_models_is_the_union_of_the_servers_models(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient, http: aiohttp.ClientSession
) -> None:
    servers = [
        await make_sim(model="alpha"),
        await make_sim(model="beta", lora_modules=("beta-sql=/adapters/sql",)),
        await make_sim(model="beta"),
    ]
    service = await make_service([f"127.0.0.1:{s.port}" for s in servers])
    client = make_client(service)
    models = [m.id async for m in client.models.list()]
    assert sorted(models) == ["alpha", "beta", "beta-sql"]
    async with http.get(proxy_url(service) + "/v1/models") as r:
        body = await r.json()
    assert body["object"] == "list"
    lora = next(card for card in body["data"] if card["id"] == "beta-sql")
    assert lora["parent"] == "beta"


async def test_health(make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession) -> None:
    service = await make_service(await three_sims(make_sim))
    async with http.get(proxy_url(service) + "/health") as r:
        assert r.status == 200
        assert await r.json() == {"status": "ok", "endpoints": 3}


# Bad input, over HTTP.


BIG = b"x" * 3000
BAD_REQUESTS = {
    "/v1/completions": [
        (b"this is not json", 400, "bad_request", "request body is not valid JSON"),
        (b"[]", 400, "bad_request", "request body must be a JSON object"),
        (b'{"prompt": "hi"}', 400, "bad_request", "request body has no 'model'"),
        (b'{"model": "sim-model"}', 400, "bad_request", "completion request needs 'prompt'"),
        (b'{"model": "gpt-4", "prompt": "hi"}', 404, "model_not_found", "'gpt-4' is not served"),
        (b'{"model": "sim-model", "prompt": "' + BIG + b'"}', 413, "body_too_large", "2048"),
    ],
    "/v1/chat/completions": [
        (b"{model: sim-model}", 400, "bad_request", "request body is not valid JSON"),
        (b'{"messages": [{"role": "user", "content": "hi"}]}', 400, "bad_request", "no 'model'"),
        (b'{"model": "sim-model", "prompt": "hi"}', 400, "bad_request", "chat request needs 'messages'"),
        (b'{"model": "gpt-4", "messages": [{"role": "user"}]}', 404, "model_not_found", "'gpt-4'"),
        (b'{"model": "sim-model", "messages": "' + BIG + b'"}', 413, "body_too_large", "2048"),
    ],
}
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}


async def test_bad_requests_get_json_errors(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sims = [await make_sim() for _ in range(2)]
    service = await make_service([f"127.0.0.1:{s.port}" for s in sims], max_body_bytes=2048)
    headers = {"Content-Type": "application/json"}
    for path, cases in BAD_REQUESTS.items():
        for payload, status, code, message in cases:
            async with http.post(proxy_url(service) + path, data=payload, headers=headers) as r:
                assert r.status == status, (path, payload[:40])
                assert r.content_type == "application/json"
                error = (await r.json())["error"]
            assert error["code"] == code
            assert message in error["message"], error
            assert error["type"] == ERROR_TYPES[status]


async def test_openai_client_sees_typed_errors(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    sim = await make_sim()
    client = make_client(await make_service([f"127.0.0.1:{sim.port}"]))
    with pytest.raises(openai.NotFoundError, match="is not served by any endpoint"):
        await client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="chat request needs 'messages'"):
        await client.chat.completions.create(model=MODEL, messages=[])
    # A 4xx from the model server itself is passed through as the server sent it, not retried.
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=10_000_000)


async def test_model_rewrites_come_from_the_rewrites_file_never_from_a_header(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient, tmp_path: Path
) -> None:
    sim = await make_sim()
    rewrites = tmp_path / "rewrites.yaml"
    rewrites.write_text(
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: alias}\n"
        f"spec:\n  poolRef: {{name: epick}}\n  rules:\n  - matches: [{{model: {{value: my-alias}}}}]\n"
        f"    targets: [{{modelRewrite: {MODEL}}}]\n"
    )
    client = make_client(await make_service([f"127.0.0.1:{sim.port}"], model_rewrites_file=str(rewrites)))
    completion = await client.completions.create(model="my-alias", prompt="hi", max_tokens=2)
    assert completion.model == MODEL
    with pytest.raises(openai.NotFoundError, match="'gpt-4' is not served"):
        await client.completions.create(
            model="gpt-4", prompt="hi", max_tokens=2, extra_headers={"x-gateway-model-name-rewrite": MODEL}
        )


async def test_control_headers_are_not_forwarded(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("echo", model="base-model")
    service = await make_service([fake.name])
    headers = {
        "x-gateway-destination-endpoint": "10.9.9.9:80",
        "x-gateway-inference-objective": "batch",
        "x-gateway-inference-fairness-id": "tenant-a",
        "x-gateway-model-name-rewrite": "other-model",
        "x-prefiller-host-port": "10.9.9.9:80",  # a client must not point decode at a host
        "x-encoder-hosts-ports": "10.9.9.9:80",  # nor at an encoder
        "x-data-parallel-host-port": "10.9.9.9:80",  # nor at a data-parallel rank
        "x-kv-cache-source-host-port": "10.9.9.9:80",  # nor name a KV source
        "Connection": "x-dropped",  # names a hop-by-hop header
        "x-dropped": "1",
        "x-request-id": "req-42",
        "Authorization": "Bearer secret",
        "x-custom": "kept",
    }
    payload = {"model": "base-model", "prompt": "hi", "max_tokens": 3}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload, headers=headers) as r:
        assert r.status == 200 and r.headers["x-fake"] == "echo"
        assert r.headers[ENDPOINT_HEADER] == fake.name
        echo = await r.json()
    seen = {k.lower(): v for k, v in echo["headers"].items()}
    assert not any(k.startswith("x-gateway-") for k in seen)
    assert "x-prefiller-host-port" not in seen and "x-dropped" not in seen
    assert "x-encoder-hosts-ports" not in seen and "x-data-parallel-host-port" not in seen
    assert "x-kv-cache-source-host-port" not in seen
    assert "x-hop" not in r.headers  # the model server's Connection-named header stops here too
    assert seen["x-request-id"] == "req-42"
    assert seen["authorization"] == "Bearer secret" and seen["x-custom"] == "kept"
    assert int(seen["content-length"]) == len(fake.requests[0][1])
    assert echo["body"] == {"model": "base-model", "prompt": "hi", "max_tokens": 3}


async def test_session_affinity_token_comes_back_and_steers(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    names = await three_sims(make_sim)
    service = await make_service(names, steering_config())
    url = proxy_url(service) + "/v1/completions"
    for name in (names[2], names[0], names[1], names[2]):
        for stream in (False, True):
            payload = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": stream}
            async with http.post(url, json=payload, headers=to(name)) as r:
                await r.read()
                assert r.status == 200
                assert r.headers[IDENTITY_HEADER] == r.headers[ENDPOINT_HEADER] == name
                assert r.headers[SESSION_HEADER] == to(name)[SESSION_HEADER]


# Failing endpoints.


async def test_endpoint_down_falls_back_to_the_next_target(
    make_sim: MakeSim,
    make_service: MakeService,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="epick.proxy.server")
    sims = await three_sims(make_sim)
    down = f"127.0.0.1:{free_port()}"
    # A long scrape interval: only the first scrape runs, so the proxy, not the scraper, finds it down.
    service = await make_service(
        [down, *sims], steering_config(fallbacks=2), refresh_metrics_interval=60, wait=False
    )
    assert service.datastore.is_healthy(down)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload, headers=to(down)) as r:
        assert r.status == 200
        assert r.headers[ENDPOINT_HEADER] in sims and r.headers[IDENTITY_HEADER] == r.headers[ENDPOINT_HEADER]
    assert not service.datastore.is_healthy(down)
    [failure] = [r.getMessage() for r in caplog.records if f"to {down} failed" in r.getMessage()]
    assert "cannot connect" in failure


async def test_endpoint_down_is_rescheduled(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    sims = await three_sims(make_sim)
    down = f"127.0.0.1:{free_port()}"
    service = await make_service(
        [down, *sims], steering_config(fallbacks=1), refresh_metrics_interval=60, wait=False
    )
    client = make_client(service)
    stream = await client.completions.create(
        model=MODEL, prompt="hi", max_tokens=4, stream=True, extra_headers=to(down)
    )
    assert len([c async for c in stream]) == 4
    assert not service.datastore.is_healthy(down)
    assert down not in [ep.name for ep in service.datastore.snapshot()]


async def test_endpoint_down_with_the_default_config(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    sims = await three_sims(make_sim)
    down = f"127.0.0.1:{free_port()}"
    service = await make_service([down, *sims], wait=False)
    client = make_client(service)
    results = await asyncio.gather(
        *(
            client.completions.with_raw_response.create(model=MODEL, prompt=f"prompt {i}", max_tokens=3)
            for i in range(12)
        )
    )
    assert all(r.status_code == 200 and r.headers[ENDPOINT_HEADER] in sims for r in results)
    await wait_until(lambda: not service.datastore.is_healthy(down), what="down endpoint unhealthy")
    # The proxy's failed connects may mark it first; its scraper fails too, and keeps failing.
    scraper = service.scrapers.scraper(down)
    assert scraper is not None
    await wait_until(lambda: scraper.consecutive_failures >= 3, what="three failed scrapes of it")


async def test_503_before_the_first_byte_is_retried_elsewhere(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="epick.proxy.server")
    failing = await make_sim(failure_rate=1.0, failure_types=("server_error",))
    good = await make_sim()
    failing_name, good_name = f"127.0.0.1:{failing.port}", f"127.0.0.1:{good.port}"
    service = await make_service([failing_name, good_name], steering_config())
    client = make_client(service)
    for stream in (False, True):
        raw = await client.completions.with_raw_response.create(
            model=MODEL, prompt="hi", max_tokens=3, stream=stream, extra_headers=to(failing_name)
        )
        assert raw.status_code == 200
        assert raw.headers[ENDPOINT_HEADER] == raw.headers[IDENTITY_HEADER] == good_name
        if stream:
            chunks = raw.parse()
            assert isinstance(chunks, openai.AsyncStream)
            assert len([c async for c in chunks]) == 3
    # Each request was tried on the failing server first.
    tried = [
        r.getMessage() for r in caplog.records if f"to {failing_name} failed: answered 503" in r.getMessage()
    ]
    assert len(tried) == 2
    # A 5xx answer is not a broken endpoint: it stays a candidate.
    assert service.datastore.is_healthy(failing_name)


async def test_every_endpoint_503_returns_the_servers_error(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sims = [await make_sim(failure_rate=1.0, failure_types=("server_error",)) for _ in range(2)]
    service = await make_service([f"127.0.0.1:{s.port}" for s in sims])
    payload = {"model": MODEL, "prompt": "hi"}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 503
        error = (await r.json())["error"]
    assert error["message"] == "The server is overloaded or not ready yet."


async def test_server_dying_mid_stream(
    make_fake: Any, make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    dying = await make_fake("die")
    sim = await make_sim()
    sim_name = f"127.0.0.1:{sim.port}"
    service = await make_service([dying.name, sim_name], steering_config())
    url = proxy_url(service) + "/v1/completions"
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stream": True}
    async with http.post(url, json=payload, headers=to(dying.name)) as r:
        assert r.status == 200 and r.headers[ENDPOINT_HEADER] == dying.name
        events = await sse_events(r)  # ends cleanly: no exception on the client's side
    assert len(events) == 3
    assert [json.loads(e.removeprefix(b"data: "))["choices"][0]["text"] for e in events[:2]] == [
        "tok0 ",
        "tok1 ",
    ]
    error = json.loads(events[2].removeprefix(b"data: "))
    assert error == {
        "error": {"message": f"upstream {dying.name} failed mid-response", "type": "upstream_error"}
    }
    assert not service.datastore.is_healthy(dying.name)

    # The proxy stays up, and the dead endpoint is no longer chosen, even when asked for.
    for stream in (True, False):
        async with http.post(url, json={**payload, "stream": stream}, headers=to(dying.name)) as r:
            await r.read()
            assert r.status == 200
            assert r.headers[ENDPOINT_HEADER] == r.headers[IDENTITY_HEADER] == sim_name
    assert len(dying.requests) == 1


async def test_server_dying_mid_stream_with_the_openai_client(
    make_fake: Any, make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    dying = await make_fake("die")
    sim = await make_sim()
    service = await make_service([dying.name, f"127.0.0.1:{sim.port}"], steering_config())
    client = make_client(service)
    stream = await client.completions.create(
        model=MODEL, prompt="hi", stream=True, extra_headers=to(dying.name)
    )
    texts = []
    with pytest.raises(openai.APIError, match="failed mid-response"):
        async for chunk in stream:
            texts.append(chunk.choices[0].text)
    assert texts == ["tok0 ", "tok1 "]
    completion = await client.completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert completion.usage is not None and completion.usage.completion_tokens == 2


async def test_compressed_answer_reaches_the_client_readable(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("gzip")
    service = await make_service([fake.name])
    payload = {"model": MODEL, "prompt": "hi"}
    headers = {"Accept-Encoding": "gzip"}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload, headers=headers) as r:
        assert r.status == 200
        raw = await r.read()
    assert json.loads(raw)["body"] == payload


async def test_silence_past_the_read_timeout_ends_the_stream_with_an_error_event(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    slow = await make_fake("gated")  # sends one chunk, then nothing until released
    service = await make_service([slow.name], read_timeout=0.2)
    payload = {"model": MODEL, "prompt": "hi", "stream": True}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 200
        events = await sse_events(r)
    assert len(events) == 2
    assert json.loads(events[1].removeprefix(b"data: "))["error"]["type"] == "upstream_error"


async def test_broken_non_streaming_answer_is_retried_elsewhere(
    make_fake: Any, make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    dying = await make_fake("die")
    sim = await make_sim()
    sim_name = f"127.0.0.1:{sim.port}"
    service = await make_service([dying.name, sim_name], steering_config())
    client = make_client(service)
    raw = await client.completions.with_raw_response.create(
        model=MODEL, prompt="hi", max_tokens=2, extra_headers=to(dying.name)
    )
    assert raw.status_code == 200 and raw.headers[ENDPOINT_HEADER] == sim_name
    assert len(dying.requests) == 1
    assert not service.datastore.is_healthy(dying.name)


async def test_every_endpoint_unreachable_is_502_then_503(
    make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    downs = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    service = await make_service(downs, refresh_metrics_interval=60, wait=False)
    url = proxy_url(service) + "/v1/completions"
    payload = {"model": MODEL, "prompt": "hi"}
    async with http.post(url, json=payload) as r:
        assert r.status == 502
        error = (await r.json())["error"]
    assert error["code"] == "upstream_failed" and "cannot connect" in error["message"]
    assert service.datastore.snapshot().endpoints == ()
    async with http.post(url, json=payload) as r:
        assert r.status == 503
        assert (await r.json())["error"]["code"] == "no_endpoints"


async def test_server_errors_on_a_stream_request_pass_through(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient
) -> None:
    sim = await make_sim()
    client = make_client(await make_service([f"127.0.0.1:{sim.port}"]))
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=10_000_000, stream=True)


async def test_rate_limit_answer_keeps_retry_after(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("ratelimit")
    service = await make_service([fake.name])
    async with http.post(proxy_url(service) + "/v1/completions", json={"model": MODEL, "prompt": "hi"}) as r:
        assert r.status == 429  # a 4xx is the server's answer: passed through, not retried
        assert r.headers["x-fake"] == "ratelimit"
        assert (await r.json())["error"]["message"] == "slow down"
        assert r.headers.get("Retry-After") == "7"


async def test_the_internal_endpoint_is_not_announced_unless_asked(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sim = await make_sim()
    dead = f"127.0.0.1:{free_port()}"
    service = await make_service([f"127.0.0.1:{sim.port}"], expose_endpoint=False)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 200 and ENDPOINT_HEADER not in r.headers
    # Every endpoint refuses connections: the error names no address.
    lonely = await make_service([dead], expose_endpoint=False, wait=False)
    async with http.post(proxy_url(lonely) + "/v1/completions", json=payload) as r:
        text = await r.text()
    assert r.status >= 500 and "127.0.0.1" not in text and str(dead.rpartition(":")[2]) not in text
    assert json.loads(text)["error"]["code"] in {"upstream_failed", "no_endpoints", "model_not_found"}


async def test_a_bad_rewrites_file_on_reload_keeps_the_running_rewrites(
    make_sim: MakeSim, make_service: MakeService, make_client: MakeClient, tmp_path: Path
) -> None:
    sim = await make_sim()
    rewrites = tmp_path / "rewrites.yaml"
    good = (
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata: {name: alias}\n"
        f"spec: {{poolRef: {{name: epick}}, rules: [{{targets: [{{modelRewrite: {MODEL}}}]}}]}}\n"
    )
    rewrites.write_text(good)
    service = await make_service([f"127.0.0.1:{sim.port}"], model_rewrites_file=str(rewrites))
    client = make_client(service)
    assert (await client.completions.create(model="anything", prompt="hi", max_tokens=1)).model == MODEL
    rewrites.write_text(good.replace("targets: [", "targets: [{modelRewrite: x, weight: 0}, "))
    assert service.reload() is False
    assert (await client.completions.create(model="anything", prompt="hi", max_tokens=1)).model == MODEL


async def test_an_endpoint_answering_5xx_is_ejected_after_consecutive_failures(
    make_sim: MakeSim, make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sim = await make_sim()
    bad = await make_fake("unavailable")
    policy = OutlierPolicy(consecutive_failures=2, base_ejection_s=600, max_ejection_s=600)
    service = await make_service([f"127.0.0.1:{sim.port}", bad.name], steering_config(), outliers=policy)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    for _ in range(5):  # every one steered to the bad endpoint first
        async with http.post(proxy_url(service) + "/v1/completions", json=payload, headers=to(bad.name)) as r:
            assert r.status == 200 and r.headers[ENDPOINT_HEADER] == f"127.0.0.1:{sim.port}"
    # Two failures in a row ejected it: the last three requests never paid a failed attempt.
    assert len(bad.requests) == 2
    assert service.datastore.is_ejected(bad.name)


async def test_a_hung_endpoint_costs_one_first_byte_timeout_then_the_next_endpoint_answers(
    make_sim: MakeSim, make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    sim = await make_sim()
    hung = await make_fake("hang")
    service = await make_service(
        [f"127.0.0.1:{sim.port}", hung.name], steering_config(), first_byte_timeout=0.3
    )
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload, headers=to(hung.name)) as r:
        assert r.status == 200 and r.headers[ENDPOINT_HEADER] == f"127.0.0.1:{sim.port}"
    assert len(hung.requests) == 1


async def test_a_request_past_its_deadline_gets_504(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    hung = await make_fake("hang")
    service = await make_service([hung.name], request_timeout=0.3)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 504 and (await r.json())["error"]["code"] == "request_timeout"
