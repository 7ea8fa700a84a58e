"""Load-following workers: the decision from CPU samples, the CPU read from /proc, and the counts a
retired worker leaves behind on the merged /metrics page."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from epick.service.settings import Settings, SettingsError, WorkerScaling
from epick.service.workers.merge import carried_page
from epick.service.workers.scaling import ScalingDecision, cpu_seconds, measurable

POLICY = WorkerScaling(up_cpu=0.6, down_cpu=0.25, sample_s=1.0, up_samples=2, down_samples=3, settle_s=5.0)


def test_one_more_worker_after_two_busy_samples_in_a_row() -> None:
    decision = ScalingDecision(POLICY, least=1, most=3)
    assert decision.sample(1, 0.7, 1.0, now=0) == 0  # one busy sample is not enough
    assert decision.sample(1, 0.3, 1.0, now=1) == 0  # and a quiet one starts the count again
    assert decision.sample(1, 0.7, 1.0, now=2) == 0
    assert decision.sample(1, 0.65, 1.0, now=3) == +1


def test_busy_is_the_average_over_the_running_workers() -> None:
    decision = ScalingDecision(POLICY, least=1, most=3)
    for t in range(5):  # 1.1 cores over two workers: 0.55 each, under the threshold
        assert decision.sample(2, 1.1, 1.0, now=t) == 0
    assert [decision.sample(2, 1.3, 1.0, now=t) for t in range(5, 7)] == [0, +1]


def test_never_beyond_the_most_or_below_the_least() -> None:
    decision = ScalingDecision(POLICY, least=2, most=3)
    assert all(decision.sample(3, 3.0, 1.0, now=t) == 0 for t in range(10))
    assert all(decision.sample(2, 0.0, 1.0, now=t) == 0 for t in range(10, 50))


def test_the_last_worker_retires_once_the_others_could_carry_the_load() -> None:
    decision = ScalingDecision(POLICY, least=1, most=3)
    # 0.3 cores over two workers: one would carry it at 0.3, above down_cpu (0.25): both stay
    assert all(decision.sample(2, 0.3, 1.0, now=t) == 0 for t in range(10))
    assert [decision.sample(2, 0.2, 1.0, now=t) for t in range(10, 13)] == [0, 0, -1]


def test_nothing_moves_while_a_change_settles() -> None:
    decision = ScalingDecision(POLICY, least=1, most=3)
    assert [decision.sample(1, 0.9, 1.0, now=t) for t in (0, 1)] == [0, +1]
    # two busy samples in a row, but within settle_s of the last change
    assert [decision.sample(2, 1.8, 1.0, now=t) for t in (2, 3, 4, 5)] == [0, 0, 0, 0]
    assert decision.sample(2, 1.8, 1.0, now=6) == +1


def test_no_worker_starts_while_none_could_and_the_count_restarts_after_a_skipped_sample() -> None:
    decision = ScalingDecision(POLICY, least=1, most=2)
    # busy, but the worker that retired last is still draining: no start, and the streak is not kept
    assert [decision.sample(1, 0.9, 1.0, now=t, room=False) for t in (0, 1, 2)] == [0, 0, 0]
    assert decision.sample(1, 0.9, 1.0, now=3) == 0  # one busy sample with room: not two yet
    decision.restart()  # a sample skipped (a worker starting)
    assert [decision.sample(1, 0.9, 1.0, now=t) for t in (4, 5)] == [0, +1]


def test_a_started_worker_serving_settles_the_count_again() -> None:
    decision = ScalingDecision(POLICY, least=1, most=3)
    assert [decision.sample(1, 0.9, 1.0, now=t) for t in (0, 1)] == [0, +1]
    decision.settle(4.0)  # the started worker serves at 4 s: nothing moves before 9 s
    assert [decision.sample(2, 1.8, 1.0, now=t) for t in (6, 7, 8)] == [0, 0, 0]
    assert decision.sample(2, 1.8, 1.0, now=9) == +1


def test_a_sample_over_no_time_or_no_workers_decides_nothing() -> None:
    decision = ScalingDecision(POLICY, least=1, most=2)
    assert decision.sample(0, 5.0, 1.0, now=0) == 0
    assert decision.sample(1, 5.0, 0.0, now=1) == 0


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        (WorkerScaling(up_cpu=0.3, down_cpu=0.3), "must be below up_cpu"),
        (WorkerScaling(sample_s=0), "sample period must be positive"),
        (WorkerScaling(settle_s=-1), "settle time cannot be negative"),
        (WorkerScaling(up_samples=0), "at least 1"),
    ],
)
def test_thresholds_that_cannot_work_are_refused_by_name(policy: WorkerScaling, says: str) -> None:
    with pytest.raises(SettingsError, match=says):
        Settings(worker_scaling=policy).check()


def test_min_workers_above_workers_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"min-workers \(3\) is above workers \(2\)"):
        Settings(workers=2, min_workers=3).check()


def test_cpu_seconds_reads_utime_and_stime_after_a_name_with_spaces(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    fields = ["S", *["0"] * 10, "250", "150", *["0"] * 30]  # fields 3.. : state, ..., utime, stime
    (tmp_path / "42" / "stat").write_text("42 (a (weird) name) " + " ".join(fields))
    assert cpu_seconds(42, tmp_path) == pytest.approx(400 / os.sysconf("SC_CLK_TCK"))
    assert cpu_seconds(43, tmp_path) is None  # gone
    (tmp_path / "44").mkdir()
    (tmp_path / "44" / "stat").write_text("44 (short) S 1")
    assert cpu_seconds(44, tmp_path) is None
    assert not measurable(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")
def test_cpu_seconds_of_this_process_grow_with_work() -> None:
    before = cpu_seconds(os.getpid())
    assert before is not None
    total = 0
    while (cpu_seconds(os.getpid()) or 0) - before < 0.02:  # spin until the kernel counts 20 ms
        total += sum(range(1000))
    assert total > 0


WORKER_PAGE = """\
# HELP requests_total Requests
# TYPE requests_total counter
requests_total{model="m"} 7.0
requests_created{model="m"} 1.7e9
# HELP running Requests running
# TYPE running gauge
running 3.0
# HELP latency_seconds Latency
# TYPE latency_seconds histogram
latency_seconds_bucket{le="1.0"} 2.0
latency_seconds_bucket{le="+Inf"} 3.0
latency_seconds_count 3.0
latency_seconds_sum 4.5
"""


def test_a_retired_workers_counters_and_histograms_are_carried_and_its_gauges_dropped() -> None:
    once = carried_page(["", WORKER_PAGE])
    twice = carried_page([once, WORKER_PAGE])  # a second retirement adds to the first
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(twice)
        for s in family.samples
    }
    assert samples == {
        ("requests_total", (("model", "m"),)): 14.0,
        ("latency_seconds_bucket", (("le", "1.0"),)): 4.0,
        ("latency_seconds_bucket", (("le", "+Inf"),)): 6.0,
        ("latency_seconds_count", ()): 6.0,
        ("latency_seconds_sum", ()): 9.0,
    }


async def test_a_retiring_or_gone_workers_counts_are_never_lost_or_counted_twice() -> None:
    """The merged page: a retiring worker whose /metrics closed stands in with its last page; its
    last page, once it arrives, replaces it; one arriving while the pages are read is not counted
    twice; a worker that dies leaves its counts as last read; a page that is not one is skipped."""
    from collections.abc import Callable

    from aiohttp import web

    from epick.proxy.server import ProxyOptions
    from epick.service.workers import Supervisor

    def page(requests: int) -> str:
        return WORKER_PAGE.replace(
            'requests_total{model="m"} 7.0', f'requests_total{{model="m"}} {requests}.0'
        )

    settings = Settings(proxy=ProxyOptions(host="127.0.0.1", port=0), metrics_port=None)
    supervisor = Supervisor(settings, 2, least=1)
    served: dict[int, str] = {0: page(5), 1: page(3)}
    while_read: list[Callable[[], None]] = []  # what happens while worker 0's page is read

    def app(index: int) -> web.Application:
        async def metrics(request: web.Request) -> web.Response:
            if index == 0:
                for act in while_read:
                    act()
                while_read.clear()
            if index not in served:
                return web.Response(status=503, text="503: draining")
            return web.Response(text=served[index])

        application = web.Application()
        application.router.add_get("/metrics", metrics)
        return application

    class Link:
        def write(self, data: bytes) -> None:
            pass

    runners = []
    try:
        for worker in supervisor.workers:
            runner = web.AppRunner(app(worker.index))
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            worker.writer, worker.wanted, worker.ready = Link(), True, True  # type: ignore[assignment]
            worker.metrics_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        async def total() -> float:
            text = (await supervisor._metrics_page()).decode()
            families = text_string_to_metric_families(text)
            return sum(s.value for f in families for s in f.samples if s.name == "requests_total")

        assert await total() == 8
        # Worker 1 retires: its /metrics answers no page while it drains; its last page stands in.
        supervisor.workers[1].wanted = False
        del served[1]
        assert await total() == 8
        # Its last page (4 by then) arrives while worker 0's page is read: counted once.
        retired = supervisor.workers[1]
        while_read.append(lambda: supervisor._carry(retired, page(4)))
        assert await total() == 5 + 4
        retired.metrics_port = 0  # as the hub sets it with the last page
        assert await total() == 9
        # Worker 0 dies: what it counted as last read stays.
        supervisor._carry(supervisor.workers[0], supervisor.workers[0].last_page)
        supervisor.workers[0].metrics_port = 0
        assert await total() == 9
    finally:
        for runner in runners:
            await runner.cleanup()
