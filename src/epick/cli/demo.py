"""`epick demo`: four simulated servers behind epick, a shared-prefix workload, default vs round-robin.

Everything runs in this process: four `sim-server`s (small KV caches, so the workload's prefixes fit
the fleet but not one server), the epick proxy, and a load generator. The same workload runs twice,
with the default config and with config/round-robin.yaml, each time on fresh servers; the table at
the end compares where requests went, the servers' own prefix-cache hit rate, TTFT and throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from epick.config import LoadedConfig, load_config_file, load_default_config
from epick.datalayer.datastore import EndpointSpec
from epick.proxy.server import ProxyOptions
from epick.service import Service, Settings
from epick.sim.options import ServerOptions
from epick.sim.server import IDENTITY_HEADER, SimServer

CONFIGS = Path(__file__).resolve().parents[3] / "config"
WORDS = ("cache", "prefix", "token", "route", "model", "server", "batch", "queue", "decode", "prefill",
         "latency", "memory", "block", "tensor", "kernel", "shard", "replica", "gateway")  # fmt: skip


DEFAULT_GROUPS = 16
DEFAULT_PROMPTS_PER_GROUP = 12


@dataclass(frozen=True, slots=True)
class Workload:
    groups: int = DEFAULT_GROUPS
    prompts_per_group: int = DEFAULT_PROMPTS_PER_GROUP
    system_tokens: int = 2000
    question_tokens: int = 60
    output_tokens: int = 24
    concurrency: int = 24
    seed: int = 7

    def requests(self) -> list[tuple[int, str]]:
        rng = random.Random(self.seed)

        def text(tokens: int) -> str:
            return " ".join(rng.choice(WORDS) for _ in range(tokens))

        systems = [f"group {g}: " + text(self.system_tokens) for g in range(self.groups)]
        items = [(g, systems[g] + "\nQ: " + text(self.question_tokens)) for g in range(self.groups)
                 for _ in range(self.prompts_per_group)]  # fmt: skip
        rng.shuffle(items)
        return items


@dataclass(slots=True)
class RunResult:
    label: str
    per_endpoint: dict[str, int] = field(default_factory=dict)
    ttft: list[float] = field(default_factory=list)
    errors: int = 0
    wall: float = 0.0
    output_tokens: int = 0
    hits: float = 0.0
    queries: float = 0.0


async def prefix_cache_counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    """A vLLM-compatible server's prefix-cache counters (hits, queries), in tokens, from its /metrics."""
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    hits = queries = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:prefix_cache_hits_total":
                hits += sample.value
            elif sample.name == "vllm:prefix_cache_queries_total":
                queries += sample.value
    return hits, queries


async def run_once(
    label: str, config: LoadedConfig, workload: Workload, time_scale: float, progress: Progress
) -> RunResult:
    engine = ServerOptions.engine_config(num_gpu_blocks=2500, max_num_seqs=64)
    sims = [SimServer(ServerOptions(port=0, time_scale=time_scale, engine=engine, name=f"sim-{i}"), i)
            for i in range(4)]  # fmt: skip
    for s in sims:
        await s.start()
    specs = tuple(EndpointSpec(s.name or "", "127.0.0.1", s.port, {}) for s in sims)
    service = Service(
        Settings(endpoints=specs, proxy=ProxyOptions(host="127.0.0.1", port=0), metrics_port=None,
                     refresh_metrics_interval=0.02),
        config,
    )  # fmt: skip
    await service.start()
    result = RunResult(label)
    items = workload.requests()
    task = progress.add_task(label, total=len(items))
    assert service.proxy is not None
    url = f"http://127.0.0.1:{service.proxy.port}/v1/completions"
    try:
        async with aiohttp.ClientSession() as session:
            queue = iter(items)

            async def worker() -> None:
                for _group, prompt in queue:
                    body = {"model": "sim-model", "prompt": prompt, "max_tokens": workload.output_tokens,
                            "stream": True}  # fmt: skip
                    start = time.perf_counter()
                    first = None
                    async with session.post(url, json=body) as r:
                        if r.status != 200:
                            result.errors += 1
                            await r.read()
                        else:
                            server = r.headers.get(IDENTITY_HEADER, "?")
                            result.per_endpoint[server] = result.per_endpoint.get(server, 0) + 1
                            async for _ in r.content.iter_any():
                                if first is None:
                                    first = time.perf_counter() - start
                            result.output_tokens += workload.output_tokens
                    if first is not None:
                        result.ttft.append(first * time_scale)  # simulated seconds, as the GPU would see
                    progress.advance(task)

            began = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(workload.concurrency)))
            result.wall = (time.perf_counter() - began) * time_scale
            for s in sims:
                hits, queries = await prefix_cache_counters(session, s.url)
                result.hits += hits
                result.queries += queries
    finally:
        await service.stop()
        for s in sims:
            await s.stop()
    return result


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: list[RunResult], workload: Workload, console: Console) -> None:
    table = Table(title=f"{workload.groups} prefix groups × {workload.prompts_per_group} prompts, "
                        f"{workload.system_tokens}-token shared prefix, 4 simulated servers")  # fmt: skip
    table.add_column("")
    for r in results:
        table.add_column(r.label, justify="right")
    servers = sorted({name for r in results for name in r.per_endpoint})
    for name in servers:
        table.add_row(f"requests on {name}", *(str(r.per_endpoint.get(name, 0)) for r in results))
    table.add_row("prefix-cache hit rate (servers' metrics)",
                  *(f"{r.hits / r.queries:.1%}" if r.queries else "-" for r in results))  # fmt: skip
    table.add_row("TTFT p50 (s)", *(f"{statistics.median(r.ttft):.3f}" if r.ttft else "-" for r in results))
    table.add_row("TTFT p99 (s)", *(f"{_pct(r.ttft, 0.99):.3f}" for r in results))
    table.add_row("throughput (output tokens/s)", *(f"{r.output_tokens / r.wall:,.0f}" for r in results))
    table.add_row("errors", *(str(r.errors) for r in results))
    console.print(table)
    console.print(
        "TTFT and throughput are measured by the client, through the proxy, in simulated seconds "
        "(wall time × --time-scale, 1 by default)."
    )


async def _demo(time_scale: float, workload: Workload) -> list[RunResult]:
    console = Console()
    runs = [("default config", load_default_config(seed=1)),
            ("round-robin", load_config_file(CONFIGS / "round-robin.yaml", seed=1))]  # fmt: skip
    results = []
    columns = (TextColumn("{task.description:>16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        for label, config in runs:
            results.append(await run_once(label, config, workload, time_scale, progress))
    report(results, workload, console)
    return results


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="default config vs round-robin on four simulated servers")
    p.add_argument("--time-scale", type=float, default=1.0, help="simulated seconds per wall second")
    p.add_argument("--groups", type=int, default=DEFAULT_GROUPS)
    p.add_argument("--prompts-per-group", type=int, default=DEFAULT_PROMPTS_PER_GROUP)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    workload = Workload(groups=args.groups, prompts_per_group=args.prompts_per_group)
    results = uvloop.run(_demo(args.time_scale, workload))
    return 1 if any(r.errors for r in results) else 0
