"""Cells run in worker processes give what they give run one after another in this process, in the
cells' order; a cell's error reaches the caller."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from epick.cli.simulate_policies import CONFIG_POLICIES
from epick.simulate.fleet import ClosedLoop, Poisson
from epick.simulate.sweep.cell import Cell, FleetSpec, PolicySpec, WorkloadSpec, run_cell
from epick.simulate.sweep.runner import run_local
from epick.simulate.workloads import WorkloadError

SMALL = WorkloadSpec(
    "shared-prefix",
    (("groups", 4), ("prompts-per-group", 6), ("system-tokens", 300), ("output-tokens", 8)),
)
POLICIES = [
    PolicySpec("default"),
    PolicySpec("round-robin", CONFIG_POLICIES["round-robin"], "round-robin"),
    PolicySpec("precise-prefix", CONFIG_POLICIES["precise-prefix"], "precise-prefix"),  # hears KV events
    PolicySpec("sglang-cache-aware", baseline="sglang-cache-aware"),
]


def cells() -> list[Cell]:
    out = [
        Cell(policy, SMALL, arrivals, seed, FleetSpec(servers=3))
        for arrivals in (Poisson(5.0), Poisson(40.0))
        for policy in POLICIES
        for seed in (0, 1)
    ]
    # Churn, P/D roles, a closed loop and a capped workload take other paths through the fleet.
    churn = FleetSpec(servers=3, restart_every=0.5, restart_downtime=0.2)
    out.append(Cell(POLICIES[0], SMALL, Poisson(20.0), 3, churn))
    pd = PolicySpec("pd", Path("config/pd.yaml").read_text(), "config/pd.yaml")
    out.append(Cell(pd, SMALL, ClosedLoop(4), 0, FleetSpec(servers=4, prefill_servers=1), requests=10))
    return out


def test_a_cell_survives_pickling() -> None:
    for cell in cells():
        assert pickle.loads(pickle.dumps(cell)) == cell


def test_workers_give_what_a_serial_run_gives_cell_for_cell() -> None:
    todo = cells()
    serial = run_local(todo, jobs=1)
    seen: list[int] = []
    parallel = run_local(todo, jobs=2, on_done=lambda i, outcome: seen.append(i))
    assert sorted(seen) == list(range(len(todo)))
    # Byte for byte, as the JSON is written; the wall time and memory are apart from the run.
    assert [json.dumps(o.run) for o in parallel] == [json.dumps(o.run) for o in serial]
    assert [(o.run["policy"], o.run["qps"], o.run["seed"]) for o in parallel] == [
        (c.policy.name, c.arrivals.qps if isinstance(c.arrivals, Poisson) else 4.0, c.seed) for c in todo
    ]
    assert parallel[-2].run["restarts"] > 0 and parallel[-1].run["completed"] == 10
    assert all(o.max_rss_bytes > 10 * 2**20 and o.wall_s > 0 for o in parallel)


def test_a_cell_that_fails_in_a_worker_stops_the_sweep_with_its_error(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival": 0.1, "prompt": "a b", "output_tokens": 2}\n{"arrival": 0.2}\n')
    bad = WorkloadSpec("trace", (("path", str(trace)),))
    todo = [
        Cell(POLICIES[0], SMALL, Poisson(5.0), 0, FleetSpec(servers=2)),
        Cell(POLICIES[0], bad, Poisson(5.0), 0),
    ]
    with pytest.raises(WorkloadError, match=r"trace.jsonl:2: field 'output_tokens': missing"):
        run_local(todo, jobs=2)


def test_a_cell_runs_the_same_whatever_ran_before_it_in_the_process() -> None:
    first, second = cells()[0], cells()[9]
    alone = run_cell(second).run
    run_cell(first)
    assert run_cell(second).run == alone


def test_a_workers_memory_is_its_largest_cells_not_the_sum_of_its_cells() -> None:
    """Eight cells of 1,024 requests on two workers: each worker's peak after its fourth cell is its
    peak after its first (a run's leftovers used to add about 16 MiB a cell until the collector ran)."""
    default = WorkloadSpec("shared-prefix")
    todo = [Cell(POLICIES[0], default, Poisson(10.0), seed, FleetSpec()) for seed in range(8)]
    peaks = sorted(o.max_rss_bytes for o in run_local(todo, jobs=2))
    assert peaks[-1] - peaks[0] < 8 * 2**20
