"""Fairness policies without parameters: which flow of a priority band dispatches next.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/fairness/{globalstrict,
roundrobin}):

- `global-strict-fairness-policy`: no fairness at all. Of the band's non-empty queues it picks the one
  whose head item comes first by the queues' ordering policy, making the band one logical queue. Every
  queue of the band must be ordered by the same ordering-policy type: a pick that meets two raises
  `IncompatiblePriorityTypeError` (upstream's ErrIncompatiblePriorityType). Equal heads: the head that
  arrived first wins. It keeps no state (`new_state` is None). A band that keeps its heads in order
  (`first_queue`, as epick's flow controller does: a band has one ordering policy) answers without a
  scan; otherwise every non-empty queue is compared.
- `round-robin-fairness-policy`: a cursor per band remembers the flow picked last. The band's flows,
  empty ones included, are sorted by `FlowKey.sort_key` (upstream's FlowKey.Compare); the scan starts
  just after the remembered flow (at the first flow when it has gone) and takes the first non-empty
  queue; when every queue is empty the cursor is cleared. The sorted flows are kept until the band's
  `generation` changes (upstream sorts on every pick).

Deviations: a pick raises where upstream returns an error; the round-robin cursor has no lock (the
flow controller calls a band's policy from its one dispatch loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from epick.framework import NamedPlugin, Reads
from epick.framework.flowcontrol import FlowKey, FlowQueue, PriorityBand
from epick.plugins.registry import Handle, NoParameters, PluginSpec

GLOBAL_STRICT_TYPE = "global-strict-fairness-policy"
ROUND_ROBIN_TYPE = "round-robin-fairness-policy"


class IncompatiblePriorityTypeError(ValueError):
    """Two queues of one band are ordered by different ordering-policy types, whose keys do not
    compare."""

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(
            f'incompatible priority score type for comparison: expected "{expected}", got "{got}"'
        )
        self.expected = expected
        self.got = got


class GlobalStrictFairnessPolicy(NamedPlugin):
    plugin_type = GLOBAL_STRICT_TYPE
    reads = Reads.NOTHING

    def new_state(self) -> None:
        return None

    def pick_flow(self, band: PriorityBand, now: float) -> FlowQueue | None:
        first_queue = getattr(band, "first_queue", None)
        if first_queue is not None:
            found: FlowQueue | None = first_queue()
            return found
        return self.scan(band)

    def scan(self, band: PriorityBand) -> FlowQueue | None:
        """Compare every non-empty queue's head (for a band that does not keep them in order)."""
        best: FlowQueue | None = None
        best_type = ""
        best_key: Any = None
        for queue in band.queues():
            if len(queue) == 0:
                continue
            item = queue.peek()
            if item is None:
                continue
            policy = queue.ordering_policy
            if best is None:
                best, best_type, best_key = queue, policy.typed_name.type, policy.key(item)
                continue
            if policy.typed_name.type != best_type:
                raise IncompatiblePriorityTypeError(best_type, policy.typed_name.type)
            key = policy.key(item)
            if key < best_key:
                best, best_key = queue, key
        return best


@dataclass(slots=True)
class RoundRobinCursor:
    """A band's round-robin state: the flow picked last."""

    last_selected: FlowKey | None = None
    generation: int = -1  # the band generation `keys` was sorted at
    keys: list[FlowKey] = field(default_factory=list)
    index: dict[FlowKey, int] = field(default_factory=dict)


class RoundRobinFairnessPolicy(NamedPlugin):
    plugin_type = ROUND_ROBIN_TYPE
    reads = Reads.HISTORY

    def new_state(self) -> RoundRobinCursor:
        return RoundRobinCursor()

    def pick_flow(self, band: PriorityBand, now: float) -> FlowQueue | None:
        cursor = band.policy_state
        if not isinstance(cursor, RoundRobinCursor):
            raise TypeError(
                f"invalid state type for {ROUND_ROBIN_TYPE}: expected RoundRobinCursor, "
                f"got {type(cursor).__name__}"
            )
        generation = getattr(band, "generation", None)
        if generation is None or generation != cursor.generation:
            cursor.keys = sorted(band.flow_keys(), key=FlowKey.sort_key)
            cursor.index = {k: i for i, k in enumerate(cursor.keys)}
            cursor.generation = -1 if generation is None else generation
        keys = cursor.keys
        n = len(keys)
        if n == 0:
            cursor.last_selected = None
            return None
        start = 0
        if cursor.last_selected is not None:
            last = cursor.index.get(cursor.last_selected)
            start = 0 if last is None else (last + 1) % n  # the flow picked last gone: start over
        for i in range(n):
            key = keys[(start + i) % n]
            queue = band.queue(key.id)
            if queue is not None and len(queue) > 0:
                cursor.last_selected = key
                return queue
        cursor.last_selected = None
        return None


def _global_strict(name: str, params: NoParameters, handle: Handle) -> GlobalStrictFairnessPolicy:
    return GlobalStrictFairnessPolicy(name)


def _round_robin(name: str, params: NoParameters, handle: Handle) -> RoundRobinFairnessPolicy:
    return RoundRobinFairnessPolicy(name)


GLOBAL_STRICT_SPEC = PluginSpec(
    GLOBAL_STRICT_TYPE,
    _global_strict,
    NoParameters,
    "flow-control fairness: the band's best head item by its ordering policy, whichever flow",
    worker_state="flow control's rotation over flows",
)
ROUND_ROBIN_SPEC = PluginSpec(
    ROUND_ROBIN_TYPE,
    _round_robin,
    NoParameters,
    "flow-control fairness: the band's flows in turn",
    worker_state="flow control's rotation over flows",
)
