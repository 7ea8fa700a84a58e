"""The simulator's speed: engine steps/s, and requests/s one `--count 16` process sustains.

1. Engine: a batch of 256 decoding sequences (1,000-token prompts), stepped in virtual time.
   Printed: steps/s, and simulated seconds per wall second (how much faster than a real GPU).
2. Server: `epick sim-server --count 16` in a subprocess; this process drives it with streaming
   requests (64 concurrent, 100-token prompts, 16 output tokens) for a fixed number of requests.
   Run at --time-scale 10 and, as the in-process baseline, at --time-scale 1000 (where the
   simulated GPU is never the limit, so what remains is the HTTP and event-loop cost).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time

import aiohttp
from rich.console import Console
from rich.table import Table

from epick.sim.engine import Engine, EngineConfig, SimRequest


def bench_engine(steps: int) -> tuple[float, float]:
    engine = Engine(EngineConfig())
    for i in range(256):
        engine.add_request(SimRequest(f"r{i}", [i % 1000 + j for j in range(1000)], max_tokens=100_000))
    now = 0.0
    for _ in range(20):  # admit and prefill everything first
        now = engine.step(now).end
    start = time.perf_counter()
    sim_start = now
    for _ in range(steps):
        now = engine.step(now).end
    wall = time.perf_counter() - start
    return steps / wall, (now - sim_start) / wall


def free_port_block(n: int) -> int:
    for base in range(20000, 60000, 97):
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports")


async def drive(base: int, count: int, requests: int, concurrency: int) -> float:
    body = {"model": "sim-model", "prompt": "benchmark " * 100, "max_tokens": 16, "stream": True}
    done = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(200):  # wait until every server answers
            try:
                for k in range(count):
                    async with session.get(f"http://127.0.0.1:{base + k}/health") as r:
                        r.raise_for_status()
                break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
        start = time.perf_counter()
        queue = iter(range(requests))

        async def worker() -> None:
            nonlocal done
            for i in queue:
                url = f"http://127.0.0.1:{base + i % count}/v1/completions"
                async with session.post(url, json=body) as r:
                    async for _ in r.content:
                        pass
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


def bench_server(time_scale: float, requests: int) -> float:
    base = free_port_block(16)
    proc = subprocess.Popen(
        [sys.executable, "-m", "epick.cli.main", "sim-server", "--count", "16", "--port", str(base),
         "--time-scale", str(time_scale)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        return asyncio.run(drive(base, 16, requests, 64))
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    console = Console()
    steps_per_s, speedup = bench_engine(200 if args.quick else 1000)
    t = Table(title="engine: 256 decoding sequences")
    t.add_column("steps/s", justify="right")
    t.add_column("simulated s per wall s", justify="right")
    t.add_row(f"{steps_per_s:,.0f}", f"{speedup:,.1f}x")
    console.print(t)
    n = 400 if args.quick else 2000
    at_10 = bench_server(10, n)
    baseline = bench_server(1000, n)
    t = Table(title="sim-server --count 16, streaming, 64 concurrent, 100-token prompts, 16 output tokens")
    for col in ("time scale", "requests/s", "ratio to the x1000 baseline"):
        t.add_column(col, justify="right")
    t.add_row("10", f"{at_10:,.0f}", f"{at_10 / baseline:.2f}")
    t.add_row("1000 (baseline)", f"{baseline:,.0f}", "1.00")
    console.print(t)


if __name__ == "__main__":
    main()
