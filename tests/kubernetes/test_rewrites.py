"""`epick serve` following a pool's InferenceModelRewrite resources in the cluster: live requests are
renamed as the resources say, in both API groups that serve them, and follow their changes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epick.cli.main import build_parser
from epick.cli.serve import settings_from
from epick.proxy.server import ProxyOptions
from epick.service import KubernetesSettings, Service, Settings
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer
from tests.kubernetes.fake_apiserver import REWRITES_GIE, REWRITES_LLMD, FakeApiServer
from tests.kubernetes.test_serve import LABELS, kubeconfig, wait_for

SERVED = "sim-model"


def rule(model: str | None, *targets: tuple[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"targets": [{"modelRewrite": m, "weight": w} for m, w in targets]}
    if model is not None:
        out["matches"] = [{"model": {"type": "Exact", "value": model}}]
    return out


def spec(pool: str, *rules: dict[str, Any]) -> dict[str, Any]:
    return {"poolRef": {"name": pool}, "rules": list(rules)}


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    server = SimServer(ServerOptions(port=0, time_scale=100), 0)
    await server.start()
    yield server
    await server.stop()


async def start_service(fake: FakeApiServer, sim: SimServer, tmp_path: Path, **more: Any) -> Service:
    fake.add_pod("pod-a", LABELS, "127.0.0.1")
    fake.put_pool("pool", LABELS, [sim.port])
    options = Settings(
        kubernetes=KubernetesSettings(
            namespace="default", pool="pool", kubeconfig=kubeconfig(tmp_path / "kc", fake.url)
        ),
        proxy=ProxyOptions(host="127.0.0.1", port=0),
        metrics_port=None,
        refresh_metrics_interval=0.02,
        rewrites_pool="pool",
        seed=3,
        **more,
    )
    service = Service(options)
    await service.start()
    return service


async def served_as(service: Service, model: str) -> tuple[int, str]:
    """Status and the model the server answered as, for a completion asking for `model`."""
    assert service.proxy is not None
    url = f"http://127.0.0.1:{service.proxy.port}/v1/completions"
    payload = {"model": model, "prompt": "hi", "max_tokens": 1}
    async with aiohttp.ClientSession() as session, session.post(url, json=payload) as r:
        body = await r.json()
        return r.status, str(body.get("model") or body.get("error", {}).get("message"))


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


async def test_requests_follow_the_pools_rewrites_in_the_cluster(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    # Present before start: in force before the first request. Another pool's rewrite is not ours.
    fake.put_rewrite("alias", spec("pool", rule("my-alias", (SERVED, 1))))
    fake.put_rewrite("elsewhere", spec("other-pool", rule("other-alias", (SERVED, 1))))
    service = await start_service(fake, sim, tmp_path)
    try:
        assert await served_as(service, "my-alias") == (200, SERVED)
        status, _ = await served_as(service, "other-alias")
        assert status == 404
        # Created in llm-d's group while serving: followed by the watch.
        fake.put_rewrite("llmd", spec("pool", rule("llmd-alias", (SERVED, 1))), api=REWRITES_LLMD)
        await wait_for(lambda: service.director.rewrites.target_model("llmd-alias") == SERVED)
        assert await served_as(service, "llmd-alias") == (200, SERVED)
        # Changed: the alias now points at a model nobody serves, so the server says so.
        fake.put_rewrite("alias", spec("pool", rule("my-alias", ("gone-model", 1))))
        await wait_for(lambda: service.director.rewrites.target_model("my-alias") == "gone-model")
        # Deleted: the name is passed through unchanged again.
        fake.delete_rewrite("llmd", api=REWRITES_LLMD)
        await wait_for(lambda: service.director.rewrites.target_model("llmd-alias") is None)
        # A rewrite whose poolRef moves to another pool stops applying here.
        fake.put_rewrite("alias", spec("other-pool", rule("my-alias", (SERVED, 1))))
        await wait_for(lambda: service.director.rewrites.target_model("my-alias") is None)
    finally:
        await service.stop()


async def test_an_invalid_rewrite_keeps_its_last_valid_version(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put_rewrite("split", spec("pool", rule("m", ("a", 1))))
    service = await start_service(fake, sim, tmp_path)
    try:
        with caplog.at_level(logging.ERROR):
            fake.put_rewrite("split", spec("pool", rule("m", ("a", 0))))  # weight 0 does not validate
            await wait_for(lambda: "targets[0].weight must be an integer" in caplog.text)
        assert "default/split (inference.networking.x-k8s.io)" in caplog.text
        assert "last valid version stays in force" in caplog.text
        assert service.director.rewrites.target_model("m") == "a"
        fake.put_rewrite("split", spec("pool", rule("m", ("b", 1))))  # fixed
        await wait_for(lambda: service.director.rewrites.target_model("m") == "b")
    finally:
        await service.stop()


async def test_cluster_and_file_rewrites_meet_under_gies_precedence(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    # The older resource wins an exact match, wherever it comes from.
    fake.put_rewrite("new", spec("pool", rule("m", ("from-cluster", 1))), created="2025-06-01T00:00:00Z")
    fake.put_rewrite("catch-all", spec("pool", rule(None, ("fallback", 1))))
    rewrites = tmp_path / "rewrites.yaml"
    rewrites.write_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceModelRewrite\n"
        "metadata: {name: old, creationTimestamp: '2024-01-01T00:00:00Z'}\n"
        "spec: {poolRef: {name: pool}, rules: [{matches: [{model: {value: m}}], "
        "targets: [{modelRewrite: from-file}]}]}\n"
    )
    service = await start_service(fake, sim, tmp_path, model_rewrites_file=str(rewrites))
    try:
        assert service.director.rewrites.target_model("m") == "from-file"
        assert service.director.rewrites.target_model("x") == "fallback"
        rewrites.write_text("")  # the file's resource goes on reload; the cluster's stay
        assert service.reload() is True
        assert service.director.rewrites.target_model("m") == "from-cluster"
        assert service.director.rewrites.target_model("x") == "fallback"
    finally:
        await service.stop()


async def test_weighted_splits_follow_the_weights(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    fake.put_rewrite("canary", spec("pool", rule("llama", ("v1", 3), ("v2", 1))))
    service = await start_service(fake, sim, tmp_path)
    try:
        picks = [service.director.rewrites.target_model("llama") for _ in range(4000)]
        assert set(picks) == {"v1", "v2"}
        assert 0.70 < picks.count("v1") / len(picks) < 0.80  # 3:1, with a fixed seed
    finally:
        await service.stop()


async def test_a_group_not_installed_or_forbidden_leaves_the_other_working(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.served_rewrite_versions = {REWRITES_GIE, REWRITES_LLMD}
    fake.forbidden_rewrite_versions = {REWRITES_GIE}
    fake.put_rewrite("llmd", spec("pool", rule("alias", (SERVED, 1))), api=REWRITES_LLMD)
    with caplog.at_level(logging.INFO):
        service = await start_service(fake, sim, tmp_path)
    try:
        assert "forbidden" in caplog.text and "InferenceModelRewrites from this group are off" in caplog.text
        assert await served_as(service, "alias") == (200, SERVED)
    finally:
        await service.stop()
    fake.served_rewrite_versions = {REWRITES_LLMD}
    fake.forbidden_rewrite_versions = set()
    fake.delete_pod("pod-a")
    fake.delete_pool("pool")
    with caplog.at_level(logging.INFO):
        service = await start_service(fake, sim, tmp_path)
    try:
        assert "not served (CRD not installed)" in caplog.text
        assert await served_as(service, "alias") == (200, SERVED)
    finally:
        await service.stop()


async def test_rewrites_are_not_watched_when_asked_not_to(
    fake: FakeApiServer, sim: SimServer, tmp_path: Path
) -> None:
    fake.put_rewrite("alias", spec("pool", rule("my-alias", (SERVED, 1))))
    fake.add_pod("pod-a", LABELS, "127.0.0.1")
    fake.put_pool("pool", LABELS, [sim.port])
    options = Settings(
        kubernetes=KubernetesSettings(
            namespace="default",
            pool="pool",
            kubeconfig=kubeconfig(tmp_path / "kc", fake.url),
            watch_rewrites=False,
        ),
        proxy=ProxyOptions(host="127.0.0.1", port=0),
        metrics_port=None,
    )
    service = Service(options)
    await service.start()
    try:
        assert service.director.rewrites.target_model("my-alias") is None
        assert not any(path.endswith("inferencemodelrewrites") for path, _ in fake.requests)
    finally:
        await service.stop()


def test_the_flag_turns_the_watch_off() -> None:
    on = settings_from(build_parser().parse_args(["serve", "--pool-name", "p"]))
    off = settings_from(build_parser().parse_args(["serve", "--pool-name", "p", "--no-watch-model-rewrites"]))
    assert on.kubernetes is not None and on.kubernetes.watch_rewrites is True
    assert off.kubernetes is not None and off.kubernetes.watch_rewrites is False
