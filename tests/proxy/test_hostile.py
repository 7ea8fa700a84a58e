"""Hostile and malformed clients against the proxy: every answer is an OpenAI-shaped JSON error, and no
connection can hold the server (slow heads, short bodies, too many connections)."""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import aiohttp
import pytest

from tests.proxy.conftest import MODEL, MakeService, proxy_url


async def raw_exchange(port: int, data: bytes, *, wait_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it (bounded by `wait_s`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), wait_s)
    finally:
        writer.close()
        await writer.wait_closed()


def json_error_of(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head.lower(), head
    return status, json.loads(body)["error"]


async def test_unknown_paths_and_methods_get_json(
    make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([], wait=False)
    async with http.get(proxy_url(service) + "/v2/nothing") as r:
        assert r.status == 404 and (await r.json())["error"]["message"] == "no such path: GET /v2/nothing"
    async with http.get(proxy_url(service) + "/v1/completions") as r:
        assert r.status == 405
        error = (await r.json())["error"]
        assert "allowed: POST" in error["message"] and r.headers["Allow"] == "POST"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    ],
)
async def test_malformed_http_gets_a_json_400(make_service: MakeService, request_bytes: bytes) -> None:
    service = await make_service([], wait=False)
    assert service.proxy is not None
    status, error = json_error_of(await raw_exchange(service.proxy.port, request_bytes))
    assert (
        status == 400
        and error["message"].startswith("malformed HTTP request")
        and error["code"] == "bad_http"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"model": "sim-model", "prompt": "x\\ud800y"}', "lone surrogate"),
    ],
)
async def test_hostile_json_gets_a_json_400(
    make_service: MakeService, http: aiohttp.ClientSession, body: bytes, message: str
) -> None:
    service = await make_service([], wait=False)
    headers = {"content-type": "application/json"}
    async with http.post(proxy_url(service) + "/v1/completions", data=body, headers=headers) as r:
        assert r.status == 400 and message in (await r.json())["error"]["message"]


async def test_gzip_bodies_are_decoded_forwarded_plain_and_limited_after_decoding(
    make_fake: Any, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("echo")
    service = await make_service([fake.name], max_body_bytes=4096)
    payload = {"model": MODEL, "prompt": "compressed " * 20, "max_tokens": 2}
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    url = proxy_url(service) + "/v1/completions"
    async with http.post(url, data=gzip.compress(json.dumps(payload).encode()), headers=headers) as r:
        assert r.status == 200, await r.text()
        echo = await r.json()
    assert echo["body"] == payload
    assert "content-encoding" not in {k.lower() for k in echo["headers"]}
    # 10 KB of zeros compress to a few dozen bytes; decoded, they pass the 4 KB limit: 413.
    bomb = gzip.compress(json.dumps({"model": MODEL, "prompt": "0" * 10_000}).encode())
    assert len(bomb) < 4096
    async with http.post(url, data=bomb, headers=headers) as r:
        assert r.status == 413 and (await r.json())["error"]["code"] == "body_too_large"


async def test_a_body_shorter_than_its_content_length_gets_408(make_service: MakeService) -> None:
    service = await make_service([], wait=False, body_timeout=0.2)
    assert service.proxy is not None
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    status, error = json_error_of(await raw_exchange(service.proxy.port, head + b'{"model":'))
    assert status == 408 and error["code"] == "body_timeout"


async def test_a_slowloris_connection_is_closed(make_service: MakeService) -> None:
    service = await make_service([], wait=False, head_timeout=0.2)
    assert service.proxy is not None
    # Half a request head, then nothing: the server answers 408 and closes (read returns at EOF).
    status, error = json_error_of(
        await raw_exchange(service.proxy.port, b"POST /v1/completions HTTP/1.1\r\nHo")
    )
    assert status == 408 and error["code"] == "head_timeout"


async def test_connections_beyond_the_limit_are_refused_with_503(
    make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    service = await make_service([], wait=False, max_connections=2)
    assert service.proxy is not None
    held = [await asyncio.open_connection("127.0.0.1", service.proxy.port) for _ in range(2)]
    try:
        status, error = json_error_of(await raw_exchange(service.proxy.port, b""))
        assert status == 503 and error["code"] == "too_many_connections"
    finally:
        for _, writer in held:
            writer.close()
            await writer.wait_closed()
    # Once they are gone, connections are served again.
    for _ in range(50):
        try:
            async with http.get(proxy_url(service) + "/health") as r:
                if r.status == 200:
                    break
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the proxy did not serve again after the held connections closed")


async def test_the_tail_of_an_unread_body_does_not_start_a_head_deadline(make_service: MakeService) -> None:
    """A body that arrives after its request was answered (here a health check that never reads it) is not the
    first bytes of a new request head: the idle kept-alive connection then gets no 408 and stays open."""
    service = await make_service([], wait=False, head_timeout=0.2)
    assert service.proxy is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", service.proxy.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(
            next(
                v
                for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n"))
                if k.lower() == b"content-length"
            )
        )
        await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200"), head
        writer.write(b"0123456789")  # the unread body, late
        await writer.drain()
        # Past the head deadline, the connection is still the client's: the next request is answered.
        await asyncio.sleep(0.4)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_request_waiting_unread_when_the_loop_stalled_is_served_not_timed_out(
    make_service: MakeService,
) -> None:
    """The head deadline fires late when the event loop stalls (a GC pause, a busy machine); a
    request already waiting in the socket then is the server's lateness, not a slow client's."""
    import time

    service = await make_service([], wait=False, head_timeout=0.2)
    assert service.proxy is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", service.proxy.port)
    try:
        await asyncio.sleep(0)  # the server has taken the connection: its head deadline runs
        time.sleep(0.3)  # the loop stalls past the deadline (a blocking stall, injected)
        await asyncio.sleep(0)  # this step and the deadline's callback now run in the same turn
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 400"), head  # answered (no model), not 408 or reset
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_request_waiting_unread_past_the_keepalive_timeout_is_served(
    make_service: MakeService,
) -> None:
    """aiohttp closes a connection that sent nothing within the keep-alive timeout; a request that
    arrived during an event-loop stall and waits unread is not such a connection."""
    import time

    service = await make_service([], wait=False, keepalive_timeout=0.2)
    assert service.proxy is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", service.proxy.port)
    try:
        await asyncio.sleep(0)
        time.sleep(0.3)  # the loop stalls past the keep-alive timeout (a blocking stall, injected)
        await asyncio.sleep(0)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 400"), head
    finally:
        writer.close()
        await writer.wait_closed()
