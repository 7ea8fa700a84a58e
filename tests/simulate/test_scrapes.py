"""The scrapes a router would have made of each simulated server: every interval, or quietly."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epick.simulate.fleet import Poisson
from epick.simulate.records import RequestRecord
from epick.simulate.scrapes import scrapes_per_server_s
from epick.simulate.sweep.cell import Cell, FleetSpec, PolicySpec, WorkloadSpec, run_cell


def request(server: int, arrival: float, finish: float, prefill: int | None = None) -> RequestRecord:
    return RequestRecord(f"r{arrival}", server, prefill, arrival, first_token=arrival + 0.1, finish=finish)


def test_without_quiet_scraping_every_tick_is_a_scrape() -> None:
    # ticks at 0, 1, ..., 19 (interval 1 s, a 19.5 s run): 20 scrapes each
    assert scrapes_per_server_s([request(0, 1, 2)], 2, 19.5, 1.0, 0.0) == pytest.approx(20 / 19.5)
    assert scrapes_per_server_s([], 2, 19.5, 0.0, 3.0) is None  # scraped before every decision


def test_an_idle_server_is_scraped_every_idle_interval_and_each_tick_while_busy() -> None:
    # interval 1 s, D = 3 s, ticks 0..19. One request from 4.5 s to 7.2 s:
    # idle 0 and 3; busy 5, 6, 7; the first tick after it, 8 (reads the idle engine); idle 11, 14, 17.
    rate = scrapes_per_server_s([request(0, 4.5, 7.2)], 1, 19.5, 1.0, 3.0)
    assert rate == pytest.approx(9 / 19.5)
    # A request between two ticks (4.2 to 4.6 s) is seen by the next tick only: 0, 3, 5, 8, 11, 14, 17.
    assert scrapes_per_server_s([request(0, 4.2, 4.6)], 1, 19.5, 1.0, 3.0) == pytest.approx(7 / 19.5)
    # Never idle: every tick.
    assert scrapes_per_server_s([request(0, 0, 30)], 1, 19.5, 1.0, 3.0) == pytest.approx(20 / 19.5)


def test_overlapping_requests_and_a_prefill_server_count_as_busy() -> None:
    records = [request(0, 4.5, 6.0), request(0, 5.5, 7.2), request(1, 4.5, 7.2, prefill=0)]
    # server 0: as one request from 4.5 to 7.2 (9 scrapes); server 1: the same
    assert scrapes_per_server_s(records, 2, 19.5, 1.0, 3.0) == pytest.approx(9 / 19.5)


@given(
    st.lists(st.tuples(st.floats(0, 50), st.floats(0, 5)), max_size=30),
    st.sampled_from([0.05, 0.2, 1.0]),
    st.sampled_from([0.05, 0.5, 2.0, 10.0]),
)
def test_quiet_scraping_never_scrapes_more_than_every_tick_nor_less_than_every_idle_interval(
    spans: list[tuple[float, float]], interval: float, idle: float
) -> None:
    records = [request(0, start, start + length) for start, length in spans]
    makespan = 60.0
    every_tick = scrapes_per_server_s(records, 1, makespan, interval, 0.0)
    quiet = scrapes_per_server_s(records, 1, makespan, interval, idle)
    assert every_tick is not None and quiet is not None
    assert quiet <= every_tick + 1e-9
    ticks = math.floor(makespan / interval) + 1
    every = max(1, math.ceil(idle / interval - 1e-9))
    assert quiet * makespan >= math.ceil(ticks / every) - 1e-9


def test_a_run_at_a_low_rate_is_scraped_less_than_half_as_often_quietly() -> None:
    """(What the policy sees does not change: every request goes through the router, so a quiet
    server's engine is idle, as its last scrape said; the count is made from the run's records.)"""
    workload = WorkloadSpec("shared-prefix", (("groups", 4), ("prompts-per-group", 8), ("output-tokens", 8)))
    loud = Cell(PolicySpec("default"), workload, Poisson(2.0), 0, FleetSpec(servers=4))
    quiet = dataclasses.replace(loud, fleet=FleetSpec(servers=4, idle_scrape_interval=1.0))
    every, rare = run_cell(loud).run, run_cell(quiet).run
    assert every["scrapes_per_server_s"] == pytest.approx(20.0, rel=0.05)
    assert 1.0 <= rare["scrapes_per_server_s"] < every["scrapes_per_server_s"] / 2
