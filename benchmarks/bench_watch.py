"""Watching the fleet: what the scrape interval and quiet scraping trade, in real time.

The same fleet and requests as bench_streamed.py (8 simulated vLLM servers, streamed 64-token chats
over 16 shared prefixes, Poisson arrivals), through epick's proxy with one worker, under each way of
watching the fleet: upstream's 50 ms interval, slower intervals, and 50 ms with quiet scraping
(`--idle-scrape-interval 1s`). For each, interleaved over `--rounds`:
- **router CPU per request**, scraping included, and the router's **idle cores** (scrapes alone);
- **fleet CPU per request** and the fleet's idle cores: what answering the scrapes costs the servers
  (the simulated servers' process; on vLLM, its API server);
- **prefix hit rate** (the servers' own `vllm:prefix_cache_hits` / `queries` over the run) and TTFT.

Every run starts fresh servers, so each setting meets cold caches alike. Idle figures are measured
over 3 s before each run. `--rates` runs each setting at several rates.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
import urllib.request

from bench_idle import cpu_seconds  # this directory is on sys.path when run as a script
from bench_service import consecutive_ports, free_ports, process, wait_http
from bench_streamed import EPICK, SERVERS, Run, pct, prompts, router, workload
from rich.console import Console
from rich.table import Table

SETTINGS: list[tuple[str, list[str]]] = [
    ("50ms (upstream's)", ["--refresh-metrics-interval", "50ms"]),
    ("200ms", ["--refresh-metrics-interval", "200ms"]),
    ("1s", ["--refresh-metrics-interval", "1s"]),
    ("50ms, quiet 1s", ["--refresh-metrics-interval", "50ms", "--idle-scrape-interval", "1s"]),
]
_SAMPLE = re.compile(r"^(vllm:prefix_cache_(?:hits|queries))_total(?:\{[^}]*\})?\s+(\S+)$", re.M)


def prefix_counts(backends: list[str]) -> tuple[float, float]:
    """The fleet's prefix-cache hits and queries so far (tokens)."""
    hits = queries = 0.0
    for backend in backends:
        with urllib.request.urlopen(f"http://{backend}/metrics", timeout=5) as r:
            page = r.read().decode()
        for name, value in _SAMPLE.findall(page):
            if name.endswith("hits"):
                hits += float(value)
            else:
                queries += float(value)
    return hits, queries


class Measured:
    def __init__(self, name: str) -> None:
        self.run = Run(name)
        self.router_cpu: list[float] = []
        self.fleet_cpu: list[float] = []
        self.router_idle: list[float] = []
        self.fleet_idle: list[float] = []
        self.hits = 0.0
        self.queries = 0.0


def one(
    m: Measured, *, router_pid: int, fleet_pid: int, url: str, backends: list[str],
    chats: list[list[dict[str, str]]], rate: float, seed: int,
) -> None:  # fmt: skip
    time.sleep(1.0)
    r0, f0, w0 = cpu_seconds(router_pid), cpu_seconds(fleet_pid), time.perf_counter()
    time.sleep(3.0)
    wall = time.perf_counter() - w0
    m.router_idle.append((cpu_seconds(router_pid) - r0) / wall)
    m.fleet_idle.append((cpu_seconds(fleet_pid) - f0) / wall)
    h0, q0 = prefix_counts(backends)
    r0, f0 = cpu_seconds(router_pid), cpu_seconds(fleet_pid)
    asyncio.run(workload([url], chats, rate, seed, m.run))
    m.router_cpu.append((cpu_seconds(router_pid) - r0) / len(chats))
    m.fleet_cpu.append((cpu_seconds(fleet_pid) - f0) / len(chats))
    h1, q1 = prefix_counts(backends)
    m.hits += h1 - h0
    m.queries += q1 - q0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=256, help="per setting, rate and round")
    parser.add_argument(
        "--rates", default="10", help="arrivals per second of simulated time, comma-separated"
    )
    parser.add_argument("--time-scale", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="one round of 96 requests at 10 req/s")
    args = parser.parse_args()
    n, rounds = (96, 1) if args.quick else (args.requests, args.rounds)
    rates = [10.0] if args.quick else [float(r) for r in args.rates.split(",")]
    chats = prompts(n, args.seed)
    console = Console(width=150)
    for rate in rates:
        results = {name: Measured(name) for name, _ in SETTINGS}
        for _ in range(rounds):
            for name, extra in SETTINGS:
                # Fresh servers for every run: each setting starts from cold caches alike.
                base = consecutive_ports(SERVERS)
                backends = [f"127.0.0.1:{base + i}" for i in range(SERVERS)]
                fleet = [*EPICK, "sim-server", "--port", str(base), "--count", str(SERVERS),
                         "--time-scale", str(args.time_scale)]  # fmt: skip
                with process(fleet) as servers:
                    asyncio.run(wait_http(f"http://{backends[-1]}/metrics"))
                    proxy, metrics = free_ports(2)
                    cmd = [*EPICK, "serve", "--endpoints", ",".join(backends), "--proxy-port", str(proxy),
                           "--metrics-port", str(metrics), "--no-extproc", "--workers", "1",
                           "--log-level", "error", *extra]  # fmt: skip
                    with router(cmd, f"http://127.0.0.1:{proxy}/health") as pid:
                        one(results[name], router_pid=pid, fleet_pid=servers.pid,
                            url=f"http://127.0.0.1:{proxy}", backends=backends, chats=chats,
                            rate=rate * args.time_scale, seed=args.seed)  # fmt: skip
        title = (f"{n} streamed chats x {rounds} round(s) at {rate:g} req/s (x{args.time_scale:g}), "
                 "epick proxy, 1 worker, 8 simulated servers")  # fmt: skip
        table = Table(title=title)
        for col in ("watching", "router µs/req", "router idle cores", "fleet µs/req", "fleet idle cores",
                    "prefix hit rate", "TTFT p50 ms", "TTFT p99 ms", "failed"):  # fmt: skip
            table.add_column(col, justify="right")
        for m in results.values():
            table.add_row(
                m.run.name,
                f"{statistics.fmean(m.router_cpu) * 1e6:,.0f}",
                f"{statistics.fmean(m.router_idle):.3f}",
                f"{statistics.fmean(m.fleet_cpu) * 1e6:,.0f}",
                f"{statistics.fmean(m.fleet_idle):.3f}",
                f"{m.hits / m.queries:.3f}" if m.queries else "–",
                f"{pct(m.run.ttft, 50) * 1e3:.2f}",
                f"{pct(m.run.ttft, 99) * 1e3:.2f}",
                str(m.run.failed),
            )
        console.print(table)


if __name__ == "__main__":
    main()
