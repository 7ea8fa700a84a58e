"""`burst-prefix-cache-producer`: requests that arrive together and share a prompt go to one replica,
so the prompt is prefilled once instead of on every replica's cold cache (RL rollouts, n samples of
one prompt, a fan-out of agents).

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix):
the first request opens a batch that seals `windowDurationMs` later (a fixed window, not a sliding
one); every request in it waits for the seal, the batch is placed (`burst_assign`), and each request
publishes a prefix match, "PrefixCacheMatchInfoDataKey/<its name>", that is whole on its assigned
replica and empty elsewhere. A `prefix-cache-scorer` with `prefixMatchInfoProducerName` naming this
plugin scores it. A batch holding `maxBatchSize` requests (-1: no limit) refuses more: those requests
fail this producer, so the producers after it are skipped, and are scheduled without its data, as
upstream does. A request that gives up waiting (its client went away, or the seal is more than 300 ms
late) stays in the batch and is placed with it.

Parameters, as upstream's: `windowDurationMs` (100; 1..10000), `maxPerReplica` (-1, or >= 1),
`blockSizeTokens` (64), `maxPrefixTokensToMatch` (0: 2048 blocks; else >= blockSizeTokens, and the
cap is it / blockSizeTokens), `minColocateBlocks` (0), `maxBatchSize` (1000; -1 or >= 1),
`balanceBy` (requests, or tokens).

Deviations, on purpose: blocks are `blockSizeTokens` × 4 bytes of the prompt text, the approximate
index's rule (docs/plugins.md), where upstream hashes the token producer's ids, so no tokenizer is
needed; the batch waits on the front end's event loop before the scheduling cycle (epick's producers
do not block), and before flow control when that is on; a request scheduled without waiting (a
retry, `epick explain`, the fleet simulator) is produced as a batch of one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.framework.request import CHARS_PER_TOKEN
from epick.plugins.prefix.burst_assign import UNLIMITED, BurstEntry, assign
from epick.plugins.prefix.hashing import prompt_block_hashes
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, PrefixMatch
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "burst-prefix-cache-producer"
MAX_WINDOW_MS = 10_000
DEFAULT_MAX_BLOCKS = 2048
SEAL_MARGIN = 0.3  # seconds a request waits past its window for the seal, upstream's margin
log = logging.getLogger(__name__)


class BurstParameters(Parameters):
    window_duration_ms: int = Field(default=100, ge=1, le=MAX_WINDOW_MS)
    max_per_replica: int = UNLIMITED
    block_size_tokens: int = Field(default=64, gt=0)
    max_prefix_tokens_to_match: int = Field(default=0, ge=0)
    min_colocate_blocks: int = Field(default=0, ge=0)
    max_batch_size: int = 1000
    balance_by: Literal["requests", "tokens", ""] = "requests"

    def check(self) -> None:
        if self.max_per_replica != UNLIMITED and self.max_per_replica < 1:
            raise ParameterError(
                "maxPerReplica", f"maxPerReplica is {self.max_per_replica}", "use -1 (no cap) or at least 1"
            )
        if self.max_batch_size != UNLIMITED and self.max_batch_size < 1:
            raise ParameterError(
                "maxBatchSize", f"maxBatchSize is {self.max_batch_size}", "use -1 (no limit) or at least 1"
            )
        if 0 < self.max_prefix_tokens_to_match < self.block_size_tokens:
            raise ParameterError(
                "maxPrefixTokensToMatch",
                f"maxPrefixTokensToMatch ({self.max_prefix_tokens_to_match}) is less than one block "
                f"(blockSizeTokens {self.block_size_tokens})",
                "use 0 (2048 blocks) or at least blockSizeTokens",
            )


class BatchFullError(RuntimeError):
    pass


class _Batch:
    def __init__(self) -> None:
        self.entries: list[BurstEntry] = []
        self.sealed = asyncio.Event()


class _Waiting:
    """A request between its batch and its scheduling cycle."""

    def __init__(self, entry: BurstEntry | None, error: str = "") -> None:
        self.entry = entry
        self.error = error


class BurstPrefixCacheProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.PROMPT | Reads.MODEL | Reads.BODY | Reads.METRICS

    def __init__(self, name: str | None = None, params: BurstParameters | None = None) -> None:
        super().__init__(name)
        self.params = params = params or BurstParameters()
        params.check()
        self.window = params.window_duration_ms / 1000
        self.block_bytes = params.block_size_tokens * CHARS_PER_TOKEN
        tokens = params.max_prefix_tokens_to_match
        self.max_blocks = tokens // params.block_size_tokens if tokens > 0 else DEFAULT_MAX_BLOCKS
        self.by_tokens = params.balance_by == "tokens"
        self.key = data_key(MATCH_DATA_TYPE, self.name)
        self.batch: _Batch | None = None
        # By request key, until the request's scheduling cycle reads it; a request that never gets
        # there (refused after waiting) is dropped when the batch after next seals.
        self.waiting: dict[int, _Waiting] = {}
        self._previous: list[int] = []
        self._current: list[int] = []

    def hashes(self, request: InferenceRequest) -> tuple[int, ...]:
        text = request.body.prefix_text
        return tuple(
            prompt_block_hashes(
                text,
                request.target_model,
                block_bytes=self.block_bytes,
                max_blocks=self.max_blocks,
                cache_salt=request.body.cache_salt,
            )
        )

    async def collect(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        batch = self.batch
        if batch is None:
            batch = self.batch = _Batch()
            asyncio.get_running_loop().call_later(self.window, self._seal, batch)
        limit = self.params.max_batch_size
        if limit != UNLIMITED and len(batch.entries) >= limit:
            self._hold(request.key, _Waiting(None, f"burst prefix batch full: maxBatchSize {limit} reached"))
            raise BatchFullError(f"the batch is full (maxBatchSize {limit})")
        entry = BurstEntry(self.hashes(request), tuple(endpoints))
        batch.entries.append(entry)
        try:
            await asyncio.wait_for(batch.sealed.wait(), self.window + SEAL_MARGIN)
        except TimeoutError:
            self._hold(request.key, _Waiting(None, "the batch did not seal in time"))
            raise
        self._hold(request.key, _Waiting(entry))

    def _hold(self, key: int, waiting: _Waiting) -> None:
        self.waiting[key] = waiting
        self._current.append(key)

    def _seal(self, batch: _Batch) -> None:
        if self.batch is batch:
            self.batch = None
        try:
            assign(
                batch.entries, self.params.max_per_replica, self.params.min_colocate_blocks, self.by_tokens
            )
        except Exception:  # a bug in placement must not leave the batch's requests waiting
            log.exception("%s: placing a batch of %d failed", self.typed_name, len(batch.entries))
        batch.sealed.set()
        for key in self._previous:
            self.waiting.pop(key, None)
        self._previous, self._current = self._current, []

    def produce(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> None:
        waiting = self.waiting.pop(request.key, None)
        if waiting is None:
            entry = BurstEntry(self.hashes(request), endpoints)  # scheduled without waiting: alone
        elif waiting.entry is None:
            raise RuntimeError(waiting.error)
        else:
            entry = waiting.entry
        total = len(entry.hashes)
        target = entry.assigned
        matched = {target.name: total} if target is not None and total else {}
        cycle_state.write(self.key, PrefixMatch(total, self.block_bytes, matched, list(entry.hashes)))


def _factory(name: str, params: BurstParameters, handle: Handle) -> BurstPrefixCacheProducer:
    return BurstPrefixCacheProducer(name, params)


SPEC = PluginSpec(
    TYPE,
    _factory,
    BurstParameters,
    "a shared prompt arriving in a burst goes to one replica",
    worker_state="its open batch of requests",
)
