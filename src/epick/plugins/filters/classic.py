"""The Go EPP's first filters, as GIE v0.5 registered them (no later upstream release does), also
under short names (`low-queue`, ...: GIE v0.4's internal names for the first three and the LoRA
filter; `least-kv-cache` and `decision-tree` are epick's, for symmetry):

- `low-queue-filter`: endpoints whose waiting queue is at most `threshold` (128).
- `least-queue-filter`: endpoints whose queue is within the lowest (max − min) / n of the range
  (integer division, as Go's), n the number of endpoints: near-minimal ones, not only the minimum.
- `least-kv-cache-filter`: the same over KV-cache use.
- `lora-affinity-filter`: endpoints where the request's adapter is active or waiting (affinity), or
  else that have room for another adapter (available); when both groups are non-empty, affinity
  with probability `threshold` (0.999), available otherwise (a seeded random source).
- `decision-tree-filter`: runs `current`, then `nextOnSuccess` on its result if it kept any
  endpoint, or `nextOnFailure` on the original endpoints if it kept none (`nextOnSuccessOrFailure`
  stands for either when the specific one is absent). Each node is a `pluginRef` to a filter or a
  nested `decisionTree`.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field, model_validator

from epick.framework import CycleState, Endpoint, Filter, InferenceRequest, NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, ParameterError, Parameters, PluginSpec


class LowQueueParameters(Parameters):
    threshold: int = Field(default=128, ge=0)


class LowQueueFilter(NamedPlugin):
    plugin_type = "low-queue-filter"
    reads = Reads.METRICS

    def __init__(self, name: str | None = None, threshold: int = 128) -> None:
        super().__init__(name)
        self.threshold = threshold

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        return [ep for ep in endpoints if ep.metrics.waiting_queue_size <= self.threshold]


class LeastQueueFilter(NamedPlugin):
    plugin_type = "least-queue-filter"
    reads = Reads.METRICS

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        queues = [ep.metrics.waiting_queue_size for ep in endpoints]
        return _lowest_nth(endpoints, queues, operator.floordiv)


class LeastKVCacheFilter(NamedPlugin):
    plugin_type = "least-kv-cache-filter"
    reads = Reads.METRICS

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        usage = [ep.metrics.kv_cache_usage_percent for ep in endpoints]
        return _lowest_nth(endpoints, usage, operator.truediv)


def _lowest_nth(
    endpoints: Sequence[Endpoint], values: list[Any], divide: Callable[[Any, int], Any]
) -> list[Endpoint]:
    """The endpoints whose value is at most min + divide(max − min, n)."""
    if not endpoints:
        return []
    lo = min(values)
    top = lo + divide(max(values) - lo, len(endpoints))
    return [ep for ep, v in zip(endpoints, values, strict=True) if v <= top]


class LoraAffinityParameters(Parameters):
    threshold: float = Field(default=0.999, ge=0.0, le=1.0)


class LoraAffinityFilter(NamedPlugin):
    plugin_type = "lora-affinity-filter"
    reads = Reads.METRICS | Reads.MODEL | Reads.HISTORY  # a random draw

    def __init__(
        self, name: str | None = None, threshold: float = 0.999, rng: random.Random | None = None
    ) -> None:
        super().__init__(name)
        self.threshold = threshold
        self._rng = rng or random.Random()

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> list[Endpoint]:
        model = request.target_model
        affinity, available = [], []
        for ep in endpoints:
            m = ep.metrics
            if model in m.active_models or model in m.waiting_models:
                affinity.append(ep)
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                available.append(ep)
        if affinity and available:
            return affinity if self._rng.random() < self.threshold else available
        return affinity or available


class DecisionTreeEntry(Parameters):
    plugin_ref: str | None = Field(default=None, min_length=1)
    decision_tree: DecisionTreeParameters | None = None

    @model_validator(mode="after")
    def _one_of(self) -> DecisionTreeEntry:
        if (self.plugin_ref is None) == (self.decision_tree is None):
            raise ValueError("give exactly one of pluginRef and decisionTree")
        return self


class DecisionTreeParameters(Parameters):
    current: DecisionTreeEntry
    next_on_success: DecisionTreeEntry | None = None
    next_on_failure: DecisionTreeEntry | None = None
    next_on_success_or_failure: DecisionTreeEntry | None = None


DecisionTreeEntry.model_rebuild()


class DecisionTreeFilter(NamedPlugin):
    plugin_type = "decision-tree-filter"
    reads = Reads.NOTHING  # its branches are plugins of their own

    def __init__(
        self,
        name: str | None,
        current: Filter,
        on_success: Filter | None = None,
        on_failure: Filter | None = None,
    ) -> None:
        super().__init__(name)
        self.current = current
        self.on_success = on_success
        self.on_failure = on_failure

    def filter(
        self, request: InferenceRequest, cycle_state: CycleState, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        kept = self.current.filter(request, cycle_state, endpoints)
        if kept:
            nxt = self.on_success
            return kept if nxt is None else nxt.filter(request, cycle_state, kept)
        nxt = self.on_failure
        return kept if nxt is None else nxt.filter(request, cycle_state, endpoints)


def _tree(name: str | None, params: DecisionTreeParameters, handle: Handle, where: str) -> DecisionTreeFilter:
    """A tree's filters, resolved; `where` is the path of `params` for errors ("" at the top)."""
    either = params.next_on_success_or_failure
    success, success_key = (params.next_on_success, "nextOnSuccess")
    if success is None:
        success, success_key = either, "nextOnSuccessOrFailure"
    failure, failure_key = (params.next_on_failure, "nextOnFailure")
    if failure is None:
        failure, failure_key = either, "nextOnSuccessOrFailure"
    return DecisionTreeFilter(
        name,
        _node(params.current, handle, _at(where, "current")),
        None if success is None else _node(success, handle, _at(where, success_key)),
        None if failure is None else _node(failure, handle, _at(where, failure_key)),
    )


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _node(entry: DecisionTreeEntry, handle: Handle, where: str) -> Filter:
    if entry.decision_tree is not None:
        return _tree(None, entry.decision_tree, handle, _at(where, "decisionTree"))
    assert entry.plugin_ref is not None
    ref = entry.plugin_ref
    try:
        plugin = handle.plugin(ref)
    except LookupError as e:
        raise ParameterError(
            _at(where, "pluginRef"), f"there is no plugin named {ref!r}", e.args[1]
        ) from None
    if not isinstance(plugin, Filter):
        raise ParameterError(
            _at(where, "pluginRef"),
            f"plugin {ref!r} ({plugin.typed_name.type}) is not a filter",
            "refer to a filter plugin",
        )
    return plugin


def _low_queue(name: str, params: LowQueueParameters, handle: Handle) -> LowQueueFilter:
    return LowQueueFilter(name, params.threshold)


def _least_queue(name: str, params: NoParameters, handle: Handle) -> LeastQueueFilter:
    return LeastQueueFilter(name)


def _least_kv(name: str, params: NoParameters, handle: Handle) -> LeastKVCacheFilter:
    return LeastKVCacheFilter(name)


def _lora(name: str, params: LoraAffinityParameters, handle: Handle) -> LoraAffinityFilter:
    return LoraAffinityFilter(name, params.threshold, handle.rng(name))


def _decision_tree(name: str, params: DecisionTreeParameters, handle: Handle) -> DecisionTreeFilter:
    return _tree(name, params, handle, "")


def specs() -> list[PluginSpec]:
    """Each filter under its GIE v0.5 type name (…-filter), with its later short name as an alias."""
    return [
        PluginSpec("low-queue-filter", _low_queue, LowQueueParameters, "waiting queue at most the threshold",
                   aliases=("low-queue",), worker_state=""),
        PluginSpec("least-queue-filter", _least_queue, NoParameters, "queues in the lowest 1/n of the range",
                   aliases=("least-queue",), worker_state=""),
        PluginSpec("least-kv-cache-filter", _least_kv, NoParameters,
                   "KV-cache use in the lowest 1/n of the range", aliases=("least-kv-cache",),
                   worker_state=""),
        PluginSpec("lora-affinity-filter", _lora, LoraAffinityParameters,
                   "endpoints with the adapter, or room for it", aliases=("lora-affinity",), worker_state=""),
        PluginSpec("decision-tree-filter", _decision_tree, DecisionTreeParameters,
                   "filters chained on success or failure", aliases=("decision-tree",), worker_state=""),
    ]  # fmt: skip
