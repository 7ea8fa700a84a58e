"""`core-metrics-extractor`: read queue depth, running requests, KV-cache use, LoRA adapters and the
cache shape from a Prometheus page, with the metric names of the endpoint's engine.

Parameters as upstream's (llm-d/llm-d-router,
pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go):
- `engineLabelKey` (default `llm-d.ai/engine-type`; GIE's `inference.networking.k8s.io/engine-type` is
  read when the endpoint lacks it) names the pod label that says which engine serves;
- `defaultEngine` (default `vllm`) is the engine of an endpoint without that label;
- `engineConfigs`: engines of the user's own, or replacements of built-in ones (an entry named as a
  built-in replaces it whole). Each has `name` and the PromQL-style selectors `queuedRequestsSpec`,
  `runningRequestsSpec`, `kvUsageSpec`, `loraSpec`, `cacheInfoSpec` (with `cacheBlockSizeLabelName`,
  `cacheNumBlocksLabelName`), `cacheBlockSizeSpec`, `cacheNumBlocksSpec` (an empty or absent selector
  disables that metric) and `customMetrics` (`attributeKey`, `metricSpec`: the first matching sample's
  value, set as attribute "<attributeKey>/core-metrics-extractor" for `endpoint-attribute-*`).
Built-in engines: vllm, sglang, trtllm-serve, triton-tensorrt-llm, triton (`epick.plugins.datalayer.engines`).

Deviation, on purpose: upstream reads an endpoint whose label names an engine it does not know with the
default engine's names; epick refuses it with an error naming the known engines (the endpoint's
scrape fails and it leaves the candidates), since vLLM names on another server would make it look idle.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field, field_validator, model_validator

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import Extracted, ExtractError, MissingDataError, Payload, data_key
from epick.plugins.datalayer.engines import (
    DEFAULT_ENGINE,
    ENGINE_LABEL,
    ENGINES,
    LEGACY_ENGINE_LABEL,
    EngineMetricNames,
    MetricSpec,
)
from epick.plugins.datalayer.prometheus import (
    MetricsParseError,
    MissingMetricsError,
    parse_metrics,
    read_scalar,
)
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "core-metrics-extractor"


def _selector(text: str | None) -> MetricSpec | None:
    if text is None or not text.strip():
        return None
    return MetricSpec.parse(text)


class CustomMetric(Parameters):
    attribute_key: str
    metric_spec: str

    @field_validator("attribute_key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not v:
            raise ValueError("custom metric attributeKey cannot be empty")
        return v

    @field_validator("metric_spec")
    @classmethod
    def _spec(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("custom metric spec cannot be empty")
        MetricSpec.parse(v)
        return v


class EngineConfig(Parameters):
    name: str
    queued_requests_spec: str | None = None
    running_requests_spec: str | None = None
    kv_usage_spec: str | None = None
    lora_spec: str | None = None
    cache_info_spec: str | None = None
    cache_block_size_label_name: str = "block_size"
    cache_num_blocks_label_name: str = "num_gpu_blocks"
    cache_block_size_spec: str | None = None
    cache_num_blocks_spec: str | None = None
    custom_metrics: list[CustomMetric] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v:
            raise ValueError("engine config name cannot be empty")
        if v == "default":
            raise ValueError('engine config name cannot be "default" (reserved)')
        return v

    @field_validator(
        "queued_requests_spec",
        "running_requests_spec",
        "kv_usage_spec",
        "lora_spec",
        "cache_info_spec",
        "cache_block_size_spec",
        "cache_num_blocks_spec",
    )
    @classmethod
    def _selector_parses(cls, v: str | None) -> str | None:
        _selector(v)  # raises ValueError naming the bad selector
        return v

    @model_validator(mode="after")
    def _distinct_custom_keys(self) -> EngineConfig:
        seen: set[str] = set()
        for m in self.custom_metrics:
            if m.attribute_key in seen:
                raise ValueError(f"custom metric attributeKey {m.attribute_key!r} is duplicated")
            seen.add(m.attribute_key)
        return self

    def names(self) -> EngineMetricNames:
        kv = _selector(self.kv_usage_spec)
        return EngineMetricNames(
            waiting=_selector(self.queued_requests_spec),
            running=_selector(self.running_requests_spec),
            kv_usage=(kv,) if kv is not None else (),
            lora_info=_selector(self.lora_spec),
            cache_info=_selector(self.cache_info_spec),
            cache_block_size_label=self.cache_block_size_label_name,
            cache_num_blocks_label=self.cache_num_blocks_label_name,
            cache_block_size=_selector(self.cache_block_size_spec),
            cache_num_blocks=_selector(self.cache_num_blocks_spec),
        )


class CoreMetricsParameters(Parameters):
    engine_label_key: str = ENGINE_LABEL
    default_engine: str = DEFAULT_ENGINE
    engine_configs: list[EngineConfig] = Field(default_factory=list)


class CoreMetricsExtractor(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING

    def __init__(
        self,
        name: str | None = None,
        *,
        engine_label_key: str = ENGINE_LABEL,
        default_engine: str = DEFAULT_ENGINE,
        engines: Mapping[str, EngineMetricNames] | None = None,
        custom: Mapping[str, tuple[tuple[str, MetricSpec], ...]] | None = None,
    ) -> None:
        super().__init__(name)
        self.engine_label_key = engine_label_key
        self.default_engine = default_engine
        self.engines = dict(engines if engines is not None else ENGINES)
        self.custom = dict(custom or {})  # engine -> ((attribute key, selector), ...)
        if default_engine not in self.engines:
            raise ValueError(f"defaultEngine {default_engine!r} not found in engineConfigs")

    @property
    def accepts(self) -> Payload:
        return "prometheus"

    def core_metrics(self) -> bool:
        return True

    def reads_endpoint(self, endpoint: Endpoint) -> EngineMetricNames:
        return self.names_for(endpoint)

    def only_shared_fields(self) -> bool:
        return not self.custom

    def families(self, endpoint: Endpoint) -> frozenset[str] | None:
        """The sample names it reads of the endpoint's page: its engine's, and the custom metrics'."""
        try:
            names = self.names_for(endpoint)
        except ExtractError:
            return None
        specs = (
            names.waiting,
            names.running,
            *names.kv_usage,
            names.lora_info,
            names.cache_info,
            names.cache_block_size,
            names.cache_num_blocks,
            *(spec for _, spec in self.custom.get(self.engine_of(endpoint.labels), ())),
        )
        return frozenset(spec.name for spec in specs if spec is not None)

    def engine_of(self, labels: Mapping[str, str]) -> str:
        """The engine an endpoint's labels name (this extractor's label, then GIE's), or the default."""
        return labels.get(self.engine_label_key) or labels.get(LEGACY_ENGINE_LABEL) or self.default_engine

    def names_for(self, endpoint: Endpoint) -> EngineMetricNames:
        engine = self.engine_of(endpoint.labels)
        names = self.engines.get(engine)
        if names is None:
            raise ExtractError(
                f"engine type {engine!r} (label {self.engine_label_key}) is not one epick can read "
                f"metrics of; known: {', '.join(self.engines)}"
            )
        return names

    def extract(self, payload: str | object, endpoint: Endpoint, now: float) -> Extracted:
        if not isinstance(payload, str):
            raise ExtractError(f"{TYPE} reads a Prometheus page, not {type(payload).__name__}")
        names = self.names_for(endpoint)
        try:
            metrics = parse_metrics(payload, names, update_time=now)
        except MissingMetricsError as e:
            raise MissingDataError(str(e)) from None
        except MetricsParseError as e:
            raise ExtractError(str(e)) from None
        # A custom metric the page lacks is not set (and not an error for the core metrics, as
        # upstream records it apart); the others are.
        attributes: dict[str, object | None] = {}
        for key, spec in self.custom.get(self.engine_of(endpoint.labels), ()):
            try:
                attributes[data_key(key, TYPE)] = read_scalar(payload, spec)
            except MetricsParseError:
                continue
        return Extracted(metrics, attributes)


def _factory(name: str, params: CoreMetricsParameters, handle: Handle) -> CoreMetricsExtractor:
    engines = dict(ENGINES)
    custom: dict[str, tuple[tuple[str, MetricSpec], ...]] = {}
    seen: set[str] = set()
    for i, config in enumerate(params.engine_configs):
        if config.name in seen:
            raise ParameterError(
                f"engineConfigs[{i}].name",
                f"mapping for engine type {config.name!r} already exists",
                "list each engine once",
            )
        seen.add(config.name)
        engines[config.name] = config.names()
        custom[config.name] = tuple(
            (m.attribute_key, MetricSpec.parse(m.metric_spec)) for m in config.custom_metrics
        )
    if params.default_engine not in engines:
        raise ParameterError(
            "defaultEngine",
            f"defaultEngine {params.default_engine!r} not found in engineConfigs",
            f"use one of: {', '.join(engines)}",
        )
    return CoreMetricsExtractor(
        name,
        engine_label_key=params.engine_label_key,
        default_engine=params.default_engine,
        engines=engines,
        custom=custom,
    )


SPEC = PluginSpec(
    TYPE, _factory, CoreMetricsParameters, "queue, running, KV-cache use, LoRA and cache shape, per engine"
)
