"""How often a router's scrapers would have polled each server over a run: every interval, or quietly.

The service scrapes each endpoint every `--refresh-metrics-interval`; with quiet scraping
(`--idle-scrape-interval D`, epick.datalayer.scraper) it skips a tick while the endpoint's last scrape
read an idle engine and nothing was sent to it since, scraping it again at least every D. In the fleet
every request goes through the router, so a server's engine is idle exactly between its requests:
quiet scraping changes nothing the policy sees here, only how often the servers are asked. This counts
those scrapes from the run's records, per server:

- a tick while the server has a request (from its arrival to its finish; on a prefill server, to its
  first token) is a scrape, and so is the first tick after the last one ends (it reads the idle engine);
- between its requests, a scrape every D (the first tick at least D after the last scrape), and the
  first tick after a new request arrives.

The requests flow control holds count from their arrival (an upper bound on the scrapes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from epick.simulate.records import RequestRecord


def scrapes_per_server_s(
    records: Iterable[RequestRecord], servers: int, makespan: float, interval: float, idle_interval: float
) -> float | None:
    """Scrapes per server per second of the run; None when scrapes follow decisions (`interval` 0)."""
    if interval <= 0 or servers <= 0 or makespan <= 0:
        return None
    ticks = math.floor(makespan / interval) + 1  # at 0, interval, 2·interval, … up to the run's end
    if idle_interval <= 0:
        return ticks / makespan
    busy: list[list[tuple[float, float]]] = [[] for _ in range(servers)]
    for r in records:
        end = r.finish if r.finish is not None else makespan
        if 0 <= r.server < servers:
            busy[r.server].append((r.arrival, end))
        if r.prefill_server is not None and 0 <= r.prefill_server < servers:
            busy[r.prefill_server].append((r.arrival, r.first_token if r.first_token is not None else end))
    every = max(1, math.ceil(idle_interval / interval - 1e-9))  # ticks between an idle server's scrapes
    total = sum(_quiet_scrapes(periods, ticks, interval, every) for periods in busy)
    return total / servers / makespan


def _quiet_scrapes(periods: list[tuple[float, float]], ticks: int, interval: float, every: int) -> int:
    """One server's scrapes over `ticks` ticks, given the (start, end) of each of its requests."""
    count = 0
    gap_from = 0  # the first tick of the current idle gap: a scrape that reads the idle engine
    for start, end in _merged(periods):
        first_busy = min(ticks, math.ceil(start / interval - 1e-9))
        after = min(ticks, math.ceil(end / interval - 1e-9))  # the first tick once it is idle again
        if first_busy > gap_from:
            count += math.ceil((first_busy - gap_from) / every)  # idle: one scrape every `every` ticks
        busy_from = max(first_busy, gap_from)
        count += max(0, after - busy_from)
        gap_from = max(gap_from, after)
    if ticks > gap_from:
        count += math.ceil((ticks - gap_from) / every)
    return count


def _merged(periods: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping (start, end) periods joined, in order."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(periods):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
