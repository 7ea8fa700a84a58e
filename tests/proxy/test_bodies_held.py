"""The request bodies held at once are bounded, over every connection (`max_bodies_bytes`): past the
budget a body is answered 503 (try again) instead of read, and the budget comes back as requests end."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from epick.extproc.exchange import FULL_DUPLEX_STREAMED, Exchange
from epick.wire.budget import BodyBudget
from tests.extproc.test_exchange import body, config, director, headers
from tests.proxy.conftest import MakeService, proxy_url, wait_until


def big(n: int) -> bytes:
    return json.dumps({"model": "sim-model", "prompt": "x" * n, "max_tokens": 1}).encode()


async def test_the_proxy_refuses_a_body_past_the_budget_while_others_are_held(
    make_fake: object, make_service: MakeService
) -> None:
    fake = await make_fake("gated")  # type: ignore[operator]
    service = await make_service([fake.name], max_bodies_bytes=100_000)
    url = f"{proxy_url(service)}/v1/completions"
    async with aiohttp.ClientSession() as http:

        async def send(size: int) -> tuple[int, str]:
            headers = {"content-type": "application/json"}
            async with http.post(url, data=big(size), headers=headers) as r:
                return r.status, await r.text()

        held = asyncio.create_task(send(60_000))  # held while the model server waits at its gate
        await wait_until(lambda: len(fake.requests) == 1, what="the first request to reach the server")
        status, text = await send(60_000)
        assert status == 503 and "bodies_held" in text
        fake.gate.set()
        assert (await held)[0] == 200
        assert (await send(60_000))[0] == 200  # the budget came back


def test_ext_proc_refuses_a_body_past_the_budget_and_gives_it_back_when_routed() -> None:
    budget = BodyBudget(100_000)
    d = director()
    first = Exchange(d, budget=budget)
    first.handle(headers(config(FULL_DUPLEX_STREAMED)))
    payload = big(60_000)
    assert first.handle(body(payload[:60_000], False)) == []  # held, more to come
    second = Exchange(d, budget=budget)
    second.handle(headers(config(FULL_DUPLEX_STREAMED)))
    refused = second.handle(body(payload[:60_000], False))
    assert refused[-1].immediate_response.status.code == 503
    first.handle(body(payload[60_000:], True))  # routed: its bytes go back
    assert budget.held == 0
    third = Exchange(d, budget=budget)
    third.handle(headers(config(FULL_DUPLEX_STREAMED)))
    assert not third.handle(body(payload, True))[-1].HasField("immediate_response")
