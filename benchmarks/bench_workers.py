"""`epick serve --workers 2` against one worker: the same prefix hits, and a worker killed under load.

Four simulated servers (one `epick sim-server` process, KV caches small enough that routing decides
the hit rate: each server holds about half of the workload's prefixes), `epick serve` with the
default config (or `--config-file`) in front, and a shared-prefix workload (16 groups of a
2,000-token system prompt, 24 questions each, shuffled with a fixed seed) at 32 concurrent clients,
each request on a fresh connection so the kernel spreads them over the workers. Per run, on fresh
servers:
- the servers' own prefix-cache hit rate (vLLM's `prefix_cache_hits` / `prefix_cache_queries`);
- the share of each group's requests that went to the server that got most of them;
- the requests that failed, requests/s, and how many requests each server got.
Runs: one worker, two workers, and two workers with one of them killed (SIGKILL) once a third of
the requests are done; interleaved rounds, medians, and the hit rates as ratios to one worker's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from bench_service import consecutive_ports, free_ports, process, wait_http
from rich.console import Console
from rich.table import Table

from epick.cli.demo import Workload, prefix_cache_counters
from epick.sim.server import IDENTITY_HEADER

EPICK = [sys.executable, "-m", "epick.cli.main"]
SERVERS = 4
BLOCKS = 1000  # per server, 16 tokens each: about 8 of the prefixes (the fleet holds all 16 twice)


@dataclass
class Run:
    hits: float = 0.0
    queries: float = 0.0
    failed: int = 0
    served: Counter[str] = field(default_factory=Counter)
    by_group: dict[int, Counter[str]] = field(default_factory=dict)
    seconds: float = 0.0
    restarted: bool = False

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def affinity(self) -> float:
        """The share of each group's requests that went to the server that got most of them."""
        total = sum(sum(c.values()) for c in self.by_group.values())
        return sum(c.most_common(1)[0][1] for c in self.by_group.values() if c) / total if total else 0.0

    @property
    def rps(self) -> float:
        return sum(self.served.values()) / self.seconds if self.seconds else 0.0


def workers_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


async def one_run(workers: int, kill: bool, workload: Workload, time_scale: float, extra: list[str]) -> Run:
    base = consecutive_ports(SERVERS)
    proxy, metrics = free_ports(2)
    sims = [f"127.0.0.1:{base + i}" for i in range(SERVERS)]
    sim_cmd = [*EPICK, "sim-server", "--port", str(base), "--count", str(SERVERS),
               "--time-scale", str(time_scale), "--num-gpu-blocks", str(BLOCKS), "--max-num-seqs", "64",
               "--seed", "7"]  # fmt: skip
    serve_cmd = [*EPICK, "serve", "--endpoints", ",".join(sims), "--proxy-port", str(proxy),
                 "--metrics-port", str(metrics), "--no-extproc", "--host", "127.0.0.1",
                 "--workers", str(workers), "--min-workers", str(workers), "--log-level", "error",
                 *extra]  # fmt: skip
    run = Run()
    with process(sim_cmd), process(serve_cmd) as serve:
        await wait_http(f"http://{sims[0]}/health")
        await wait_http(f"http://127.0.0.1:{proxy}/health")
        while len(workers_of(serve.pid)) < workers and workers > 1:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # every worker has scraped every server
        items = workload.requests()
        queue = iter(items)
        done = 0
        url = f"http://127.0.0.1:{proxy}/v1/completions"
        connector = aiohttp.TCPConnector(force_close=True, limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def client() -> None:
                nonlocal done
                for group, prompt in queue:
                    body = {"model": "sim-model", "prompt": prompt, "max_tokens": workload.output_tokens}
                    try:
                        async with session.post(url, json=body) as r:
                            await r.read()
                            if r.status == 200:
                                server = r.headers.get(IDENTITY_HEADER, "?")
                                run.served[server] += 1
                                run.by_group.setdefault(group, Counter())[server] += 1
                            else:
                                run.failed += 1
                    except aiohttp.ClientError:
                        run.failed += 1
                    done += 1
                    if kill and done == len(items) // 3:
                        os.kill(workers_of(serve.pid)[0], signal.SIGKILL)

            began = time.perf_counter()
            await asyncio.gather(*(client() for _ in range(workload.concurrency)))
            run.seconds = time.perf_counter() - began
            for sim in sims:
                hits, queries = await prefix_cache_counters(session, f"http://{sim}")
                run.hits += hits
                run.queries += queries
        for _ in range(600):  # the killed worker's successor: started within a few seconds
            if len(workers_of(serve.pid)) == workers:
                run.restarted = True
                break
            await asyncio.sleep(0.05)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 rounds of a smaller workload")
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per second")
    parser.add_argument("--config-file", default=None, help="epick's config (default: the default config)")
    parser.add_argument("--prompts-per-group", type=int, default=None)
    args = parser.parse_args()
    rounds = 2 if args.quick else args.rounds
    per_group = args.prompts_per_group or (12 if args.quick else 24)
    extra = ["--config-file", args.config_file] if args.config_file else []
    workload = Workload(groups=16, prompts_per_group=per_group, output_tokens=8,
                        concurrency=32, seed=7)  # fmt: skip
    variants = [("1 worker", 1, False), ("2 workers", 2, False), ("2 workers, one killed", 2, True)]
    runs: dict[str, list[Run]] = {name: [] for name, _, _ in variants}
    for _ in range(rounds):
        for name, workers, kill in variants:
            runs[name].append(asyncio.run(one_run(workers, kill, workload, args.time_scale, extra)))
    console = Console(width=150)
    table = Table(title=f"--workers: {len(workload.requests())} requests, 16 shared prefixes, 32 clients "
                  f"({rounds} interleaved rounds; medians)")  # fmt: skip
    for column in ("run", "prefix hit rate", "× 1 worker's", "on each group's server", "requests/s", "failed",
                   "per server",
                   "worker back"):  # fmt: skip
        table.add_column(column, justify="right")
    one = statistics.median(r.hit_rate for r in runs["1 worker"])
    for name, _, kill in variants:
        rs = runs[name]
        rate = statistics.median(r.hit_rate for r in rs)
        spread = sorted(Counter(r.served).most_common() for r in rs)[len(rs) // 2]
        table.add_row(
            name,
            f"{rate:.3f} ({min(r.hit_rate for r in rs):.3f}–{max(r.hit_rate for r in rs):.3f})",
            f"{rate / one:.3f}" if one else "–",
            f"{statistics.median(r.affinity for r in rs):.3f}",
            f"{statistics.median(r.rps for r in rs):,.0f}",
            " ".join(str(r.failed) for r in rs),
            " ".join(str(n) for _, n in spread),
            " ".join("yes" if r.restarted else "no" for r in rs) if kill else "",
        )
    console.print(table)


if __name__ == "__main__":
    main()
