"""Soak test: does `epick serve`'s memory stay bounded under steady load?

What it measures: the resident set size (VmRSS, from /proc/PID/status) of the `epick serve` process
alone, sampled every 10 s while 32 (by default) concurrent clients send a steady, realistic mix
through its OpenAI-compatible proxy for `--minutes` minutes. It prints one row per minute (requests
done, errors, RSS, RSS change per minute) and a verdict that compares the RSS growth rate (least
squares slope, MB/min) over the last third of the run with the first third: memory that levels off
shows a last-third slope near zero.

The load: chat and completion requests alternating at random, each prompt one of ~200 fixed shared
prefixes (system prompts, 500 to 6,000 characters) followed by a random suffix (100 to 1,000
characters), so the prefix-cache scorer's index keeps learning new blocks until each endpoint's LRU
is full; a share of them streamed (`--stream-share`). Everything random comes from `--seed`. An
error is a status other than 200, a stream that ends without `data: [DONE]` or carries an error
event, a body that is not a completion, or a client-side exception.

The processes: `epick sim-server --count N --time-scale 1000` (simulated vLLM servers, fast enough
never to be the limit) and `epick serve --endpoints ... --no-extproc --metrics-port 0` each run as
their own subprocess on free loopback ports, so the RSS measured is epick's alone; the load comes
from this process. Both are stopped on every exit (Ctrl-C and SIGTERM included), and are asked to
die with this process should it be killed outright (Linux).

Run it:

    python benchmarks/soak.py --minutes 20 --concurrency 32 --servers 4 [--stream-share 0.5] \
        [--json out.json]

`--serve-wrapper FILE` runs `python FILE serve ...` in place of `python -m epick.cli.main serve ...`
(for instance a script that starts tracemalloc and then calls `epick.cli.main.main`), and
`--log-dir DIR` keeps both subprocesses' output there (a temporary directory otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import signal
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from bench_service import consecutive_ports, free_ports

EPICK = [sys.executable, "-m", "epick.cli.main"]
SAMPLE_EVERY_S = 10.0
MODEL = "sim-model"
N_PREFIXES = 200
PREFIX_CHARS = (500, 6000)
SUFFIX_CHARS = (100, 1000)
_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at an which but not have "
    "has had were their they can more one all will also other these its been into only most some time "
    "such than when then would about there them many first may new over used after between each two "
    "where both very through during model token cache request server batch prefix decode prefill "
    "memory block queue route endpoint latency throughput system data result value customer order "
    "invoice policy support answer question document summary translate review code function error"
)
WORDS = _WORDS.split()


# Processes.
def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when this process dies (Linux), even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Processes:
    """Subprocesses, each in its own process group, all stopped by `stop` (idempotent)."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self._files: list[Any] = []

    def start(self, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        out = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self._files.append(out)
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches this process only; it stops the children itself
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509 (before any thread)
        )
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        for f in self._files:
            f.close()
        self._files.clear()


def rss_mb(pid: int) -> float:
    """VmRSS of `pid` in MB (2**20 bytes)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# The load.
def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def make_prefixes(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"System prompt #{i}: " + _text(rng, rng.randint(*PREFIX_CHARS)) for i in range(N_PREFIXES)]


def make_body(rng: random.Random, prefixes: list[str], stream_share: float) -> tuple[str, dict[str, Any]]:
    prefix = rng.choice(prefixes)
    # Random characters as well as words: a suffix shares no block with any other prompt's.
    tag = "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))
    suffix = f" [{tag}] " + _text(rng, rng.randint(*SUFFIX_CHARS))
    stream = rng.random() < stream_share
    max_tokens = rng.randint(4, 48)
    if rng.random() < 0.5:
        body: dict[str, Any] = {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": prefix},
                {"role": "user", "content": "Question:" + suffix},
            ],
            "max_tokens": max_tokens,
            "stream": stream,
        }
        return "/v1/chat/completions", body
    return "/v1/completions", {"model": MODEL, "prompt": prefix + suffix, "max_tokens": max_tokens,
                               "stream": stream}  # fmt: skip


@dataclass
class Counters:
    requests: int = 0
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    prompt_bytes: int = 0

    def error(self, kind: str) -> None:
        self.errors += 1
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1


async def one_request(
    session: aiohttp.ClientSession, base: str, path: str, body: dict[str, Any], counters: Counters
) -> None:
    try:
        async with session.post(base + path, json=body) as r:
            if r.status != 200:
                await r.read()
                counters.error(f"status {r.status}")
                return
            if body["stream"]:
                data = b""
                async for chunk in r.content.iter_any():
                    data += chunk
                if b'"error"' in data:
                    counters.error("error event in stream")
                elif not data.rstrip().endswith(b"data: [DONE]"):
                    counters.error("stream without [DONE]")
            else:
                answer = await r.json()
                if not answer.get("choices"):
                    counters.error("no choices")
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
        counters.error(type(e).__name__)
    finally:
        counters.requests += 1


async def client(
    *,
    worker: int,
    session: aiohttp.ClientSession,
    base: str,
    prefixes: list[str],
    args: argparse.Namespace,
    counters: Counters,
    stop_at: float,
) -> None:
    rng = random.Random(args.seed * 1000 + worker)
    while time.monotonic() < stop_at:
        path, body = make_body(rng, prefixes, args.stream_share)
        await one_request(session, base, path, body, counters)


@dataclass
class Sample:
    t_s: float
    requests: int
    errors: int
    rss_mb: float


async def wait_ready(base: str, servers: int, procs: list[subprocess.Popen[bytes]]) -> None:
    """The proxy's /health lists every endpoint, and one request goes through."""
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args!r} exited with {p.returncode} before the load started")
            try:
                async with s.get(base + "/health") as r:
                    if r.status == 200 and (await r.json()).get("endpoints") == servers:
                        body = {"model": MODEL, "prompt": "warm up", "max_tokens": 2}
                        async with s.post(base + "/v1/completions", json=body) as c:
                            if c.status == 200:
                                return
            except (aiohttp.ClientError, json.JSONDecodeError):
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{base} did not become ready in 60 s")


async def run_load(args: argparse.Namespace, base: str, serve_pid: int) -> tuple[list[Sample], Counters]:
    prefixes = make_prefixes(args.seed)
    counters = Counters()
    samples = [Sample(0.0, 0, 0, rss_mb(serve_pid))]
    print(f"t=0s  RSS {samples[0].rss_mb:.1f} MB (before load)", flush=True)
    start = time.monotonic()
    stop_at = start + args.minutes * 60
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        workers = [
            asyncio.create_task(
                client(
                    worker=i,
                    session=session,
                    base=base,
                    prefixes=prefixes,
                    args=args,
                    counters=counters,
                    stop_at=stop_at,
                )
            )
            for i in range(args.concurrency)
        ]
        try:
            next_sample = start + SAMPLE_EVERY_S
            while True:
                await asyncio.sleep(max(0.0, next_sample - time.monotonic()))
                now = time.monotonic()
                s = Sample(round(now - start, 1), counters.requests, counters.errors, rss_mb(serve_pid))
                samples.append(s)
                if args.verbose:
                    print(f"t={s.t_s:.0f}s requests {s.requests} errors {s.errors} RSS {s.rss_mb:.1f} MB",
                          flush=True)  # fmt: skip
                next_sample += SAMPLE_EVERY_S
                if next_sample > stop_at + 1e-6:
                    break
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    return samples, counters


# Reporting.
def slope(points: list[Sample]) -> float:
    """Least-squares RSS slope in MB per minute."""
    if len(points) < 2:
        return 0.0
    xs = [p.t_s / 60 for p in points]
    ys = [p.rss_mb for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def minute_rows(samples: list[Sample]) -> list[dict[str, float]]:
    rows = []
    per_minute = int(60 / SAMPLE_EVERY_S)
    previous = samples[0]
    for i in range(per_minute, len(samples), per_minute):
        s = samples[i]
        minutes = (s.t_s - previous.t_s) / 60
        rows.append({
            "minute": round(s.t_s / 60, 2),
            "requests": s.requests,
            "errors": s.errors,
            "rss_mb": round(s.rss_mb, 1),
            "delta_mb_per_min": round((s.rss_mb - previous.rss_mb) / minutes, 2),
            "requests_per_s": round((s.requests - previous.requests) / (s.t_s - previous.t_s), 1),
        })  # fmt: skip
        previous = s
    return rows


def verdict(samples: list[Sample]) -> dict[str, Any]:
    loaded = samples[1:]  # from the first sample under load
    third = max(2, len(loaded) // 3)
    first, last = slope(loaded[:third]), slope(loaded[-third:])
    growth = loaded[-1].rss_mb - loaded[0].rss_mb
    if last <= 0.1 or last <= 0.1 * max(first, 0.0):
        text = f"levels off: {last:+.2f} MB/min over the last third vs {first:+.2f} MB/min over the first"
        bounded = True
    else:
        text = (f"still growing: {last:+.2f} MB/min over the last third vs {first:+.2f} MB/min over "
                f"the first")  # fmt: skip
        bounded = False
    return {
        "first_third_mb_per_min": round(first, 3),
        "last_third_mb_per_min": round(last, 3),
        "growth_under_load_mb": round(growth, 1),
        "bounded": bounded,
        "text": text,
    }


def print_report(args: argparse.Namespace, samples: list[Sample], counters: Counters) -> dict[str, Any]:
    rows = minute_rows(samples)
    v = verdict(samples)
    print()
    print(f"epick serve RSS under {args.concurrency} clients, {args.servers} sim servers, "
          f"stream share {args.stream_share}, seed {args.seed}")  # fmt: skip
    print(f"{'minute':>7} {'requests':>10} {'errors':>7} {'req/s':>7} {'RSS MB':>8} {'delta MB/min':>13}")
    print(f"{0:>7} {0:>10} {0:>7} {'':>7} {samples[0].rss_mb:>8.1f} {'':>13}")
    for r in rows:
        print(f"{r['minute']:>7g} {r['requests']:>10} {r['errors']:>7} {r['requests_per_s']:>7.1f} "
              f"{r['rss_mb']:>8.1f} {r['delta_mb_per_min']:>+13.2f}")  # fmt: skip
    if counters.error_kinds:
        print("errors:", ", ".join(f"{k}: {n}" for k, n in sorted(counters.error_kinds.items())))
    print(f"verdict: {v['text']} (RSS {samples[1].rss_mb:.1f} -> {samples[-1].rss_mb:.1f} MB under load)")
    return {
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "samples": [asdict(s) for s in samples],
        "minutes": rows,
        "errors": counters.error_kinds,
        "verdict": v,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the samples, the per-minute table and the verdict here")
    parser.add_argument("--serve-wrapper", help="run `python FILE serve ...` instead of `epick serve ...`")
    parser.add_argument("--log-dir", help="keep the subprocesses' output here")
    parser.add_argument("--verbose", action="store_true", help="print every 10 s sample as it is taken")
    args = parser.parse_args()

    # SIGTERM (and SIGHUP) end the run the way Ctrl-C does: through the `finally` that stops the children.
    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # under nohup, a hangup stays ignored
        signal.signal(signal.SIGHUP, _terminate)

    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="epick-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = Processes()
    try:
        sim_base = consecutive_ports(args.servers)
        (proxy_port,) = free_ports(1)
        sims = ",".join(f"127.0.0.1:{sim_base + i}" for i in range(args.servers))
        sim_cmd = [*EPICK, "sim-server", "--port", str(sim_base), "--count", str(args.servers),
                   "--time-scale", "1000", "--seed", str(args.seed)]  # fmt: skip
        procs.start(sim_cmd, log_dir / "sim-server.log")
        serve_cmd = [sys.executable, args.serve_wrapper] if args.serve_wrapper else EPICK
        serve = procs.start([*serve_cmd, "serve", "--workers", "1", "--endpoints", sims,
                             "--host", "127.0.0.1", "--proxy-port", str(proxy_port), "--no-extproc",
                             "--metrics-port", "0"],
                            log_dir / "serve.log")  # fmt: skip
        base = f"http://127.0.0.1:{proxy_port}"
        print(f"sim servers {sims}; epick serve pid {serve.pid} on {base}; logs in {log_dir}", flush=True)
        asyncio.run(wait_ready(base, args.servers, procs.procs))
        samples, counters = asyncio.run(run_load(args, base, serve.pid))
        if serve.poll() is not None:
            print(f"epick serve exited with {serve.returncode} during the run", file=sys.stderr)
            return 1
        report = print_report(args, samples, counters)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        return 0
    except KeyboardInterrupt:
        print("interrupted: stopping the subprocesses", file=sys.stderr)
        return 130
    finally:
        procs.stop()


if __name__ == "__main__":
    sys.exit(main())
