"""Workload generators for `epick simulate`: the request streams a fleet simulation routes.

A workload is a small frozen dataclass of parameters. `requests(rng)` draws one seed from `rng` at
once and returns a lazy iterator of `SimRequestSpec`s, so a seeded `Random` always gives the same
stream (whatever else the caller later draws from it) and a million requests never sit in memory
together. Generated prompts use `epick.simulate.vocab`: one word is one token and `text` is
`vocab.text(tokens)`, so equal text prefixes are equal token prefixes. A shared prefix (system
prompt, document) is generated once as a tuple and reused by every request that shares it; token
ids are drawn from one pool of int objects, so a request's tuple holds pointers, not new ints.

Every workload can also say which tokens the engine should emit for a request (`output_plan`, empty
for "any"; only `MultiTurn` needs it, since its later prompts contain the earlier answers) and which
LoRA adapters its requests name (`adapter_names`, empty unless `LoraMix`).

Workloads: `SharedPrefix`, `MultiTurn`, `ShareGPTLike`, `LoraMix`, `LongDocQA`, `Trace`; build one
by name with `build_workload("shared-prefix", {"groups": 150})`. See docs/workloads.md. One module
per workload; `base` holds the protocol and its error, `sampling` the random prompts they share,
`registry` the lookup by name.
"""

from epick.simulate.types import BASE_MODEL
from epick.simulate.workloads.base import Workload, WorkloadError
from epick.simulate.workloads.long_doc_qa import LongDocQA
from epick.simulate.workloads.lora_mix import LoraMix
from epick.simulate.workloads.multi_turn import MultiTurn, assistant_tokens
from epick.simulate.workloads.registry import WORKLOADS, build_workload, workload_parameters
from epick.simulate.workloads.shared_prefix import SharedPrefix
from epick.simulate.workloads.sharegpt_like import ShareGPTLike
from epick.simulate.workloads.trace import TRACE_BLOCK_TOKENS, Trace, trace_block_tokens, word_token

__all__ = [
    "BASE_MODEL",
    "TRACE_BLOCK_TOKENS",
    "WORKLOADS",
    "LongDocQA",
    "LoraMix",
    "MultiTurn",
    "ShareGPTLike",
    "SharedPrefix",
    "Trace",
    "Workload",
    "WorkloadError",
    "assistant_tokens",
    "build_workload",
    "trace_block_tokens",
    "word_token",
    "workload_parameters",
]
