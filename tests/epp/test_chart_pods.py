"""`epp` run as upstream's charts run the Go EPP: their arguments and environment, the API double as
the cluster, probed by service name over plaintext gRPC, one request through a real Envoy, JSON logs,
SIGTERM, a missing pool, and two replicas electing a leader."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from epick.extproc.health import NOT_SERVING, SERVING
from epick.sim.options import ServerOptions
from epick.sim.server import IDENTITY_HEADER, SimServer
from tests.epp.charts import ChartPod, chart_pods
from tests.epp.running import Envoy, start_epp
from tests.kubernetes.fake_apiserver import FakeApiServer

PODS = {pod.name: pod for pod in chart_pods()}
LABELS = {"app": "vllm-qwen3-32b"}
ZAP_KEYS = {"level", "ts", "logger", "caller", "msg"}


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = SimServer(ServerOptions(port=0, time_scale=100), 0)
    await server.start()
    yield server
    await server.stop()


def pool_name(pod: ChartPod) -> str:
    return pod.args[pod.args.index("--pool-name") + 1]


@pytest.mark.parametrize("name", ["gie-v1.5.0-default", "router-gateway-default"])
async def test_a_chart_pod_waits_for_its_pool_serves_through_envoy_and_stops_on_sigterm(
    name: str, fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    pod = PODS[name]
    _, probe_service = pod.probe("readiness")
    scraper = f"system:serviceaccount:{pod.namespace}:{pod.fixture['serviceAccountName']}"
    fake.tokens = {"scraper": (scraper, ["system:serviceaccounts"])}
    fake.allowed = {(scraper, "/metrics", "get")}
    epp = start_epp(pod, tmp_path, fake.url)
    envoy: Envoy | None = None
    try:
        # No InferencePool yet: running, unready, trying again.
        await epp.wait_health(probe_service, NOT_SERVING)
        assert await epp.health("liveness") == SERVING
        fake.add_pod("vllm-0", LABELS, "127.0.0.1", namespace=pod.namespace)
        fake.put_pool(pool_name(pod), LABELS, [sim.port], namespace=pod.namespace)
        await epp.wait_health(probe_service, SERVING)
        for service in ("", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            assert await epp.health(service) == SERVING

        envoy = Envoy(tmp_path, epp.grpc_port)
        await envoy.wait_ready()
        async with aiohttp.ClientSession() as session:
            body = {"model": "sim-model", "prompt": "hello", "max_tokens": 2}
            async with session.post(f"{envoy.url}/v1/completions", json=body) as r:
                assert r.status == 200, await r.text()
                assert r.headers[IDENTITY_HEADER] == sim.name
            # /metrics: upstream's default is TokenReview + SubjectAccessReview, as Prometheus scrapes
            # it with the EPP's service-account token
            metrics = f"http://127.0.0.1:{epp.metrics_port}/metrics"
            async with session.get(metrics) as r:
                assert r.status == 401
            async with session.get(metrics, headers={"Authorization": "Bearer scraper"}) as r:
                assert r.status == 200
                page = await r.text()
            for family in ("llm_d_epp_request_total", "inference_objective_request_total", "llm_d_epp_info"):
                assert f"\n{family}{{" in page, family

        # The pool is deleted: readiness turns NOT_SERVING, the process stays.
        fake.delete_pool(pool_name(pod), namespace=pod.namespace)
        await epp.wait_health(probe_service, NOT_SERVING)
        assert epp.proc.poll() is None

        took = await epp.terminate()
        assert epp.proc.returncode == 0
        assert 4.5 <= took < 12  # idle: the drain ends 5 s in, once no stream is open (the grace is 130 s)
        lines = epp.log_lines()  # every line is JSON
        assert lines and all(line.keys() >= ZAP_KEYS for line in lines)
        messages = [line["msg"] for line in lines]
        assert any("not found" in m and pool_name(pod) in m for m in messages)
        assert any(m.startswith("not ready: ") for m in messages)
    finally:
        if envoy is not None:
            envoy.stop()
        epp.kill()


async def test_two_replicas_elect_one_leader_and_the_standby_takes_over_when_it_is_killed(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    pod = PODS["gie-v1.5.0-replicas2"]
    assert "--ha-enable-leader-election" in pod.args and pod.probe("readiness")[1] == "readiness"
    fake.add_pod("vllm-0", LABELS, "127.0.0.1", namespace=pod.namespace)
    fake.put_pool(pool_name(pod), LABELS, [sim.port], namespace=pod.namespace)
    fast = ["--lease-duration=2s", "--lease-renew-deadline=1s", "--lease-retry-period=100ms"]
    replicas = [start_epp(pod, tmp_path, fake.url, extra=fast, tag=str(i)) for i in range(2)]
    lease_name = f"epp-{pod.namespace}-{pool_name(pod)}.llm-d.ai"
    try:
        for epp in replicas:
            await epp.wait_health("liveness", SERVING)
        # exactly one is ready: the Lease holder
        for _ in range(200):
            ready = [await epp.health("readiness") == SERVING for epp in replicas]
            if sum(ready) == 1:
                break
            await _pause()
        assert sum(ready) == 1, ready
        leader, standby = (replicas[0], replicas[1]) if ready[0] else (replicas[1], replicas[0])
        assert await standby.health("") == NOT_SERVING
        assert await standby.health("inference-extension") == 1 + 2  # SERVICE_UNKNOWN, as upstream
        lease = fake.lease(lease_name, namespace=pod.namespace)
        assert lease is not None and lease["spec"]["leaseDurationSeconds"] == 2

        leader.kill()  # SIGKILL: no release; the standby waits the Lease out
        await standby.wait_health("readiness", SERVING, timeout=15)
        took = await standby.terminate()
        assert standby.proc.returncode == 0 and took < 10
        released = fake.lease(lease_name, namespace=pod.namespace)
        assert released is not None and released["spec"]["holderIdentity"] == ""
    finally:
        for epp in replicas:
            epp.kill()


async def _pause() -> None:
    import asyncio

    await asyncio.sleep(0.05)


async def test_epp_listens_on_every_address_family(tmp_path: Path) -> None:
    """epp binds as the Go EPP: IPv4 and IPv6 alike (a dual-stack cluster's probes use either)."""
    import socket

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from epick.datalayer.datastore import EndpointSpec
    from epick.extproc.server import ExtProcOptions
    from epick.service import Service, Settings
    from tests.extproc.gateway import free_port

    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))  # this machine has IPv6 loopback (the test needs it)
    options = ExtProcOptions(
        host="", port=free_port(), health_port=free_port(), secure=False, health_plaintext=True
    )
    service = Service(
        Settings(
            endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}),), proxy=None, extproc=options, metrics_port=None
        )
    )
    await service.start()
    try:
        for address in ("127.0.0.1", "[::1]"):
            async with grpc.aio.insecure_channel(f"{address}:{options.health_port}") as channel:
                answer = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service="liveness"), timeout=5
                )
                assert answer.status == SERVING, address
    finally:
        await service.stop()
