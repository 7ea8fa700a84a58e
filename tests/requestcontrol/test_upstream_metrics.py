"""/metrics against upstream's: every family epick serves under an upstream name has upstream's type,
labels and buckets (tests/data/upstream_metrics.json, llm-d-router ebab687), every other family is
epick's own (`epick_*`), and docs/metrics.md says which upstream families are served."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epick.config import LoadedConfig, load_config_file, load_config_text
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.kvevents import KVEventsCollector, KVEventSubscribers, sinks_of
from epick.datalayer.scraper import ScrapeErrors
from epick.extproc.stream_metrics import StreamMetrics
from epick.framework import Metrics, Response, Usage
from epick.requestcontrol.director import Director
from epick.requestcontrol.metrics import DataLayerErrors, EppMetrics
from epick.requestcontrol.plugin_metrics import PluginMetrics
from epick.service.config_watch import ConfigReloads
from epick.wire.h2 import Status
from tests.requestcontrol.test_director import rewrites

ROOT = Path(__file__).parents[2]
UPSTREAM = {
    f["name"]: f for f in json.loads((ROOT / "tests/data/upstream_metrics.json").read_text())["families"]
}
DOC = ROOT / "docs" / "metrics.md"

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: utilization-detector
- type: prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
- type: prefix-cache-affinity-filter
- type: precise-prefix-cache-producer
  parameters: {indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}}
- type: predicted-latency-producer
  parameters: {streamingMode: true, predictor: {learner: analytic}}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: prefix-cache-scorer
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
flowControl:
  saturationDetector: {pluginRef: utilization-detector}
  priorityBands:
  - {priority: 0, maxRequests: 100}
"""


# llm-d's deprecated P/D handler, which counts its decisions under the pd_decision families.
PD_LEGACY = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: prefix-based-pd-decider
- type: pd-profile-handler
- type: decode-filter
- type: prefill-filter
- type: max-score-picker
schedulingProfiles:
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: prefix-cache-scorer}, {pluginRef: max-score-picker}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]
"""


def _families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def served() -> dict[str, Any]:
    """The families on /metrics after a few streamed requests through flow control."""
    ds = Datastore()
    for i in range(2):
        ds.upsert(EndpointSpec(f"ep{i}", f"10.0.0.{i}", 8000, {}))
        ds.update_metrics(f"ep{i}", Metrics(waiting_queue_size=i, kv_cache_usage_percent=0.1))
    config: LoadedConfig = load_config_text(CONFIG, seed=1)
    holder: list[Director] = []
    metrics = EppMetrics("pool", ds, lambda: holder[0].config, namespace="ns")
    config.scheduler.timer = metrics
    director = Director(config, ds.snapshot, observer=metrics, flow_observer=metrics.flow)
    director.rewrites = rewrites((["alias"], [("base", 1)]))
    holder.append(director)
    # the collectors the service adds: scrape errors, KV events, ext_proc streams
    errors = ScrapeErrors()
    errors.polled("metrics-data-source")
    errors.extracted("metrics-data-source", "core-metrics-extractor")
    metrics.registry.register(DataLayerErrors(errors))
    subscribers = KVEventSubscribers(ds)
    subscribers.sinks.extend(sinks_of(config.plugins.values()))
    metrics.registry.register(KVEventsCollector(subscribers))
    streams = StreamMetrics()
    streams.closed(streams.opened(), Status.OK)
    metrics.registry.register(streams)
    metrics.registry.register(ConfigReloads())
    # a disaggregating config's decisions (its profile handler's counters), and the deprecated handler's
    for pd in (load_config_file(str(ROOT / "config" / "pd.yaml")), load_config_text(PD_LEGACY)):
        pd_director = Director(pd, ds.snapshot)
        for _ in range(2):
            pd_director.decide(
                json.dumps({"model": "m", "prompt": "p " * 300}).encode(), {}, "/v1/completions"
            )
        metrics.registry.register(PluginMetrics(lambda pd=pd: pd.plugins.values()))  # type: ignore[misc]
    for i in range(3):
        body = json.dumps({"model": "alias", "prompt": "same prompt " * 20, "stream": True}).encode()
        headers = {"x-gateway-inference-fairness-id": "tenant", "x-llm-d-slo-ttft-ms": "0.001"}
        cycle = director.begin(body, headers, "/v1/completions")
        result = await cycle.admit()
        endpoint = result.targets[0]
        cycle.received(Response(cycle.request.request_id, status=200, streaming=True), endpoint)
        for chunk in (b'data: {"choices":[{"text":"a"}]}\n\n', b'data: {"choices":[{"text":"b"}]}\n\n'):
            cycle.streamed(Response(cycle.request.request_id, streaming=True, chunk=chunk), endpoint)
        done = Response(cycle.request.request_id, end_of_stream=True, usage=Usage(40, 2 + i))
        cycle.completed(done, endpoint)
    return _families(generate_latest(metrics.registry).decode())


def _labels(family: Any) -> set[str]:
    names: set[str] = set()
    for sample in family.samples:
        names |= set(sample.labels) - {"le"}
    return names


def _buckets(family: Any) -> list[float]:
    found = sorted({float(s.labels["le"]) for s in family.samples if "le" in s.labels})
    return [b for b in found if b != float("inf")]


def _upstream_name(family: Any) -> str:
    return f"{family.name}_total" if family.type == "counter" else family.name


async def test_every_family_is_upstreams_shape_or_epicks_own() -> None:
    families = await served()
    assert len(families) > 40
    for family in families.values():
        name = _upstream_name(family)
        upstream = UPSTREAM.get(name)
        if upstream is None:
            assert name.startswith("epick_"), f"{name} is neither upstream's nor under epick's prefix"
            continue
        assert family.type == upstream["type"], name
        if family.samples:
            assert _labels(family) == set(upstream["labels"]), name
        if upstream["buckets"] and family.samples:
            assert _buckets(family) == [float(b) for b in upstream["buckets"]], name


def doc_table() -> dict[str, str]:
    """docs/metrics.md's table: each upstream family and what epick does with it."""
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `([a-z0-9_:]+)` \| ([a-z]+) \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = m.group(3)
    return rows


def test_the_doc_lists_every_upstream_family() -> None:
    assert set(doc_table()) == set(UPSTREAM)


async def test_what_the_doc_says_is_served_is_served() -> None:
    families = {_upstream_name(f) for f in (await served()).values()}
    for name, status in doc_table().items():
        if status.startswith("served"):
            assert name in families, f"docs/metrics.md says {name} is served"
        if status.startswith("not served"):
            assert name not in families, f"docs/metrics.md says {name} is not served"


GUIDES_QUERY = [
    "llm_d_epp_flow_control_pool_saturation",
    "llm_d_epp_flow_control_queue_size",
    "inference_objective_running_requests",
]


@pytest.mark.parametrize("name", GUIDES_QUERY)
async def test_what_llm_ds_autoscaling_guides_query_is_served(name: str) -> None:
    assert name in {_upstream_name(f) for f in (await served()).values()}
