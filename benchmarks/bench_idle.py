"""The cost of watching the fleet with no traffic: the CPU epick spends scraping, and the CPU the model
servers spend answering, per scrape and per second.

1. **One scrape, both sides.** A page server in its own process exposes a vLLM-sized registry through
   prometheus_client, as vLLM does (40 families, most of them labelled histograms: about 80 kB), and
   honours `?name[]=` as prometheus_client's exposition does. An in-process scraper pool (on
   uvloop, as `epick serve` runs) polls N endpoints on it every 50 ms, first asking for the whole
   page (upstream's EPP's way), then for the samples its extractor reads (epick's). Router CPU per
   scrape and server CPU per scrape, with the ratio of epick's way to the whole page's.
2. **`epick serve --workers 1`, `--workers 2` and `--workers 2 --min-workers 2`** against 8 simulated
   servers (`epick sim-server`), idle: the CPU of the router's processes and of the simulators per
   second of wall time, against one worker's; then the same with quiet scraping
   (`--idle-scrape-interval 1s`). `--workers 2` runs a second worker only while the first is busy
   (`epick.service.workers.scaling`): idle, it is a supervisor and one worker; `--min-workers 2`
   keeps both running.

CPU is read from /proc (user + system) of each process and its children.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import uvloop
from bench_service import consecutive_ports, free_ports, process, wait_http  # this directory is on sys.path
from rich.console import Console
from rich.table import Table

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its children (reaped or not), from /proc."""
    total = 0.0
    pids = [pid]
    while pids:
        p = pids.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICKS
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            children = []
        pids.extend(int(c) for c in children)
    return total


_PAGE_SERVER = """
import sys
from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

registry = CollectorRegistry()
model = ["model_name"]
for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
    Gauge(name, name, model, registry=registry).labels("meta-llama/Llama-3.1-8B-Instruct").set(1)
buckets = [0.001 * 2**i for i in range(16)]
for i in range(37):
    h = Histogram(f"vllm:histogram_family_{i}_seconds", "a vLLM-shaped histogram", model + ["engine"],
                  buckets=buckets, registry=registry)
    h.labels("meta-llama/Llama-3.1-8B-Instruct", "0").observe(0.05 * (i + 1))


async def metrics(request):
    names = request.query.getall("name[]", [])
    chosen = registry.restricted_registry(names) if names else registry
    return web.Response(body=generate_latest(chosen), headers={"Content-Type": CONTENT_TYPE_LATEST})

app = web.Application()
app.router.add_get("/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def one_scrape(endpoints: int, seconds: float, filtered: bool) -> tuple[float, float, int]:
    """(router CPU µs per scrape, server CPU µs per scrape, page bytes)."""
    from epick.config import load_default_config
    from epick.datalayer.datastore import Datastore, EndpointSpec
    from epick.datalayer.scraper import ScraperPool

    port = consecutive_ports(1)
    with process([sys.executable, "-c", _PAGE_SERVER, str(port)]) as server:
        await wait_http(f"http://127.0.0.1:{port}/metrics")
        store = Datastore()
        store.replace_all(EndpointSpec(f"e{i}", "127.0.0.1", port, {}) for i in range(endpoints))
        pool = ScraperPool(store, interval=0.05, plan=load_default_config(seed=0).data_layer)
        await pool.start()
        scrapers = [s for group in pool.scrapers.values() for s in group]
        path = scrapers[0].target.path
        if not filtered:
            for s in scrapers:  # upstream's way: the whole page
                s.filtered = None
                assert s.client is not None
                s.client.path = path
        await asyncio.sleep(1.0)
        page = scrapers[0].client
        before = sum(s.scrapes for s in scrapers)
        router0, server0 = time.process_time(), cpu_seconds(server.pid)
        await asyncio.sleep(seconds)
        router, served = time.process_time() - router0, cpu_seconds(server.pid) - server0
        scrapes = sum(s.scrapes for s in scrapers) - before
        size = 0
        if page is not None:
            import aiohttp

            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}{page.path}") as r,
            ):
                size = len(await r.read())
        await pool.stop()
    if scrapes == 0:
        raise RuntimeError("no scrape succeeded")
    return router / scrapes * 1e6, served / scrapes * 1e6, size


def idle_serve(
    workers: int, seconds: float, servers: int = 8, *, quiet: str = "", least: int = 1
) -> tuple[float, float]:
    """(router CPU, simulators' CPU), in cores, of an idle `epick serve --workers N --min-workers
    least` (with `--idle-scrape-interval quiet` when given)."""
    base = consecutive_ports(servers)
    proxy, metrics = free_ports(2)
    sim = [sys.executable, "-m", "epick.cli.main", "sim-server", "--port", str(base), "--count", str(servers)]
    with process(sim) as fleet:
        asyncio.run(wait_http(f"http://127.0.0.1:{base + servers - 1}/metrics"))
        router = [
            sys.executable, "-m", "epick.cli.main", "serve",
            "--endpoints", ",".join(f"127.0.0.1:{base + i}" for i in range(servers)),
            "--proxy-port", str(proxy), "--metrics-port", str(metrics), "--no-extproc",
            "--workers", str(workers), "--min-workers", str(least), "--log-level", "error",
            *(["--idle-scrape-interval", quiet] if quiet else []),
        ]  # fmt: skip
        with process(router) as serve:
            asyncio.run(wait_http(f"http://127.0.0.1:{proxy}/health"))
            time.sleep(2.0)  # every worker started and scraping
            r0, f0, w0 = cpu_seconds(serve.pid), cpu_seconds(fleet.pid), time.perf_counter()
            time.sleep(seconds)
            wall = time.perf_counter() - w0
            used, served = cpu_seconds(serve.pid) - r0, cpu_seconds(fleet.pid) - f0
            serve.send_signal(signal.SIGTERM)
    return used / wall, served / wall


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="3 s windows")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else args.seconds
    console = Console(width=120)

    table = Table(
        title=f"one scrape of a vLLM-sized page (prometheus_client exposition), 50 ms, {seconds:g} s"
    )
    for col in (
        "endpoints",
        "asked for",
        "page bytes",
        "router µs/scrape",
        "server µs/scrape",
        "ratio (both)",
    ):
        table.add_column(col, justify="right")
    for endpoints in (8, 16):
        # On uvloop, as `epick serve` runs.
        whole = uvloop.run(one_scrape(endpoints, seconds, filtered=False))
        only = uvloop.run(one_scrape(endpoints, seconds, filtered=True))
        for label, (router, served, size) in (("whole page", whole), ("what is read", only)):
            ratio = (router + served) / (whole[0] + whole[1])
            table.add_row(
                str(endpoints), label, f"{size:,}", f"{router:.0f}", f"{served:.0f}", f"{ratio:.2f}"
            )
    console.print(table)

    table = Table(title=f"idle epick serve against 8 simulated servers, 50 ms, {seconds:g} s")
    for col in ("workers", "scraping", "router CPU (cores)", "servers CPU (cores)", "router / 1 worker's"):
        table.add_column(col, justify="right")
    for quiet in ("", "1s"):
        one = idle_serve(1, seconds, quiet=quiet)
        up_to_two = idle_serve(2, seconds, quiet=quiet)
        two = idle_serve(2, seconds, quiet=quiet, least=2)
        how = f"quiet ({quiet})" if quiet else "every 50 ms"
        rows = (("1", one), ("up to 2 (following load)", up_to_two), ("2 (--min-workers 2)", two))
        for workers, (router, served) in rows:
            ratio = f"{router / one[0]:.2f}" if one[0] > 0 else "–"
            table.add_row(workers, how, f"{router:.3f}", f"{served:.3f}", ratio)
    console.print(table)


if __name__ == "__main__":
    main()
