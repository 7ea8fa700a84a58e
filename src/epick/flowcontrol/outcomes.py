"""How a request leaves flow control: upstream's QueueOutcome values (their names are metric labels)."""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    DISPATCHED = "Dispatched"
    # Refused before entering a queue.
    REJECTED_CAPACITY = "RejectedCapacity"  # a band or global limit was full: 429
    REJECTED_NO_ENDPOINTS = "RejectedNoEndpoints"  # full while the pool had no endpoints: 503
    REJECTED_OTHER = "RejectedOther"  # e.g. the controller is shutting down: 503
    # Removed from a queue without being dispatched.
    EVICTED_TTL = "EvictedTTL"  # its queue-wait budget ran out: 429
    EVICTED_NO_ENDPOINTS = "EvictedNoEndpoints"  # ran out while the pool had no endpoints: 503
    EVICTED_CONTEXT_CANCELLED = "EvictedContextCancelled"  # the client went away
    EVICTED_OTHER = "EvictedOther"  # e.g. shutdown while queued: 503

    @property
    def dispatched(self) -> bool:
        return self is Outcome.DISPATCHED
