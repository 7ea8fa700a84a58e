"""`epick serve` discovering its endpoints from an InferencePool: requests follow the pool's pods."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from epick.cli.main import build_parser
from epick.cli.serve import settings_from
from epick.proxy.server import ProxyOptions
from epick.service import KubernetesSettings, Service, Settings
from epick.sim.options import ServerOptions
from epick.sim.server import IDENTITY_HEADER, SimServer
from tests.kubernetes.fake_apiserver import FakeApiServer

LABELS = {"app": "vllm"}


def kubeconfig(path: Path, url: str) -> str:
    path.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{url}"}}}}]
users: [{{name: me, user: {{token: secret}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: me, namespace: default}}}}]
current-context: fake
""",
        encoding="utf-8",
    )
    return str(path)


async def wait_for(condition: object, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def test_requests_follow_the_pools_pods(
    fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    sims = [SimServer(ServerOptions(port=0, time_scale=100), i) for i in range(2)]
    for s in sims:
        await s.start()
    # One pod whose two target ports are the two simulated servers: endpoints pod-a-rank-0 and -rank-1.
    fake.add_pod("pod-a", LABELS, "127.0.0.1")
    fake.put_pool("pool", LABELS, [sims[0].port, sims[1].port])
    options = Settings(
        kubernetes=KubernetesSettings(
            namespace="default", pool="pool", kubeconfig=kubeconfig(tmp_path / "kc", fake.url)
        ),
        proxy=ProxyOptions(host="127.0.0.1", port=0),
        metrics_port=None,
        refresh_metrics_interval=0.02,
    )
    service = Service(options)
    await service.start()
    try:
        assert sorted(ep.name for ep in service.datastore.all_endpoints()) == ["pod-a-rank-0", "pod-a-rank-1"]
        assert service.proxy is not None
        url = f"http://127.0.0.1:{service.proxy.port}/v1/completions"
        served = set()
        async with aiohttp.ClientSession() as session:
            for i in range(8):
                body = {"model": "sim-model", "prompt": f"request {i}", "max_tokens": 1}
                async with session.post(url, json=body) as r:
                    assert r.status == 200, await r.text()
                    served.add(r.headers[IDENTITY_HEADER])
            assert served <= {s.name for s in sims}
            # The pod goes away: so do its endpoints, and the proxy says there is nothing to serve on.
            fake.delete_pod("pod-a")
            await wait_for(lambda: len(service.datastore) == 0)
            async with session.post(url, json={"model": "sim-model", "prompt": "x", "max_tokens": 1}) as r:
                assert r.status == 503
                assert "no ready endpoint" in (await r.json())["error"]["message"]
    finally:
        await service.stop()
        for s in sims:
            await s.stop()


def test_flags_choose_kubernetes_discovery() -> None:
    args = build_parser().parse_args(["serve", "--pool-name", "p", "--pool-namespace", "ns"])
    options = settings_from(args)
    assert options.kubernetes == KubernetesSettings(namespace="ns", pool="p")
    assert options.pool_name == "p" and options.endpoints == ()
    args = build_parser().parse_args(
        ["serve", "--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000,8001"]
    )
    options = settings_from(args)
    assert options.kubernetes is not None
    assert options.kubernetes.selector == "app=vllm" and options.kubernetes.target_ports == (8000, 8001)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["serve", "--endpoints", "a:1", "--pool-name", "p"],
        ["serve", "--pool-name", "p", "--endpoint-selector", "a=b"],
    ],
)
def test_one_source_of_endpoints(argv: list[str]) -> None:
    with pytest.raises(SystemExit, match="epick serve: give"):
        settings_from(build_parser().parse_args(argv))


async def test_a_pool_protocol_no_parser_serves_keeps_the_service_unready(
    fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As upstream's readiness: the InferencePool's appProtocol must be one every parser that names its
    protocols serves (the default config's OpenAI parser: http and kubernetes.io/h2c)."""
    from epick.extproc.health import NOT_SERVING, SERVING
    from epick.extproc.server import ExtProcOptions
    from tests.extproc.gateway import free_port

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    fake.add_pod("pod-a", LABELS, "127.0.0.1")
    fake.put_pool("pool", LABELS, [8000], app_protocol="kubernetes.io/ws")
    settings = Settings(
        kubernetes=KubernetesSettings(
            namespace="default", pool="pool", kubeconfig=kubeconfig(tmp_path / "kc", fake.url)
        ),
        proxy=None,
        extproc=ExtProcOptions(host="127.0.0.1", port=free_port(), health_port=free_port(), secure=False),
        metrics_port=None,
    )
    service = Service(settings)
    await service.start()
    try:
        assert service.health.status("readiness") == NOT_SERVING
        assert "not the InferencePool's 'kubernetes.io/ws'" in (service.health.not_ready or "")
        fake.put_pool("pool", LABELS, [8000], app_protocol="kubernetes.io/h2c")
        await wait_for(lambda: service.health.status("readiness") == SERVING)
    finally:
        await service.stop()
