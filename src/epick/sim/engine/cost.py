"""How long one engine step takes: a linear cost model, calibrated in docs/simulator.md.

step = overhead + prefill_token × prefill tokens + decode_seq × decoding sequences
       + context_token × tokens of context attended + transfer_token × KV tokens received
       + lora_load × adapters loaded into a slot this step

"Context attended" is, over every sequence in the step, the length of KV it reads (its computed
tokens plus the new ones): the memory-bound attention cost that grows with long contexts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostModel:
    # Defaults: Llama-3.1-8B (bf16) on one H100 SXM; derivation and sources in docs/simulator.md.
    overhead_s: float = 0.0055
    prefill_token_s: float = 0.000045
    decode_seq_s: float = 0.00003
    context_token_s: float = 0.00000004
    transfer_token_s: float = 0.000002
    lora_load_s: float = 0.005

    def step_time(
        self,
        prefill_tokens: int,
        decode_seqs: int,
        context_tokens: int,
        transfer_tokens: int = 0,
        lora_loads: int = 0,
    ) -> float:
        return (
            self.overhead_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decode_seqs
            + self.context_token_s * context_tokens
            + self.transfer_token_s * transfer_tokens
            + self.lora_load_s * lora_loads
        )
