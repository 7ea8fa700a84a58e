"""`epick simulate`: routing policies and epick configs side by side on a simulated fleet, in virtual time."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from epick.cli.simulate_policies import CONFIG_POLICIES, UsageError, policy_factories, policy_names
from epick.cli.simulate_report import finite, print_table
from epick.config import ConfigError
from epick.plugins.duration import parse_duration
from epick.sim.engine.profiles import DEFAULT_PROFILE, PROFILES
from epick.simulate.fleet import Arrivals, ClosedLoop, Poisson
from epick.simulate.sweep import aggregate, show
from epick.simulate.sweep.cell import Cell, CellOutcome, FleetSpec, NoRequestsError, PolicySpec, WorkloadSpec
from epick.simulate.sweep.figures import DEFAULT_METRIC, FIGURES
from epick.simulate.sweep.grid import Grid, GridError, load_grid
from epick.simulate.sweep.plot import plot
from epick.simulate.sweep.ray_runner import RayMissingError, RayUnreachableError, run_on_ray
from epick.simulate.sweep.runner import WorkerDiedError, available_cores, run_local
from epick.simulate.workloads import WORKLOADS, Trace, WorkloadError


def _number(kind: Callable[[str], float], minimum: float, what: str) -> Callable[[str], Any]:
    """An argparse type: a finite number of `kind` at least `minimum` (a usage error otherwise)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


positive_int = _number(int, 1, "a positive integer")
non_negative_int = _number(int, 0, "an integer of 0 or more")
positive_float = _number(float, math.ulp(0.0), "a positive number")


def _rates(text: str) -> list[float]:
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give rates separated by commas, e.g. 5,10,20")
    return [positive_float(x) for x in parts]


def _interval(text: str) -> float:
    """A duration ('50ms', '2s') or a number of seconds; 0 scrapes before every decision."""
    try:
        seconds = parse_duration(float(text) if _is_number(text) else text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite duration")
    return seconds


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _InOrder(argparse.Action):
    """--policy and --config, kept in one list (`policies`) in the order given: (kind, value)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = (option_string or "--policy").removeprefix("--")
        setattr(namespace, self.dest, [*getattr(namespace, self.dest), (kind, values)])  # a new list


def parse_params(values: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--param {item!r}: expected NAME=VALUE")
        if key in params:
            raise UsageError(f"--param {key} is given twice ({params[key]!r} and {value.strip()!r})")
        params[key] = value.strip()
    return params


def loads(args: argparse.Namespace) -> list[Arrivals]:
    if args.concurrency is not None:
        return [ClosedLoop(args.concurrency)]
    if args.qps_sweep:
        return [Poisson(x) for x in args.qps_sweep]
    return [Poisson(args.qps if args.qps is not None else DEFAULT_QPS)]


DEFAULT_QPS = 10.0


def _check_output(path: str | None, flag: str, suffix: str | None = None) -> None:
    """Refuse an output path that cannot be written before the run, not after: it is opened for
    writing (and removed again if it did not exist)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; give a file name")
    if suffix is not None and target.suffix.lower() != suffix:
        raise UsageError(f"{flag} {path}: the plot is a PNG; give a file name ending in {suffix}")
    existed = target.exists()
    try:
        with target.open("a"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write it: {e.strerror or e}") from None
    if not existed:
        target.unlink()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="compare routing policies on a simulated fleet, in virtual time")
    _policy_flags(p)
    _workload_flags(p)
    _fleet_flags(p)
    _sweep_flags(p)
    p.set_defaults(func=run)


def _policy_flags(p: argparse.ArgumentParser) -> None:
    """The policies compared: named ones and config files, in the order given."""
    p.add_argument(
        "--policy",
        dest="policies",
        metavar="NAME",
        action=_InOrder,
        default=[],
        help=f"a named policy: {', '.join(policy_names())} (repeatable; rows keep the order given)",
    )
    p.add_argument(
        "--config",
        dest="policies",
        metavar="FILE",
        action=_InOrder,
        help="an EndpointPickerConfig file to run as a policy (repeatable)",
    )


def _workload_flags(p: argparse.ArgumentParser) -> None:
    """The fleet's size, the workload and its load."""
    p.add_argument("--servers", type=positive_int, default=8)
    p.add_argument(
        "--prefill-servers",
        type=non_negative_int,
        default=0,
        help="of the servers, how many have role prefill (the rest decode): for P/D configs",
    )
    p.add_argument("--workload", default="shared-prefix", help=f"{', '.join(WORKLOADS)} (docs/workloads.md)")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a workload parameter (repeatable; names and defaults in docs/workloads.md)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--qps",
        type=positive_float,
        default=None,
        help=f"Poisson arrivals per second (default {DEFAULT_QPS:g})",
    )
    load.add_argument("--qps-sweep", type=_rates, help="several Poisson rates, comma-separated")
    load.add_argument("--concurrency", type=positive_int, help="closed loop: requests kept in flight")
    p.add_argument(
        "--requests", type=positive_int, default=None, help="stop the workload after this many requests"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        metavar="K",
        help="run every cell on K seeds (--seed, --seed + 1, …): means and 95%% intervals over them",
    )


def _fleet_flags(p: argparse.ArgumentParser) -> None:
    """The engines, the scrapes and KV events, the SLO, churn and the outputs."""
    p.add_argument(
        "--scrape-interval",
        type=_interval,
        default="50ms",
        help="how stale the metrics the policy sees are: '50ms', '1s' or seconds (0: fresh every decision)",
    )
    p.add_argument(
        "--idle-scrape-interval",
        type=_interval,
        default="0",
        help="quiet scraping, as `epick serve --idle-scrape-interval`: a server idle since its last scrape, "
        "and sent nothing since, is scraped only this often; the run reports the scrapes per server and "
        "second (epick.simulate.scrapes; what the policy sees is the same). 0: off",
    )
    p.add_argument(
        "--engine-profile",
        choices=list(PROFILES),
        default=DEFAULT_PROFILE,
        help="the model and GPUs each server simulates: step costs and KV blocks (docs/simulator.md)",
    )
    p.add_argument(
        "--num-gpu-blocks",
        type=positive_int,
        default=None,
        help="KV blocks per server (default: the profile's)",
    )
    p.add_argument("--max-num-seqs", type=positive_int, default=None)
    p.add_argument("--max-loras", type=positive_int, default=None, help="LoRA adapter slots per server")
    p.add_argument("--slo-ttft", type=positive_float, default=2.0, help="goodput: TTFT limit in seconds")
    p.add_argument(
        "--slo-tpot", type=positive_float, default=0.1, help="goodput: time-per-output-token limit in seconds"
    )
    p.add_argument(
        "--kv-event-delay",
        type=_number(float, 0.0, "a delay in seconds"),
        default=0.0,
        help="seconds from an engine's KV event to a precise index hearing it (default 0)",
    )
    p.add_argument(
        "--restart-every",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="pod churn: every SECONDS of virtual time the next server in turn restarts, its requests "
        "failed and its KV cache lost",
    )
    p.add_argument(
        "--restart-downtime",
        type=_number(float, 0.0, "a duration in seconds"),
        default=0.0,
        metavar="SECONDS",
        help="how long a restarted server is out of the pool (default 0: it restarts in place, "
        "unnoticed by discovery; only KV events tell)",
    )
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--plot", help="draw latency and throughput against load to this PNG")


def _sweep_flags(p: argparse.ArgumentParser) -> None:
    """How the cells run, and a grid file in place of the flags above."""
    p.add_argument(
        "--grid",
        metavar="FILE",
        help="a grid file (YAML): the axes to sweep and the settings every cell shares (docs/simulator.md)",
    )
    p.add_argument(
        "--metric",
        choices=list(FIGURES),
        default=None,
        help=f"the figure that ranks policies in the summary (default: the grid's, else {DEFAULT_METRIC})",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="worker processes running cells at once (default: the cores available; 1: here, in turn)",
    )
    where.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="run the cells on the Ray cluster at ADDR ('auto': the one this machine has joined); "
        "pip install 'epick[ray]'",
    )


# The flags a grid file replaces; `--grid` refuses them unless left at their defaults.
_SWEEP_ONLY = {"grid", "metric", "jobs", "ray_address", "json", "plot", "func", "command"}


@functools.cache
def _defaults() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    _policy_flags(parser)
    _workload_flags(parser)
    _fleet_flags(parser)
    return vars(parser.parse_args([]))


@dataclass(frozen=True, slots=True)
class _Plan:
    cells: list[Cell]
    metric: str
    grid: Grid | None
    warnings: list[str]


def _prepare(args: argparse.Namespace) -> _Plan:
    """The cells, every argument checked: UsageError, WorkloadError, GridError or ConfigError
    otherwise."""
    plan = _grid_plan(args) if args.grid else _flags_plan(args)
    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", ".png")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed: pip install 'epick[plots]'")
    return plan


def _flags_plan(args: argparse.Namespace) -> _Plan:
    workload = WorkloadSpec(args.workload, tuple(parse_params(args.param).items()))
    built = workload.build()
    policies = _policy_specs(args.policies)
    if not args.prefill_servers < args.servers:
        raise UsageError(
            f"--prefill-servers must be between 0 and {args.servers - 1} (--servers - 1), "
            f"got {args.prefill_servers}"
        )
    if isinstance(built, Trace) and (args.qps is not None or args.qps_sweep):
        raise UsageError(
            "--qps and --qps-sweep do not apply to a trace: its lines carry their arrival times "
            "(--concurrency may cap the requests in flight)"
        )
    if args.restart_downtime and args.restart_every is None:
        raise UsageError("--restart-downtime needs --restart-every (how often a server restarts)")
    fleet = FleetSpec(
        servers=args.servers,
        prefill_servers=args.prefill_servers,
        engine_profile=args.engine_profile,
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_loras=args.max_loras,
        scrape_interval=args.scrape_interval,
        idle_scrape_interval=args.idle_scrape_interval,
        kv_event_delay=args.kv_event_delay,
        restart_every=args.restart_every,
        restart_downtime=args.restart_downtime,
        slo_ttft=args.slo_ttft,
        slo_tpot=args.slo_tpot,
    )
    seeds = range(args.seed, args.seed + args.seeds)
    cells = [
        Cell(policy, workload, arrivals, seed, fleet, args.requests)
        for arrivals in loads(args)
        for policy in policies
        for seed in seeds
    ]
    shortfall = workload.shortfall(args.requests) if args.requests is not None else None
    return _Plan(cells, args.metric or DEFAULT_METRIC, None, [shortfall] if shortfall else [])


def _grid_plan(args: argparse.Namespace) -> _Plan:
    given = [
        "--policy/--config" if dest == "policies" else f"--{dest.replace('_', '-')}"
        for dest, default in _defaults().items()
        if dest not in _SWEEP_ONLY and getattr(args, dest) != default
    ]
    if given:
        verb = "belongs" if len(given) == 1 else "belong"
        raise UsageError(f"--grid sets the cells: {', '.join(given)} {verb} in the grid file")
    written = load_grid(args.grid)
    grid = written.relative_to(Path(args.grid).parent)
    entries = [("policy", name) for name in grid.policies] + [("config", path) for path in grid.configs]
    policies = _policy_specs(entries)
    warnings = []
    for workload in grid.workload_points():
        workload.build()  # its parameters checked before anything runs
        shortfall = workload.shortfall(grid.requests, "requests:") if grid.requests is not None else None
        if shortfall:
            warnings.append(shortfall)
    intervals = {}
    for name in ("scrape_interval", "idle_scrape_interval"):
        try:
            intervals[name] = _interval(str(getattr(grid, name)))
        except argparse.ArgumentTypeError as e:
            raise GridError(f"{args.grid}: {name}: {e}") from None
    fleet = FleetSpec(
        num_gpu_blocks=grid.num_gpu_blocks,
        max_num_seqs=grid.max_num_seqs,
        max_loras=grid.max_loras,
        scrape_interval=intervals["scrape_interval"],
        idle_scrape_interval=intervals["idle_scrape_interval"],
        kv_event_delay=grid.kv_event_delay,
        restart_every=grid.restart_every,
        restart_downtime=grid.restart_downtime,
        slo_ttft=grid.slo_ttft,
        slo_tpot=grid.slo_tpot,
    )
    return _Plan(grid.cells(policies, fleet), args.metric or grid.metric, written, warnings)


def _policy_specs(entries: list[tuple[str, str]]) -> list[PolicySpec]:
    """--policy and --config entries, (kind, value) in order, as policies a worker builds: a config's
    text travels with the cell. Names as `policy_factories` gives them (which checks every entry)."""
    names = [name for name, _ in policy_factories(argparse.Namespace(policies=entries))]
    out = []
    for (kind, value), name in zip(entries, names, strict=True):
        if kind == "config":
            out.append(PolicySpec(name, Path(value).read_text(encoding="utf-8"), str(value)))
        elif value == "default":
            out.append(PolicySpec(name))
        elif value in CONFIG_POLICIES:
            out.append(PolicySpec(name, CONFIG_POLICIES[value], value))
        else:
            out.append(PolicySpec(name, baseline=value))
    return out


def run(args: argparse.Namespace) -> int:
    try:
        plan = _prepare(args)
    except (WorkloadError, UsageError, GridError) as e:
        print(f"epick simulate: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        for issue in e.issues:
            print(issue.render(e.source), file=sys.stderr)
        return 2
    for warning in plan.warnings:
        print(f"epick simulate: warning: {warning}", file=sys.stderr)
    workers = 1 if args.ray_address else min(args.jobs or available_cores(), len(plan.cells))
    started = time.perf_counter()
    try:
        outcomes = _execute(plan.cells, args.ray_address, workers)
    except WorkloadError as e:  # a trace is read as it runs: a bad line stops the run
        print(f"epick simulate: {e} (no results written)", file=sys.stderr)
        return 2
    except (NoRequestsError, RayMissingError, RayUnreachableError) as e:
        print(f"epick simulate: {e}", file=sys.stderr)
        return 2
    except WorkerDiedError as e:
        print(f"epick simulate: {e} (no results written)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("epick simulate: interrupted (no results written)", file=sys.stderr)
        return 130
    wall = time.perf_counter() - started
    runs = [o.run for o in outcomes]
    for warning in _made_fewer(plan.cells, runs, "requests:" if plan.grid else "--requests"):
        print(f"epick simulate: warning: {warning}", file=sys.stderr)
    _report(runs, plan, args)
    if args.ray_address:
        where = f"on Ray ({args.ray_address})"
    else:
        where = f"on {workers} workers" if workers > 1 else "in this process"
    peak = max(o.max_rss_bytes for o in outcomes) / 2**20
    print(
        f"{len(outcomes)} cell{'s' * (len(outcomes) > 1)} in {_duration(wall)} {where}: "
        f"{len(outcomes) / wall * 60:,.1f} cells/min; peak memory of a worker {peak:,.0f} MiB",
        file=sys.stderr,
    )
    return 0


def _execute(cells: Sequence[Cell], ray_address: str | None, workers: int) -> list[CellOutcome]:
    """Every cell's outcome, in order, with one progress bar over all of them."""
    console = Console(stderr=True)
    columns = (
        TextColumn("cells"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("cells", total=len(cells))

        def done(index: int, outcome: CellOutcome) -> None:
            progress.advance(task)

        if ray_address:
            return run_on_ray(cells, ray_address, done)
        return run_local(cells, workers, done)


def _made_fewer(cells: Sequence[Cell], runs: Sequence[dict[str, Any]], flag: str) -> list[str]:
    """For workloads whose size is not known in advance (a trace): a cell that made fewer requests
    than `flag` (--requests, or the grid's requests:) asked for."""
    out: dict[str, str] = {}
    for cell, run in zip(cells, runs, strict=True):
        made = run["completed"] + run["failed"]
        if cell.requests is not None and made < cell.requests and cell.workload.kind == "trace":
            out.setdefault(
                cell.workload.name,
                f"{flag} {cell.requests:,} is more than the {cell.workload.name} workload made: "
                f"{made:,} requests, one per line of its trace",
            )
    return list(out.values())


def _report(runs: list[dict[str, Any]], plan: _Plan, args: argparse.Namespace) -> None:
    """The tables on stdout, the JSON and the plot."""
    stats = aggregate.stats(runs)
    summary = aggregate.summary(runs, plan.metric)
    seeds = max(len(s["seeds"]) for s in stats)
    if plan.grid is None and seeds == 1:
        print_table(runs)
    else:
        show.print_stats(stats)
    show.print_failures(runs)
    if plan.grid is not None:
        show.print_summary(summary)
    if args.json:
        document: dict[str, Any] = {}
        if plan.grid is not None:
            document["grid"] = plan.grid.model_dump(mode="json")
        document.update(runs=runs, stats=stats, summary=summary)
        Path(args.json).write_text(json.dumps(finite(document), indent=2))
    if args.plot:
        plot(stats, args.plot)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"
