"""`epick simulate` sweep throughput: cells per minute with one worker and with every core, and the
ratio between them.

The cells are a small capacity grid on the shared-prefix workload (SGLang's prompt lengths, 128 groups
of 24 prompts: 3,072 requests, about a second of one core each) on 8 servers: policies × loads ×
seeds. The baseline is `--jobs 1` (the cells
one after another in this process); then the same cells on a pool of one worker per core
(`epick.simulate.sweep.runner.run_local`, as `--jobs N` runs them), the pool's start included. Both
runs must give the same figures, cell for cell; the benchmark checks it.
"""

from __future__ import annotations

import argparse
import json
import time

from rich.console import Console
from rich.table import Table

from epick.cli.simulate_policies import CONFIG_POLICIES
from epick.simulate.fleet import Poisson
from epick.simulate.sweep.cell import Cell, CellOutcome, FleetSpec, PolicySpec, WorkloadSpec
from epick.simulate.sweep.runner import available_cores, run_local

POLICIES = (
    PolicySpec("default"),
    PolicySpec("round-robin", CONFIG_POLICIES["round-robin"], "round-robin"),
    PolicySpec("sglang-cache-aware", baseline="sglang-cache-aware"),
)


def cells(quick: bool) -> list[Cell]:
    policies = POLICIES[:2] if quick else POLICIES
    loads = (20.0, 40.0) if quick else (10.0, 25.0, 40.0)
    seeds = range(2 if quick else 4)
    workload = WorkloadSpec("shared-prefix", (("groups", 128), ("prompts-per-group", 24)))
    return [
        Cell(p, workload, Poisson(q), s, FleetSpec(servers=8)) for q in loads for p in policies for s in seeds
    ]


def sweep(todo: list[Cell], jobs: int) -> tuple[float, list[CellOutcome]]:
    start = time.perf_counter()
    outcomes = run_local(todo, jobs)
    return time.perf_counter() - start, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    todo = cells(args.quick)
    cores = available_cores()
    table = Table(title=f"epick simulate sweep: {len(todo)} cells (shared-prefix, 3,072 requests, 8 servers)")
    for col in (
        "workers",
        "wall (s)",
        "cells/min",
        "ratio to 1 worker",
        "mean cell (s)",
        "peak worker RSS (MiB)",
    ):
        table.add_column(col, justify="right")
    base_wall, base = sweep(todo, 1)
    rows = [(1, base_wall, base)]
    if cores > 1:
        rows.append((cores, *sweep(todo, cores)))
    for workers, wall, outcomes in rows:
        table.add_row(
            str(workers),
            f"{wall:.1f}",
            f"{len(todo) / wall * 60:,.0f}",
            f"{base_wall / wall:.2f}",
            f"{sum(o.wall_s for o in outcomes) / len(outcomes):.2f}",
            f"{max(o.max_rss_bytes for o in outcomes) / 2**20:,.0f}",
        )
        if [json.dumps(o.run) for o in outcomes] != [json.dumps(o.run) for o in base]:
            raise SystemExit(f"{workers} workers gave other figures than one: a bug")
    Console().print(table)
    Console().print(
        f"{cores} cores available; the figures of every cell are the same with 1 and {cores} workers"
    )


if __name__ == "__main__":  # the workers import this module's caller: guarded, as multiprocessing asks
    main()
