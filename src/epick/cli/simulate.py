"""`epick simulate`: routing policies and epick configs side by side on a simulated fleet, in virtual time."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from epick.config import ConfigError, load_config_file, load_config_text, load_default_config
from epick.plugins.registry import parse_duration
from epick.sim.options import ServerOptions
from epick.simulate.epick_policy import EpickPolicy
from epick.simulate.fleet import Arrivals, ClosedLoop, Fleet, Poisson
from epick.simulate.report import SLO, summarize
from epick.simulate.types import Policy

# Policies that are epick configs (the same files ship under config/; a test keeps them equal).
CONFIG_POLICIES = {
    "round-robin": """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: round-robin-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: round-robin-picker
""",
    "random": """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
""",
    "load-only": """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: max-score-picker
""",
}
PolicyFactory = Callable[[int], Policy]


def policy_factories(args: argparse.Namespace) -> list[tuple[str, PolicyFactory]]:
    """(name, factory(seed)) for every --policy and --config, in the order given."""
    from epick.simulate.policies import POLICIES

    out: list[tuple[str, PolicyFactory]] = []
    for name in args.policy:
        if name == "default" or name in CONFIG_POLICIES:
            out.append((name, _config_policy(name, CONFIG_POLICIES.get(name))))
        elif name in POLICIES:
            out.append((name, _baseline_policy(POLICIES[name])))
        else:
            known = ["default", *CONFIG_POLICIES, *POLICIES]
            raise SystemExit(f"epick simulate: unknown --policy {name!r}; choose from {', '.join(known)}")
    for path in args.config:
        load_config_file(path)  # fail early, with the file's errors
        out.append((Path(path).stem, _file_policy(path)))
    if not out:
        raise SystemExit("epick simulate: give at least one --policy or --config")
    return out


def _config_policy(name: str, text: str | None) -> PolicyFactory:
    def build(seed: int) -> Policy:
        config = (
            load_default_config(seed=seed) if text is None else load_config_text(text, source=name, seed=seed)
        )
        return EpickPolicy(name, config)

    return build


def _file_policy(path: str) -> PolicyFactory:
    def build(seed: int) -> Policy:
        return EpickPolicy(Path(path).stem, load_config_file(path, seed=seed))

    return build


def _baseline_policy(factory: Callable[[random.Random], Policy]) -> PolicyFactory:
    def build(seed: int) -> Policy:
        return factory(random.Random(seed))

    return build


def parse_params(values: list[str]) -> dict[str, str]:
    params = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"epick simulate: --param {item!r}: expected NAME=VALUE")
        params[key.strip()] = value.strip()
    return params


def loads(args: argparse.Namespace) -> list[Arrivals]:
    if args.concurrency is not None:
        return [ClosedLoop(args.concurrency)]
    if args.qps_sweep:
        return [Poisson(float(x)) for x in args.qps_sweep.split(",") if x.strip()]
    return [Poisson(args.qps)]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="compare routing policies on a simulated fleet, in virtual time")
    p.add_argument("--policy", action="append", default=[], help="a named policy (repeatable)")
    p.add_argument("--config", action="append", default=[], help="an EndpointPickerConfig to run as a policy")
    p.add_argument("--servers", type=int, default=8)
    p.add_argument(
        "--prefill-servers",
        type=int,
        default=0,
        help="of the servers, how many have role prefill (the rest decode): for P/D configs",
    )
    p.add_argument("--workload", default="shared-prefix")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="workload parameter")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--qps", type=float, default=10.0, help="Poisson arrivals per second")
    load.add_argument("--qps-sweep", help="several Poisson rates, comma-separated")
    load.add_argument("--concurrency", type=int, help="closed loop: requests kept in flight")
    p.add_argument("--requests", type=int, default=None, help="stop the workload after this many requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scrape-interval", default="50ms", help="how stale the metrics the policy sees are")
    p.add_argument(
        "--num-gpu-blocks", type=int, default=None, help="KV blocks per server (default: 8B on H100)"
    )
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-loras", type=int, default=None)
    p.add_argument("--slo-ttft", type=float, default=2.0, help="goodput: TTFT limit in seconds")
    p.add_argument(
        "--slo-tpot", type=float, default=0.1, help="goodput: time-per-output-token limit in seconds"
    )
    p.add_argument("--json", help="write every run's figures to this file")
    p.add_argument("--plot", help="draw latency and throughput against load to this PNG")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from epick.simulate.workloads import WorkloadError, build_workload

    try:
        workload = build_workload(args.workload, parse_params(args.param))
    except WorkloadError as e:
        print(f"epick simulate: {e}", file=sys.stderr)
        return 2
    try:
        policies = policy_factories(args)
    except ConfigError as e:
        for issue in e.issues:
            print(issue.render(e.source), file=sys.stderr)
        return 2
    if args.servers < 1:
        print("epick simulate: --servers must be at least 1", file=sys.stderr)
        return 2
    if not 0 <= args.prefill_servers < args.servers:
        print(
            f"epick simulate: --prefill-servers must be between 0 and {args.servers - 1} (--servers - 1)",
            file=sys.stderr,
        )
        return 2
    roles: Sequence[str | None] | None = None
    if args.prefill_servers:
        roles = ["prefill"] * args.prefill_servers + ["decode"] * (args.servers - args.prefill_servers)
    engine = ServerOptions.engine_config(
        num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs, max_loras=args.max_loras
    )
    engine = dataclasses.replace(engine, cache_output_blocks=workload.reuses_outputs)
    scrape = parse_duration(args.scrape_interval)
    slo = SLO(args.slo_ttft, args.slo_tpot)
    console = Console(stderr=True)
    runs: list[dict[str, Any]] = []
    output_plan = workload.output_plan
    lora_ids = {name: i + 1 for i, name in enumerate(workload.adapter_names)}
    columns = (TextColumn("{task.description:>28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        for arrivals in loads(args):
            level = arrivals.qps if isinstance(arrivals, Poisson) else float(arrivals.concurrency)
            for name, factory in policies:
                specs = workload.requests(random.Random(args.seed))
                if args.requests is not None:
                    specs = itertools.islice(specs, args.requests)
                task = progress.add_task(f"{name} @ {level:g}", total=args.requests)
                fleet = Fleet(
                    args.servers,
                    engine,
                    factory(args.seed),
                    scrape_interval=scrape,
                    output_plan=output_plan,
                    lora_ids=lora_ids,
                    progress=_advance(progress, task),
                    roles=roles,
                )
                started = time.perf_counter()
                result = fleet.run(specs, arrivals, random.Random(args.seed + 1))
                summary = summarize(name, level, result, slo)
                summary["wall_s"] = time.perf_counter() - started
                summary["load_kind"] = "qps" if isinstance(arrivals, Poisson) else "concurrency"
                runs.append(summary)
    print_table(runs)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": _finite(runs)}, indent=2))
    if args.plot:
        plot(runs, args.plot)
    return 0


def _advance(progress: Progress, task: TaskID) -> Callable[[], None]:
    def advance() -> None:
        progress.advance(task)

    return advance


def _finite(value: Any) -> Any:
    """NaN (a percentile of nothing) becomes null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def print_table(runs: list[dict[str, Any]]) -> None:
    table = Table(title="epick simulate (virtual time; latencies in seconds)")
    columns = ["policy", "load", "TTFT p50", "p90", "p99", "TPOT p50", "p99", "e2e p50", "out tok/s", "req/s"]
    columns += ["hit rate", "load CoV", "goodput/s", "done", "failed"]
    for col in columns:
        table.add_column(col, justify="right")
    for r in runs:
        table.add_row(
            r["policy"],
            f"{r['qps']:g}",
            *(f"{r['ttft_s'][k]:.3f}" for k in ("p50", "p90", "p99")),
            *(f"{r['tpot_s'][k]:.4f}" for k in ("p50", "p99")),
            f"{r['e2e_s']['p50']:.2f}",
            f"{r['output_tokens_per_s']:,.0f}",
            f"{r['requests_per_s']:.2f}",
            f"{r['prefix_cache_hit_rate']:.1%}",
            f"{r['load_cov']:.2f}",
            f"{r['goodput']:.2f}",
            str(r["completed"]),
            str(r["failed"]),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def plot(runs: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r["policy"] for r in runs):
        mine = sorted((r for r in runs if r["policy"] == name), key=lambda r: r["qps"])
        xs = [r["qps"] for r in mine]
        ax1.plot(xs, [r["ttft_s"]["p90"] for r in mine], marker="o", label=name)
        ax2.plot(xs, [r["output_tokens_per_s"] for r in mine], marker="o", label=name)
    kind = runs[0].get("load_kind", "qps") if runs else "qps"
    for ax, title in ((ax1, "TTFT p90 (s)"), (ax2, "output tokens/s")):
        ax.set_xlabel("offered load (requests/s)" if kind == "qps" else "concurrency")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    ax1.set_yscale("log")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
