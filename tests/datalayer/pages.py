"""Model-server /metrics pages as the engines write them, and small helpers shared by the service tests."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from epick.config import load_default_config
from epick.config.datalayer import DataLayerPlan, PolledSource
from epick.sim.engine import RequestOutput
from epick.sim.options import ServerOptions
from epick.sim.server import SimServer

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LORA_INFO = 'vllm:lora_requests_info{max_lora="4",running_lora_adapters'
CACHE_INFO = ",".join(
    f'{k}="{v}"'
    for k, v in {
        "block_size": 16,
        "cache_dtype": "auto",
        "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.9,
        "num_cpu_blocks": None,
        "num_gpu_blocks": 27709,
        "num_gpu_blocks_override": None,
        "sliding_window": None,
        "swap_space": 4,
    }.items()
)

# vLLM V1 (0.10-ish): labelled gauges, LoRA info with one sample per adapter-state change (the value is
# the time of the change, the newest wins), cache config info, and plenty of families the parser skips.
VLLM_PAGE = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.4375
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
{LORA_INFO}="sql-lora,chat-lora",waiting_lora_adapters=""}} 1.7453e+09
{LORA_INFO}="sql-lora",waiting_lora_adapters="chat-lora,tool-lora"}} 1.7454e+09
{LORA_INFO}="",waiting_lora_adapters=""}} 1.7452e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{{CACHE_INFO}}} 1.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{MODEL}"}} 18734.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.001",model_name="{MODEL}"}} 0.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 57.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 57.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 4.21
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12345.0
"""

# vLLM V0 (before kv_cache_usage_perc): the older KV name, no LoRA info.
VLLM_OLD_PAGE = f"""\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="{MODEL}"}} 1.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{{model_name="{MODEL}"}} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="{MODEL}"}} 7.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="{MODEL}"}} 0.91
# HELP vllm:cpu_cache_usage_perc CPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:cpu_cache_usage_perc gauge
vllm:cpu_cache_usage_perc{{model_name="{MODEL}"}} 0.0
"""

SGLANG_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 12.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="Qwen/Qwen2.5-7B-Instruct"} 40211.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.62
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 4.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.33
"""

TRTLLM_PAGE = """\
# HELP trtllm_num_requests_running Number of requests currently running.
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{model_name="llama",engine_type="trtllm"} 5
# HELP trtllm_num_requests_waiting Number of requests waiting.
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{model_name="llama",engine_type="trtllm"} 0
# HELP trtllm_kv_cache_utilization KV cache utilization.
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{model_name="llama",engine_type="trtllm"} 0.25
"""


def vllm_page(*, waiting: float = 0, running: float = 0, kv: float = 0.0, model: str = "sim-model") -> str:
    """A minimal but complete vLLM page with the given values."""
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{model_name="{model}"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="{model}"}} {waiting}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{model_name="{model}"}} {kv}\n'
    )


async def wait_until(condition: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    """Poll `condition` on the event loop until it holds; fail after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}") from None


class AppServer:
    """A tiny aiohttp app on a free loopback port, for endpoints that misbehave on purpose."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> AppServer:
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = int(self._runner.addresses[-1][1])
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host_port}"


def free_port() -> int:
    """A loopback port with nothing listening (free when asked)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stop_sim(server: SimServer) -> None:
    """Stop a SimServer, first ending any request still in flight so aiohttp's shutdown does not wait."""
    for pending in list(server._pending.values()):
        pending.queue.put_nowait(RequestOutput(pending.request, [], True))
    await server.stop()


async def start_sim(**kw: Any) -> SimServer:
    """A SimServer on a free loopback port, simulated time fast unless told otherwise."""
    kw.setdefault("port", 0)
    kw.setdefault("time_scale", 1000.0)
    server = SimServer(ServerOptions(**kw))
    await server.start()
    return server


def core_plan() -> DataLayerPlan:
    """The default config's data layer: each endpoint's /metrics, read by the core-metrics extractor."""
    return load_default_config(seed=0).data_layer


def core_polled() -> PolledSource:
    """The default data layer's one polled source, as a `Scraper` takes it."""
    return core_plan().polled[0]
