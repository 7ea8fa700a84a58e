"""The service's costs, each against a baseline measured in the same run.

1. /metrics parsing: epick's selective parser vs prometheus_client's full parser on a vLLM-sized
   page; and the CPU a scraper pool spends per 100 endpoints at the default 50 ms interval.
2. Proxy overhead: TTFT p50/p99 of streaming requests sent one at a time straight to a simulated
   server, then through `epick serve` (ratio = proxied / direct).
3. Proxy throughput: the highest completed-request rate with 64 concurrent streams through the proxy
   vs straight to the servers (simulated servers at time scale 100, so they are never the limit).
4. ext_proc through Envoy: the same load through a real Envoy asking epick, vs through the proxy.
Servers, epick and Envoy run as subprocesses; the load comes from this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from string import Template

import aiohttp
import uvloop
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from epick.config import load_default_config
from epick.plugins.datalayer.engines import ENGINES
from epick.plugins.datalayer.prometheus import parse_metrics
from epick.sim.metrics import TTFT_BUCKETS

ROOT = Path(__file__).resolve().parents[1]
EPICK = [sys.executable, "-m", "epick.cli.main"]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [int(s.getsockname()[1]) for s in socks]
    for s in socks:
        s.close()
    return ports


def consecutive_ports(n: int) -> int:
    for base in range(21000, 60000, 53):
        try:
            socks = []
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


@contextlib.contextmanager
def process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


async def wait_http(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(400):
            try:
                async with s.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


# 1. Parsing.
def vllm_page(families: int = 40) -> str:
    """A page shaped like a vLLM server's: gauges, counters, and many labelled histograms."""
    lines = []
    model = 'model_name="meta-llama/Llama-3.1-8B-Instruct"'
    for name, value in (("vllm:num_requests_running", 12), ("vllm:num_requests_waiting", 3),
                        ("vllm:kv_cache_usage_perc", 0.42), ("vllm:gpu_cache_usage_perc", 0.42)):  # fmt: skip
        lines += [f"# HELP {name} doc", f"# TYPE {name} gauge", f"{name}{{{model}}} {value}"]
    lines.append(
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9'
    )
    lines.append(f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="27000",{model}}} 1.0')
    buckets = TTFT_BUCKETS[:17]  # a vLLM histogram's buckets
    for f in range(families):
        name = f"vllm:histogram_family_{f}_seconds"
        lines += [f"# HELP {name} doc", f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{b}",{model}}} {i * 7}' for i, b in enumerate(buckets)]
        lines += [
            f'{name}_bucket{{le="+Inf",{model}}} 200',
            f"{name}_count{{{model}}} 200",
            f"{name}_sum{{{model}}} 31.5",
        ]
    return "\n".join(lines) + "\n"


def full_parser(text: str) -> dict[str, float]:
    wanted = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[sample.name] = sample.value
    return out


def bench_parse() -> tuple[int, float, float]:
    page = vllm_page()
    names = ENGINES["vllm"]
    n = 300
    t = time.perf_counter()
    for _ in range(n):
        parse_metrics(page, names)
    ours = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n // 3):
        full_parser(page)
    theirs = (time.perf_counter() - t) / (n // 3)
    return page.count("\n"), ours, theirs


async def bench_scrape_cpu(endpoints: int, seconds: float) -> float:
    """CPU seconds per wall second of a ScraperPool polling `endpoints` fake servers every 50 ms."""
    from epick.datalayer.datastore import Datastore, EndpointSpec
    from epick.datalayer.scraper import ScraperPool

    # The page is served by another process, so only the scrapers' CPU is counted here.
    base = consecutive_ports(1)
    with process([sys.executable, "-c", _PAGE_SERVER, str(base), str(Path(__file__).parent)]):
        await wait_http(f"http://127.0.0.1:{base}/metrics")
        store = Datastore()
        store.replace_all(EndpointSpec(f"e{i}", "127.0.0.1", base, {}) for i in range(endpoints))
        pool = ScraperPool(store, interval=0.05, plan=load_default_config(seed=0).data_layer)
        await pool.start()
        await asyncio.sleep(1.0)
        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        used = (time.process_time() - cpu) / (time.perf_counter() - wall)
        scrapes = sum(s.scrapes for group in pool.scrapers.values() for s in group)
        await pool.stop()
        if scrapes == 0:
            raise RuntimeError("no scrape succeeded")
    return used


_PAGE_SERVER = """
import sys
from aiohttp import web
sys.path.insert(0, sys.argv[2])
from bench_service import vllm_page
page = vllm_page()
async def metrics(request):
    return web.Response(text=page)
app = web.Application()
app.router.add_get('/metrics', metrics)
web.run_app(app, host='127.0.0.1', port=int(sys.argv[1]), print=None, access_log=None)
"""


# 2-4. Load through the service.
BODY = {"model": "sim-model", "prompt": "benchmark prompt " * 50, "max_tokens": 8, "stream": True}


async def one_ttft(session: aiohttp.ClientSession, url: str) -> float:
    start = time.perf_counter()
    async with session.post(url, json=BODY) as r:
        r.raise_for_status()
        async for _ in r.content.iter_any():
            first = time.perf_counter() - start
            break
        else:
            raise RuntimeError("empty response")
        async for _ in r.content.iter_any():
            pass
    return first


async def ttfts(url: str, n: int) -> tuple[float, float]:
    async with aiohttp.ClientSession() as session:
        for _ in range(10):
            await one_ttft(session, url)
        values = sorted([await one_ttft(session, url) for _ in range(n)])
    return values[len(values) // 2], values[min(len(values) - 1, int(len(values) * 0.99))]


async def throughput(urls: list[str], n: int, concurrency: int) -> float:
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        work = iter(range(n))

        async def worker() -> None:
            nonlocal done
            for i in work:
                async with session.post(urls[i % len(urls)], json=BODY) as r:
                    r.raise_for_status()
                    async for _ in r.content.iter_any():
                        pass
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - start)


FULL_DUPLEX = "FULL_DUPLEX_STREAMED"


def envoy_config(listen: int, admin: int, grpc: int, body_mode: str) -> str:
    """Envoy in front of epick: the request body as GIE's gateways send it (full duplex), the response
    body in `body_mode`."""
    template = Template((ROOT / "tests" / "extproc" / "envoy.yaml.tmpl").read_text())
    return template.substitute(
        listen_port=listen,
        admin_port=admin,
        grpc_port=grpc,
        failure_mode_allow="false",
        request_body_mode=FULL_DUPLEX,
        response_body_mode=body_mode,
        request_trailer_mode="SEND",
        response_trailer_mode="SEND" if body_mode == FULL_DUPLEX else "SKIP",
        early_body="false",
        allow_mode_override="false",
    )


async def bench_service(quick: bool) -> dict[str, float]:
    results: dict[str, float] = {}
    base = consecutive_ports(4)
    proxy_port, metrics_port, grpc_port, health_port, listen, admin = free_ports(6)
    sims = [f"127.0.0.1:{base + i}" for i in range(4)]
    n = 100 if quick else 400
    with process([*EPICK, "sim-server", "--port", str(base), "--count", "4", "--time-scale", "1"]):
        await wait_http(f"http://{sims[0]}/health")
        serve = [*EPICK, "serve", "--workers", "1", "--endpoints", ",".join(sims[:1]),
                 "--proxy-port", str(proxy_port), "--metrics-port", str(metrics_port), "--no-extproc",
                 "--log-level", "error"]  # fmt: skip
        with process(serve):
            await wait_http(f"http://127.0.0.1:{proxy_port}/health")
            await asyncio.sleep(0.5)
            results["direct_p50"], results["direct_p99"] = await ttfts(f"http://{sims[0]}/v1/completions", n)
            results["proxy_p50"], results["proxy_p99"] = await ttfts(
                f"http://127.0.0.1:{proxy_port}/v1/completions", n
            )
    with process([*EPICK, "sim-server", "--port", str(base), "--count", "4", "--time-scale", "100"]):
        await wait_http(f"http://{sims[0]}/health")
        results["direct_rps"] = await throughput([f"http://{s}/v1/completions" for s in sims], n * 3, 64)
        with process([*EPICK, "serve", "--workers", "1", "--endpoints", ",".join(sims),
                      "--proxy-port", str(proxy_port), "--grpc-port", str(grpc_port),
                      "--grpc-health-port", str(health_port),
                      "--metrics-port", str(metrics_port), "--log-level", "error"]):  # fmt: skip
            await wait_http(f"http://127.0.0.1:{proxy_port}/health")
            await asyncio.sleep(0.5)
            results["proxy_rps"] = await throughput(
                [f"http://127.0.0.1:{proxy_port}/v1/completions"], n * 3, 64
            )
            for body_mode in (FULL_DUPLEX, "STREAMED", "NONE"):
                with tempfile.TemporaryDirectory() as tmp:
                    path = Path(tmp) / "envoy.yaml"
                    path.write_text(envoy_config(listen, admin, grpc_port, body_mode))
                    envoy = str(Path(sys.executable).with_name("envoy"))
                    with process([envoy, "-c", str(path), "--concurrency", "1", "--log-level", "error",
                                  "--base-id", str(listen)]):  # fmt: skip
                        await wait_http(f"http://127.0.0.1:{admin}/ready")
                        url = f"http://127.0.0.1:{listen}/v1/completions"
                        results[f"envoy_{body_mode}_rps"] = await throughput([url], n * 3, 64)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    console = Console()
    lines, ours, theirs = bench_parse()
    cpu = uvloop.run(bench_scrape_cpu(100, 2.0 if args.quick else 5.0))  # as `epick serve` runs
    t = Table(title=f"/metrics parsing ({lines}-line vLLM-shaped page)")
    for col in ("parser", "µs per page", "ratio to prometheus_client"):
        t.add_column(col, justify="right")
    t.add_row("epick (selective)", f"{ours * 1e6:,.0f}", f"{ours / theirs:.2f}")
    t.add_row("prometheus_client (full)", f"{theirs * 1e6:,.0f}", "1.00")
    console.print(t)
    console.print(f"scraper pool, 100 endpoints every 50 ms: {cpu:.2f} CPU cores")
    r = asyncio.run(bench_service(args.quick))
    t = Table(title="proxy and ext_proc (simulated servers; ratios against the direct baseline)")
    for col in ("measure", "direct", "through epick", "ratio"):
        t.add_column(col, justify="right")
    t.add_row("TTFT p50 (ms), one at a time", f"{r['direct_p50'] * 1e3:.2f}", f"{r['proxy_p50'] * 1e3:.2f}",
              f"{r['proxy_p50'] / r['direct_p50']:.2f}")  # fmt: skip
    t.add_row("TTFT p99 (ms), one at a time", f"{r['direct_p99'] * 1e3:.2f}", f"{r['proxy_p99'] * 1e3:.2f}",
              f"{r['proxy_p99'] / r['direct_p99']:.2f}")  # fmt: skip
    t.add_row("requests/s, 64 streams, proxy", f"{r['direct_rps']:,.0f}", f"{r['proxy_rps']:,.0f}",
              f"{r['proxy_rps'] / r['direct_rps']:.2f}")  # fmt: skip
    for mode, label in (
        (FULL_DUPLEX, "full duplex, GIE's setting"),
        ("STREAMED", "every chunk to epick"),
        ("NONE", "no response body to epick"),
    ):
        rps = r[f"envoy_{mode}_rps"]
        row = f"requests/s, 64 streams, Envoy + ext_proc, {label}"
        t.add_row(row, f"{r['direct_rps']:,.0f}", f"{rps:,.0f}", f"{rps / r['direct_rps']:.2f}")
    console.print(t)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
