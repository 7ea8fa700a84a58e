"""In-cluster: the client as a pod runs it, over HTTPS to the API double with the token and CA the kubelet
mounts; the token rotated on disk; RBAC refusals; the API server going away and coming back."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from epick.datalayer.datastore import Datastore
from epick.datalayer.discovery.kubernetes import KubernetesDiscovery
from epick.datalayer.discovery.kubernetes.client import TokenFile, load_client
from epick.datalayer.discovery.static import DiscoveryError
from epick.service.leader import LeaderElector, LeaseSettings
from tests.kubernetes.fake_apiserver import FakeApiServer, ServerTls
from tests.kubernetes.serviceaccount import ServiceAccountVolume
from tests.kubernetes.test_discovery import FAST, LOGGER, VLLM, eventually, wait_names, wait_watching

USER = "system:serviceaccount:default:epp"
POD_READER = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


@pytest.fixture
async def cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[FakeApiServer, Path]]:
    """The API double on HTTPS with one accepted token, and the pod's environment pointing at it."""
    tls = ServerTls.make(tmp_path / "apiserver")
    server = await FakeApiServer().start(tls=tls)
    server.accept_token("token-1", USER)
    volume = ServiceAccountVolume(tmp_path / "serviceaccount", tls.cert)
    volume.write("token-1")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
    yield server, volume.path
    await server.stop()


async def start_discovery(sa: Path, **kw: Any) -> tuple[KubernetesDiscovery, Datastore, Any]:
    api = await load_client(None, service_account=str(sa))
    ds = Datastore()
    d = KubernetesDiscovery(ds, "default", selector=VLLM, api_client=api, **{**FAST, **kw})
    await d.start()
    return d, ds, api


async def test_https_with_the_mounted_token_and_ca(cluster: tuple[FakeApiServer, Path]) -> None:
    fake, sa = cluster
    fake.add_pod("a", VLLM, "10.0.0.1")
    d, ds, api = await start_discovery(sa)
    try:
        assert api.configuration.host == f"https://127.0.0.1:{fake.port}"
        await wait_names(ds, {"a"})
        assert fake.tokens_seen and set(fake.tokens_seen) == {"token-1"}
        assert fake.refused == []
    finally:
        await d.stop()
        await api.close()


async def test_a_server_certificate_the_mounted_ca_did_not_sign_is_refused(
    cluster: tuple[FakeApiServer, Path], tmp_path: Path
) -> None:
    fake, sa = cluster
    other = ServerTls.make(tmp_path / "other-ca")
    (sa / "ca.crt").unlink()
    (sa / "ca.crt").write_bytes(other.cert.read_bytes())
    api = await load_client(None, service_account=str(sa))
    d = KubernetesDiscovery(Datastore(), "default", selector=VLLM, api_client=api, **FAST)
    try:
        with pytest.raises(
            DiscoveryError, match=r"cannot reach the Kubernetes API server at https://127\.0\.0\.1"
        ):
            await d.start()
    finally:
        await api.close()
    assert fake.requests == []  # no request got past the handshake


async def test_missing_token_or_ca_is_an_error_naming_the_file(
    cluster: tuple[FakeApiServer, Path], tmp_path: Path
) -> None:
    _, sa = cluster
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DiscoveryError, match=re.escape(f"no CA certificate at {empty / 'ca.crt'}")):
        await load_client(None, service_account=str(empty))
    (empty / "ca.crt").write_bytes((sa / "ca.crt").read_bytes())
    with pytest.raises(
        DiscoveryError, match=re.escape("cannot read the service-account token: ") + ".*token"
    ):
        await load_client(None, service_account=str(empty))


async def test_a_rotated_token_is_picked_up_before_the_next_request(
    cluster: tuple[FakeApiServer, Path],
) -> None:
    """The kubelet writes a new token and the old one stops working: the next request carries the new
    one, without a 401 first."""
    fake, sa = cluster
    fake.add_pod("a", VLLM, "10.0.0.1")
    d, ds, api = await start_discovery(sa)
    try:
        await wait_watching(fake)
        ServiceAccountVolume(sa, sa / "ca.crt").write("token-2")
        fake.accept_token("token-2", USER)
        fake.revoke_token("token-1")
        fake.end_watches()  # the next watch is a new request
        fake.add_pod("b", VLLM, "10.0.0.2")
        await wait_names(ds, {"a", "b"})
        assert fake.tokens_seen[-1] == "token-2"
        assert fake.refused == []
    finally:
        await d.stop()
        await api.close()


def test_the_token_file_keeps_the_last_token_while_the_file_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    token = TokenFile(path)
    assert token.refresh() == "one" and token.reads == 1
    assert token.refresh() == "one" and token.reads == 1  # unchanged: not read again
    path.unlink()
    with caplog.at_level(logging.WARNING):
        assert token.refresh() == "one"
        assert token.refresh() == "one"
    assert len(caplog.records) == 1 and "keeping the last token" in caplog.records[0].getMessage()
    path.write_text("two")
    assert token.refresh() == "two"
    path.write_text("")  # half-written: keep what worked
    assert token.refresh() == "two"


async def test_an_unaccepted_token_is_a_401_saying_so(
    cluster: tuple[FakeApiServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    fake, sa = cluster
    fake.accept_token("token-2", USER)
    fake.revoke_token("token-1")
    api = await load_client(None, service_account=str(sa))
    d = KubernetesDiscovery(Datastore(), "default", selector=VLLM, api_client=api, **FAST)
    try:
        with pytest.raises(DiscoveryError) as raised:
            await d.start()
    finally:
        await api.close()
    assert "401 Unauthorized" in str(raised.value)
    assert (
        "the API server refused the service account's token, asked to list pods in namespace default"
        in str(raised.value)
    )


async def test_rbac_refusals_name_the_verb_and_the_resource(
    cluster: tuple[FakeApiServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Allowed to list pods but not to watch them: the warning quotes the API server and says which
    permission the service account lacks."""
    fake, sa = cluster
    fake.grant(USER, [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], namespace="default")
    fake.add_pod("a", VLLM, "10.0.0.1")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        d, ds, api = await start_discovery(sa)
        try:
            await wait_names(ds, {"a"})
            await eventually(lambda: any(code == 403 for code, _ in fake.refused), lambda: fake.refused)
            await eventually(lambda: bool(caplog.records), lambda: caplog.records)
        finally:
            await d.stop()
            await api.close()
    message = caplog.records[0].getMessage()
    assert (
        '403 Forbidden: pods is forbidden: User "system:serviceaccount:default:epp" cannot watch resource '
        '"pods" in API group "" in the namespace "default"'
    ) in message
    assert "RBAC: this pod's service account may not watch pods in namespace default" in message


async def test_rbac_refusal_of_the_lease_names_it(
    cluster: tuple[FakeApiServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    fake, sa = cluster
    fake.grant(USER, POD_READER, namespace="default")
    api = await load_client(None, service_account=str(sa))
    settings = LeaseSettings(
        "epp-default-pool.llm-d.ai", "default", lease_duration=0.6, renew_deadline=0.4, retry_period=0.05
    )
    elector = LeaderElector(api, settings)
    try:
        with caplog.at_level(logging.WARNING, logger="epick.leader"):
            elector.start()
            await eventually(lambda: bool(caplog.records), lambda: fake.refused)
    finally:
        await elector.stop()
        await api.close()
    assert not elector.leading
    assert (
        "may not get leases.coordination.k8s.io 'epp-default-pool.llm-d.ai' in namespace default"
        in caplog.records[0].getMessage()
    )


async def test_the_api_server_going_away_and_coming_back(
    cluster: tuple[FakeApiServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """While it is away, pods change and the history is compacted: back, the watch's version is 410 Gone,
    discovery lists again and ends with what is there, with no restart."""
    fake, sa = cluster
    fake.add_pod("a", VLLM, "10.0.0.1")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        d, ds, api = await start_discovery(sa)
        try:
            await wait_watching(fake)
            lists = fake.request_count(watch=False)
            await fake.stop()
            fake.add_pod("b", VLLM, "10.0.0.2")
            fake.delete_pod("a")
            fake.expire_history()
            await eventually(
                lambda: any("retrying with backoff" in r.getMessage() for r in caplog.records),
                lambda: [r.getMessage() for r in caplog.records],
            )
            await fake.start(tls=fake.tls, port=fake.port)
            await wait_names(ds, {"b"})
            assert fake.gone_served >= 1
            assert fake.request_count(watch=False) == lists + 1
            await wait_watching(fake)
        finally:
            await d.stop()
            await api.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any("watch expired" in m and "listing again" in m for m in messages)
    assert any("answers again" in m for m in messages)
