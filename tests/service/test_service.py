"""The service built from `Settings` alone (no command line): it serves, and stops gracefully."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import aiohttp
import pytest

from epick.datalayer.datastore import EndpointSpec
from epick.extproc.health import NOT_SERVING, SERVING
from epick.extproc.server import ExtProcOptions
from epick.proxy.server import ProxyOptions
from epick.service import KubernetesSettings, Service, Settings, SettingsError
from tests.conftest import MakeApp
from tests.datalayer.pages import free_port, wait_until
from tests.proxy.conftest import MODEL, FakeModelServer


def settings_for(fake: FakeModelServer, **kw: object) -> Settings:
    host, _, port = fake.name.rpartition(":")
    fields: dict[str, object] = {
        "endpoints": (EndpointSpec(fake.name, host, int(port), {}),),
        "proxy": ProxyOptions(host="127.0.0.1", port=0, expose_endpoint=True),
        "extproc": ExtProcOptions(host="127.0.0.1", port=0, health_port=0, secure=False),
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "refresh_metrics_interval": 0.02,
        "seed": 3,
        **kw,
    }
    return Settings(**fields)  # type: ignore[arg-type]


async def started(fake: FakeModelServer, **kw: object) -> Service:
    service = Service(settings_for(fake, **kw))
    await service.start()
    await wait_until(lambda: MODEL in service.catalog.known(), what="the model server's model")
    return service


async def proxied(make_app: MakeApp, mode: str, drain_timeout: float) -> tuple[FakeModelServer, Service, str]:
    """A fake model server in `mode`, a service in front of it, and the proxy's completions URL."""
    fake = FakeModelServer(mode)
    fake.server = await make_app(fake.app())
    service = await started(fake, drain_timeout=drain_timeout)
    assert service.proxy is not None
    return fake, service, f"http://127.0.0.1:{service.proxy.port}/v1/completions"


async def test_a_service_from_settings_serves_the_proxy_ext_proc_health_and_metrics(
    make_app: MakeApp,
) -> None:
    fake = FakeModelServer("echo")
    fake.server = await make_app(fake.app())
    service = await started(fake)
    try:
        assert service.proxy is not None and service.extproc is not None
        assert service.extproc.health.status("") == SERVING
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "prompt": "hello"}
            async with http.post(f"http://127.0.0.1:{service.proxy.port}/v1/completions", json=body) as r:
                assert r.status == 200
                assert r.headers["x-epick-endpoint"] == fake.name
            async with http.get(f"http://127.0.0.1:{service.metrics_bound_port}/metrics") as r:
                page = await r.text()
        assert 'inference_objective_request_total{model_name="sim-model"' in page
    finally:
        await service.stop()
    assert service.extproc.health.status("") == NOT_SERVING


async def test_stop_lets_a_request_in_flight_finish_and_accepts_no_new_one(make_app: MakeApp) -> None:
    fake, service, url = await proxied(make_app, "gated", drain_timeout=30.0)
    async with aiohttp.ClientSession() as http:
        response = await http.post(url, json={"model": MODEL, "prompt": "x", "stream": True})
        assert response.status == 200
        first = await response.content.readline()
        assert first.startswith(b"data: ")
        stopping = asyncio.create_task(service.stop())
        await wait_until(
            lambda: service.extproc is not None and service.extproc.health.status("") == NOT_SERVING,
            what="ext_proc's health to say NOT_SERVING",
        )
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as other:
                await other.post(url, json={"model": MODEL, "prompt": "late"})
        assert not stopping.done()  # the stream is still being answered
        fake.gate.set()
        rest = await response.read()
        assert rest.endswith(b"data: [DONE]\n\n")
        await stopping
        response.release()


async def test_the_drain_timeout_bounds_how_long_stop_waits(make_app: MakeApp) -> None:
    fake, service, url = await proxied(make_app, "hang", drain_timeout=0.2)
    async with aiohttp.ClientSession() as http:
        pending = asyncio.create_task(http.post(url, json={"model": MODEL, "prompt": "x"}))
        await wait_until(lambda: len(fake.requests) == 1, what="the request to reach the model server")
        await service.stop()  # returns though the model server never answers
        with pytest.raises(aiohttp.ClientConnectionError):
            await pending
    fake.gate.set()


@pytest.mark.parametrize(
    ("fields", "complaint"),
    [
        ({"workers": 0}, "workers must be at least 1"),
        ({"refresh_metrics_interval": 0.0}, "refresh interval must be positive"),
        ({"drain_timeout": -1.0}, "drain timeout cannot be negative"),
        ({"shared_state": "http://redis:6379"}, "give a redis://, rediss:// \\(TLS\\)"),
        ({"workers": 2, "proxy": None}, "need the proxy or ext_proc"),
        ({"workers": 2, "extproc": ExtProcOptions(port=0)}, "give fixed ports"),
        ({"kubernetes": KubernetesSettings("ns")}, "an InferencePool name or a label selector"),
        (
            {"kubernetes": KubernetesSettings("ns", pool="p"), "endpoints": (EndpointSpec("a", "h", 1, {}),)},
            "not both",
        ),
    ],
)
def test_settings_that_cannot_make_a_service_are_refused_naming_the_setting(
    fields: dict[str, object], complaint: str
) -> None:
    settings = Settings(**fields)  # type: ignore[arg-type]
    with pytest.raises(SettingsError, match=complaint):
        settings.check()
    with pytest.raises(SettingsError, match=complaint):
        Service(settings)


def test_settings_survive_the_trip_to_a_worker_process() -> None:
    import pickle

    settings = Settings(
        endpoints=(EndpointSpec("a", "127.0.0.1", 8000, {"role": "decode"}),),
        kubernetes=None,
        objectives=(("premium", 2),),
        workers=4,
    )
    assert pickle.loads(pickle.dumps(settings)) == settings


def test_sigterm_stops_a_single_process_serve_with_status_0() -> None:
    """As PID 1 in a container, the only stop a pod gets before SIGKILL is SIGTERM."""
    argv = [sys.executable, "-m", "epick.cli.main", "serve", "--endpoints", f"127.0.0.1:{free_port()}",
            "--host", "127.0.0.1", "--proxy-port", "0", "--no-extproc", "--metrics-port", "0",
            "--workers", "1"]  # fmt: skip
    process = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if "epick serving" in line:
                break
        else:
            raise AssertionError("epick serve exited before serving")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert "stopping: draining requests in flight" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


async def test_a_body_a_hook_changed_is_what_the_server_receives(make_app: MakeApp) -> None:
    """`selective-kv-policy` changes the parsed body (`RequestBody.mark_mutated`): the proxy forwards
    it re-encoded, as upstream's director forwards a mutated body."""
    fake = FakeModelServer("echo")
    fake.server = await make_app(fake.app())
    config = (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- {type: selective-kv-policy, parameters: {loadPolicy: disable}}\n- type: queue-scorer\n"
    )
    service = await started(fake, config_text=config, allow_experimental_plugins=True)
    try:
        assert service.proxy is not None
        body = {"model": MODEL, "prompt": "hello", "kv_transfer_params": {"keep": 1}}
        url = f"http://127.0.0.1:{service.proxy.port}/v1/completions"
        async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
            assert r.status == 200
        _, received = fake.requests[-1]
        sent = json.loads(received)
        assert sent["kv_transfer_params"] == {"keep": 1, "max_load_tokens": 0}
        assert sent["prompt"] == "hello"
    finally:
        await service.stop()
