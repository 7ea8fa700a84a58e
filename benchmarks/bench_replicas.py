"""Two `epick serve` replicas in front of the same servers, each request sent to either at random as a
gateway spreads them: learning alone (the baseline), against sharing their state through Redis
(`--shared-state`), and against one replica.

Four simulated servers (one `epick sim-server` process, KV caches small enough that routing decides
the hit rate), the default config, and a shared-prefix workload (16 groups of a 2,000-token system
prompt, 24 questions each, shuffled with a fixed seed) at 32 concurrent clients. Per run, on fresh
servers (and a fresh redis-server): the servers' own prefix-cache hit rate, the share of each group's
requests that went to the server that got most of them, requests/s and failures. Interleaved rounds;
medians; hit rates as ratios to two replicas learning alone. Needs `redis-server` (Debian's package).
Run: `make bench` (or with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import time
from collections import Counter
from contextlib import ExitStack

import aiohttp
from bench_service import consecutive_ports, free_ports, process, wait_http
from bench_workers import Run
from rich.console import Console
from rich.table import Table

from epick.cli.demo import Workload, prefix_cache_counters
from epick.sim.server import IDENTITY_HEADER

EPICK = [sys.executable, "-m", "epick.cli.main"]
SERVERS = 4
BLOCKS = 1000  # per server, 16 tokens each: about 8 of the 16 prefixes


async def one_run(replicas: int, shared: bool, workload: Workload, time_scale: float) -> Run:
    base = consecutive_ports(SERVERS)
    sims = [f"127.0.0.1:{base + i}" for i in range(SERVERS)]
    sim_cmd = [*EPICK, "sim-server", "--port", str(base), "--count", str(SERVERS),
               "--time-scale", str(time_scale), "--num-gpu-blocks", str(BLOCKS), "--max-num-seqs", "64",
               "--seed", "7"]  # fmt: skip
    redis_port, *proxies = free_ports(1 + replicas)
    extra = ["--shared-state", f"redis://127.0.0.1:{redis_port}/0"] if shared else []
    run = Run()
    with ExitStack() as stack:
        if shared:
            redis = [shutil.which("redis-server") or "redis-server", "--port", str(redis_port),
                     "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]  # fmt: skip
            stack.enter_context(process(redis))
        stack.enter_context(process(sim_cmd))
        for port in proxies:
            serve = [*EPICK, "serve", "--endpoints", ",".join(sims), "--proxy-port", str(port),
                     "--metrics-port", "0", "--no-extproc", "--host", "127.0.0.1", "--workers", "1",
                     "--log-level", "error", *extra]  # fmt: skip
            stack.enter_context(process(serve))
        await wait_http(f"http://{sims[0]}/health")
        for port in proxies:
            await wait_http(f"http://127.0.0.1:{port}/health")
        await asyncio.sleep(0.5)  # every replica has scraped every server
        rng = random.Random(11)
        queue = iter(workload.requests())
        urls = [f"http://127.0.0.1:{port}/v1/completions" for port in proxies]
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def client() -> None:
                for group, prompt in queue:
                    body = {"model": "sim-model", "prompt": prompt, "max_tokens": workload.output_tokens}
                    try:
                        async with session.post(rng.choice(urls), json=body) as r:
                            await r.read()
                            if r.status == 200:
                                server = r.headers.get(IDENTITY_HEADER, "?")
                                run.served[server] += 1
                                run.by_group.setdefault(group, Counter())[server] += 1
                            else:
                                run.failed += 1
                    except aiohttp.ClientError:
                        run.failed += 1

            began = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(workload.concurrency)))
            run.seconds = time.perf_counter() - began
            for sim in sims:
                hits, queries = await prefix_cache_counters(session, f"http://{sim}")
                run.hits += hits
                run.queries += queries
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 rounds of a smaller workload")
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per second")
    args = parser.parse_args()
    console = Console(width=150)
    if shutil.which("redis-server") is None:
        console.print("bench_replicas: skipped, no redis-server installed (apt-get install redis-server)")
        return
    rounds = 2 if args.quick else args.rounds
    per_group = 12 if args.quick else 24
    workload = Workload(groups=16, prompts_per_group=per_group, output_tokens=8, concurrency=32, seed=7)
    variants = [
        ("2 replicas, each alone (baseline)", 2, False),
        ("2 replicas, --shared-state", 2, True),
        ("1 replica", 1, False),
    ]
    runs: dict[str, list[Run]] = {name: [] for name, _, _ in variants}
    for _ in range(rounds):
        for name, replicas, shared in variants:
            runs[name].append(asyncio.run(one_run(replicas, shared, workload, args.time_scale)))
    title = (
        f"replicas: {len(workload.requests())} requests, 16 shared prefixes, 32 clients, each request to a "
        f"replica at random ({rounds} interleaved rounds; medians)"
    )
    table = Table(title=title)
    columns = ("run", "prefix hit rate", "× baseline", "on each group's server", "requests/s", "failed")
    for column in columns:
        table.add_column(column, justify="right")
    baseline = statistics.median(r.hit_rate for r in runs[variants[0][0]])
    for name, _, _ in variants:
        rs = runs[name]
        rate = statistics.median(r.hit_rate for r in rs)
        table.add_row(
            name,
            f"{rate:.3f} ({min(r.hit_rate for r in rs):.3f}–{max(r.hit_rate for r in rs):.3f})",
            f"{rate / baseline:.3f}" if baseline else "–",
            f"{statistics.median(r.affinity for r in rs):.3f}",
            f"{statistics.median(r.rps for r in rs):,.0f}",
            " ".join(str(r.failed) for r in rs),
        )
    console.print(table)


if __name__ == "__main__":
    main()
