"""Through a real Envoy: epick asks for no more of each response than the service reads.

With usage metrics off, the response body is needed by nothing in the default config: in buffered and
streamed modes (`allow_mode_override`), epick's `mode_override` leaves the body out, and the stream's
end completes the response; under full duplex with nothing read at all, epick ends the stream once
the request is routed. Either way the client gets the whole response, streamed or not.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from epick.datalayer.health import OutlierPolicy
from epick.sim.server import IDENTITY_HEADER
from tests.extproc.gateway import FULL_DUPLEX, Gateway, MessageLog, Modes, running_gateway

NO_OUTLIERS = OutlierPolicy(consecutive_failures=0)


async def exercise(gateway: Gateway) -> set[str]:
    """Two plain and two streamed requests; each lands where epick chose, whole. Their ids."""
    ids: set[str] = set()
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            body = {"model": "sim-model", "prompt": f"plain {i} " + "context " * 40, "max_tokens": 3}
            async with session.post(
                gateway.url + "/v1/completions", json=body, headers={"x-request-id": f"p{i}"}
            ) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["usage"]["completion_tokens"] == 3
                assert r.headers[IDENTITY_HEADER] == gateway.decisions[f"p{i}"].targets[0].host_port
            ids.add(f"p{i}")
        for i in range(2):
            body = {"model": "sim-model", "messages": [{"role": "user", "content": f"stream {i}"}],
                    "max_tokens": 6, "stream": True}  # fmt: skip
            async with session.post(
                gateway.url + "/v1/chat/completions", json=body, headers={"x-request-id": f"s{i}"}
            ) as r:
                assert r.status == 200, await r.text()
                events = [line async for line in r.content if line.startswith(b"data: ")]
            assert events[-1].strip() == b"data: [DONE]"
            chunks = [json.loads(e[6:]) for e in events[:-1]]
            assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) == 6
            ids.add(f"s{i}")
    return ids


@pytest.mark.parametrize("request_mode", ["BUFFERED", "STREAMED"])
async def test_the_override_leaves_the_response_body_out(
    tmp_path: Path, request_mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = MessageLog(monkeypatch)
    modes = Modes(request_mode, "STREAMED", allow_override=True)
    async with running_gateway(tmp_path, modes, usage_metrics=False) as gateway:
        ids = await exercise(gateway)
        await gateway.wait_completed(ids)  # the stream's end completes each response
    kinds = Counter(kind for kind, _ in seen.seen)
    assert kinds["response_headers"] == 4  # outlier detection reads the statuses
    assert kinds["response_body"] == 0


async def test_without_allow_mode_override_the_response_still_comes_and_is_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = MessageLog(monkeypatch)
    async with running_gateway(tmp_path, Modes("BUFFERED", "STREAMED"), usage_metrics=False) as gateway:
        ids = await exercise(gateway)
        await gateway.wait_completed(ids)
    assert Counter(kind for kind, _ in seen.seen)["response_body"] >= 4


@pytest.mark.parametrize("response_mode", [FULL_DUPLEX, "STREAMED"])
async def test_full_duplex_reading_nothing_ends_each_stream_once_routed_unless_the_response_is_full_duplex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, response_mode: str
) -> None:
    seen = MessageLog(monkeypatch)
    modes = Modes(FULL_DUPLEX, response_mode)
    async with running_gateway(tmp_path, modes, usage_metrics=False, outliers=NO_OUTLIERS) as gateway:
        ids = await exercise(gateway)
        await gateway.wait_completed(ids)
    kinds = Counter(kind for kind, _ in seen.seen)
    assert kinds["request_headers"] == 4 and kinds["request_body"] >= 4
    if response_mode == FULL_DUPLEX:  # Envoy drains what it sends: epick stays to echo it
        assert kinds["response_headers"] == 4 and kinds["response_body"] >= 4
    else:
        assert kinds["response_headers"] == kinds["response_body"] == kinds["response_trailers"] == 0


async def test_full_duplex_reading_statuses_keeps_the_response_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = MessageLog(monkeypatch)
    async with running_gateway(tmp_path, Modes(FULL_DUPLEX, FULL_DUPLEX), usage_metrics=False) as gateway:
        ids = await exercise(gateway)
        await gateway.wait_completed(ids)
    assert Counter(kind for kind, _ in seen.seen)["response_headers"] == 4
