"""`no-hit-lru-scorer` (llm-d): spread cold requests, which fill caches fastest, over the endpoints.

A request is cold when no candidate holds any of its blocks, by the prefix-match producer
(`prefixMatchInfoProducerName`, or the config's `approx-prefix-cache-producer`), else the prefix scorer
(`prefixPluginName`, default `prefix-cache-scorer`, which must come before this scorer in the profile),
or when that left no match at all. A warm request scores 0.5 everywhere. For a cold one, endpoints are
ranked by when they last received a cold request: first those that never did (in candidate order),
then the rest from least to most recent; rank r of n scores max(0, 1 − r / (n − 1)), a single
endpoint 1. The order is kept in PreRequest for the primary target and the `prefillProfile`
(default prefill) target of cold requests, over at most `lruSize` (1024) endpoints. Under `epick
serve --workers` the order is shared: every worker's cold requests move endpoints in one order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from pydantic import Field

from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    NamedPlugin,
    Reads,
    SchedulingResult,
    state_key,
)
from epick.framework.replication import Publish
from epick.plugins.debug_state import MAX_LISTED
from epick.plugins.prefix.scorer import TYPE as PREFIX_TYPE
from epick.plugins.prefix.scorer import find_prefix_match, resolve_producer
from epick.plugins.registry import Handle, Parameters, PluginSpec

TYPE = "no-hit-lru-scorer"


@dataclass(frozen=True, slots=True)
class _Scored:
    """Left in the cycle state by `score` for PreRequest: whether the request was cold."""

    cold: bool


class NoHitLruParameters(Parameters):
    prefix_plugin_name: str = Field(default=PREFIX_TYPE, min_length=1)
    prefill_profile: str = Field(default="prefill", min_length=1)
    lru_size: int = Field(default=1024, gt=0)
    prefix_match_info_producer_name: str = ""


class NoHitLruScorer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.HISTORY  # its LRU order, and the prefix scorer's match

    def __init__(
        self,
        name: str | None = None,
        prefix_plugin_name: str = PREFIX_TYPE,
        prefill_profile: str = "prefill",
        lru_size: int = 1024,
    ) -> None:
        super().__init__(name)
        self.prefix_plugin_name = prefix_plugin_name
        self.prefill_profile = prefill_profile
        self.lru_size = lru_size
        self._lru: OrderedDict[str, None] = OrderedDict()  # endpoint names, least recent first
        self._publish: Publish | None = None

    def score(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        match = find_prefix_match(cycle_state, self.prefix_plugin_name)
        # Cold when no candidate holds a block (upstream's rule): in P/D the prefill endpoints may
        # hold the prefix while no decode candidate does.
        cold = match is None or not any(match.matched.get(ep.name, 0) > 0 for ep in endpoints)
        cycle_state.write(state_key(self), _Scored(cold))
        if not cold:
            return [0.5] * len(endpoints)
        n = len(endpoints)
        if n == 1:
            return [1.0]
        position = {name: i for i, name in enumerate(self._lru)}
        never = sum(1 for ep in endpoints if ep.name not in position)
        scores = []
        fresh = 0
        for ep in endpoints:
            pos = position.get(ep.name)
            if pos is None:
                rank = fresh
                fresh += 1
            else:
                rank = never + pos
            scores.append(max(0.0, 1.0 - rank / (n - 1)))
        return scores

    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        scored = cycle_state.read(state_key(self), _Scored)
        if scored is None or not scored.cold:  # warm, or not scored in this cycle
            return
        for profile in (result.primary_profile, self.prefill_profile):
            r = result.profile_results.get(profile)
            if r is not None and r.targets:
                self._used(r.targets[0].name)

    def endpoint_removed(self, name: str) -> None:
        self._lru.pop(name, None)

    def _used(self, name: str) -> None:
        if self._publish is not None:
            self._publish(name)
        self._touch(name)

    def _touch(self, name: str) -> None:
        self._lru.pop(name, None)
        self._lru[name] = None
        if len(self._lru) > self.lru_size:
            self._lru.popitem(last=False)

    # Replicated: under `epick serve --workers`, one LRU order of every worker's cold requests.
    def dump_state(self) -> object:
        """The endpoints in LRU order, least recent first (`/debug/plugins/state`), as upstream's."""
        order = list(self._lru)
        return {"endpoints": order[:MAX_LISTED], "totalEndpoints": len(order), "maxEndpoints": MAX_LISTED}

    def replicate(self, publish: Publish | None, worker: int) -> None:
        self._publish = publish

    def apply_update(self, update: object, worker: int) -> None:
        self._touch(str(update))

    def snapshot(self) -> object:
        return list(self._lru)

    def restore(self, snapshot: object) -> None:
        """A running worker's order goes before (is older than) what this one recorded itself."""
        mine = list(self._lru)
        self._lru.clear()
        for name in [*cast("list[str]", snapshot), *mine]:
            self._touch(str(name))

    def worker_left(self, worker: int) -> None:
        """The order stays: the endpoints got those requests whichever worker sent them."""


def _factory(name: str, params: NoHitLruParameters, handle: Handle) -> NoHitLruScorer:
    # llm-d's layout: the match comes from a producer (the one named, or the config's default one);
    # GIE's: from the prefix scorer named by prefixPluginName.
    producer = resolve_producer(handle, params.prefix_match_info_producer_name, "prefixMatchInfoProducerName")
    source = producer if producer is not None else params.prefix_plugin_name
    return NoHitLruScorer(name, source, params.prefill_profile, params.lru_size)


SPEC = PluginSpec(TYPE, _factory, NoHitLruParameters, "cold requests to endpoints least recently given one")
