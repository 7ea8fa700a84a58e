"""Latency spikes: `--latency-spike-rate R --latency-spike-s S` hold a share of requests S wall seconds.

Timing is only ever bounded from below (a held request answers no sooner than S); everything else is
shown by the server's counters (`spikes_injected`, `spikes_in_flight`) and by the order of events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from epick.cli.main import main
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer
from tests.sim.conftest import ServerFactory, scrape, wait_until

MODEL = "sim-model"
SPIKE_S = 0.2
LONG_S = 30.0  # a spike no test waits out: whatever happens during it happens before it ends
MakeClient = Callable[..., AsyncOpenAI]


@asynccontextmanager
async def raw_post(
    server: SimServer, body: dict[str, Any], path: str = "/v1/completions"
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A POST on a plain TCP connection, so that a test sees its first byte and can hang up at will."""
    reader, writer = await asyncio.open_connection(server.options.host, server.port)
    try:
        data = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()
        yield reader, writer
    finally:
        writer.close()
        await writer.wait_closed()


def completion(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **kw}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_spike_holds_the_first_byte_for_s_wall_seconds(
    make_server: ServerFactory, *, stream: bool
) -> None:
    # time_scale 1000 (the fixtures' default): the spike is wall time all the same.
    server = await make_server(latency_spike_rate=1.0, latency_spike_s=SPIKE_S)
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with raw_post(server, completion(stream=stream)) as (reader, _):
        first = await reader.read(1)
        elapsed = loop.time() - start
        # The first byte came after the spike had ended, not during it.
        assert first == b"H"
        assert server.spikes_injected == 1
        assert server.spikes_in_flight == 0
        rest = await reader.read()
    assert elapsed >= SPIKE_S
    assert (first + rest).startswith(b"HTTP/1.1 200")
    assert (b"data: [DONE]" in rest) is stream


async def test_rate_zero_never_takes_the_spike_path(
    make_server: ServerFactory, make_client: MakeClient
) -> None:
    server = await make_server(latency_spike_rate=0.0, latency_spike_s=LONG_S)
    client = make_client(server)
    for _ in range(5):
        await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
    stream = await client.completions.create(model=MODEL, prompt="hi", max_tokens=2, stream=True)
    async for _chunk in stream:
        pass
    assert server.spikes_injected == 0


async def test_spikes_are_seeded(make_server: ServerFactory, make_client: MakeClient) -> None:
    async def pattern(seed: int) -> list[bool]:
        server = await make_server(latency_spike_rate=0.5, latency_spike_s=0.0, seed=seed)
        client = make_client(server)
        out = []
        for _ in range(40):
            before = server.spikes_injected
            await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
            out.append(server.spikes_injected == before + 1)
        assert server.spikes_injected == sum(out)
        return out

    first, second = await pattern(7), await pattern(7)
    assert first == second
    assert 0 < sum(first) < 40


async def test_spikes_leave_the_failure_draws_as_they_were(
    make_server: ServerFactory, make_client: MakeClient
) -> None:
    async def failures(spike_rate: float) -> list[bool]:
        server = await make_server(failure_rate=0.5, latency_spike_rate=spike_rate, seed=3)
        client = make_client(server)
        out = []
        for _ in range(30):
            try:
                await client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
                out.append(False)
            except (openai.RateLimitError, openai.InternalServerError):
                out.append(True)
        if spike_rate:
            assert server.spikes_injected == out.count(False)  # every accepted request, no failed one
        return out

    assert await failures(0.0) == await failures(1.0)


async def test_an_injected_failure_is_not_held(make_server: ServerFactory, make_client: MakeClient) -> None:
    server = await make_server(
        failure_rate=1.0, failure_types=("server_error",), latency_spike_rate=1.0, latency_spike_s=LONG_S
    )
    with pytest.raises(openai.InternalServerError):
        await make_client(server).completions.create(model=MODEL, prompt="hi", max_tokens=1)
    assert server.spikes_injected == 0


async def test_other_endpoints_answer_during_a_spike(
    make_server: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await make_server(latency_spike_rate=1.0, latency_spike_s=LONG_S)
    async with raw_post(server, completion()) as (reader, _):
        await wait_until(lambda: server.spikes_in_flight == 1)
        metrics = await scrape(http, server)
        for path in ("/health", "/v1/models"):
            async with http.get(server.url + path) as r:
                assert r.status == 200
        async with http.post(server.url + "/reset_prefix_cache") as r:
            assert r.status == 200
        # All answered while the spiked request was still held, before it reached the engine.
        assert server.spikes_in_flight == 1
        assert not reader.at_eof()
        assert metrics.value("vllm:num_requests_waiting") == metrics.value("vllm:num_requests_running") == 0


async def test_a_client_that_hangs_up_during_a_spike_leaves_nothing_behind(
    make_server: ServerFactory, make_client: MakeClient, http: aiohttp.ClientSession
) -> None:
    server = await make_server(latency_spike_rate=1.0, latency_spike_s=LONG_S)
    for stream in (False, True):
        async with raw_post(server, completion(stream=stream)):
            await wait_until(lambda: server.spikes_in_flight == 1)
        # Released long before the spike would have ended; the request never reached the engine.
        await wait_until(lambda: server.spikes_in_flight == 0)
    assert server.spikes_injected == 2
    assert not server._pending
    assert not server.engine.has_work
    metrics = await scrape(http, server)
    assert metrics.value("vllm:prompt_tokens_total") == 0
    assert metrics.value("vllm:request_success_total", finished_reason="length") == 0


async def test_stop_answers_spiked_requests_with_503_at_once(make_server: ServerFactory) -> None:
    server = await make_server(latency_spike_rate=1.0, latency_spike_s=LONG_S)
    async with raw_post(server, completion()) as (reader, _):
        await wait_until(lambda: server.spikes_in_flight == 1)
        await asyncio.wait_for(server.stop(), 5)
        answer = await reader.read()
    assert answer.startswith(b"HTTP/1.1 503")
    assert b"shutting down" in answer
    assert server.spikes_in_flight == 0


# The command line.


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--latency-spike-rate", "1.5"], "--latency-spike-rate"),
        (["--latency-spike-rate", "-0.1"], "--latency-spike-rate"),
        (["--latency-spike-rate", "nan"], "--latency-spike-rate"),
        (["--latency-spike-rate", "half"], "--latency-spike-rate"),
        (["--latency-spike-s", "-1"], "--latency-spike-s"),
        (["--latency-spike-s", "nan"], "--latency-spike-s"),
        (["--latency-spike-s", "inf"], "--latency-spike-s"),
    ],
)
def test_bad_spike_flags_are_usage_errors(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sim-server", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: '{argv[1]}'" in err
    assert "Traceback" not in err


def test_spike_flags_reach_the_server_options() -> None:
    from epick.cli.main import build_parser
    from epick.cli.sim_server import options_from

    args = build_parser().parse_args(
        ["sim-server", "--latency-spike-rate", "0.25", "--latency-spike-s", "1.5"]
    )
    options = options_from(args)
    assert (options.latency_spike_rate, options.latency_spike_s) == (0.25, 1.5)
    default = options_from(build_parser().parse_args(["sim-server"]))
    assert (default.latency_spike_rate, default.latency_spike_s) == (0.0, 0.0)


@pytest.mark.parametrize(
    "kw",
    [
        {"latency_spike_rate": 1.5},
        {"latency_spike_rate": float("nan")},
        {"latency_spike_s": -1.0},
        {"latency_spike_s": float("inf")},
    ],
)
def test_server_options_refuse_bad_spikes(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="--latency-spike-"):
        ServerOptions(**kw)
