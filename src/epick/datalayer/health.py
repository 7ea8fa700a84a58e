"""What the front ends learn of an endpoint's health from the requests they send it, kept in the data
layer: outlier detection (Envoy's, in its defaults) and endpoints found unreachable.

- An endpoint that cannot be reached (connection refused or reset, a response broken off) leaves the
  candidates at once, and comes back when its metrics answer again (the scraper marks it healthy).
- An endpoint that fails `consecutive_failures` times in a row is ejected
  for `base_ejection_s` × the number of times it has been ejected in a row, at most
  `max_ejection_s`; each `base_ejection_s` it then stays clean takes one off that count. At most
  `max_ejection_percent` of the endpoints are ejected at once, but always at least one may be
  (Envoy's outlier detection: consecutive_5xx 5, base_ejection_time 30 s, max_ejection_time 300 s,
  max_ejection_percent 10). A success resets the run of failures.

Only failures that implicate the endpoint count: first-byte timeouts, and the answers a server gives
when it is overloaded or broken behind itself (502, 503, 504, as Envoy's consecutive gateway failures).
Any other answer, a 500 included, resets the run: the server answered, and what went wrong may be the
request's (a body that is not what its Content-Encoding says, a prompt too long), which a client could
otherwise use to get healthy servers ejected.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from epick.datalayer.datastore import Datastore

log = logging.getLogger(__name__)

# The answers that implicate the server rather than the request (Envoy's gateway failures).
GATEWAY_FAILURES = frozenset({502, 503, 504})


@dataclass(frozen=True, slots=True)
class OutlierPolicy:
    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 10.0

    @property
    def counts_statuses(self) -> bool:
        """Whether 5xx answers and first-byte timeouts eject endpoints (0 consecutive failures: outlier
        detection is off, as when the gateway does its own)."""
        return self.consecutive_failures > 0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 0:
            raise ValueError("consecutive_failures must be 0 (5xx answers eject nothing) or more")
        if not (0 < self.base_ejection_s <= self.max_ejection_s and math.isfinite(self.max_ejection_s)):
            raise ValueError("ejection times must be finite, with 0 < base_ejection_s <= max_ejection_s")
        if not 0 <= self.max_ejection_percent <= 100:
            raise ValueError("max_ejection_percent must be in [0, 100]")


@dataclass(slots=True)
class _Record:
    failures: int = 0  # in a row
    ejections: int = 0  # in a row, decaying while clean
    clean_since: float = 0.0


@dataclass(slots=True)
class EndpointHealth:
    datastore: Datastore
    policy: OutlierPolicy = field(default_factory=OutlierPolicy)
    clock: Callable[[], float] = time.monotonic
    _records: dict[str, _Record] = field(default_factory=dict)

    def unreachable(self, name: str, reason: str) -> None:
        """`name` could not be reached: out of the candidates until its metrics answer again."""
        if self.datastore.is_healthy(name):
            log.warning("%s is unreachable (%s): a candidate again once its metrics answer", name, reason)
        self.datastore.set_healthy(name, False)

    def answered(self, name: str, status: int) -> None:
        """A response's status: a gateway failure (502, 503, 504) counts towards ejection, anything
        else resets the count."""
        if not self.policy.counts_statuses:
            return
        if status in GATEWAY_FAILURES:
            self.failed(name, f"answered {status}")
        else:
            self.succeeded(name)

    def succeeded(self, name: str) -> None:
        record = self._records.get(name)
        if record is None:
            return
        record.failures = 0
        if record.ejections:
            now = self.clock()
            clean = int((now - record.clean_since) // self.policy.base_ejection_s)
            if clean > 0:
                record.ejections = max(0, record.ejections - clean)
                record.clean_since = now
        if not record.failures and not record.ejections:
            del self._records[name]

    def failed(self, name: str, reason: str) -> None:
        if not self.policy.counts_statuses:
            return  # outlier detection is off
        record = self._records.setdefault(name, _Record())
        record.failures += 1
        if record.failures < self.policy.consecutive_failures:
            return
        if not self._may_eject():
            log.warning("%s failed %d times in a row (%s), but the ejection limit is reached", name,
                        record.failures, reason)  # fmt: skip
            return
        record.failures = 0
        record.ejections += 1
        seconds = min(self.policy.base_ejection_s * record.ejections, self.policy.max_ejection_s)
        now = self.clock()
        record.clean_since = now + seconds
        self.datastore.eject(name, now + seconds)
        log.warning("%s ejected for %gs: %d failures in a row, the last %s", name, seconds,
                    self.policy.consecutive_failures, reason)  # fmt: skip

    def _may_eject(self) -> bool:
        total = len(self.datastore)
        ejected = self.datastore.ejected_count()
        return ejected < max(1, math.floor(total * self.policy.max_ejection_percent / 100))
