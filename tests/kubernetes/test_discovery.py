"""Kubernetes discovery with the real kubernetes-asyncio client against an in-memory API server."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.discovery.kubernetes import KubernetesDiscovery
from epick.datalayer.discovery.static import DiscoveryError
from tests.kubernetes.fake_apiserver import POOL_V1ALPHA2, FakeApiServer, parse_label_selector

VLLM = {"app": "vllm"}
FAST = {"backoff_s": (0.005, 0.05), "request_timeout_s": 5.0}
LOGGER = "epick.datalayer.discovery.kubernetes"

Make = Callable[..., Awaitable[KubernetesDiscovery]]


@pytest.fixture
def ds() -> Datastore:
    return Datastore()


@pytest.fixture
async def make(api: Any, ds: Datastore) -> AsyncIterator[Make]:
    """Build and start a discovery (on the `ds` fixture unless given `datastore`), stopped at the end."""
    started: list[KubernetesDiscovery] = []

    async def start(**kw: Any) -> KubernetesDiscovery:
        kw.setdefault("api_client", api)
        d = KubernetesDiscovery(kw.pop("datastore", ds), kw.pop("namespace", "default"), **{**FAST, **kw})
        await d.start()
        started.append(d)
        return d

    yield start
    for d in started:
        await d.stop()


def names(ds: Datastore) -> set[str]:
    return {s.name for s in ds.specs()}


async def eventually(check: Callable[[], bool], what: Callable[[], object], timeout: float = 5.0) -> None:
    """Poll until `check()` holds; fail with `what()` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out; now: {what()}")
        await asyncio.sleep(0.002)


async def wait_names(ds: Datastore, expected: set[str]) -> None:
    await eventually(lambda: names(ds) == expected, lambda: sorted(names(ds)))


async def wait_watching(fake: FakeApiServer, resource: str = "pods", count: int = 1) -> None:
    await eventually(lambda: fake.watch_count(resource) >= count, lambda: fake.watch_count(resource))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# label selectors


async def test_a_pod_endpoint_carries_its_pod_name_and_node_address(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    # What dcgm-data-source (useNodeAddress) and dcgm-extractor (the pod label filter) read.
    fake.add_pod("a", VLLM, "10.0.0.1", host_ip="192.168.1.7")
    await make(selector="app=vllm")
    (spec,) = ds.specs()
    assert (spec.pod_name, spec.node_address) == ("a", "192.168.1.7")
    endpoint = ds.get("a")
    assert endpoint is not None and (endpoint.pod_name, endpoint.node_address) == ("a", "192.168.1.7")


async def test_selector_lists_only_ready_pods_with_an_ip_not_being_deleted(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    fake.add_pod("a", {"app": "vllm", "tier": "gpu"}, "10.0.0.1")
    fake.add_pod("b", VLLM, "10.0.0.2", ready=False)
    fake.add_pod("c", {"app": "other"}, "10.0.0.3")
    fake.add_pod("d", VLLM, None)  # scheduled, no IP yet
    fake.add_pod("e", VLLM, "10.0.0.5")
    fake.mark_deleting("e")
    fake.add_pod("f", VLLM, "10.0.0.6", namespace="elsewhere")
    d = await make(selector="app=vllm")
    # start() returns with the datastore filled: no waiting
    assert ds.specs() == [EndpointSpec("a", "10.0.0.1", 8000, {"app": "vllm", "tier": "gpu"}, "a")]
    assert d.source == "pods in default (app=vllm)"
    assert d.target_ports == (8000,)


async def test_selector_as_match_labels_and_set_based_strings(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    fake.add_pod("a", {"app": "vllm", "tier": "a"}, "10.0.0.1")
    fake.add_pod("b", {"app": "vllm", "tier": "b"}, "10.0.0.2")
    fake.add_pod("c", {"app": "vllm", "tier": "c"}, "10.0.0.3")
    fake.add_pod("d", {"app": "vllm"}, "10.0.0.4")
    for selector, ports, expected in [
        ({"app": "vllm", "tier": "b"}, None, {"b"}),
        ("app=vllm,tier in (a,b)", None, {"a", "b"}),
        ("app==vllm, tier notin (a), tier", None, {"b", "c"}),
        ("app=vllm,!tier", None, {"d"}),
        ("tier!=a", [9000], {"b", "c", "d"}),
    ]:
        own = Datastore()
        await make(selector=selector, target_ports=ports, datastore=own)
        assert names(own) == expected, selector
    assert {s.port for s in own.specs()} == {9000}
    assert len(ds) == 0


async def test_pods_come_and_go_live(fake: FakeApiServer, make: Make, ds: Datastore) -> None:
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(selector="app=vllm")
    assert names(ds) == {"a"}

    fake.add_pod("b", VLLM, "10.0.0.2")
    await wait_names(ds, {"a", "b"})
    fake.add_pod("c", VLLM, "10.0.0.3", ready=False)
    fake.add_pod("x", {"app": "other"}, "10.0.0.9")
    fake.set_ready("b", True)  # no change: still one endpoint
    fake.set_ready("c", True)
    await wait_names(ds, {"a", "b", "c"})
    fake.set_ready("a", False)
    await wait_names(ds, {"b", "c"})
    fake.delete_pod("b")
    await wait_names(ds, {"c"})
    fake.set_ready("a", True)
    await wait_names(ds, {"a", "c"})
    fake.mark_deleting("a")  # terminating pods stop taking traffic at once
    await wait_names(ds, {"c"})
    fake.set_labels("c", {"app": "other"})  # no longer selected: the server sends DELETED
    await wait_names(ds, set())
    fake.set_labels("x", {"app": "vllm", "new": "label"})  # now selected: ADDED
    await wait_names(ds, {"x"})
    assert ds.spec("x") == EndpointSpec("x", "10.0.0.9", 8000, {"app": "vllm", "new": "label"}, "x")
    fake.set_labels("x", {"app": "vllm", "new": "value"})  # labels follow
    await eventually(lambda: ds.spec("x") is not None and ds.spec("x").labels["new"] == "value", ds.specs)  # type: ignore[union-attr]
    fake.set_ip("x", "10.0.1.9")
    await eventually(lambda: ds.spec("x") is not None and ds.spec("x").address == "10.0.1.9", ds.specs)  # type: ignore[union-attr]
    fake.set_ip("x", None)
    await wait_names(ds, set())
    assert fake.request_count(watch=False) == 1  # one list; everything else came by watch


async def test_several_target_ports_give_rank_endpoints(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(selector=VLLM, target_ports=[8000, 8001, 8002])
    assert sorted((s.name, s.host_port) for s in ds.specs()) == [
        ("a-rank-0", "10.0.0.1:8000"),
        ("a-rank-1", "10.0.0.1:8001"),
        ("a-rank-2", "10.0.0.1:8002"),
    ]
    fake.add_pod("b", VLLM, "10.0.0.2")
    await wait_names(ds, {"a-rank-0", "a-rank-1", "a-rank-2", "b-rank-0", "b-rank-1", "b-rank-2"})
    fake.set_ready("a", False)
    await wait_names(ds, {"b-rank-0", "b-rank-1", "b-rank-2"})


# InferencePools


async def test_inference_pool_v1(fake: FakeApiServer, make: Make, ds: Datastore) -> None:
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    fake.add_pod("b", {"app": "sglang"}, "10.0.0.2")
    d = await make(pool="pool")
    assert ds.specs() == [EndpointSpec("a", "10.0.0.1", 8000, VLLM, "a")]
    assert d.source == "InferencePool default/pool"
    fake.add_pod("c", VLLM, "10.0.0.3")
    await wait_names(ds, {"a", "c"})


async def test_a_pool_without_an_endpoint_picker_ref_is_read(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    """GIE v1.6.0 made spec.endpointPickerRef optional (#2898): the EPP never reads it."""
    fake.put_pool("pool", VLLM, [8000], picker_ref=False)
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(pool="pool")
    assert ds.specs() == [EndpointSpec("a", "10.0.0.1", 8000, VLLM, "a")]


async def test_inference_pool_v1_with_several_ports(fake: FakeApiServer, make: Make, ds: Datastore) -> None:
    fake.put_pool("pool", VLLM, [8000, 8001])
    fake.add_pod("a", VLLM, "10.0.0.1")
    d = await make(pool="pool")
    assert sorted((s.name, s.port) for s in ds.specs()) == [("a-rank-0", 8000), ("a-rank-1", 8001)]
    assert d.target_ports == (8000, 8001)


@pytest.mark.parametrize("v1_served", [True, False], ids=["v1-served-but-empty", "v1-not-served"])
async def test_inference_pool_v1alpha2_when_v1_has_none(
    fake: FakeApiServer, make: Make, ds: Datastore, v1_served: bool
) -> None:
    if not v1_served:
        fake.served_pool_versions = {POOL_V1ALPHA2}
    fake.put_pool("old", VLLM, [8100], version="v1alpha2")
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(pool="old")
    assert ds.specs() == [EndpointSpec("a", "10.0.0.1", 8100, VLLM, "a")]
    await wait_watching(fake, "inferencepools")
    fake.put_pool("old", {"app": "vllm", "v": "2"}, [8200], version="v1alpha2")  # watched in v1alpha2
    fake.add_pod("b", {"app": "vllm", "v": "2"}, "10.0.0.2")
    await wait_names(ds, {"b"})
    assert ds.spec("b") == EndpointSpec("b", "10.0.0.2", 8200, {"app": "vllm", "v": "2"}, "b")


async def test_pool_selector_or_ports_change_relists(fake: FakeApiServer, make: Make, ds: Datastore) -> None:
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    fake.add_pod("b", {"app": "sglang"}, "10.0.0.2")
    d = await make(pool="pool")
    await wait_watching(fake, "inferencepools")

    fake.put_pool("pool", {"app": "sglang"}, [8000])
    await wait_names(ds, {"b"})
    fake.put_pool("pool", {"app": "sglang"}, [9000, 9001])
    await wait_names(ds, {"b-rank-0", "b-rank-1"})
    assert sorted(s.host_port for s in ds.specs()) == ["10.0.0.2:9000", "10.0.0.2:9001"]
    fake.put_pool("pool", {"app": "sglang"}, [9000])
    await wait_names(ds, {"b"})
    assert ds.spec("b") == EndpointSpec("b", "10.0.0.2", 9000, {"app": "sglang"}, "b")
    # the new selector is watched live
    await wait_watching(fake, "pods")
    fake.add_pod("c", {"app": "sglang"}, "10.0.0.3")
    fake.add_pod("d", VLLM, "10.0.0.4")
    await wait_names(ds, {"b", "c"})
    assert fake.request_count(watch=False) == 4  # the first list, then one per change
    assert d.target_ports == (9000,)


async def test_pool_update_that_changes_nothing_does_not_relist(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(pool="pool")
    await wait_watching(fake, "inferencepools")
    fake.put_pool("pool", VLLM, [8000])  # same spec, new resourceVersion
    fake.add_pod("b", VLLM, "10.0.0.2")
    await wait_names(ds, {"a", "b"})  # type: ignore[attr-defined]
    assert fake.request_count(watch=False) == 1


async def test_deleted_pool_empties_until_it_returns(
    fake: FakeApiServer, make: Make, ds: Datastore, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    fake.add_pod("b", VLLM, "10.0.0.2")
    await make(pool="pool")
    await wait_watching(fake, "inferencepools")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        fake.delete_pool("pool")
        await wait_names(ds, set())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "InferencePool default/pool was deleted: removing its 2 endpoints until it is created again"
    ]
    await eventually(
        lambda: fake.watch_count("pods") == 0, lambda: fake.watch_count("pods")
    )  # pods unwatched
    fake.add_pod("c", VLLM, "10.0.0.3")
    fake.put_pool("pool", VLLM, [8000])
    await wait_names(ds, {"a", "b", "c"})


async def test_invalid_pool_update_keeps_the_endpoints(
    fake: FakeApiServer, make: Make, ds: Datastore, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(pool="pool")
    await wait_watching(fake, "inferencepools")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        fake.put_pool("pool", VLLM, [])
        await eventually(lambda: bool(caplog.records), lambda: caplog.records)
    assert (
        "spec.targetPorts: give at least one port; keeping the current endpoints"
        in caplog.records[0].getMessage()
    )
    fake.add_pod("b", VLLM, "10.0.0.2")
    await wait_names(ds, {"a", "b"})
    fake.put_pool("pool", VLLM, [8001])  # valid again
    await eventually(lambda: {s.port for s in ds.specs()} == {8001}, ds.specs)


# expiry, stream ends, errors


@pytest.mark.parametrize("as_event", [False, True], ids=["http-410", "error-event"])
async def test_gone_relists_without_losing_or_duplicating(
    fake: FakeApiServer, make: Make, ds: Datastore, as_event: bool
) -> None:
    fake.gone_as_event = as_event
    fake.put_pool("pool", VLLM, [8000])
    for i in range(3):
        fake.add_pod(f"p{i}", VLLM, f"10.0.0.{i}")
    await make(pool="pool")
    seen: list[tuple[str, bool]] = []
    ds.subscribe(lambda name, spec: seen.append((name, spec is not None)))
    await wait_watching(fake, "pods")
    await wait_watching(fake, "inferencepools")

    fake.expire_history()  # the watches end; what they hold is too old now
    fake.delete_pod("p0")  # changes the old watches never see
    fake.add_pod("p3", VLLM, "10.0.0.3")
    fake.set_ready("p1", False)
    await wait_names(ds, {"p2", "p3"})
    await wait_watching(fake, "pods")
    assert fake.gone_served >= 2  # pods and the pool
    assert fake.request_count(watch=False) == 2  # the first list and one re-list
    assert sorted(seen) == [("p0", False), ("p1", False), ("p3", True)]  # p2 untouched
    # watching again from the re-list
    fake.add_pod("p4", VLLM, "10.0.0.4")
    await wait_names(ds, {"p2", "p3", "p4"})
    assert len(ds) == len(ds.specs()) == 3


async def test_watch_ending_resumes_from_the_last_version(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    fake.timeout_scale = 0.01  # timeoutSeconds=1 ends a watch after 10 ms
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(selector=VLLM, watch_timeout_s=1)
    await eventually(lambda: fake.request_count(watch=True) >= 4, lambda: fake.requests)
    fake.add_pod("b", VLLM, "10.0.0.2")
    await wait_names(ds, {"a", "b"})
    await eventually(lambda: fake.request_count(watch=True) >= 8, lambda: fake.requests)
    fake.delete_pod("a")
    await wait_names(ds, {"b"})
    assert fake.request_count(watch=False) == 1  # resumed each time, never re-listed
    assert all(q.get("timeoutSeconds") == "1" for path, q in fake.requests if q.get("watch"))


async def test_changes_while_disconnected_are_replayed(
    fake: FakeApiServer, make: Make, ds: Datastore
) -> None:
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(selector=VLLM)
    await wait_watching(fake)
    fake.end_watches()
    fake.add_pod("b", VLLM, "10.0.0.2")  # logged while no one watches
    fake.delete_pod("a")
    await wait_names(ds, {"b"})
    assert fake.request_count(watch=False) == 1
    assert fake.request_count(watch=True) == 2


async def test_api_errors_back_off_and_recover(
    fake: FakeApiServer, make: Make, ds: Datastore, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_pod("a", VLLM, "10.0.0.1")
    await make(selector=VLLM)
    await wait_watching(fake)
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        fake.fail_next(5, status=500)
        fake.end_watches()
        fake.add_pod("b", VLLM, "10.0.0.2")
        await wait_names(ds, {"a", "b"})
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert len([m for level, m in messages if level == "WARNING"]) == 1  # once a streak, however many retries
    assert len([m for _, m in messages if "500 InternalError: injected failure 500" in m]) == 5
    assert any(re.search(r"answers again \(after [56] failures\)", m) for _, m in messages)
    assert ("INFO", "pods in default (app=vllm): pod b added: b=10.0.0.2:8000") in messages
    assert fake.request_count(watch=False) == 1  # errors, then a watch from where it was


async def test_stop_ends_the_watches(fake: FakeApiServer, api: Any) -> None:
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    ds = Datastore()
    d = KubernetesDiscovery(ds, "default", pool="pool", api_client=api, **FAST)
    await d.start()
    await wait_watching(fake, "pods")
    await wait_watching(fake, "inferencepools")
    await d.stop()
    await d.stop()
    await eventually(lambda: fake.watch_count("pods") + fake.watch_count("inferencepools") == 0, lambda: 0)
    fake.add_pod("b", VLLM, "10.0.0.2")
    assert names(ds) == {"a"}  # stopped: the datastore keeps what it had
    with pytest.raises(RuntimeError, match="twice"):
        await d.start()


# errors at start


async def test_missing_pool_is_an_error_naming_it(fake: FakeApiServer, api: Any) -> None:
    fake.put_pool("other", VLLM, [8000])
    d = KubernetesDiscovery(Datastore(), "team-a", pool="nope", api_client=api, **FAST)
    with pytest.raises(DiscoveryError) as e:
        await d.start()
    assert str(e.value) == (
        "InferencePool 'nope' not found in namespace 'team-a' (looked in inference.networking.k8s.io/v1 and "
        f"inference.networking.x-k8s.io/v1alpha2 at {fake.url})"
    )


async def test_waiting_for_a_missing_pool_stays_unsynced_and_retries(
    fake: FakeApiServer, api: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """As the Go EPP: no pool (or no CRD) yet is not fatal; one log line per reason, then the pool is
    followed once it appears, and its deletion turns `synced` off again."""
    fake.served_pool_versions = set()  # no InferencePool CRD at all
    fake.add_pod("a", VLLM, "10.0.0.1")
    ds = Datastore()
    changes: list[bool] = []
    d = KubernetesDiscovery(ds, "default", pool="pool", api_client=api, on_synced=changes.append, **FAST)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await d.start(wait_for_pool=True)
        assert not d.synced and names(ds) == set()
        gets = lambda: sum("/inferencepools/pool" in path for path, _ in fake.requests)  # noqa: E731
        await eventually(lambda: gets() >= 6, gets)  # tried three times, in both versions
        fake.served_pool_versions = {("inference.networking.k8s.io", "v1")}
        fake.put_pool("pool", VLLM, [8000])
        await eventually(lambda: d.synced, lambda: changes)
    try:
        assert names(ds) == {"a"}
        assert changes == [True]
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "InferencePool 'pool' not found" in errors[0]
        assert "; not ready, trying again" in errors[0]
        await wait_watching(fake, "inferencepools")
        fake.delete_pool("pool")
        await eventually(lambda: not d.synced, lambda: changes)
        assert changes == [True, False]
    finally:
        await d.stop()


async def test_invalid_pool_at_start_is_an_error(fake: FakeApiServer, api: Any) -> None:
    fake.put_pool("pool", {}, [8000])
    d = KubernetesDiscovery(Datastore(), "default", pool="pool", api_client=api, **FAST)
    with pytest.raises(DiscoveryError, match=re.escape("spec.selector is empty")):
        await d.start()


async def test_unreachable_api_server_is_an_error_with_the_address() -> None:
    host = f"http://127.0.0.1:{free_port()}"
    async with client.ApiClient(client.Configuration(host=host)) as api:
        d = KubernetesDiscovery(Datastore(), "default", selector=VLLM, api_client=api, **FAST)
        with pytest.raises(DiscoveryError) as e:
            await d.start()
    message = str(e.value)
    assert message.startswith(
        f"pods in default (app=vllm): cannot reach the Kubernetes API server at {host}: "
    )


async def test_refused_list_is_an_error_quoting_the_server(fake: FakeApiServer, api: Any) -> None:
    d = KubernetesDiscovery(Datastore(), "default", selector="app in (vllm", api_client=api, **FAST)
    with pytest.raises(DiscoveryError) as e:
        await d.start()
    assert str(e.value).startswith(
        f"pods in default (app in (vllm): the Kubernetes API server at {fake.url} said 400 BadRequest: "
    )
    fake.fail_next(1, status=403)
    d = KubernetesDiscovery(Datastore(), "default", pool="p", api_client=api, **FAST)
    with pytest.raises(DiscoveryError, match="said 403 BadRequest: injected failure 403"):
        await d.start()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "give either an InferencePool name or a label selector"),
        ({"pool": "p", "selector": "a=b"}, "give either an InferencePool name or a label selector"),
        ({"pool": "p", "target_ports": [8000]}, "InferencePool 'p' sets the target ports"),
        ({"pool": ""}, "the InferencePool name is empty"),
        ({"selector": " "}, "the label selector is empty"),
        ({"selector": {}}, "the label selector is empty"),
        ({"selector": "a=b", "target_ports": []}, "give at least one port"),
        ({"selector": "a=b", "target_ports": [0]}, "0 is not a port in 1..65535"),
        ({"selector": "a=b", "target_ports": [8000, 8000]}, "repeats a port"),
        ({"selector": "a=b", "api_client": object(), "kubeconfig": "x"}, "an API client or a kubeconfig"),
    ],
)
def test_bad_arguments(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(DiscoveryError, match=re.escape(message)):
        KubernetesDiscovery(Datastore(), "default", **kw)


def test_namespace_required() -> None:
    with pytest.raises(DiscoveryError, match="a namespace is required"):
        KubernetesDiscovery(Datastore(), "", selector="a=b")


# configuration


async def test_kubeconfig_path(fake: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{fake.url}"}}}}]
users: [{{name: me, user: {{token: secret}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: me, namespace: default}}}}]
current-context: fake
""",
        encoding="utf-8",
    )
    fake.add_pod("a", VLLM, "10.0.0.1")
    ds = Datastore()
    d = KubernetesDiscovery(ds, "default", selector=VLLM, kubeconfig=kubeconfig, **FAST)
    await d.start()
    try:
        assert names(ds) == {"a"}
        fake.add_pod("b", VLLM, "10.0.0.2")
        await wait_names(ds, {"a", "b"})
    finally:
        await d.stop()


async def test_bad_kubeconfig_is_an_error(tmp_path: Path) -> None:
    d = KubernetesDiscovery(Datastore(), "default", selector=VLLM, kubeconfig=str(tmp_path / "missing"))
    with pytest.raises(DiscoveryError, match=re.escape(f"cannot load the kubeconfig {tmp_path / 'missing'}")):
        await d.start()


async def test_in_cluster_configuration_when_in_a_pod(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from epick.datalayer.discovery.kubernetes import client as kubernetes_client

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(kubernetes_client, "SERVICE_ACCOUNT_DIR", str(tmp_path))
    (tmp_path / "ca.crt").write_text("a CA")
    d = KubernetesDiscovery(Datastore(), "default", selector=VLLM)
    with pytest.raises(DiscoveryError, match=r"cannot load the in-cluster configuration \(.*\): .*token"):
        await d.start()


# the fake's label selectors


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("", {}, True),
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": ""}, True),
        ("a in (1,2)", {"a": "3"}, False),
        ("a notin (1)", {}, True),
        ("!a", {"a": "1"}, False),
        ("example.com/a-b=x_y.z", {"example.com/a-b": "x_y.z"}, True),
    ],
)
def test_fake_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector)(labels) is expected


async def test_waiting_is_synced_once_every_first_list_is_done_not_on_each_retry(
    fake: FakeApiServer, api: Any
) -> None:
    """The pool and its pods list fine but the objectives' list fails a few times: readiness stays off
    until a start-up succeeds whole, then turns on once (no flapping on each retry)."""
    fake.put_pool("pool", VLLM, [8000])
    fake.add_pod("a", VLLM, "10.0.0.1")
    changes: list[bool] = []
    fake.fail_paths = {"inferenceobjectives": 3}
    d = KubernetesDiscovery(
        Datastore(), "default", pool="pool", api_client=api, on_synced=changes.append,
        on_objectives=lambda found: None, **FAST,
    )  # fmt: skip
    await d.start(wait_for_pool=True)
    try:
        await eventually(lambda: d.synced, lambda: changes)
        assert changes == [True]
        assert fake.fail_paths == {"inferenceobjectives": 0}  # it did fail, three times
    finally:
        await d.stop()
