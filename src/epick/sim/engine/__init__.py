"""The engine model: a pure, clock-agnostic state machine advanced one step at a time.

Layers as vLLM's v1 core: `Engine` (add, abort, step) → `StepScheduler` (who runs this step) →
`KVCacheManager` (blocks per request, prefix hits) → `BlockPool` (ref counts, LRU free queue, hash map).
Nothing here does I/O or reads a clock: the caller says when a step starts and advances its own
clock (real or virtual) by the duration the cost model returns.
"""

from epick.sim.engine.block_pool import AllBlocksCleared, BlockPool, BlockRemoved, BlockStored, KVEvent
from epick.sim.engine.cost import CostModel
from epick.sim.engine.engine import Engine, EngineConfig, RequestOutput, StepResult
from epick.sim.engine.request import FinishReason, RequestStatus, SimRequest

__all__ = [
    "AllBlocksCleared",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "CostModel",
    "Engine",
    "EngineConfig",
    "FinishReason",
    "KVEvent",
    "RequestOutput",
    "RequestStatus",
    "SimRequest",
    "StepResult",
]
