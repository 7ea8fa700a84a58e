"""Engine profiles: a model on its GPUs, as the simulator's cost model and KV cache see it.

Each profile is calibrated in docs/simulator.md ("Engine profiles") from published vLLM measurements:
the step costs (weight read and launch overhead, per prefill token, per decoding sequence, per token
of context attended, per KV token received) and the KV cache vLLM allocates at
gpu_memory_utilization 0.9, in blocks of 16 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from epick.sim.engine.cost import CostModel


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str
    model: str
    hardware: str
    cost: CostModel
    num_gpu_blocks: int  # blocks of 16 tokens per server (per replica, all its GPUs together)


PROFILES = {
    p.name: p
    for p in (
        EngineProfile(
            "llama-3.1-8b-h100", "meta-llama/Llama-3.1-8B-Instruct", "1 × H100 SXM 80 GB", CostModel(), 27_000
        ),
        EngineProfile(
            "qwen3-32b-tp2-h100",
            "Qwen/Qwen3-32B",
            "2 × H100 SXM 80 GB, tensor parallel",
            CostModel(
                overhead_s=0.0105,
                prefill_token_s=80e-6,
                decode_seq_s=60e-6,
                context_token_s=0.05e-6,
                transfer_token_s=2e-6,
            ),
            19_208,  # 307,328 tokens: llm-d's published KV size for this setup
        ),
        EngineProfile(
            "llama-3.1-70b-tp4-h100",
            "meta-llama/Llama-3.1-70B-Instruct",
            "4 × H100 SXM 80 GB, tensor parallel",
            CostModel(
                overhead_s=0.011,
                prefill_token_s=85e-6,
                decode_seq_s=65e-6,
                context_token_s=0.025e-6,
                transfer_token_s=1.25e-6,
            ),
            28_836,  # 461,376 tokens: llm-d's published KV size for this setup
        ),
    )
}
DEFAULT_PROFILE = "llama-3.1-8b-h100"


def engine_profile(name: str) -> EngineProfile:
    """The profile called `name`; a ValueError naming the known ones otherwise."""
    found = PROFILES.get(name)
    if found is None:
        raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(PROFILES)}")
    return found
