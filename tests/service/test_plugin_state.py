"""Plugins in readiness (upstream's ReadinessChecker) and `/debug/plugins/state` (StateDumper)."""

from __future__ import annotations

import datetime
import textwrap

import aiohttp

from epick.datalayer.datastore import EndpointSpec
from epick.extproc.health import LIVENESS, NOT_SERVING, SERVING, HealthService
from epick.framework import NamedPlugin
from epick.service import Service, Settings
from epick.service.plugin_state import UNSUPPORTED, not_ready, states
from tests.datalayer.pages import wait_until


class Warming(NamedPlugin):
    plugin_type = "warming"

    def __init__(self) -> None:
        super().__init__("warming")
        self.reason: str | None = "the tokenizer has not answered yet"

    def check_ready(self) -> str | None:
        return self.reason


class Dumps(NamedPlugin):
    plugin_type = "dumps"

    def __init__(self, state: object) -> None:
        super().__init__("dumps")
        self.state = state

    def dump_state(self) -> object:
        if isinstance(self.state, Exception):
            raise self.state
        return self.state


class Plain(NamedPlugin):
    plugin_type = "plain"


def test_the_first_plugin_not_ready_names_itself_and_why() -> None:
    warming = Warming()
    assert not_ready({"plain": Plain(), "warming": warming}) == (
        "plugin warming/warming is not ready: the tokenizer has not answered yet"
    )
    warming.reason = None
    assert not_ready({"plain": Plain(), "warming": warming}) is None


def test_a_readiness_check_that_raises_is_a_plugin_not_ready() -> None:
    class Broken(Warming):
        def check_ready(self) -> str | None:
            raise RuntimeError("boom")

    assert not_ready({"b": Broken()}) == (
        "plugin warming/warming is not ready: its readiness check failed: RuntimeError: boom"
    )


def test_health_asks_the_plugins_at_each_check_but_not_for_liveness() -> None:
    warming = Warming()
    health = HealthService()
    health.probe = lambda: not_ready({"warming": warming})
    assert health.status("") == NOT_SERVING
    assert health.status(LIVENESS) == SERVING
    assert "tokenizer has not answered" in (health.why_not_ready() or "")
    warming.reason = None
    assert health.status("") == SERVING
    assert health.why_not_ready() is None


def test_the_state_page_has_upstreams_shape() -> None:
    when = datetime.datetime(2026, 12, 6, 9, 30, 0, 123000, tzinfo=datetime.UTC)
    page = states(
        {
            "ok": Dumps({"endpoints": ["a"], "totalEndpoints": 1}),
            "plain": Plain(),
            "fails": Dumps(RuntimeError("index closed")),
            "odd": Dumps({"when": datetime.date(2026, 1, 1)}),
            "nan": Dumps({"x": float("nan")}),
        },
        now=when,
    )
    assert page["timestamp"] == "2026-12-06T09:30:00.123000Z"
    plugins = page["plugins"]
    assert isinstance(plugins, dict)
    assert plugins["ok"] == {
        "name": "ok",
        "type": "dumps",
        "state": {"endpoints": ["a"], "totalEndpoints": 1},
    }
    assert plugins["plain"] == {"name": "plain", "type": "plain", "message": UNSUPPORTED}
    assert plugins["fails"]["message"] == "failed to dump plugin state: RuntimeError: index closed"
    assert plugins["odd"]["message"].startswith("plugin returned state that is not JSON")
    assert plugins["nan"]["message"].startswith("plugin returned state that is not JSON")


CONFIG = textwrap.dedent(
    """\
    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins:
    - type: approx-prefix-cache-producer
    - type: prefix-cache-scorer
    - type: inflight-load-producer
    - type: no-hit-lru-scorer
    - type: queue-scorer
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: prefix-cache-scorer
      - pluginRef: no-hit-lru-scorer
      - pluginRef: queue-scorer
    """
)


async def started(config: str) -> Service:
    service = Service(
        Settings(
            endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}), EndpointSpec("b", "127.0.0.1", 2, {})),
            proxy=None,
            metrics_port=0,
            metrics_host="127.0.0.1",
            config_text=config,
        )
    )
    await service.start()
    return service


async def test_the_service_serves_every_plugins_state() -> None:
    service = await started(CONFIG)
    try:
        producer = service.director.config.plugins["approx-prefix-cache-producer"]
        producer.index.add("a", [1, 2, 3])  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{service.metrics_bound_port}/debug/plugins/state"
        async with aiohttp.ClientSession() as http, http.get(url) as r:
            assert r.status == 200 and r.content_type == "application/json"
            page = await r.json()
        plugins = page["plugins"]
        assert plugins["approx-prefix-cache-producer"]["state"] == {
            "pods": [{"pod": "a", "blocks": 3}],
            "totalPods": 1,
            "maxPods": 100,
        }
        assert plugins["inflight-load-producer"]["state"]["endpoints"] == []
        assert plugins["no-hit-lru-scorer"]["state"]["maxEndpoints"] == 100
        assert plugins["queue-scorer"]["message"] == UNSUPPORTED
        async with aiohttp.ClientSession() as http, http.post(url) as r:
            assert r.status == 405  # upstream answers GET only
    finally:
        await service.stop()


async def test_a_plugin_not_ready_keeps_the_service_out_of_readiness_until_it_is() -> None:
    service = await started(CONFIG)
    try:
        warming = Warming()
        service.director.config.plugins["warming"] = warming
        assert service.health.status("readiness") == NOT_SERVING
        assert service.health.status(LIVENESS) == SERVING
        warming.reason = None
        await wait_until(lambda: service.health.plugins is None)  # the background check saw it
        assert service.health.status("readiness") == SERVING
    finally:
        await service.stop()
