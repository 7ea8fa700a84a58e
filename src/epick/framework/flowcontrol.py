"""Flow control's extension points: how requests are ordered within a flow, how flows share a
priority band, how far each band may push the pool, and which in-flight requests may be evicted.

The shapes follow upstream's (llm-d/llm-d-router, pkg/epp/framework/interface/flowcontrol): a request
belongs to a flow, keyed by (fairness id, priority); the flows of one priority form a band; within a
flow an `OrderingPolicy` orders the queue, within a band a `FairnessPolicy` picks the flow served
next, and a `UsageLimitPolicy` sets each band's ceiling on the pool's saturation. Policies are
singletons shared by every band that names them: a fairness policy keeps per-band state in the
object `new_state` returns, which the band hands back through `policy_state`.

Python-shaped differences from upstream's Go interfaces: an ordering policy gives a sort `key`
(upstream's `Less(a, b)` is `key(a) < key(b)`); a fairness policy's `Pick` is `pick_flow` (a plugin
with a `pick` method is a scheduling picker); and time is passed in (`now`, seconds) rather than
read from a wall clock, so the same policies run in the fleet simulator's virtual time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from epick.framework.cycle_state import CycleState
from epick.framework.datalayer import data_key
from epick.framework.endpoint import Endpoint
from epick.framework.plugin import Plugin
from epick.framework.request import InferenceRequest

DEFAULT_FAIRNESS_ID = "default-flow"  # upstream's id for a request that names none
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")  # upstream's, GIE's
# Where a request-header processor leaves the agent identity it found (the `agent-identity` plugin).
AGENT_IDENTITY_KEY = data_key("agent-identity", "")


# A client's own queue-wait bound (llm-d/llm-d-router #2649): a Go duration ("2s", "1500ms"); it can
# only shorten the operator's bound. Invalid, zero and negative values are ignored, as upstream's.
TTL_HEADER = "x-llm-d-inference-ttl"
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def requested_ttl(headers: Mapping[str, str]) -> float | None:
    """Seconds the request's `x-llm-d-inference-ttl` asks to wait at most; None when absent, not a
    Go duration, or not positive (time.ParseDuration's syntax: units required, a sign allowed)."""
    raw = headers.get(TTL_HEADER)
    if raw is None:
        return None
    text = raw.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    if text[:1] in ("+", "-"):
        text = text[1:]
    pos, seconds = 0, 0.0
    for m in _GO_DURATION.finditer(text):
        if m.start() != pos:
            break
        seconds += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text) or sign * seconds <= 0:
        return None
    return seconds


def fairness_id(request: InferenceRequest, cycle_state: CycleState | None = None) -> str:
    """The request's flow (its program): its fairness header (upstream's name, then GIE's), else the
    agent identity a request-header plugin found, else "default-flow", as upstream's director reads
    it (llm-d/llm-d-router, requestcontrol/director.go). Request control keys flows by it too."""
    for header in FAIRNESS_HEADERS:
        value = request.headers.get(header)
        if value:
            return value
    if cycle_state is not None:
        agent = cycle_state.read(AGENT_IDENTITY_KEY, str)
        if agent:
            return agent
    return DEFAULT_FAIRNESS_ID


@dataclass(frozen=True, slots=True)
class FlowKey:
    """One flow: a fairness id (tenant, program, …) at one priority. The same id at two priorities
    is two flows."""

    id: str
    priority: int

    def __str__(self) -> str:
        return f"{self.id}:{self.priority}"

    def sort_key(self) -> tuple[int, str]:
        """Upstream's FlowKey.Compare order: higher priority first, then id ascending."""
        return (-self.priority, self.id)


class QueueItem(Protocol):
    """A queued request as policies see it (read-only)."""

    @property
    def request(self) -> InferenceRequest: ...

    @property
    def flow_key(self) -> FlowKey: ...

    @property
    def byte_size(self) -> int: ...

    @property
    def received_time(self) -> float:
        """When the front end received the request (seconds, the controller's clock)."""
        ...

    @property
    def enqueue_time(self) -> float:
        """When flow control accepted it for queueing."""
        ...

    @property
    def ttl(self) -> float:
        """Its queue-wait budget while the pool has endpoints; 0: none."""
        ...


class FlowQueue(Protocol):
    """One flow's queue, as a fairness policy sees it."""

    @property
    def flow_key(self) -> FlowKey: ...

    @property
    def ordering_policy(self) -> OrderingPolicy: ...

    @property
    def byte_size(self) -> int: ...

    def __len__(self) -> int: ...

    def peek(self) -> QueueItem | None:
        """The item its ordering policy serves next, or None when empty."""
        ...


class PriorityBand(Protocol):
    """The flows of one priority, as a fairness policy sees them."""

    @property
    def priority(self) -> int: ...

    @property
    def policy_state(self) -> Any:
        """The object the band's fairness policy's `new_state` returned for this band."""
        ...

    def flow_keys(self) -> list[FlowKey]:
        """Every flow the band holds, empty queues included (no order promised)."""
        ...

    def queue(self, flow_id: str) -> FlowQueue | None: ...

    def queues(self) -> Iterator[FlowQueue]:
        """The band's non-empty queues (no order promised)."""
        ...

    def first_queue(self) -> FlowQueue | None:
        """The non-empty queue whose head the band's ordering policy serves first (every flow of a
        band has the band's ordering policy); None when all are empty. Kept up to date as items
        come and go, so it costs no scan."""
        ...

    @property
    def generation(self) -> int:
        """Changes whenever a flow joins or leaves the band (a policy may cache what it derives from
        `flow_keys` until it does)."""
        ...


@runtime_checkable
class OrderingPolicy(Plugin, Protocol):
    """Orders the requests within one flow: the item with the smallest key is served first."""

    def key(self, item: QueueItem) -> Any:
        """A sort key, fixed for the item's life in the queue (it is ordered once, on entry)."""
        ...


@runtime_checkable
class FairnessPolicy(Plugin, Protocol):
    """Picks which flow of a band dispatches next."""

    def new_state(self) -> Any:
        """The per-band state this policy keeps (None when it keeps none)."""
        ...

    def pick_flow(self, band: PriorityBand, now: float) -> FlowQueue | None:
        """The queue to serve next; None when no queue is eligible."""
        ...


@runtime_checkable
class UsageLimitPolicy(Plugin, Protocol):
    """Each band's ceiling on pool saturation: a band dispatches only while saturation < its ceiling.

    Called once per dispatch cycle with the bands' priorities, highest first, and a buffer of
    ceilings pre-filled with 1.0 (no gating) to write into. Ceilings must not increase from a higher
    band to a lower one: the cycle stops at the first gated band.
    """

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None: ...


@runtime_checkable
class BandSelectionPolicy(Plugin, Protocol):
    """The order a dispatch cycle visits the priority bands in (upstream's `BandSelectionPolicy`,
    `flowControl.bandSelectionPolicyPluginRef`, llm-d-router #2920): given the cycle's saturation, the
    bands' priorities (highest first) and their ceilings, rearrange `order` (indices into them,
    pre-filled highest first) in place."""

    def rank(
        self, saturation: float, priorities: Sequence[int], ceilings: Sequence[float], order: list[int]
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class EvictionItem:
    """An in-flight (dispatched) request that might be evicted to free capacity."""

    request_id: str
    priority: int
    dispatch_time: float
    target: Endpoint | None
    request: InferenceRequest | None = None


@runtime_checkable
class EvictionFilterPolicy(Plugin, Protocol):
    """Which in-flight requests may be evicted at all."""

    def accept(self, item: EvictionItem) -> bool: ...


@runtime_checkable
class EvictionOrderingPolicy(Plugin, Protocol):
    """Which evictable request goes first."""

    def evicts_before(self, a: EvictionItem, b: EvictionItem) -> bool: ...
