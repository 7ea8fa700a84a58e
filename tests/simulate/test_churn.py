"""Pod churn in the fleet simulator: servers restart, their requests fail and their caches are lost;
a restart with a downtime takes the server out of the pool (the policy hears it), one without is
unnoticed but for the KV events of the restarted engine."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from epick.cli.main import main
from epick.config import load_config_file, load_config_text, load_default_config
from epick.sim import engine as engine_events
from epick.sim.engine import CostModel, EngineConfig
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Fleet, FleetResult, Poisson
from epick.simulate.policies.least_request import LeastRequest
from epick.simulate.policies.sglang_cache_aware import SGLangCacheAware
from epick.simulate.types import Churn, ServerView, SimRequestSpec
from epick.simulate.workloads import build_workload

from .test_fleet import CONFIGS, shared_prefix
from .test_precise_sim import PRECISE

ENGINE = EngineConfig(num_gpu_blocks=2000, cost=CostModel())


def workload(groups: int = 6, per_group: int = 20) -> list[SimRequestSpec]:
    params = {
        "groups": str(groups),
        "prompts-per-group": str(per_group),
        "system-tokens": "800",
        "question-tokens": "64",
        "output-tokens": "64",
    }
    return list(build_workload("shared-prefix", params).requests(random.Random(3)))


class Recording(LeastRequest):
    """Least-request routing that records what it was offered and what it heard."""

    def __init__(self) -> None:
        super().__init__(random.Random(1))
        self.offered: list[tuple[float, frozenset[int]]] = []
        self.heard: list[tuple[str, int, float]] = []

    def route(self, request: SimRequestSpec, servers: Sequence[ServerView], now: float) -> int:
        self.offered.append((now, frozenset(s.index for s in servers)))
        return super().route(request, servers, now)

    def server_left(self, server: int, now: float) -> None:
        self.heard.append(("left", server, now))

    def server_joined(self, server: int, now: float) -> None:
        self.heard.append(("joined", server, now))


def failed_by(result: FleetResult) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in result.records:
        if r.failed is not None:
            counts[r.failed] = counts.get(r.failed, 0) + 1
    return counts


def test_servers_restart_in_turn_and_leave_the_pool_for_the_downtime() -> None:
    policy = Recording()
    fleet = Fleet(4, ENGINE, policy, churn=Churn(interval=1.0, downtime=0.5))
    result = fleet.run(workload(), Poisson(40.0), random.Random(2))
    assert result.restarts >= 3
    left = [(server, at) for kind, server, at in policy.heard if kind == "left"]
    joined = [(server, at) for kind, server, at in policy.heard if kind == "joined"]
    assert left[:3] == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert joined[:3] == [(0, 1.5), (1, 2.5), (2, 3.5)]
    for at, offered in policy.offered:
        down = {server for server, t in left if t <= at < t + 0.5}
        assert offered == frozenset(range(4)) - down, f"at {at}: offered {sorted(offered)}"
    # Each restart failed the requests its server held, and only those.
    reasons = failed_by(result)
    assert set(reasons) <= {f"server s{i} restarted" for i in range(4)} and reasons
    for r in result.records:
        if r.failed is not None:
            assert r.failed == f"server s{r.server} restarted"
            assert r.finish in {float(t) for _, t in left}
    assert all(v.in_flight == 0 for v in fleet.views)
    assert len(result.records) == 120


def test_restarts_stop_with_the_run_and_do_not_stretch_it() -> None:
    specs = workload(2, 5)
    calm = Fleet(2, ENGINE, LeastRequest(random.Random(1))).run(specs, Poisson(20.0), random.Random(2))
    churned = Fleet(2, ENGINE, LeastRequest(random.Random(1)), churn=Churn(interval=1e6, downtime=1e6))
    result = churned.run(specs, Poisson(20.0), random.Random(2))
    assert result.restarts == 0  # the run ended long before the first restart
    assert result.makespan == calm.makespan
    assert [r.finish for r in result.records] == [r.finish for r in calm.records]


def test_a_restarted_server_loses_its_cache_and_its_counters_are_kept() -> None:
    specs = list(shared_prefix(80, groups=1))  # one shared prefix: every later request hits it
    calm = Fleet(1, ENGINE, LeastRequest(random.Random(1))).run(specs, Poisson(10.0), random.Random(2))
    fleet = Fleet(1, ENGINE, LeastRequest(random.Random(1)), churn=Churn(interval=2.0))
    result = fleet.run(specs, Poisson(10.0), random.Random(2))
    assert result.restarts >= 2
    # Every restart recomputes the prefix once more; the lookups of replaced engines still count.
    assert result.prefix_queries > fleet.engines[0].scheduler.prefix_queries
    assert result.prefix_hits < calm.prefix_hits
    assert sum(result.busy_time) > fleet.engines[0].busy_time


def test_a_fleet_of_one_refuses_requests_while_its_server_is_down() -> None:
    fleet = Fleet(1, ENGINE, LeastRequest(random.Random(1)), churn=Churn(interval=1.0, downtime=0.8))
    result = fleet.run(workload(2, 20), Poisson(20.0), random.Random(2))
    reasons = failed_by(result)
    assert reasons.get("no server is up", 0) > 0
    for r in result.records:
        if r.failed == "no server is up":
            assert any(k <= r.arrival < k + 0.8 for k in range(1, 10)), r.arrival


def test_the_epick_policy_forgets_a_server_that_leaves_the_pool() -> None:
    policy = EpickPolicy("default", load_default_config(seed=1))
    scorer = policy.config.plugins["prefix-cache-scorer"]
    index = scorer.index  # type: ignore[attr-defined]
    fleet = Fleet(3, ENGINE, policy)
    fleet.run(workload(3, 10), Poisson(20.0), random.Random(2))
    assert "s1" in index.endpoints()
    policy.server_left(1, fleet._now)
    assert "s1" not in index.endpoints() and index.endpoints()


def test_a_precise_index_drops_a_server_that_leaves_and_ignores_its_late_events() -> None:
    policy = EpickPolicy("precise", load_config_text(PRECISE, seed=1))
    producer = policy.config.plugins["precise-prefix-cache-producer"]
    fleet = Fleet(3, ENGINE, policy, kv_event_delay=0.2, churn=Churn(interval=1.5, downtime=1.0))
    left: list[tuple[int, float, dict[str, int]]] = []
    heard_left = policy.server_left

    def spy(server: int, now: float) -> None:
        heard_left(server, now)
        left.append((server, now, producer.index.blocks_by_pod()))  # type: ignore[attr-defined]

    policy.server_left = spy  # type: ignore[method-assign]
    delivered: list[tuple[int, float]] = []
    hear = policy.kv_events

    def record(server: int, events: Sequence[object], now: float, adapters: dict[int, str]) -> None:
        delivered.append((server, now))
        hear(server, events, now, adapters)

    policy.kv_events = record  # type: ignore[method-assign]
    result = fleet.run(workload(), Poisson(40.0), random.Random(2))
    assert result.restarts >= 2 and left
    for server, at, blocks in left:
        assert f"s{server}:0" not in blocks, "its blocks left the index with it"
        # What its old engine published in its last 0.2 s never reached the index.
        assert not [t for s, t in delivered if s == server and at < t < at + 0.2]


def test_an_unnoticed_restart_clears_the_precise_index_at_the_new_engines_first_event() -> None:
    policy = EpickPolicy("precise", load_config_text(PRECISE, seed=1))
    batches: list[tuple[int, float, list[object]]] = []
    hear = policy.kv_events

    def record(server: int, events: Sequence[object], now: float, adapters: dict[int, str]) -> None:
        batches.append((server, now, list(events)))
        hear(server, events, now, adapters)

    policy.kv_events = record  # type: ignore[method-assign]
    recorder = Recording()
    fleet = Fleet(2, ENGINE, policy, churn=Churn(interval=1.0))
    result = fleet.run(workload(4, 15), Poisson(30.0), random.Random(2))
    assert result.restarts >= 1
    clears = [
        (s, t, events)
        for s, t, events in batches
        if any(isinstance(e, engine_events.AllBlocksCleared) for e in events)
    ]
    assert [s for s, _, _ in clears][:2] == [0, 1]
    for _, at, events in clears:
        assert isinstance(events[0], engine_events.AllBlocksCleared)  # first, before its new blocks
        assert at > 1.0
    # Unnoticed: the servers never left the pool.
    unnoticed = Fleet(2, ENGINE, recorder, churn=Churn(interval=1.0))
    unnoticed.run(workload(4, 15), Poisson(30.0), random.Random(2))
    assert not recorder.heard and all(o == frozenset({0, 1}) for _, o in recorder.offered)


def test_disaggregated_requests_fail_cleanly_when_either_of_their_servers_restarts() -> None:
    rng = random.Random(4)
    specs = []
    for i in range(80):
        tokens = tuple(rng.randrange(32000) for _ in range(600))
        specs.append(SimRequestSpec(f"r{i}", None, tokens, 30))
    policy = EpickPolicy("pd", load_config_file(CONFIGS / "pd.yaml", seed=2))
    churn = Churn(interval=0.3, downtime=0.1)
    fleet = Fleet(4, ENGINE, policy, roles=["prefill", "prefill", "decode", "decode"], churn=churn)
    result = fleet.run(specs, Poisson(60.0), random.Random(2))
    assert result.restarts >= 4 and len(result.records) == 80
    failed = [r for r in result.records if r.failed is not None]
    assert failed and all(r.failed.endswith("restarted") for r in failed)
    assert any(
        r.prefill_server is not None and r.failed == f"server s{r.prefill_server} restarted" for r in failed
    )
    assert all(v.in_flight == 0 for v in fleet.views)


def test_sglangs_tree_forgets_a_removed_worker() -> None:
    policy = SGLangCacheAware(random.Random(1))
    policy.insert("the shared system prompt, then question one", 0)
    policy.insert("the shared system prompt, then question two", 1)
    policy.insert("something else entirely", 1)
    policy.server_left(1, 0.0)
    assert policy.tree_chars(1) == 0
    assert policy.match_chars("the shared system prompt, then question two", 1) == 0
    assert policy.match_chars("the shared system prompt, then question one", 0) == 43
    assert policy.tree_chars(0) == 43
    root = policy._root
    assert set(root.children) == {"t"}  # "something else entirely" had no other holder: gone
    policy.insert("the shared system prompt, then question two", 1)
    assert policy.match_chars("the shared system prompt, then question two", 1) == 43


@pytest.mark.parametrize(("interval", "downtime"), [(0.0, 0.0), (-1.0, 0.0), (1.0, -0.5)])
def test_bad_churn_is_refused(interval: float, downtime: float) -> None:
    with pytest.raises(ValueError, match="restart"):
        Churn(interval, downtime)


def test_the_cli_needs_an_interval_for_a_downtime(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--policy", "random", "--restart-downtime", "5"]) == 2
    assert "--restart-downtime needs --restart-every" in capsys.readouterr().err


def test_the_cli_reports_restarts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.json"
    argv = [
        "simulate", "--policy", "least-request", "--servers", "2", "--workload", "shared-prefix",
        "--param", "groups=2", "--param", "prompts-per-group=20", "--qps", "20",
        "--restart-every", "0.5", "--restart-downtime", "0.2", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    (summary,) = json.loads(out.read_text())["runs"]
    assert summary["restarts"] >= 1
    assert "restarted" in capsys.readouterr().out
