"""How often `epick serve --workers N` scrapes each model server, for N = 1, 2, 4.

Three metrics servers (aiohttp, a vLLM-shaped page) record the time of every GET /metrics; `epick serve`
runs against them with the default interval (50 ms) and each worker count in turn; after a few
seconds to start, the scrapes of a measured window give the rate per server and the gaps between
consecutive scrapes of one server. The workers take turns (epick/datalayer/scraper.py), so the rate
should be one process's whatever N, with the gaps near the interval.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import statistics
import sys
import time

from aiohttp import web
from bench_service import free_ports  # this directory is on sys.path when run as a script
from rich.console import Console
from rich.table import Table

SERVERS = 3
PAGE = "\n".join(
    [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="m"} 0',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{model_name="m"} 0',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{model_name="m"} 0.1',
        "",
    ]
)


async def measure(workers: int, settle: float, window: float) -> tuple[list[float], list[float]]:
    """Scrapes per second of each server, and the gaps (s) between one server's scrapes."""
    hits: dict[int, list[float]] = {}
    ports = free_ports(SERVERS)
    runners = []
    for port in ports:

        async def metrics(request: web.Request, port: int = port) -> web.Response:
            hits.setdefault(port, []).append(time.time())
            return web.Response(text=PAGE)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    proxy, metrics_port = free_ports(2)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "epick.cli.main", "serve",
        "--endpoints", ",".join(f"127.0.0.1:{p}" for p in ports),
        "--proxy-port", str(proxy), "--metrics-port", str(metrics_port), "--no-extproc",
        "--workers", str(workers), "--min-workers", str(workers), "--log-level", "error",
    )  # fmt: skip
    try:
        await asyncio.sleep(settle)
        start = time.time()
        await asyncio.sleep(window)
        end = time.time()
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
        for runner in runners:
            await runner.cleanup()
    rates = [sum(start <= t < end for t in hits.get(p, [])) / (end - start) for p in ports]
    times = sorted(t for t in hits.get(ports[0], []) if start <= t < end)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return rates, gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", default="1,2,4", help="worker counts to run, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="the measured window")
    parser.add_argument("--quick", action="store_true", help="a 2 s window")
    args = parser.parse_args()
    window = 2.0 if args.quick else args.seconds
    table = Table(
        title=f"scrapes of each model server by epick serve --workers N (50 ms interval, {window:g} s)"
    )
    for col in ("workers", "scrapes/s per server", "gap p10 ms", "gap p50 ms", "gap p90 ms"):
        table.add_column(col, justify="right")
    for workers in (int(w) for w in args.workers.split(",")):
        rates, gaps = asyncio.run(measure(workers, settle=4.0, window=window))
        deciles = statistics.quantiles(gaps, n=10) if len(gaps) >= 2 else [float("nan")] * 9
        table.add_row(
            str(workers),
            ", ".join(f"{r:.1f}" for r in rates),
            *(f"{deciles[i] * 1e3:.1f}" for i in (0, 4, 8)),
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
