"""The fleet simulation's bookkeeping: determinism, conservation, arrivals, turns, failures."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import pytest

from epick.config import load_config_file, load_default_config
from epick.sim.engine import CostModel, EngineConfig
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import ClosedLoop, Fleet, FleetResult, Poisson
from epick.simulate.report import SLO, cov, percentile, summarize
from epick.simulate.types import ServerView, SimRequestSpec
from epick.simulate.vocab import text

CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "config"
ENGINE = EngineConfig(num_gpu_blocks=2000, cost=CostModel())


def shared_prefix(n: int, groups: int = 4, seed: int = 5) -> Iterator[SimRequestSpec]:
    rng = random.Random(seed)
    systems = [tuple(rng.randrange(32000) for _ in range(300)) for _ in range(groups)]
    for i in range(n):
        tokens = systems[rng.randrange(groups)] + tuple(rng.randrange(32000) for _ in range(20))
        yield SimRequestSpec(f"r{i}", text(tokens), tokens, 8)


class FirstServer:
    name = "first"
    reads_metrics = False

    def __init__(self) -> None:
        self.finished_ids: list[str] = []

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        return 0

    def finished(self, request: SimRequestSpec, server: int, now: float) -> None:
        self.finished_ids.append(request.request_id)


def run_default(seed: int, n: int = 60) -> FleetResult:
    fleet = Fleet(4, ENGINE, EpickPolicy("default", load_default_config(seed=seed)))
    return fleet.run(shared_prefix(n), Poisson(50.0), random.Random(seed))


def test_same_seed_same_run() -> None:
    a, b = run_default(1), run_default(1)
    assert [(r.server, r.arrival, r.first_token, r.finish) for r in a.records] == [
        (r.server, r.arrival, r.first_token, r.finish) for r in b.records
    ]
    c = run_default(2)
    assert [r.arrival for r in a.records] != [r.arrival for r in c.records]


def test_every_request_finishes_or_fails_and_is_reported_once() -> None:
    policy = FirstServer()
    specs = [*shared_prefix(30), SimRequestSpec("too-long", "x", tuple(range(200_000)), 5)]
    result = Fleet(2, ENGINE, policy).run(specs, Poisson(100.0), random.Random(0))
    assert len(result.records) == 31
    failed = [r for r in result.records if r.failed]
    assert [r.request_id for r in failed] == ["too-long"]
    done = [r for r in result.records if not r.failed]
    assert all(r.finish is not None and r.first_token is not None and r.output_tokens == 8 for r in done)
    assert sorted(policy.finished_ids) == sorted(r.request_id for r in result.records)
    assert result.requests_per_server == [31, 0]


class InFlightWatch(FirstServer):
    """Records the most requests in flight at once; alternates two servers as requests finish, or
    keeps to the first."""

    def __init__(self, alternate: bool) -> None:
        super().__init__()
        self.alternate = alternate
        self.max_in_flight = 0

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        self.max_in_flight = max(self.max_in_flight, sum(v.in_flight for v in servers) + 1)
        return len(self.finished_ids) % 2 if self.alternate else 0


def test_closed_loop_keeps_the_concurrency() -> None:
    policy = InFlightWatch(alternate=True)
    result = Fleet(2, ENGINE, policy).run(shared_prefix(40), ClosedLoop(5), random.Random(0))
    assert policy.max_in_flight == 5
    assert len([r for r in result.records if r.finish]) == 40


def test_a_later_turn_waits_for_the_earlier_one_and_its_think_time() -> None:
    first = SimRequestSpec("t1", "a b c", (1, 2, 3), 4, session="s")
    second = SimRequestSpec("t2", "a b c d e", (1, 2, 3, 4, 5), 4, session="s", after="t1", think_time=2.5)
    result = Fleet(1, ENGINE, FirstServer()).run([first, second], Poisson(1.0), random.Random(0))
    by_id = {r.request_id: r for r in result.records}
    assert by_id["t1"].finish is not None
    assert by_id["t2"].arrival == pytest.approx(by_id["t1"].finish + 2.5)


def sessions(count: int, turns: int, think: float) -> Iterator[SimRequestSpec]:
    """Sessions one after another, as the multi-turn workload yields them: turn 0 first."""
    for s in range(count):
        for t in range(turns):
            tokens = tuple(range(1, 10 * (t + 1)))
            after = f"s{s}-t{t - 1}" if t else None
            yield SimRequestSpec(f"s{s}-t{t}", "x", tokens, 3, session=f"s{s}", after=after, think_time=think)


@pytest.mark.parametrize("concurrency", [1, 2, 5])
def test_closed_loop_runs_every_turn_of_every_session(concurrency: int) -> None:
    """A later turn read after its earlier turn finished starts then (it used to wait forever)."""
    policy = InFlightWatch(alternate=False)
    result = Fleet(2, ENGINE, policy).run(sessions(6, 4, 0.5), ClosedLoop(concurrency), random.Random(0))
    assert [r.failed for r in result.records if r.failed] == []
    assert len(result.records) == 24
    assert policy.max_in_flight <= concurrency
    by_id = {r.request_id: r for r in result.records}
    for s in range(6):
        for t in range(1, 4):
            earlier, later = by_id[f"s{s}-t{t - 1}"], by_id[f"s{s}-t{t}"]
            assert earlier.finish is not None
            assert later.arrival == pytest.approx(earlier.finish + 0.5)
    if concurrency == 1:  # one session at a time: a session's turns run before the next session starts
        order = sorted(result.records, key=lambda r: r.arrival)
        assert [r.request_id for r in order] == [f"s{s}-t{t}" for s in range(6) for t in range(4)]


def test_poisson_runs_every_turn_of_sessions_read_late() -> None:
    result = Fleet(2, ENGINE, FirstServer()).run(sessions(5, 3, 0.2), Poisson(0.5), random.Random(0))
    assert [r for r in result.records if r.failed] == []
    assert len(result.records) == 15


def test_prefix_affinity_beats_round_robin_on_hits() -> None:
    default = run_default(3, n=80)
    rr = Fleet(4, ENGINE, EpickPolicy("rr", load_config_file(CONFIGS / "round-robin.yaml", seed=3))).run(
        shared_prefix(80), Poisson(50.0), random.Random(3)
    )
    # 4 groups over 4 servers: the default config keeps each group on one server (one miss each);
    # round-robin sends every group to every server (a miss per group per server).
    assert default.prefix_hits / default.prefix_queries > rr.prefix_hits / rr.prefix_queries


def test_summary_fields_and_arithmetic() -> None:
    result = run_default(4, n=40)
    s = summarize("default", 50.0, result, SLO(ttft_s=10, tpot_s=10))
    assert s["completed"] + s["failed"] == 40
    assert s["goodput"] == pytest.approx(s["requests_per_s"])  # generous SLO: every request is good
    assert set(s["ttft_s"]) == {"p50", "p90", "p99"} and set(s["tpot_s"]) == {"p50", "p99"}
    # nearest rank: of 1..10, p50 is the 5th, p90 the 9th, p99 the 10th
    assert [percentile([float(i) for i in range(1, 11)], q) for q in (50, 90, 99)] == [5.0, 9.0, 10.0]
    assert cov([1.0, 1.0, 1.0]) == 0.0 and cov([0.0, 2.0]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("arrivals", "disaggregated"),
    [(Poisson(30.0), False), (Poisson(300.0), False), (ClosedLoop(6), False), (Poisson(30.0), True)],
)
def test_cohort_engines_change_nothing_but_speed(arrivals: Poisson | ClosedLoop, disaggregated: bool) -> None:
    def run(stepped: bool) -> list[tuple[str, int, float, float | None, float | None, int]]:
        specs = [
            SimRequestSpec(s.request_id, s.text, s.tokens, 5 + i % 40)
            for i, s in enumerate(shared_prefix(60))
        ]
        if disaggregated:
            policy = EpickPolicy("pd", load_config_file(CONFIGS / "pd.yaml", seed=9))
        else:
            policy = EpickPolicy("default", load_default_config(seed=9))
        engine = EngineConfig(
            num_gpu_blocks=400, max_num_seqs=4, cost=CostModel()
        )  # tight: preemption, queues
        roles = ["prefill", "decode", "decode"] if disaggregated else None
        fleet = Fleet(3, engine, policy, stepped=stepped, roles=roles)
        result = fleet.run(specs, arrivals, random.Random(9))
        if disaggregated:
            assert any(r.prefill_server is not None for r in result.records)
        return [
            (r.request_id, r.server, r.arrival, r.first_token, r.finish, r.output_tokens)
            for r in sorted(result.records, key=lambda r: r.request_id)
        ]

    stepped, batched = run(True), run(False)
    assert [r[:2] for r in stepped] == [r[:2] for r in batched]
    for a, b in zip(stepped, batched, strict=True):
        assert a[2:] == pytest.approx(b[2:], rel=1e-9, abs=1e-9)


def test_disaggregated_requests_prefill_on_a_prefill_server_and_decode_on_a_decode_server() -> None:
    # config/pd.yaml disaggregates when more than 256 prompt tokens are not cached on the decode
    # server: 600-token prompts with nothing shared always are; 40-token prompts never.
    rng = random.Random(4)
    specs = []
    for i in range(40):
        tokens = tuple(rng.randrange(32000) for _ in range(600 if i % 2 else 40))
        specs.append(SimRequestSpec(f"r{i}", text(tokens), tokens, 6))
    policy = EpickPolicy("pd", load_config_file(CONFIGS / "pd.yaml", seed=2))
    fleet = Fleet(3, ENGINE, policy, roles=["prefill", "decode", "decode"])
    result = fleet.run(specs, Poisson(20.0), random.Random(2))
    by_id = {r.request_id: r for r in result.records}
    assert len(by_id) == 40 and all(r.failed is None and r.finish is not None for r in by_id.values())
    for i in range(40):
        r = by_id[f"r{i}"]
        assert r.server in (1, 2), "decode never runs on the prefill server"
        assert r.prefill_server == (0 if i % 2 else None)
        assert r.output_tokens == 6
    # The prefill server computed the long prompts (and one token each); the decode servers only
    # received them, which costs less than computing them.
    prefill, decode = fleet.engines[0], fleet.engines[1:]
    assert prefill.scheduler.prefix_queries == 20 * 600
    assert prefill.steps > 0 and all(e.steps > 0 for e in decode)
    long = [by_id[f"r{i}"] for i in range(1, 40, 2)]
    assert all(r.first_token is not None and r.first_token > r.arrival for r in long)
    assert all(v.in_flight == 0 for v in fleet.views)
    # Each server counts the requests it decoded or prefilled; balance is measured within a role.
    assert result.requests_per_server[0] == 20 and sum(result.requests_per_server[1:]) == 40
    assert result.roles == ["prefill", "decode", "decode"]
    summary = summarize("pd", 20.0, result, SLO(ttft_s=10, tpot_s=10))
    decode_counts = [float(n) for n in result.requests_per_server[1:]]
    assert summary["load_cov"] == pytest.approx(cov(decode_counts) * 2 / 3)  # the prefill group: 0


def test_a_request_that_fits_the_prefill_server_but_not_the_decode_server_fails_clearly() -> None:
    tokens = tuple(range(600))
    spec = SimRequestSpec("big", text(tokens), tokens, 2000)  # 600 + 2,000 tokens: 163 blocks of 16
    engine = EngineConfig(num_gpu_blocks=100, cost=CostModel())
    policy = EpickPolicy("pd", load_config_file(CONFIGS / "pd.yaml", seed=2))
    fleet = Fleet(2, engine, policy, roles=["prefill", "decode"])
    (record,) = fleet.run([spec], Poisson(5.0), random.Random(1)).records
    assert record.prefill_server == 0 and record.failed is not None and "KV blocks" in record.failed
    assert all(v.in_flight == 0 for v in fleet.views)


def test_policies_that_read_no_metrics_are_not_scraped_for() -> None:
    rr = EpickPolicy("rr", load_config_file(CONFIGS / "round-robin.yaml", seed=1))
    default = EpickPolicy("default", load_default_config(seed=1))
    assert not rr.reads_metrics and default.reads_metrics
    for policy, scraped in ((rr, False), (default, True)):
        fleet = Fleet(2, ENGINE, policy)
        fleet.run(shared_prefix(20), Poisson(50.0), random.Random(1))
        assert (fleet.views[0].epoch > 0) is scraped


@pytest.mark.parametrize("model", ["sim-model", "adapter-x"])
def test_the_exact_cache_view_sees_an_adapters_own_blocks(model: str) -> None:
    """cached_tokens hashes the prompt as the engine does, LoRA id included."""

    class Peek(FirstServer):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[int] = []

        def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
            self.seen.append(servers[0].cached_tokens(request))
            return 0

    tokens = tuple(range(1, 401))
    specs = [SimRequestSpec(f"r{i}", None, tokens, 2, model=model, arrival=float(i)) for i in range(3)]
    policy = Peek()
    Fleet(2, ENGINE, policy).run(specs, Poisson(1.0), random.Random(0))
    assert policy.seen == [0, 384, 384]  # 24 full blocks of 16 below the 400-token prompt
