"""Workers that follow the load, from cold: `epick serve --workers 2` (one worker until the first is
busy) against `--workers 1`, under wrk's 64 kept-alive connections to static nginx backends, over
consecutive windows: requests/s in each, and how many workers serve at its end (the supervisor's
`epick_workers_serving`). The second worker needs a few busy seconds and a start; then the first
closes its kept-alive connections after their next response and wrk's reconnections spread over
both (docs/service.md, "Several processes")."""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import time
import urllib.request
from pathlib import Path

from bench_dataplane import EPICK, process, static_backends, tools_missing, wait_http, wrk
from bench_service import free_ports  # this directory is on sys.path when run as a script
from rich.console import Console
from rich.table import Table


def serving(metrics_port: int) -> str:
    page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    found = re.search(r"^epick_workers_serving (\S+)", page, re.M)
    return f"{float(found.group(1)):.0f}" if found else "1"  # one worker: no supervisor, no such series


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0, help="each window")
    parser.add_argument("--quick", action="store_true", help="3 windows of 3 s")
    args = parser.parse_args()
    windows, seconds = (3, 3.0) if args.quick else (args.windows, args.seconds)
    console = Console(width=120)
    if tools_missing(console, "bench_scaling"):
        return
    table = Table(title=f"from cold: wrk, 64 kept-alive connections, {windows} windows of {seconds:g} s")
    table.add_column("epick serve")
    for i in range(windows):
        table.add_column(f"window {i + 1}: req/s (workers serving)", justify="right")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        script, backends, _ = static_backends(stack, Path(tmp))
        for extra in (["--workers", "2"], ["--workers", "1"]):
            proxy, metrics = free_ports(2)
            cmd = [*EPICK, "serve", "--endpoints", ",".join(backends), "--log-level", "error",
                   "--proxy-port", str(proxy), "--metrics-port", str(metrics), "--no-extproc",
                   *extra]  # fmt: skip
            with process(cmd) as proc:
                wait_http(f"http://127.0.0.1:{proxy}/health", timeout=60)
                time.sleep(2.0)  # scraping, settled
                cells = []
                for _ in range(windows):
                    run = wrk(f"http://127.0.0.1:{proxy}", script, 64, seconds, [proc.pid])
                    cells.append(f"{run.rps:,.0f} ({serving(metrics)})")
            table.add_row(" ".join(extra), *cells)
    console.print(table)


if __name__ == "__main__":
    main()
