"""What `epick sim-server` is told: one set of options, shared by the servers of one process."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from epick.kvcache.vllm_hashing import HASH_ALGORITHMS
from epick.sim.engine import CostModel, EngineConfig
from epick.sim.engine.profiles import DEFAULT_PROFILE, engine_profile

Role = Literal["both", "prefill", "decode"]
KV_EVENTS_ENCODINGS = ("map", "array")  # vLLM 0.34's events (maps tagged by "type"), older (arrays)


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
    kv_events_encoding: str = "map"  # see KV_EVENTS_ENCODINGS
    # vLLM's --prefix-caching-hash-algo: the block hashes the KV events carry (seeded by PYTHONHASHSEED).
    prefix_caching_hash_algo: str = "sha256"
    tokenizer: str | None = None  # a model's tokenizer files (directory or tokenizer.json); None: built-in
    failure_rate: float = 0.0
    failure_types: tuple[str, ...] = ("rate_limit", "server_error")
    # Latency spikes: each request accepted for generation is, with probability latency_spike_rate
    # (drawn from a generator seeded by `seed`), held latency_spike_s wall seconds (not scaled by
    # time_scale) before it reaches the engine, so no response byte leaves before the spike ends.
    latency_spike_rate: float = 0.0
    latency_spike_s: float = 0.0
    default_max_tokens: int = 128
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self) -> None:
        if self.kv_events_encoding not in KV_EVENTS_ENCODINGS:
            choices = ", ".join(KV_EVENTS_ENCODINGS)
            raise ValueError(f"--kv-events-encoding {self.kv_events_encoding!r}: choose from {choices}")
        if self.prefix_caching_hash_algo not in HASH_ALGORITHMS:
            raise ValueError(
                f"--prefix-caching-hash-algo {self.prefix_caching_hash_algo!r}: "
                f"choose from {', '.join(HASH_ALGORITHMS)}"
            )
        if not (math.isfinite(self.latency_spike_rate) and 0.0 <= self.latency_spike_rate <= 1.0):
            raise ValueError(
                f"--latency-spike-rate {self.latency_spike_rate!r}: give a probability in [0, 1]"
            )
        if not (math.isfinite(self.latency_spike_s) and self.latency_spike_s >= 0.0):
            raise ValueError(f"--latency-spike-s {self.latency_spike_s!r}: give finite seconds >= 0")

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
        profile: str = DEFAULT_PROFILE,
    ) -> EngineConfig:
        """An engine of `profile` (a model on its GPUs: step costs and KV blocks), with what is given
        in place of its values. Raises ValueError for an unknown profile."""
        chosen = engine_profile(profile)
        base = EngineConfig(num_gpu_blocks=chosen.num_gpu_blocks, cost=chosen.cost)
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
