"""One cell of a sweep: a policy, a workload, a load, a fleet and a seed, described as plain picklable
data that any process (a pool worker, a Ray worker on another machine) turns into a run.

A cell carries everything its run needs except the code: a config file's text rather than its path,
so a worker reads nothing from the caller's disk (a trace workload's file aside: it is read where the
cell runs). `run_cell` gives back the run's summary, as plain data, and apart from it what the run
cost: its wall time and the worker's peak memory, which differ from run to run and machine to machine
and so stay out of the summary.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import random
import resource
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from epick.config import load_config_text, load_default_config
from epick.sim.engine import EngineConfig
from epick.sim.engine.profiles import DEFAULT_PROFILE
from epick.sim.options import ServerOptions
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Arrivals, ClosedLoop, Fleet
from epick.simulate.report import SLO, summarize
from epick.simulate.scrapes import scrapes_per_server_s
from epick.simulate.types import Churn, Policy, SimRequestSpec
from epick.simulate.workloads import Trace, Workload, build_workload


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A policy to build in the worker: an EndpointPickerConfig's text (`config`; None: the default
    config), or a baseline policy by name (`baseline`, one of `epick.simulate.policies.POLICIES`)."""

    name: str
    config: str | None = None
    source: str = "<config>"  # where the config's text came from, for its error messages
    baseline: str | None = None

    def build(self, seed: int) -> Policy:
        if self.baseline is not None:
            from epick.simulate.policies import POLICIES

            return POLICIES[self.baseline](random.Random(seed))
        if self.config is None:
            return EpickPolicy(self.name, load_default_config(seed=seed))
        return EpickPolicy(self.name, load_config_text(self.config, source=self.source, seed=seed))


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A workload by kind and parameters (as `build_workload` takes them), and its name in the results."""

    kind: str
    params: tuple[tuple[str, str | int | float], ...] = ()
    label: str = ""

    def build(self) -> Workload:
        return build_workload(self.kind, dict(self.params))

    @property
    def name(self) -> str:
        return self.label or self.kind

    def shortfall(self, requests: int, flag: str = "--requests") -> str | None:
        """What to tell a user who asks for more requests than this workload makes (None when it makes
        enough, or its size is not known in advance): its size and the parameters that set it."""
        workload = self.build()
        size, params = workload.size, workload.size_parameters
        if size is None or requests <= size:
            return None
        product = " × ".join(f"{k} {v:,}" for k, v in params.items())
        names = " or ".join(params)
        return (
            f"{flag} {requests:,} is more than the {self.name} workload makes: {size:,} requests "
            f"({product}), so {size:,} run; raise {names} for more"
        )


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The servers and what every run on them shares: engines, roles, scrapes, churn and the SLO."""

    servers: int = 8
    prefill_servers: int = 0
    engine_profile: str = DEFAULT_PROFILE
    num_gpu_blocks: int | None = None
    max_num_seqs: int | None = None
    max_loras: int | None = None
    scrape_interval: float = 0.05
    idle_scrape_interval: float = 0.0  # quiet scraping's D (epick.simulate.scrapes); 0: off
    kv_event_delay: float = 0.0
    restart_every: float | None = None
    restart_downtime: float = 0.0
    slo_ttft: float = 2.0
    slo_tpot: float = 0.1

    def engine(self, workload: Workload) -> EngineConfig:
        engine = ServerOptions.engine_config(
            num_gpu_blocks=self.num_gpu_blocks,
            max_num_seqs=self.max_num_seqs,
            max_loras=self.max_loras,
            profile=self.engine_profile,
        )
        return dataclasses.replace(engine, cache_output_blocks=workload.reuses_outputs)

    @property
    def roles(self) -> list[str | None] | None:
        if not self.prefill_servers:
            return None
        roles: list[str | None] = ["prefill"] * self.prefill_servers
        return roles + ["decode"] * (self.servers - self.prefill_servers)

    @property
    def churn(self) -> Churn | None:
        if self.restart_every is None:
            return None
        return Churn(self.restart_every, self.restart_downtime)


@dataclass(frozen=True, slots=True)
class Cell:
    policy: PolicySpec
    workload: WorkloadSpec
    arrivals: Arrivals
    seed: int
    fleet: FleetSpec = FleetSpec()
    requests: int | None = None  # stop the workload after this many


@dataclass(frozen=True, slots=True)
class CellOutcome:
    run: dict[str, Any]  # the summary: the same for the same cell, wherever it runs
    wall_s: float
    max_rss_bytes: int  # the peak resident memory of the process that ran it, so far


class NoRequestsError(Exception):
    """A cell's workload gave no request."""


def level(arrivals: Arrivals, trace: bool) -> float | None:
    """A run's load for the table, the JSON and the plot: requests/s, concurrency, or None for a trace's
    own arrivals."""
    if isinstance(arrivals, ClosedLoop):
        return float(arrivals.concurrency)
    return None if trace else arrivals.qps


def run_cell(cell: Cell, progress: Callable[[], None] | None = None) -> CellOutcome:
    """The cell's run, summarized. `progress` is called after each request (in this process)."""
    started = time.perf_counter()
    run = _run(cell, progress)
    # A run leaves reference cycles (engines, policy, records) that the collector would reach only
    # after some more cells: collected now, a worker's memory is its largest cell's, not a sum.
    gc.collect()
    return CellOutcome(run, time.perf_counter() - started, max_rss_bytes())


def _run(cell: Cell, progress: Callable[[], None] | None) -> dict[str, Any]:
    workload = cell.workload.build()
    trace = isinstance(workload, Trace)
    specs: Iterable[SimRequestSpec] = workload.requests(random.Random(cell.seed))
    if cell.requests is not None:
        specs = itertools.islice(specs, cell.requests)
    setup = cell.fleet
    engine = setup.engine(workload)
    fleet = Fleet(
        setup.servers,
        engine,
        cell.policy.build(cell.seed),
        scrape_interval=setup.scrape_interval,
        output_plan=workload.output_plan,
        lora_ids={name: i + 1 for i, name in enumerate(workload.adapter_names)},
        progress=progress,
        roles=setup.roles,
        kv_event_delay=setup.kv_event_delay,
        churn=setup.churn,
    )
    result = fleet.run(specs, cell.arrivals, random.Random(cell.seed + 1))
    if not result.records:
        raise NoRequestsError(f"the {cell.workload.kind} workload has no requests")
    run = summarize(
        cell.policy.name, level(cell.arrivals, trace), result, SLO(setup.slo_ttft, setup.slo_tpot)
    )
    run["scrapes_per_server_s"] = scrapes_per_server_s(
        result.records, setup.servers, result.makespan, setup.scrape_interval, setup.idle_scrape_interval
    )
    run.update(
        load_kind="concurrency" if isinstance(cell.arrivals, ClosedLoop) else ("trace" if trace else "qps"),
        workload=cell.workload.name,
        servers=setup.servers,
        engine_profile=setup.engine_profile,
        num_gpu_blocks=engine.num_gpu_blocks,
        seed=cell.seed,
    )
    return run


def max_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports kilobytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
