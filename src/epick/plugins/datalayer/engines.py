"""Which metrics each model-server engine exposes, chosen by a pod's engine-type label.

The engines and their metric specs follow llm-d's core metrics extractor (llm-d/llm-d-router,
pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go): vllm, sglang, trtllm-serve,
triton-tensorrt-llm (Triton with the TensorRT-LLM backend) and triton (classic Triton: no KV cache).
A spec is a family name, optionally with label matchers: `nv_trt_llm_request_metrics{request_type=waiting}`
sums the samples of that family whose `request_type` is `waiting`.

The label is llm-d's `llm-d.ai/engine-type`, or GIE's older `inference.networking.k8s.io/engine-type`;
without either an endpoint is read as vLLM. Unlike upstream, which reads an unknown engine type with
its default mapping, an unknown type is an error that names the known ones: vLLM names would only
make a non-vLLM server look idle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

ENGINE_LABEL = "llm-d.ai/engine-type"
LEGACY_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"  # GIE's name for it
DEFAULT_ENGINE = "vllm"

_SPEC = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?$")
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"?([^",]*)"?\s*')


class UnknownEngineError(ValueError):
    """An engine-type label no mapping exists for."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A family and the label values its samples must have (empty: all of them)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MetricSpec:
        m = _SPEC.match(text.strip())
        if m is None:
            raise ValueError(f"{text!r} is not a metric spec (name, or name{{label=value,...}})")
        matchers: list[tuple[str, str]] = []
        if m[2]:
            for part in m[2].split(","):
                pm = _MATCHER.fullmatch(part)
                if pm is None:
                    raise ValueError(f"{text!r}: {part!r} is not a label=value matcher")
                matchers.append((pm[1], pm[2]))
        return cls(m[1], tuple(matchers))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels)

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.labels) + "}"


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    waiting: MetricSpec | None  # None: disabled (an engine config's empty spec)
    running: MetricSpec | None
    kv_usage: tuple[MetricSpec, ...]  # the first one present wins (newer name first); empty: none
    lora_info: MetricSpec | None = None
    cache_info: MetricSpec | None = None  # an info metric whose labels carry the block size and count
    cache_block_size_label: str = "block_size"
    cache_num_blocks_label: str = "num_gpu_blocks"
    cache_block_size: MetricSpec | None = None  # or the block size and count as metrics of their own
    cache_num_blocks: MetricSpec | None = None


def _spec(text: str) -> MetricSpec:
    return MetricSpec.parse(text)


ENGINES: dict[str, EngineMetricNames] = {
    "vllm": EngineMetricNames(
        waiting=_spec("vllm:num_requests_waiting"),
        running=_spec("vllm:num_requests_running"),
        kv_usage=(_spec("vllm:kv_cache_usage_perc"), _spec("vllm:gpu_cache_usage_perc")),  # older vLLMs
        lora_info=_spec("vllm:lora_requests_info"),
        cache_info=_spec("vllm:cache_config_info"),
    ),
    "sglang": EngineMetricNames(
        waiting=_spec("sglang:num_queue_reqs"),
        running=_spec("sglang:num_running_reqs"),
        kv_usage=(_spec("sglang:token_usage"),),
        cache_info=_spec("sglang:cache_config_info"),
        cache_block_size_label="page_size",
        cache_num_blocks_label="num_pages",
    ),
    "trtllm-serve": EngineMetricNames(
        waiting=_spec("trtllm_num_requests_waiting"),
        running=_spec("trtllm_num_requests_running"),
        kv_usage=(_spec("trtllm_kv_cache_utilization"),),
        cache_block_size=_spec("trtllm_kv_cache_tokens_per_block"),
        cache_num_blocks=_spec("trtllm_kv_cache_max_blocks"),
    ),
    "triton-tensorrt-llm": EngineMetricNames(
        waiting=_spec("nv_trt_llm_request_metrics{request_type=waiting}"),
        running=_spec("nv_trt_llm_request_metrics{request_type=scheduled}"),
        kv_usage=(_spec("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}"),),
        cache_block_size=_spec("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}"),
        cache_num_blocks=_spec("nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}"),
    ),
    "triton": EngineMetricNames(
        waiting=_spec("nv_inference_pending_request_count"),
        running=_spec("nv_inference_exec_count"),
        kv_usage=(),
    ),
}


def engine_type(labels: Mapping[str, str]) -> str:
    """The engine a pod's labels name (llm-d's label first, then GIE's), or vLLM."""
    return labels.get(ENGINE_LABEL) or labels.get(LEGACY_ENGINE_LABEL) or DEFAULT_ENGINE


def engine_names(engine: str | None) -> EngineMetricNames:
    """The metrics of an engine type (None: vLLM). Raises `UnknownEngineError` naming the known ones."""
    names = ENGINES.get(engine or DEFAULT_ENGINE)
    if names is None:
        raise UnknownEngineError(
            f"engine type {engine!r} (label {ENGINE_LABEL}) is not one epick can read metrics of; "
            f"known: {', '.join(ENGINES)}"
        )
    return names
