"""Flow control: hold requests in priority bands and per-tenant queues while the pool is saturated,
and dispatch them, by priority, fairness and order, as capacity frees.

The layer is upstream's (llm-d/llm-d-router, pkg/epp/flowcontrol) rebuilt sans I/O: `FlowController`
takes requests (`submit`), runs dispatch cycles on the pool it is shown (`dispatch_once`), expires
requests past their queue-wait budget (`sweep`) and drops a request whose client left (`cancel`);
each request ends in exactly one `Outcome`, reported to the callback it was submitted with. It reads
time only from the clock it is given, so the service (requestcontrol/admission.py drives it on the
event loop) and the fleet simulator (in virtual time) run the same code.
"""

from epick.flowcontrol.controller import FlowController, FlowObserver
from epick.flowcontrol.outcomes import Outcome
from epick.flowcontrol.queues import FlowItem
from epick.flowcontrol.settings import BandSettings, FlowControlSettings

__all__ = [
    "BandSettings",
    "FlowControlSettings",
    "FlowController",
    "FlowItem",
    "FlowObserver",
    "Outcome",
]
