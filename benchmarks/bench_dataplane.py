"""The data plane side by side: epick's proxy and Envoy + epick's ext_proc against vllm-router.

Method (issue 15's): static backends (nginx answering a canned OpenAI chat completion, and a
vLLM-shaped /metrics page for epick's scrapers), load from wrk at 64 connections for a few seconds
per run, a 2 KB chat body over 16 shared prefixes, the fronts measured in interleaved rounds (each
front once per round, medians over rounds), and every figure also as a ratio within this run:
- requests/s, and the ratio to vllm-router's cache_aware policy;
- CPU per request: the front's own processes (user + system time over the run / requests);
- latency p50 and p99 at 64 connections, and p99 / p50;
- added latency at one connection: p50 through the front minus p50 straight to a backend.
Only the front measured runs: the others are stopped (SIGSTOP) meanwhile, so their scrapers and
health checks take nothing from it. Each run also records how busy the machine was and what the load
generator (wrk and nginx) took, which bounds what `--workers 2` can gain on a machine this small.

Needs `wrk` and `nginx` on PATH (Debian: apt-get install wrk nginx-light); vllm-router rows need
the `vllm-router` package (pip install -e '.[bench]'). What is missing is skipped, and said.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from bench_service import free_ports  # this directory is on sys.path when run as a script
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
EPICK = [sys.executable, "-m", "epick.cli.main"]
BACKENDS = 4
PREFIXES = 16

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "sim-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A short canned answer from a static backend."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 512, "completion_tokens": 9, "total_tokens": 521},
    }
)
METRICS = "\n".join(
    [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{model_name="sim-model"} 0',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{model_name="sim-model"} 0',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{model_name="sim-model"} 0.1',
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="27000"} 1.0',
        "",
    ]
)

# 16 shared system prompts of about 1.9 KB, each followed by a short question: 2 KB bodies.
WRK_SCRIPT = Template(r"""
local prefixes = {}
for p = 1, $prefixes do
  local words = {}
  for w = 1, 300 do words[w] = "tok" .. ((p * 7919 + w * 104729) % 5000) end
  prefixes[p] = table.concat(words, " ")
end
-- Each request formatted once per thread, in init (where wrk.format knows the Host header):
-- formatted on every call, wrk spent about 7 us per request straight to nginx instead of 5.
local requests = {}
init = function(args)
  for i = 1, $prefixes * 8 do
    local p = ((i - 1) % $prefixes) + 1
    local body = '{"model":"sim-model","max_tokens":16,"messages":[{"role":"system","content":"' ..
      prefixes[p] .. '"},{"role":"user","content":"question number ' .. i .. ' about this"}]}'
    requests[i] = wrk.format("POST", "/v1/chat/completions", {["Content-Type"] = "application/json"}, body)
  end
end
local n = 0
request = function()
  n = n + 1
  return requests[(n % #requests) + 1]
end
""")


@contextlib.contextmanager
def process(args: list[str], log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A subprocess for the duration; its output to `log` (for the error when it does not come up)."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not None:
            out.close()  # type: ignore[union-attr]


def wait_http(
    url: str, method: str = "GET", body: bytes | None = None, timeout: float = 30.0, log: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            request = urllib.request.Request(url, data=body, method=method)
            request.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(request, timeout=2) as r:
                if r.status < 500:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
    raise RuntimeError(
        f"{url} did not answer within {timeout:g}s" + (f"; its log ends:\n{tail}" if tail else "")
    )


def nginx_config(tmp: Path, ports: list[int]) -> Path:
    servers = "\n".join(
        f"""  server {{
    listen 127.0.0.1:{port} reuseport backlog=4096;
    keepalive_requests 1000000;
    location = /metrics {{ default_type text/plain; return 200 '{METRICS}'; }}
    location / {{ default_type application/json; return 200 '{COMPLETION}'; }}
  }}"""
        for port in ports
    )
    path = tmp / "nginx.conf"
    path.write_text(
        f"""daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx.error.log error;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  client_body_buffer_size 64k;
{servers}
}}
"""
    )
    return path


FULL_DUPLEX = "FULL_DUPLEX_STREAMED"
# Envoy + epick's ext_proc: (name, request body mode, response body mode, allow_mode_override, epick's
# extra arguments). The first is GIE's gateway setting with epick's defaults.
EXTPROC_VARIANTS: list[tuple[str, str, str, bool, list[str]]] = [
    ("Envoy + epick ext_proc (GIE modes)", FULL_DUPLEX, FULL_DUPLEX, False, ["--workers", "1"]),
    ("Envoy + epick ext_proc (GIE modes; reads no response)", FULL_DUPLEX, FULL_DUPLEX, False,
     ["--workers", "1", "--no-usage-metrics", "--outlier-consecutive-5xx", "0"]),
    ("Envoy + epick ext_proc (buffered; mode_override)", "BUFFERED", "STREAMED", True,
     ["--workers", "1", "--no-usage-metrics"]),
    ("Envoy (2 threads) + epick ext_proc (GIE modes; 2 workers)", FULL_DUPLEX, FULL_DUPLEX, False,
     ["--workers", "2", "--min-workers", "2"]),
]  # fmt: skip


def envoy_config(
    tmp: Path, listen: int, admin: int, grpc: int, *, modes: tuple[str, str] = (FULL_DUPLEX, FULL_DUPLEX),
    allow_override: bool = False,
) -> Path:  # fmt: skip
    """Envoy in front of epick's ext_proc with these body modes (GIE's gateways: both full duplex)."""
    template = Template((ROOT / "tests" / "extproc" / "envoy.yaml.tmpl").read_text())
    path = tmp / f"envoy-{listen}.yaml"
    request, response = modes
    path.write_text(
        template.substitute(
            listen_port=listen,
            admin_port=admin,
            grpc_port=grpc,
            failure_mode_allow="false",
            request_body_mode=request,
            response_body_mode=response,
            request_trailer_mode="SEND" if request == FULL_DUPLEX else "SKIP",
            response_trailer_mode="SEND" if response == FULL_DUPLEX else "SKIP",
            early_body="false",
            allow_mode_override="true" if allow_override else "false",
        )
    )
    return path


@dataclass
class Run:
    rps: float
    p50: float
    p99: float
    requests: int
    cpu: float  # CPU seconds of the front's processes over the run
    seconds: float = 0.0  # the run's wall time
    busy: float = 0.0  # CPU seconds the whole machine spent over the run (all processes)
    load: float = 0.0  # CPU seconds of the load generator: wrk, and the nginx backends when given


@dataclass
class Front:
    name: str
    url: str
    pids: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    single: list[float] = field(default_factory=list)  # p50 at one connection, per round


def _family(pid: int) -> Iterator[int]:
    """The process and its live descendants (`epick serve --workers`' workers)."""
    yield pid
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            yield from _family(int(child))


def cpu_seconds(pids: list[int]) -> float:
    """User + system time of these processes, their live descendants, and the children they waited for."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in (p for root in pids for p in _family(root)):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    return total


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _duration(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text)
    if m is None:
        raise ValueError(f"wrk printed a latency {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def machine_busy() -> float:
    """CPU seconds the machine has spent outside idle and iowait since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wrk(
    url: str, script: Path, connections: int, seconds: float, pids: list[int], *, backends: int | None = None
) -> Run:
    """One wrk run against `url`; `pids` are the front's processes, `backends` nginx's pid (its CPU
    counted as load)."""
    before = cpu_seconds(pids)
    nginx = [backends] if backends is not None else []
    load_before, busy_before, started = cpu_seconds(nginx) + _children_cpu(), machine_busy(), time.monotonic()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cpu = cpu_seconds(pids) - before
    wall, busy = time.monotonic() - started, machine_busy() - busy_before
    load = cpu_seconds(nginx) + _children_cpu() - load_before
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _duration(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _duration(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} responses were errors")
    return Run(rps, p50, p99, requests, cpu, wall, busy, load)


def run_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments every wrk benchmark takes: --rounds, --seconds, --quick (see `rounds_of`)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="each run at 64 connections")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 2 s")
    return parser


def rounds_of(args: argparse.Namespace) -> None:
    if args.quick:
        args.rounds, args.seconds = 2, 2.0


def tools_missing(console: Console, name: str, *also: str) -> bool:
    """Whether wrk, nginx (or the tools in `also`, paths or names) are missing; if so, say so."""
    missing = [tool for tool in ("wrk", "nginx") if shutil.which(tool) is None]
    missing += [Path(tool).name for tool in also if not Path(tool).exists() and shutil.which(tool) is None]
    if missing:
        console.print(f"{name}: skipped, {' and '.join(missing)} not found "
                      "(Debian: apt-get install wrk nginx-light)")  # fmt: skip
    return bool(missing)


def main() -> None:
    parser = run_parser(__doc__)
    parser.add_argument("--only", default="", help="comma-separated front names to run (default: all)")
    args = parser.parse_args()
    rounds_of(args)
    console = Console(width=170)
    if tools_missing(console, "bench_dataplane"):
        return
    with tempfile.TemporaryDirectory() as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        script, backends, nginx = static_backends(stack, tmp)
        fronts = [Front("direct (nginx)", f"http://{backends[0]}")]
        fronts += start_fronts(stack, tmp, backends, args, console)
        time.sleep(1.0)  # scrapers have read every backend
        for front in fronts:  # warm-up: connection pools, caches, first paths
            wrk(front.url, script, 64, 1.0, front.pids)
        with stopped([f.pids for f in fronts]) as paused:
            for _ in range(args.rounds):
                for front in fronts:
                    with running(front.pids, paused):
                        run = wrk(front.url, script, 64, args.seconds, front.pids, backends=nginx)
                        front.runs.append(run)
                        single = wrk(front.url, script, 1, max(1, round(args.seconds / 2)), front.pids)
                        front.single.append(single.p50)
    report(console, fronts, args)


SETTLE = 0.5  # after a front resumes: its scrapers read the backends again, its timers catch up


@contextlib.contextmanager
def stopped(groups: list[list[int]]) -> Iterator[set[int]]:
    """Every process of these fronts (and their descendants) stopped for the duration, and continued
    after it whatever happens; yields the set of stopped pids, which `running` takes from."""
    paused = {pid for pids in groups for root in pids for pid in _family(root)}
    try:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield paused
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@contextlib.contextmanager
def running(pids: list[int], paused: set[int]) -> Iterator[None]:
    """One front's processes continued for the duration (of those `stopped` paused), then stopped again."""
    family = [pid for root in pids for pid in _family(root) if pid in paused]
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    if family:
        time.sleep(SETTLE)
    try:
        yield
    finally:
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)


def static_backends(stack: contextlib.ExitStack, tmp: Path) -> tuple[Path, list[str], int]:
    """wrk's script in `tmp`, and the static backends (one nginx on BACKENDS ports) answering: their
    host:port and nginx's pid; nginx stops with `stack`."""
    script = tmp / "chat.lua"
    script.write_text(WRK_SCRIPT.substitute(prefixes=PREFIXES))
    ports = free_ports(BACKENDS)
    backends = [f"127.0.0.1:{p}" for p in ports]
    nginx = stack.enter_context(process(["nginx", "-c", str(nginx_config(tmp, ports))]))
    for b in backends:
        wait_http(f"http://{b}/metrics")
    return script, backends, nginx.pid


def start_fronts(
    stack: contextlib.ExitStack, tmp: Path, backends: list[str], args: argparse.Namespace, console: Console
) -> list[Front]:
    """vllm-router (two policies), epick's proxy (two configs) and Envoy + epick's ext_proc,
    each started and answering; those not wanted (`--only`) or not installed are left out."""
    only = {n for n in args.only.split(",") if n}
    fronts: list[Front] = []
    router = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    if not Path(router).exists():
        console.print("vllm-router not installed (pip install -e '.[bench]'): its rows are skipped")
    for policy in ("round_robin", "cache_aware") if Path(router).exists() else ():
        name = f"vllm-router {policy}"
        if only and name not in only:
            continue
        port, prometheus = free_ports(2)
        cmd = [router, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
               "--prometheus-port", str(prometheus), "--log-level", "error",
               "--worker-urls", *(f"http://{b}" for b in backends)]  # fmt: skip
        log = tmp / f"router-{policy}.log"
        proc = stack.enter_context(process(cmd, log))
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60, log=log)
        fronts.append(Front(name, f"http://127.0.0.1:{port}", [proc.pid]))
    variants: list[tuple[str, list[str]]] = [
        ("epick proxy default", ["--workers", "1"]),
        ("epick proxy default (2 workers)", ["--workers", "2", "--min-workers", "2"]),
        # Starts with one; a second joins once the first is busy (and retires after 30 idle seconds).
        ("epick proxy default (up to 2 workers)", ["--workers", "2"]),
        (
            "epick proxy round-robin",
            ["--workers", "1", "--config-file", str(ROOT / "config" / "round-robin.yaml")],
        ),
    ]
    serve = [*EPICK, "serve", "--endpoints", ",".join(backends), "--log-level", "error"]
    for name, extra in variants:
        if only and name not in only:
            continue
        proxy, metrics = free_ports(2)
        cmd = [*serve, "--proxy-port", str(proxy), "--metrics-port", str(metrics), "--no-extproc", *extra]
        log = tmp / f"epick-{proxy}.log"
        proc = stack.enter_context(process(cmd, log))
        wait_http(f"http://127.0.0.1:{proxy}/health", timeout=60, log=log)
        fronts.append(Front(name, f"http://127.0.0.1:{proxy}", [proc.pid]))
    envoy = str(Path(sys.executable).with_name("envoy"))
    for name, request, response, allow_override, extra in EXTPROC_VARIANTS if Path(envoy).exists() else []:
        if only and name not in only:
            continue
        grpc, health, metrics, listen, admin = free_ports(5)
        cmd = [*serve, "--no-proxy", "--grpc-port", str(grpc), "--grpc-health-port", str(health),
               "--metrics-port", str(metrics), *extra]  # fmt: skip
        epick_log, envoy_log = tmp / f"epick-{grpc}.log", tmp / f"envoy-{listen}.log"
        epick = stack.enter_context(process(cmd, epick_log))
        config = envoy_config(
            tmp, listen, admin, grpc, modes=(request, response), allow_override=allow_override
        )
        cmd = [
            envoy,
            "-c",
            str(config),
            "--concurrency",
            # One Envoy thread opens one connection to ext_proc; with epick's workers, one per worker.
            next((extra[i + 1] for i, a in enumerate(extra) if a == "--workers"), "1"),
            "--log-level",
            "error",
            "--base-id",
            str(listen),
        ]
        proc = stack.enter_context(process(cmd, envoy_log))
        wait_http(f"http://127.0.0.1:{admin}/ready", timeout=60, log=envoy_log)
        url = f"http://127.0.0.1:{listen}"
        body = b'{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}'
        wait_http(f"{url}/v1/chat/completions", "POST", body, timeout=60, log=epick_log)
        fronts.append(Front(name, url, [epick.pid, proc.pid]))
    return fronts


def report(console: Console, fronts: list[Front], args: argparse.Namespace) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    direct = fronts[0]
    base_single = med(direct.single)
    reference = next((f for f in fronts if f.name == "vllm-router cache_aware"), None)
    ref_rps = med([r.rps for r in reference.runs]) if reference else None
    t = Table(
        title=f"data plane: static backends, wrk 64 connections, 2 KB chat bodies over {PREFIXES} prefixes "
        f"({args.rounds} interleaved rounds of {args.seconds:g} s; medians)"
    )
    for col in ("front", "req/s", "× vllm-router cache_aware", "CPU µs/request", "p50 ms", "p99 ms",
                "p99/p50", "added p50 at 1 conn (µs)"):  # fmt: skip
        t.add_column(col, justify="right")
    for f in fronts:
        rps = med([r.rps for r in f.runs])
        cpu = med([r.cpu / r.requests for r in f.runs]) if f.pids else float("nan")
        p50, p99 = med([r.p50 for r in f.runs]), med([r.p99 for r in f.runs])
        added = (med(f.single) - base_single) * 1e6 if f is not direct else 0.0
        t.add_row(
            f.name,
            f"{rps:,.0f}",
            f"{rps / ref_rps:.2f}" if ref_rps else "–",
            f"{cpu * 1e6:,.0f}" if f.pids else "–",
            f"{p50 * 1e3:.1f}",
            f"{p99 * 1e3:.1f}",
            f"{p99 / p50:.2f}",
            f"{added:+,.0f}" if f is not direct else "0",
        )
    console.print(t)
    by_name = {f.name: f for f in fronts if f.runs}
    one, two = by_name.get("epick proxy default"), by_name.get("epick proxy default (2 workers)")
    if one and two:
        console.print(workers_line(one, two))


def workers_line(one: Front, two: Front) -> str:
    """`--workers 2` against one worker, and what this machine leaves the workers: its cores less what
    the load generator and everything else took during the two-worker runs, over the cores one
    worker used (the most two workers could serve, each core as productive as one worker's)."""

    def med(values: list[float]) -> float:
        return statistics.median(values)

    cores = len(os.sched_getaffinity(0))
    rps1, rps2 = med([r.rps for r in one.runs]), med([r.rps for r in two.runs])
    used1 = med([r.cpu / r.seconds for r in one.runs])
    used2 = med([r.cpu / r.seconds for r in two.runs])
    load2 = med([r.load / r.seconds for r in two.runs])
    rest2 = med([max(0.0, r.busy - r.cpu - r.load) / r.seconds for r in two.runs])
    free = cores - load2 - rest2
    return (
        f"--workers 2 against one worker (default config): {rps2 / rps1:.2f}× the requests/s. "
        f"One worker used {used1:.2f} cores; during the two-worker runs the load generator "
        f"(wrk + nginx) took {load2:.2f} and everything else {rest2:.2f} of this machine's {cores}, "
        f"leaving {free:.2f} for the workers (they used {used2:.2f}): at most {free / used1:.2f}× here. "
        f"Per core used, two workers served {(rps2 / used2) / (rps1 / used1):.2f}× what one did."
    )


if __name__ == "__main__":
    main()
