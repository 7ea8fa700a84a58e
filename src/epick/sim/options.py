"""What `epick sim-server` is told: one set of options, shared by the servers of one process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from epick.sim.engine import CostModel, EngineConfig

Role = Literal["both", "prefill", "decode"]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model: str = "sim-model"
    host: str = "127.0.0.1"
    port: int = 8000
    count: int = 1
    time_scale: float = 1.0  # simulated seconds per wall second
    role: Role = "both"
    name: str | None = None  # identity shown in the x-epick-sim-server header; default host:port
    lora_modules: tuple[str, ...] = ()
    kv_events_endpoint: str | None = None  # tcp://HOST:PORT; server i binds PORT + i
    failure_rate: float = 0.0
    failure_types: tuple[str, ...] = ("rate_limit", "server_error")
    default_max_tokens: int = 128
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)

    @staticmethod
    def engine_config(
        *,
        num_gpu_blocks: int | None = None,
        block_size: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        max_loras: int | None = None,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        cost: CostModel | None = None,
    ) -> EngineConfig:
        base = EngineConfig()
        return EngineConfig(
            num_gpu_blocks=num_gpu_blocks or base.num_gpu_blocks,
            block_size=block_size or base.block_size,
            max_num_seqs=max_num_seqs or base.max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or base.max_num_batched_tokens,
            max_loras=base.max_loras if max_loras is None else max_loras,
            max_model_len=max_model_len or base.max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            cost=cost or base.cost,
        )
