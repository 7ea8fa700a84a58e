"""`epick simulate`: routing policies and epick configs side by side on a simulated fleet, in virtual time."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from epick.cli.simulate_policies import PolicyFactory, UsageError, policy_factories, policy_names
from epick.cli.simulate_report import finite, plot, print_failures, print_table
from epick.config import ConfigError
from epick.plugins.duration import parse_duration
from epick.sim.engine import EngineConfig
from epick.sim.engine.profiles import DEFAULT_PROFILE, PROFILES
from epick.sim.options import ServerOptions
from epick.simulate.fleet import Arrivals, ClosedLoop, Fleet, Poisson
from epick.simulate.report import SLO, summarize
from epick.simulate.types import Churn, SimRequestSpec
from epick.simulate.workloads import WORKLOADS, Trace, Workload, WorkloadError, build_workload


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


def _fleet_flags(p: argparse.ArgumentParser) -> None:
    """The engines, the scrapes and KV events, the SLO, churn and the outputs."""
    p.add_argument(
        "--scrape-interval",
        type=_interval,
        default="50ms",
        help="how stale the metrics the policy sees are: '50ms', '1s' or seconds (0: fresh every decision)",
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


def _prepare(args: argparse.Namespace) -> tuple[Workload, list[tuple[str, PolicyFactory]]]:
    """The workload and the policies, every argument checked: UsageError, WorkloadError or
    ConfigError otherwise."""
    workload = build_workload(args.workload, parse_params(args.param))
    policies = policy_factories(args)
    if not args.prefill_servers < args.servers:
        raise UsageError(
            f"--prefill-servers must be between 0 and {args.servers - 1} (--servers - 1), "
            f"got {args.prefill_servers}"
        )
    if isinstance(workload, Trace) and (args.qps is not None or args.qps_sweep):
        raise UsageError(
            "--qps and --qps-sweep do not apply to a trace: its lines carry their arrival times "
            "(--concurrency may cap the requests in flight)"
        )
    if args.restart_downtime and args.restart_every is None:
        raise UsageError("--restart-downtime needs --restart-every (how often a server restarts)")
    _check_output(args.json, "--json")
    _check_output(args.plot, "--plot", ".png")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib, which is not installed: pip install 'epick[plots]'")
    return workload, policies


def run(args: argparse.Namespace) -> int:
    try:
        workload, policies = _prepare(args)
    except (WorkloadError, UsageError) as e:
        print(f"epick simulate: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        for issue in e.issues:
            print(issue.render(e.source), file=sys.stderr)
        return 2
    setup = _setup(args, workload)
    runs: list[dict[str, Any]] = []
    columns = (TextColumn("{task.description:>28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as progress:
        for arrivals in loads(args):
            for name, factory in policies:
                try:
                    runs.append(
                        _run_one(
                            args, workload, setup, arrivals, name=name, factory=factory, progress=progress
                        )
                    )
                except WorkloadError as e:  # a trace is read as it runs: a bad line stops the run
                    progress.stop()
                    print(f"epick simulate: {e} (no results written)", file=sys.stderr)
                    return 2
                except _NoRequestsError:
                    progress.stop()
                    print(f"epick simulate: the {args.workload} workload has no requests", file=sys.stderr)
                    return 2
    print_table(runs)
    print_failures(runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": finite(runs)}, indent=2))
    if args.plot:
        plot(runs, args.plot)
    return 0


class _NoRequestsError(Exception):
    """A run's workload gave no request."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Setup:
    """What every run of one invocation shares: the fleet's engines, roles, churn and SLO."""

    engine: EngineConfig
    roles: Sequence[str | None] | None
    slo: SLO
    churn: Churn | None
    lora_ids: dict[str, int]


def _setup(args: argparse.Namespace, workload: Workload) -> _Setup:
    roles: Sequence[str | None] | None = None
    if args.prefill_servers:
        roles = ["prefill"] * args.prefill_servers + ["decode"] * (args.servers - args.prefill_servers)
    engine = ServerOptions.engine_config(
        num_gpu_blocks=args.num_gpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_loras=args.max_loras,
        profile=args.engine_profile,
    )
    return _Setup(
        engine=dataclasses.replace(engine, cache_output_blocks=workload.reuses_outputs),
        roles=roles,
        slo=SLO(args.slo_ttft, args.slo_tpot),
        churn=Churn(args.restart_every, args.restart_downtime) if args.restart_every is not None else None,
        lora_ids={name: i + 1 for i, name in enumerate(workload.adapter_names)},
    )


def _run_one(
    args: argparse.Namespace,
    workload: Workload,
    setup: _Setup,
    arrivals: Arrivals,
    *,
    name: str,
    factory: PolicyFactory,
    progress: Progress,
) -> dict[str, Any]:
    """One policy at one load: the fleet run, summarized."""
    trace = isinstance(workload, Trace)
    level = _level(arrivals, trace)
    specs: Iterable[SimRequestSpec] = workload.requests(random.Random(args.seed))
    if args.requests is not None:
        specs = itertools.islice(specs, args.requests)
    label = f"{name} @ {level:g}" if level is not None else f"{name} (trace)"
    total = workload.size if args.requests is None else min(args.requests, workload.size or args.requests)
    task = progress.add_task(label, total=total)
    fleet = Fleet(
        args.servers,
        setup.engine,
        factory(args.seed),
        scrape_interval=args.scrape_interval,
        output_plan=workload.output_plan,
        lora_ids=setup.lora_ids,
        progress=_advance(progress, task),
        roles=setup.roles,
        kv_event_delay=args.kv_event_delay,
        churn=setup.churn,
    )
    started = time.perf_counter()
    result = fleet.run(specs, arrivals, random.Random(args.seed + 1))
    if not result.records:
        raise _NoRequestsError
    summary = summarize(name, level, result, setup.slo)
    summary.update(
        wall_s=time.perf_counter() - started,
        load_kind="concurrency" if isinstance(arrivals, ClosedLoop) else ("trace" if trace else "qps"),
        engine_profile=args.engine_profile,
        num_gpu_blocks=setup.engine.num_gpu_blocks,
    )
    return summary


def _level(arrivals: Arrivals, trace: bool) -> float | None:
    """The run's load for the table, the JSON and the plot: requests/s, concurrency, or None for a
    trace's own arrivals."""
    if isinstance(arrivals, ClosedLoop):
        return float(arrivals.concurrency)
    return None if trace else arrivals.qps


def _advance(progress: Progress, task: TaskID) -> Callable[[], None]:
    def advance() -> None:
        progress.advance(task)

    return advance
