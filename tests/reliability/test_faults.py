"""Faults under load, each with the number of client-visible failures asserted.

- kill: a model-server process is SIGKILLed mid-run. Non-streamed requests are retried on another
  endpoint before anything reaches the client (0 failures); a streamed request fails (an SSE error event
  after its 200) only when its attempt was on the killed server at the kill.
- SIGSTOP: a stopped server costs a request one first-byte timeout, then the next endpoint answers
  (0 failures); after `consecutive_failures` of them it is ejected and costs nothing more.
- 5xx bursts: a server answering 503 is retried elsewhere by the proxy (0 failures) and ejected after
  `consecutive_failures` answers; through Envoy, which does not retry, exactly that many 503s reach the
  client, then none.
- garbage /metrics: the endpoint leaves the candidates after 3 failed scrapes in a row; every request
  succeeds elsewhere and the service stays up.

Faults are triggered on counts and events (the n-th completion, a chunk relayed from the server to be
killed), never after sleeps; conditions are polled in bounded loops. The only timer a test waits on is
the proxy's first-byte timeout (the SIGSTOP fault itself); a fake clock ends an ejection.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from epick.datalayer.health import OutlierPolicy
from epick.extproc.server import ExtProcOptions
from epick.framework import Endpoint
from epick.proxy.server import ENDPOINT_HEADER
from epick.requestcontrol.cycle import RequestCycle
from epick.service import Service
from epick.sim.server import SimServer
from tests.conftest import MakeApp, MakeSim
from tests.datalayer.pages import vllm_page, wait_until
from tests.extproc.gateway import FULL_DUPLEX, Gateway, Modes
from tests.proxy.conftest import MODEL, FakeModelServer, MakeService, proxy_url, steering_config, to
from tests.reliability.conftest import StartSims

GIE = Modes(FULL_DUPLEX, FULL_DUPLEX)  # the gateway settings of GIE's and llm-d's manifests


def name_of(sim: SimServer) -> str:
    return f"127.0.0.1:{sim.port}"


@dataclass(slots=True)
class Outcome:
    """What the client saw of one request."""

    index: int
    stream: bool
    status: int = 0
    endpoint: str | None = None  # x-epick-endpoint: where it was served
    ok: bool = False
    error: dict[str, Any] | None = None  # the error body or SSE error event, if any


async def send(
    http: aiohttp.ClientSession,
    url: str,
    index: int,
    *,
    stream: bool,
    target: str | None = None,
    max_tokens: int = 8,
) -> Outcome:
    """One completion; ok when a 200 came with a whole answer (a stream: `[DONE]` and no error event)."""
    payload = {"model": MODEL, "prompt": f"request {index}: tell me a story", "max_tokens": max_tokens,
               "stream": stream}  # fmt: skip
    headers = {"x-request-id": f"r{index}", **(to(target) if target else {})}
    out = Outcome(index, stream)
    try:
        async with http.post(url + "/v1/completions", json=payload, headers=headers) as r:
            out.status, out.endpoint = r.status, r.headers.get(ENDPOINT_HEADER)
            if stream and r.status == 200:
                events = [line.strip()[5:].strip() async for line in r.content if line.startswith(b"data:")]
                errors = [json.loads(e)["error"] for e in events if e.startswith(b'{"error"')]
                out.error = errors[0] if errors else None
                out.ok = not errors and bool(events) and events[-1] == b"[DONE]"
            else:
                body = await r.json(content_type=None)
                out.error = body.get("error") if isinstance(body, dict) else None
                out.ok = r.status == 200 and bool(body.get("choices"))
    except aiohttp.ClientError as e:  # never expected: the proxy always answers
        out.error = {"client": f"{type(e).__name__}: {e}"}
    return out


async def run_load(count: int, concurrency: int, one: Callable[[int], Awaitable[Outcome]]) -> list[Outcome]:
    """`count` requests, in index order, at most `concurrency` at once."""
    indices = iter(range(count))
    results: dict[int, Outcome] = {}

    async def worker() -> None:
        for i in indices:  # shared: each index is taken by one worker
            results[i] = await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [results[i] for i in range(count)]


@dataclass
class Attempts:
    """Every attempt the proxy makes (request id -> endpoints tried, in order), those in flight, and the
    failed ones (request id, endpoint, what failed)."""

    tried: dict[str, list[str]] = field(default_factory=dict)
    in_flight: Counter[tuple[str, bool]] = field(default_factory=Counter)  # (endpoint, streamed)
    failed: list[tuple[str, str, str]] = field(default_factory=list)

    @classmethod
    def record(cls, service: Service) -> Attempts:
        attempts = cls()
        proxy = service.proxy
        assert proxy is not None
        forward = proxy._forward

        async def recording(
            http: Any, reply: Any, d: Any, endpoint: Endpoint, *, path: str, state: Any
        ) -> Any:
            key = (endpoint.name, bool(d.request.body.stream))
            attempts.tried.setdefault(d.request.request_id, []).append(endpoint.name)
            attempts.in_flight[key] += 1
            try:
                return await forward(http, reply, d, endpoint, path=path, state=state)
            except Exception as e:  # an attempt that failed before anything reached the client
                attempts.failed.append((d.request.request_id, endpoint.name, str(e)))
                raise
            finally:
                attempts.in_flight[key] -= 1

        proxy._forward = recording  # type: ignore[method-assign]
        return attempts

    def on(self, endpoint: str) -> list[str]:
        """The requests that had an attempt on `endpoint`."""
        return [r for r, names in self.tried.items() if endpoint in names]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_clock(service: Service) -> FakeClock:
    """Outlier detection and the datastore on a clock the test moves (an ejection ends when told)."""
    clock = FakeClock()
    service.outliers.clock = clock
    service.datastore.clock = clock
    return clock


# kill


async def test_a_killed_server_loses_no_plain_request_and_only_streams_it_was_serving(
    sim_processes: StartSims,
    make_sim: MakeSim,
    make_service: MakeService,
    http: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (victim,) = await sim_processes(1)
    others = [name_of(await make_sim()) for _ in range(2)]
    names = [others[0], victim.host_port, others[1]]
    service = await make_service(names, steering_config())
    attempts = Attempts.record(service)
    total, kill_after = 60, 20
    done = 0
    at_kill: Counter[tuple[str, bool]] | None = None
    after_kill: set[int] = set()  # requests sent once the victim was dead
    chunks: Counter[str] = Counter()

    # The kill: once `kill_after` requests are done, at the first chunk the proxy relays of a stream
    # from the victim (so that stream is mid-response there), synchronously, in the proxy's relay loop.
    streaming = RequestCycle.streamed

    def kill_mid_stream(decision: Any, response: Any, endpoint: Endpoint) -> None:
        nonlocal at_kill
        request_id = decision.request.request_id
        chunks[request_id] += 1
        first = chunks[request_id] == 1
        if at_kill is None and first and done >= kill_after and endpoint.name == victim.host_port:
            victim.signal(signal.SIGKILL)
            at_kill = attempts.in_flight.copy()
        streaming(decision, response, endpoint)

    monkeypatch.setattr(RequestCycle, "streamed", kill_mid_stream)

    async def one(i: int) -> Outcome:
        nonlocal done
        if at_kill is not None:
            after_kill.add(i)
        # Every third request is steered to the victim first, and asks for 1,000 tokens there (the
        # simulator needs ~250 ms for them: a stream caught at its first chunk cannot have been sent
        # whole before the kill); the others ask for 8. Odd requests stream.
        target = names[i % 3]
        tokens = 1000 if target == victim.host_port else 8
        out = await send(http, proxy_url(service), i, stream=i % 2 == 1, target=target, max_tokens=tokens)
        done += 1
        return out

    outcomes = await run_load(total, 8, one)

    assert at_kill is not None, "the victim was never killed"
    assert await asyncio.wait_for(victim.process.wait(), 10) == -signal.SIGKILL
    streams_on_victim = at_kill[(victim.host_port, True)]
    plain_on_victim = at_kill[(victim.host_port, False)]
    failed = [o for o in outcomes if not o.ok]
    # Non-streamed: no client-visible failure, whatever was in flight on the victim.
    assert [o for o in failed if not o.stream] == [], f"{plain_on_victim} plain requests were on the victim"
    # Streamed: 1 <= failures <= the streams whose attempt was on the victim at the kill; each one is
    # a 200 from the victim ended by an SSE error event, and every other request succeeded.
    assert 1 <= len(failed) <= streams_on_victim, (len(failed), streams_on_victim)
    for o in failed:
        assert o.stream and o.status == 200 and o.endpoint == victim.host_port, o
        assert o.error is not None and o.error["type"] == "upstream_error", o
    assert sum(o.ok for o in outcomes) == total - len(failed)
    # Requests sent after the kill were all served elsewhere, those steered to the victim included.
    late = [outcomes[i] for i in sorted(after_kill)]
    assert any(o.index % 3 == 1 for o in late)
    assert all(o.ok and o.endpoint != victim.host_port for o in late)
    assert not service.datastore.is_healthy(victim.host_port)


# SIGSTOP


async def test_a_stopped_server_costs_one_first_byte_timeout_per_request_until_it_is_ejected(
    sim_processes: StartSims, make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    (victim,) = await sim_processes(1)
    others = [name_of(await make_sim()) for _ in range(2)]
    names = [others[0], victim.host_port, others[1]]
    policy = OutlierPolicy(consecutive_failures=2, base_ejection_s=600, max_ejection_s=600)
    service = await make_service(names, steering_config(), first_byte_timeout=0.5, outliers=policy)
    attempts = Attempts.record(service)
    victim.signal(signal.SIGSTOP)
    try:
        outcomes = []
        ejected_after: int | None = None
        for i in range(12):  # in turn: requests 1, 4, 7 and 10 are steered to the stopped server
            outcomes.append(await send(http, proxy_url(service), i, stream=i % 2 == 1, target=names[i % 3]))
            if ejected_after is None and service.datastore.is_ejected(victim.host_port):
                ejected_after = i
    finally:
        victim.signal(signal.SIGCONT)
    # 0 client-visible failures, streamed or not: nothing had reached the client when the attempt timed out.
    assert [o for o in outcomes if not o.ok] == []
    assert all(o.endpoint != victim.host_port for o in outcomes)
    # Exactly two requests paid a first-byte timeout (1 and 4), then the server was ejected: 7 and 10
    # never tried it.
    assert attempts.failed == [(r, victim.host_port, "no response within 0.5s") for r in ("r1", "r4")]
    assert sorted(attempts.on(victim.host_port)) == ["r1", "r4"]
    assert attempts.tried["r1"][0] == attempts.tried["r4"][0] == victim.host_port
    assert len(attempts.tried["r1"]) == len(attempts.tried["r4"]) == 2
    assert ejected_after == 4 and service.datastore.is_ejected(victim.host_port)


# 5xx bursts


async def test_a_5xx_burst_is_retried_elsewhere_and_the_server_ejected_until_it_recovers(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    good = [await make_sim(), await make_sim()]
    bursting = await make_sim(failure_rate=1.0, failure_types=("server_error",))  # 503 to every request
    names = [name_of(good[0]), name_of(bursting), name_of(good[1])]
    policy = OutlierPolicy(consecutive_failures=3, base_ejection_s=30, max_ejection_s=300)
    service = await make_service(names, steering_config(), outliers=policy)
    clock = fake_clock(service)
    attempts = Attempts.record(service)
    url = proxy_url(service)
    burst = [await send(http, url, i, stream=i % 2 == 1, target=names[i % 3]) for i in range(12)]
    # 0 client-visible failures, streamed or not; the burst cost exactly 3 attempts (requests 1, 4, 7),
    # then ejection: request 10 never tried the server.
    assert [o for o in burst if not o.ok] == []
    assert sorted(attempts.on(names[1])) == ["r1", "r4", "r7"]
    assert service.datastore.is_ejected(names[1])
    # The burst ends and the ejection runs out: the server serves what is steered to it again.
    bursting.options = replace(bursting.options, failure_rate=0.0)
    clock.now += 30.0
    after = [await send(http, url, i, stream=i % 2 == 1, target=names[i % 3]) for i in range(12, 18)]
    assert all(o.ok for o in after)
    assert [o.endpoint for o in after if o.index % 3 == 1] == [names[1]] * 2
    assert not service.datastore.is_ejected(names[1])


async def test_a_5xx_burst_through_envoy_reaches_the_client_until_the_server_is_ejected(
    tmp_path: Path, make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    """Envoy does not retry: exactly `consecutive_failures` 503s reach the client, then none (epick
    learns each status from the response headers Envoy sends it over ext_proc)."""
    good = [await make_sim(), await make_sim()]
    bursting = await make_sim(failure_rate=1.0, failure_types=("server_error",))
    names = [name_of(good[0]), name_of(bursting), name_of(good[1])]
    policy = OutlierPolicy(consecutive_failures=3, base_ejection_s=600, max_ejection_s=600)
    extproc = ExtProcOptions(host="127.0.0.1", port=0, health_port=0, secure=True)
    service = await make_service(names, steering_config(), outliers=policy, extproc=extproc)
    gateway = Gateway(service, [], tmp_path, GIE)
    try:
        await gateway.wait_ready(http)
        outcomes = [
            await send(http, gateway.url, i, stream=i % 2 == 1, target=names[i % 3]) for i in range(12)
        ]
    finally:
        gateway.stop()
    failed = [o for o in outcomes if not o.ok]
    assert [o.index for o in failed] == [1, 4, 7]  # exactly 3 client-visible failures
    for o in failed:  # the server's own error, passed through
        assert o.status == 503 and o.error is not None and o.error["code"] == "service_unavailable", o
    assert service.datastore.is_ejected(names[1])
    landed = {rid: d.targets[0].name for rid, d in gateway.decisions.items()}
    assert landed["r10"] != names[1]


# garbage /metrics


class GarbageMetrics(FakeModelServer):
    """Answers generation requests (mode "echo", JSON), but its /metrics is garbage: a page served with
    status 200, or (`raw`) bytes written on the connection instead of an HTTP response."""

    def __init__(self, garbage: bytes, *, raw: bool = False) -> None:
        super().__init__("echo")
        self.garbage = garbage
        self.raw = raw
        self.scrapes = 0

    async def _metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        if self.raw:
            assert request.transport is not None
            request.transport.write(self.garbage)
            request.transport.close()
            return web.Response()  # never sent: the connection is gone
        return web.Response(body=self.garbage, content_type="text/plain")


_NOISE = random.Random(5).randbytes(4096)
GARBAGE = {
    "binary": (_NOISE, False),
    "html": (b"<html><body><h1>502 Bad Gateway</h1></body></html>", False),
    "nan": (vllm_page(waiting=float("nan")).encode(), False),
    "negative": (vllm_page(waiting=-3).encode(), False),
    "overflow": (vllm_page(running=1e400).encode(), False),  # 1e400 reads as inf
    "labels": (b'vllm:num_requests_waiting{model_name="a\\"} 1\nvllm:num_requests_running{ 2\n', False),
    "not-http": (b"SSH-2.0-OpenSSH_9.6\r\n", True),
    "bad-chunks": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n", True),
    "bad-length": (b"HTTP/1.1 200 OK\r\nContent-Length: -7\r\n\r\n" + _NOISE[:64], True),
    "head-over-4MiB": (b"HTTP/1.1 200 OK\r\nX-Junk: " + b"j" * (5 << 20), True),
}


@pytest.mark.parametrize(
    "kind",
    [
        *GARBAGE,
    ],
)
async def test_garbage_metrics_take_the_endpoint_out_after_three_failed_scrapes(
    kind: str, make_sim: MakeSim, make_app: MakeApp, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    garbage, raw = GARBAGE[kind]
    fake = GarbageMetrics(garbage, raw=raw)
    fake.server = await make_app(fake.app())
    good = [name_of(await make_sim()) for _ in range(2)]
    names = [good[0], fake.name, good[1]]
    service = await make_service(names, steering_config(), wait=False)
    scraper = service.scrapers.scraper(fake.name)
    await wait_until(lambda: scraper.failures >= 3, what="three scrapes of the garbage")
    # Three failures in a row (none ever succeeded): out of the candidates, and no metrics were taken.
    assert scraper.scrapes == 0 and scraper.last_error is not None
    assert not service.datastore.is_healthy(fake.name), scraper.last_error
    endpoint = service.datastore.get(fake.name)
    assert endpoint is not None and endpoint.metrics.update_time is None
    await wait_until(
        lambda: all(service.datastore.get(n).metrics.update_time is not None for n in good),  # type: ignore[union-attr]
        what="first scrapes of the good servers",
    )
    outcomes = [
        await send(http, proxy_url(service), i, stream=i % 2 == 1, target=names[i % 3]) for i in range(9)
    ]
    assert [o for o in outcomes if not o.ok] == []  # 0 client-visible failures
    assert fake.requests == [] and all(o.endpoint in good for o in outcomes)
    async with http.get(proxy_url(service) + "/health") as r:
        assert r.status == 200
    assert scraper.consecutive_failures >= 3 and not service.datastore.is_healthy(fake.name)
