"""Flow control through the proxy, seen by independent HTTP clients: a saturated pool holds
requests (the connection stays open), dispatches them by priority then fairness as capacity frees,
refuses beyond the band's limit and past the queue-wait budget with upstream's status and reason,
and forgets a request whose client disconnects, at once. Every request gets exactly one answer."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import aiohttp

from epick.config import LoadedConfig, load_config_text
from epick.requestcontrol.admission import DROPPED_REASON_HEADER
from tests.datalayer.pages import wait_until
from tests.proxy.conftest import MODEL, MakeService, proxy_url


def flow_config(
    *, band_limit: int = 100, ttl: str = "60s", concurrency: int = 1, eviction: bool = False
) -> LoadedConfig:
    """One request in flight per endpoint at most (the concurrency detector), two bands."""
    return load_config_text(
        f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: concurrency-detector
  parameters: {{maxConcurrency: {concurrency}, concurrencyMode: requests}}
- type: round-robin-fairness-policy
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
flowControl:
  enableEviction: {str(eviction).lower()}
  defaultRequestTTL: {ttl}
  saturationDetector: {{pluginRef: concurrency-detector}}
  priorityBands:
  - {{priority: 10, fairnessPolicyRef: round-robin-fairness-policy}}
  - {{priority: 0, fairnessPolicyRef: round-robin-fairness-policy, maxRequests: {band_limit}}}
""",
        seed=0,
    )


def body(name: str) -> bytes:
    return json.dumps({"model": MODEL, "prompt": name, "max_tokens": 2, "stream": True}).encode()


def headers(tenant: str, objective: str = "") -> dict[str, str]:
    h = {"content-type": "application/json", "x-gateway-inference-fairness-id": tenant}
    if objective:
        h["x-gateway-inference-objective"] = objective
    return h


async def send(
    http: aiohttp.ClientSession, url: str, name: str, tenant: str, objective: str = ""
) -> tuple[str, int, str]:
    async with http.post(url + "/v1/completions", data=body(name), headers=headers(tenant, objective)) as r:
        text = await r.text()
        return name, r.status, r.headers.get(DROPPED_REASON_HEADER, "") or text


def served_order(fake: object) -> list[str]:
    return [json.loads(raw)["prompt"] for _, raw in fake.requests]  # type: ignore[attr-defined]


async def test_a_saturated_pool_dispatches_by_priority_then_round_robin(
    make_fake: object, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("gated")  # type: ignore[operator]
    service = await make_service([fake.name], flow_config(), objectives=(("urgent", 10),))
    url = proxy_url(service)
    admission = service.director.admission
    assert admission is not None
    first = asyncio.create_task(send(http, url, "A", "x"))
    await wait_until(lambda: len(fake.requests) == 1, what="A to reach the model server")
    queued = []
    for name, tenant, objective in [("B1", "b", ""), ("B2", "b", ""), ("C1", "c", ""), ("H1", "h", "urgent")]:
        queued.append(asyncio.create_task(send(http, url, name, tenant, objective)))
        count = len(queued)
        await wait_until(lambda: admission.queued == count, what=f"{name} to queue")  # noqa: B023
    assert served_order(fake) == ["A"]  # the others wait in epick, their connections open
    fake.gate.set()
    results = await asyncio.gather(first, *queued)
    assert [status for _, status, _ in results] == [200] * 5
    assert served_order(fake) == ["A", "H1", "B1", "C1", "B2"]


async def test_a_full_band_answers_429_with_the_dropped_reason(
    make_fake: object, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("gated")  # type: ignore[operator]
    service = await make_service([fake.name], flow_config(band_limit=2))
    url = proxy_url(service)
    admission = service.director.admission
    assert admission is not None
    first = asyncio.create_task(send(http, url, "A", "x"))
    await wait_until(lambda: len(fake.requests) == 1, what="A to reach the model server")
    waiting = [asyncio.create_task(send(http, url, f"W{i}", "x")) for i in range(2)]
    await wait_until(lambda: admission.queued == 2, what="two to queue")
    _, status, reason = await send(http, url, "over", "x")
    assert (status, reason) == (429, "rejected-saturated")
    fake.gate.set()
    assert [s for _, s, _ in await asyncio.gather(first, *waiting)] == [200, 200, 200]
    assert "over" not in served_order(fake)


async def test_a_request_past_its_budget_gets_429_ttl_expired(
    make_fake: object, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("gated")  # type: ignore[operator]
    service = await make_service([fake.name], flow_config(ttl="200ms"))
    url = proxy_url(service)
    first = asyncio.create_task(send(http, url, "A", "x"))
    await wait_until(lambda: len(fake.requests) == 1, what="A to reach the model server")
    async with http.post(url + "/v1/completions", data=body("late"), headers=headers("x")) as r:
        assert r.status == 429
        assert r.headers[DROPPED_REASON_HEADER] == "rejected-ttl-expired"
        error = (await r.json())["error"]
    assert error["code"] == "rejected-ttl-expired" and "timed out in queue" in error["message"]
    fake.gate.set()
    assert (await first)[1] == 200
    assert served_order(fake) == ["A"]


async def test_a_client_that_disconnects_leaves_the_queue_at_once(
    make_fake: object, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    fake = await make_fake("gated")  # type: ignore[operator]
    service = await make_service([fake.name], flow_config())
    url = proxy_url(service)
    admission = service.director.admission
    assert admission is not None
    first = asyncio.create_task(send(http, url, "A", "x"))
    await wait_until(lambda: len(fake.requests) == 1, what="A to reach the model server")
    leaving = asyncio.create_task(send(http, url, "gone", "y"))
    await wait_until(lambda: admission.queued == 1, what="the request to queue")
    leaving.cancel()  # the client closes its connection
    await wait_until(lambda: admission.queued == 0, what="the queue to forget it")
    fake.gate.set()
    assert (await first)[1] == 200
    assert served_order(fake) == ["A"]
    metrics = service.metrics.registry.get_sample_value(
        "llm_d_epp_flow_control_requests_total",
        {"outcome": "EvictedContextCancelled", "priority": "0", "inference_pool": service.settings.pool_name},
    )
    assert metrics == 1.0
    # Both requests were admitted to a queue (A dispatched at once, the other held): two enqueues.
    enqueued = [
        service.metrics.registry.get_sample_value(
            "inference_extension_flow_control_request_enqueue_duration_seconds_count",
            {"fairness_id": tenant, "priority": "0", "outcome": "NotYetFinalized"},
        )
        for tenant in ("x", "y")
    ]
    assert enqueued == [1.0, 1.0]


async def test_overload_from_many_tenants_every_request_answered_once(
    make_fake: object, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    """40 requests, 4 tenants, 2 priorities, 4 slots, band 0 holding 12: each request is answered
    exactly once (200 or 429), the model server sees each 200 exactly once, only band 0 refuses,
    and no request of band 0 is served while one of band 10 waits."""
    fake = await make_fake("gated")  # type: ignore[operator]
    service = await make_service(
        [fake.name], flow_config(band_limit=12, concurrency=4), objectives=(("urgent", 10),)
    )
    url = proxy_url(service)
    admission = service.director.admission
    assert admission is not None
    tasks = []
    for i in range(40):
        tenant, objective = f"t{i % 4}", ("urgent" if i % 3 == 0 else "")
        tasks.append(asyncio.create_task(send(http, url, f"r{i}", tenant, objective)))
    await wait_until(
        lambda: len(fake.requests) == 4 and admission.queued + sum(t.done() for t in tasks) == 36,
        what="4 in flight and the rest queued or refused",
    )
    fake.gate.set()
    results = await asyncio.gather(*tasks)
    statuses = Counter(status for _, status, _ in results)
    assert set(statuses) <= {200, 429} and sum(statuses.values()) == 40
    served = served_order(fake)
    assert sorted(served) == sorted(name for name, status, _ in results if status == 200)
    assert len(set(served)) == len(served)
    refused = [name for name, status, _ in results if status == 429]
    assert refused and all(int(name[1:]) % 3 != 0 for name in refused)  # only band 0 was full
    later = [int(name[1:]) % 3 == 0 for name in served[4:]]  # after the first four, dispatched from queues
    assert later == sorted(later, reverse=True)  # every urgent one before any other
    assert admission.queued == 0


async def test_a_sheddable_request_in_flight_is_evicted_for_a_waiting_urgent_one(
    make_fake: object, make_service: MakeService, http: aiohttp.ClientSession
) -> None:
    """enableEviction: the pool is full with a batch (priority -5) request the model server has not
    answered yet; an urgent (10) one arrives and waits; flow control evicts the batch request (its
    client gets 429 `evicted`, its model-server connection closes) and the urgent one goes."""
    fake = await make_fake("hang")  # type: ignore[operator]
    service = await make_service(
        [fake.name], flow_config(eviction=True), objectives=(("urgent", 10), ("batch", -5))
    )
    url = proxy_url(service)
    batch = asyncio.create_task(send(http, url, "batch", "x", "batch"))
    await wait_until(lambda: len(fake.requests) == 1, what="the batch request at the model server")
    urgent = asyncio.create_task(send(http, url, "urgent", "y", "urgent"))
    _, status, reason = await batch
    assert (status, reason) == (429, "evicted")
    await wait_until(lambda: len(fake.requests) == 2, what="the urgent request at the model server")
    assert served_order(fake) == ["batch", "urgent"]
    fake.gate.set()
    assert (await urgent)[1] == 200
    admission = service.director.admission
    assert admission is not None and admission.controller.reclamation is not None
    assert admission.controller.reclamation.issued == 1
