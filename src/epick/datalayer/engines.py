"""Which metric names each model-server engine exposes, by label `inference.networking.k8s.io/engine-type`."""

from __future__ import annotations

from dataclasses import dataclass

ENGINE_LABEL = "inference.networking.k8s.io/engine-type"


@dataclass(frozen=True, slots=True)
class EngineMetricNames:
    waiting: str
    running: str
    kv_usage: tuple[str, ...]  # first one present wins (newer name first)
    lora_info: str | None = None
    cache_info: str | None = None


ENGINES: dict[str, EngineMetricNames] = {
    "vllm": EngineMetricNames(
        waiting="vllm:num_requests_waiting",
        running="vllm:num_requests_running",
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        lora_info="vllm:lora_requests_info",
        cache_info="vllm:cache_config_info",
    ),
    "sglang": EngineMetricNames(
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage=("sglang:token_usage",),
        cache_info="sglang:cache_config_info",
    ),
    "trtllm-serve": EngineMetricNames(
        waiting="trtllm_num_requests_waiting",
        running="trtllm_num_requests_running",
        kv_usage=("trtllm_kv_cache_utilization",),
    ),
}
DEFAULT_ENGINE = "vllm"


def engine_names(engine_type: str | None) -> EngineMetricNames:
    """The names for an engine type; unknown or missing types are read as vLLM."""
    return ENGINES.get(engine_type or DEFAULT_ENGINE, ENGINES[DEFAULT_ENGINE])
