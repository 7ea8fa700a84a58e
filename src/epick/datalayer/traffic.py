"""The requests this router has sent to each endpoint: how many are in flight, and when the last went.

The data layer's quiet scraping (`--idle-scrape-interval`, epick.datalayer.scraper) reads it: an
endpoint that this router has sent nothing since its last scrape, and that was idle then, has no new
state to report from this router's traffic. The request path reports each endpoint a request goes
to (its primary target and prefill endpoint; with the proxy, every target it tries) when it is
dispatched (`sent`) and when the request ends (`done`).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Traffic:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._in_flight: dict[str, int] = {}
        self._last_sent: dict[str, float] = {}

    def sent(self, endpoint: str) -> None:
        self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1
        self._last_sent[endpoint] = self.clock()

    def done(self, endpoint: str) -> None:
        left = self._in_flight.get(endpoint, 0) - 1
        if left > 0:
            self._in_flight[endpoint] = left
        else:
            self._in_flight.pop(endpoint, None)

    def in_flight(self, endpoint: str) -> int:
        return self._in_flight.get(endpoint, 0)

    def quiet_since(self, endpoint: str, moment: float) -> bool:
        """Whether nothing is in flight to `endpoint` and nothing was sent there after `moment`
        (this tracker's clock)."""
        return endpoint not in self._in_flight and self._last_sent.get(endpoint, -1.0) < moment

    def forget(self, endpoint: str) -> None:
        """The endpoint left the pool."""
        self._in_flight.pop(endpoint, None)
        self._last_sent.pop(endpoint, None)
