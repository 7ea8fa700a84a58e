"""The Service as a whole: config reload, and its own /metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epick.cli.simulate_policies import CONFIG_POLICIES
from epick.config.defaults import DEFAULT_CONFIG_YAML
from epick.datalayer.datastore import EndpointSpec
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.proxy.server import ENDPOINT_HEADER, ProxyOptions
from epick.service import Service, Settings
from tests.conftest import MakeSim
from tests.datalayer.pages import free_port
from tests.proxy.conftest import MODEL, SEED, MakeService, proxy_url

ROUND_ROBIN = CONFIG_POLICIES["round-robin"]

BAD = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: no-such-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: no-such-scorer
"""


async def test_reload_keeps_the_old_config_on_error_and_swaps_in_a_good_one(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO, logger="epick.serve")
    path = tmp_path / "epick.yaml"
    path.write_text(DEFAULT_CONFIG_YAML, encoding="utf-8")
    sims = [await make_sim() for _ in range(3)]
    names = sorted(f"127.0.0.1:{s.port}" for s in sims)
    service = await make_service(names, config_file=str(path))
    running = service.director.config
    assert running.source == str(path)

    async def served_by() -> str:
        payload = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
        async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
            assert r.status == 200
            return r.headers[ENDPOINT_HEADER]

    for text in (BAD, "plugins: [", ""):
        path.write_text(text, encoding="utf-8")
        assert service.reload() is False
        assert service.director.config is running
    path.unlink()
    assert service.reload() is False
    assert service.director.config is running
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("config reload refused" in e and "no-such-scorer" in e for e in errors)
    await served_by()  # still serving

    path.write_text(ROUND_ROBIN, encoding="utf-8")
    assert service.reload() is True
    fresh = service.director.config
    assert fresh is not running
    assert "round-robin-picker" in fresh.plugins and "queue-scorer" not in fresh.plugins
    assert fresh.scheduler.timer is service.metrics  # prepared like the first one
    # Round robin, in name order, from the next request on.
    order = [await served_by() for _ in range(6)]
    assert order == names + names
    assert any("config reloaded from" in r.getMessage() for r in caplog.records)


async def test_a_reload_keeps_the_prefix_index_of_an_unchanged_scorer(
    make_sim: MakeSim, make_service: MakeService, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    path = tmp_path / "epick.yaml"
    path.write_text(DEFAULT_CONFIG_YAML, encoding="utf-8")
    sims = [await make_sim() for _ in range(2)]
    service = await make_service([f"127.0.0.1:{s.port}" for s in sims], config_file=str(path))
    payload = {"model": MODEL, "prompt": "a system prompt worth caching " * 10, "max_tokens": 1}
    async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
        assert r.status == 200
        served = r.headers[ENDPOINT_HEADER]
    prefix = service.director.config.plugins["prefix-cache-scorer"]
    assert isinstance(prefix, PrefixCacheScorer) and served in prefix.index.endpoints()
    # The same file again, and a file that changes only the weights: the scorer and its index stay.
    for text in (DEFAULT_CONFIG_YAML, DEFAULT_CONFIG_YAML.replace("weight: 3", "weight: 4")):
        path.write_text(text, encoding="utf-8")
        assert service.reload() is True
        assert service.director.config.plugins["prefix-cache-scorer"] is prefix
        assert served in prefix.index.endpoints()
    # New parameters make a new scorer, with an empty index.
    path.write_text(
        DEFAULT_CONFIG_YAML.replace(
            "- type: prefix-cache-scorer", "- type: prefix-cache-scorer\n  parameters: {blockSizeTokens: 32}"
        ),
        encoding="utf-8",
    )
    assert service.reload() is True
    fresh = service.director.config.plugins["prefix-cache-scorer"]
    assert isinstance(fresh, PrefixCacheScorer) and fresh is not prefix and len(fresh.index) == 0


async def test_service_metrics_endpoint(make_sim: MakeSim, http: aiohttp.ClientSession) -> None:
    sims = [await make_sim() for _ in range(2)]
    port = free_port()
    options = Settings(
        endpoints=tuple(EndpointSpec(f"127.0.0.1:{s.port}", "127.0.0.1", s.port, {}) for s in sims),
        proxy=ProxyOptions(host="127.0.0.1", port=0),
        metrics_port=port,
        metrics_host="127.0.0.1",
        refresh_metrics_interval=0.02,
        pool_name="my-pool",
        seed=SEED,
    )
    service = Service(options)
    await service.start()
    try:
        payload = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
        for _ in range(3):
            async with http.post(proxy_url(service) + "/v1/completions", json=payload) as r:
                assert r.status == 200
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200
            text = await r.text()
    finally:
        await service.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("inference_pool_ready_pods", (("name", "my-pool"),))] == 2
    assert (
        samples[
            (
                "inference_objective_request_total",
                (("model_name", MODEL), ("priority", "0"), ("target_model_name", MODEL)),
            )
        ]
        == 3
    )
    assert samples[("inference_extension_scheduler_e2e_duration_seconds_count", ())] == 3

    def calls(scorer: str) -> float:
        labels = (("extension_point", "Scorer"), ("plugin_name", scorer), ("plugin_type", scorer))
        return samples[("inference_extension_plugin_duration_seconds_count", labels)]

    # Every call is timed; the queue scorer reads only metrics, so it runs once per snapshot version
    # (the scrapes decide how many), the prefix scorer once per request.
    assert calls("prefix-cache-scorer") == 3
    assert 1 <= calls("queue-scorer") <= 3


DETECTOR_AS_FILTER = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: utilization-detector
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: utilization-detector
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""


def offline_service(config_text: str, tmp_path: Path, **kw: object) -> Service:
    """A Service built (not started: no sockets, no tasks) from the config file holding `config_text`."""
    path = tmp_path / "config.yaml"
    path.write_text(config_text)
    options = Settings(
        endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}),),
        proxy=ProxyOptions(host="127.0.0.1", port=0),
        metrics_port=None,
        seed=SEED,
        config_file=str(path),
        **kw,  # type: ignore[arg-type]
    )
    return Service(options)


def test_staleness_threshold_option_reaches_the_saturation_detector(tmp_path: Path) -> None:
    service = offline_service(DEFAULT_CONFIG_YAML, tmp_path, metrics_staleness_threshold=5.0)
    detector = service.director.config.saturation_detector
    assert detector.params.metrics_staleness_threshold == 5.0  # type: ignore[attr-defined]
    assert (
        offline_service(
            DEFAULT_CONFIG_YAML, tmp_path
        ).director.config.saturation_detector.params.metrics_staleness_threshold  # type: ignore[attr-defined]
        == 0.2
    )


def test_staleness_threshold_option_reaches_the_detector_used_as_a_filter(tmp_path: Path) -> None:
    service = offline_service(DETECTOR_AS_FILTER, tmp_path, metrics_staleness_threshold=5.0)
    config = service.director.config
    [used_as_filter] = config.scheduler.profiles["default"].filters
    assert used_as_filter.params.metrics_staleness_threshold == 5.0  # type: ignore[attr-defined]
