"""Ordering policies: which request of a flow's queue is served first.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/ordering/{fcfs,edf,
slodeadline}), none of which takes parameters:

- `fcfs-ordering-policy`: the earliest enqueue time first.
- `edf-ordering-policy`: the earliest deadline, enqueue time + TTL, first; an item without a TTL
  (TTL <= 0) has no deadline and goes after every item that has one; equal deadlines go in enqueue
  order.
- `slo-deadline-ordering-policy`: the earliest SLO deadline, received time + the request header
  `x-llm-d-slo-ttft-ms` (or its deprecated alias `x-slo-ttft-ms`, read only when the current name is
  absent) in milliseconds, first. A missing, empty, unparsable (Go's `ParseInt` after trimming
  blanks), negative or overflowing value gives no deadline; equal deadlines go in received order.

Deviation by design (the protocol's, see `epick.framework.flowcontrol`): each policy gives a sort key,
a tuple of floats, instead of upstream's `Less(a, b)`; `Less(a, b)` is `key(a) < key(b)`. "No
deadline" is +inf (upstream: the largest time.Time). Times are seconds as floats, not nanoseconds, so
two deadlines equal to the nanosecond upstream may differ by a rounding error here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from epick.framework import NamedPlugin, Reads
from epick.framework.flowcontrol import QueueItem
from epick.plugins.latency.slo import OLD_TTFT_HEADER, TTFT_HEADER, header_value
from epick.plugins.registry import Handle, NoParameters, PluginSpec

FCFS_TYPE = "fcfs-ordering-policy"
EDF_TYPE = "edf-ordering-policy"
SLO_DEADLINE_TYPE = "slo-deadline-ordering-policy"


NO_DEADLINE = math.inf
# The largest millisecond count Go can turn into a time.Duration (int64 nanoseconds) without overflow.
_MAX_MS = (2**63 - 1) // 1_000_000
# What Go's strings.TrimSpace strips (unicode.IsSpace), which differs from str.strip's set.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
_INT = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64)'s syntax (no underscores in base 10)


class FCFSOrderingPolicy(NamedPlugin):
    plugin_type = FCFS_TYPE
    reads = Reads.NOTHING

    def key(self, item: QueueItem) -> tuple[float]:
        return (item.enqueue_time,)


def edf_deadline(item: QueueItem) -> float:
    """Enqueue time + TTL; +inf when the item has no TTL."""
    ttl = item.ttl
    if ttl <= 0:
        return NO_DEADLINE
    return item.enqueue_time + ttl


class EDFOrderingPolicy(NamedPlugin):
    plugin_type = EDF_TYPE
    reads = Reads.NOTHING

    def key(self, item: QueueItem) -> tuple[float, float]:
        return (edf_deadline(item), item.enqueue_time)


def slo_ttft_ms(headers: Mapping[str, str]) -> int | None:
    """The request's TTFT objective in milliseconds (headers by lower-case name), or None when it
    gives no valid one."""
    value = header_value(headers, TTFT_HEADER, OLD_TTFT_HEADER)  # present wins, even if unusable
    if value is None:
        return None
    text = value.strip(_GO_SPACE)
    if not _INT.fullmatch(text):
        return None
    ms = int(text)
    if ms < 0 or ms > _MAX_MS:
        return None
    return ms


def slo_deadline(item: QueueItem) -> float:
    """Received time + the request's TTFT objective; +inf when it has none."""
    ms = slo_ttft_ms(item.request.headers)
    if ms is None:
        return NO_DEADLINE
    return item.received_time + ms / 1000.0


class SLODeadlineOrderingPolicy(NamedPlugin):
    plugin_type = SLO_DEADLINE_TYPE
    reads = Reads.HEADERS

    def key(self, item: QueueItem) -> tuple[float, float]:
        return (slo_deadline(item), item.received_time)


def _fcfs(name: str, params: NoParameters, handle: Handle) -> FCFSOrderingPolicy:
    return FCFSOrderingPolicy(name)


def _edf(name: str, params: NoParameters, handle: Handle) -> EDFOrderingPolicy:
    return EDFOrderingPolicy(name)


def _slo_deadline(name: str, params: NoParameters, handle: Handle) -> SLODeadlineOrderingPolicy:
    return SLODeadlineOrderingPolicy(name)


FCFS_SPEC = PluginSpec(FCFS_TYPE, _fcfs, NoParameters, "flow-control ordering: first come, first served")
EDF_SPEC = PluginSpec(
    EDF_TYPE, _edf, NoParameters, "flow-control ordering: earliest enqueue time + TTL first"
)
SLO_DEADLINE_SPEC = PluginSpec(
    SLO_DEADLINE_TYPE,
    _slo_deadline,
    NoParameters,
    "flow-control ordering: earliest received time + x-llm-d-slo-ttft-ms first",
)
