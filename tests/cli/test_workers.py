"""`epick serve --workers N`: one port, N processes, one prefix index; a killed worker comes back with
the shared state; the port cannot be bound twice."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epick.config import load_default_config
from epick.datalayer.datastore import EndpointSpec
from epick.plugins.pickers.max_score import MaxScorePicker
from epick.plugins.prefix.index import PrefixIndex
from epick.plugins.prefix.scorer import PrefixCacheScorer
from epick.proxy.server import ENDPOINT_HEADER, WORKER_HEADER
from epick.service.settings import Settings
from epick.service.workers.frames import frame, read_frame
from epick.service.workers.link import WorkerLink
from epick.service.workers.merge import MergedPages
from tests.conftest import MakeSim
from tests.datalayer.pages import free_port, wait_until

PREFIXES = [f"system prompt {p}: " + " ".join(f"rule{p}-{i}" for i in range(120)) for p in "abcd"]
# Affinity alone decides (the default config's load scorers would move a busy prefix on purpose).
PREFIX_ONLY = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def test_a_prefix_index_replica_matches_after_updates_and_a_snapshot() -> None:
    sent: list[object] = []
    origin, replica, late = PrefixIndex(100), PrefixIndex(100), PrefixIndex(100)
    origin.publish = sent.append
    origin.add("ep-1", [1, 2, 3])
    origin.add("ep-2", [1, 9])
    for update in sent:
        replica.apply_update(update)
    assert replica.match([1, 2, 3]) == origin.match([1, 2, 3]) == {"ep-1": 3, "ep-2": 1}
    late.add("ep-3", [7])  # what the late one recorded itself is kept, as the most recent
    late.restore(origin.snapshot())
    assert late.match([1, 2, 3]) == {"ep-1": 3, "ep-2": 1} and late.match([7]) == {"ep-3": 1}
    assert replica.publish is None and len(sent) == 2  # applying publishes nothing again


def test_the_scorer_publishes_through_its_index() -> None:
    scorer, sent = PrefixCacheScorer(), []
    scorer.replicate(sent.append, 0)
    scorer.index.add("ep", [5])
    scorer.replicate(None, 0)
    scorer.index.add("ep", [6])
    assert sent == [["ep", [5]]]


@pytest.mark.parametrize(("workers", "by_prompt"), [(1, False), (2, True), (4, True)])
def test_a_workers_service_builds_its_plugins_for_the_worker_count(workers: int, by_prompt: bool) -> None:
    from epick.service import Service
    from epick.service.workers.process import Role, worker_settings

    settings = Settings(
        endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}),), metrics_port=None, workers=workers
    )
    service = Service(worker_settings(settings, Role(index=0, count=workers, hub="/nonexistent")))
    picker = service.director.config.plugins["max-score-picker"]
    assert isinstance(picker, MaxScorePicker) and picker._by_prompt is by_prompt


async def test_frames_carry_64_bit_hashes_and_end_cleanly() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(frame({"t": "u", "items": [["p", ["ep", [2**64 - 1, 3]]]]}))
    reader.feed_eof()
    assert await read_frame(reader) == {"t": "u", "items": [["p", ["ep", [2**64 - 1, 3]]]]}
    assert await read_frame(reader) is None


def test_merged_metrics_sum_counters_and_histograms_and_keep_the_largest_gauge() -> None:
    page = (
        '# HELP req_total requests\n# TYPE req_total counter\nreq_total{model="m"} {n}\n'
        "# HELP ready endpoints\n# TYPE ready gauge\nready {g}\n"
        '# HELP lat seconds\n# TYPE lat histogram\nlat_bucket{le="1.0"} {n}\nlat_bucket{le="+Inf"} {n}\n'
        "lat_sum {n}\nlat_count {n}\n"
    )
    pages = [page.replace("{n}", "3").replace("{g}", "4"), page.replace("{n}", "5").replace("{g}", "2")]
    merged = {
        f.name: {(s.name, tuple(s.labels.items())): s.value for s in f.samples}
        for f in MergedPages(pages).collect()
    }
    assert merged["req"][("req_total", (("model", "m"),))] == 8
    assert merged["ready"][("ready", ())] == 4
    assert merged["lat"][("lat_count", ())] == 8 and merged["lat"][("lat_bucket", (("le", "+Inf"),))] == 8


def test_a_worker_serves_the_settings_on_shared_ports_with_its_own_metrics() -> None:
    from epick.extproc.server import ExtProcOptions
    from epick.proxy.server import ProxyOptions
    from epick.service import Settings
    from epick.service.workers.process import Role, worker_settings

    settings = Settings(
        endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}),),
        proxy=ProxyOptions(port=8080),
        extproc=ExtProcOptions(port=9002, health_port=9003),
        workers=3,
    )
    worker = worker_settings(settings, Role(index=2, count=3, hub="/tmp/hub.sock"))
    assert worker.proxy is not None and worker.proxy.worker == 2 and worker.proxy.port == 8080
    assert worker.extproc is not None and worker.extproc.shared_ports
    assert (worker.metrics_host, worker.metrics_port, worker.workers) == ("127.0.0.1", 0, 3)
    assert worker.endpoints == settings.endpoints


# --- the processes --------------------------------------------------------------------------------


@dataclass
class Served:
    process: asyncio.subprocess.Process
    url: str
    metrics: str
    log: Path

    def workers(self) -> list[int]:
        """The worker processes' pids (the supervisor's children)."""
        path = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    started: list[asyncio.subprocess.Process] = []

    async def start(endpoints: list[str], *extra: str) -> Served:
        port, metrics = free_port(), free_port()
        log = tmp_path / f"serve-{port}.log"
        config = tmp_path / "prefix-only.yaml"
        config.write_text(PREFIX_ONLY)
        ext = [] if "--extproc" in extra else ["--no-extproc"]
        command = [sys.executable, "-m", "epick.cli.main", "serve", "--endpoints", ",".join(endpoints),
                   "--proxy-port", str(port), "--metrics-port", str(metrics), *ext,
                   "--expose-endpoint", "--host", "127.0.0.1", "--config-file", str(config),
                   *(e for e in extra if e != "--extproc")]  # fmt: skip
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(*command, stdout=out, stderr=out)
        started.append(process)
        served = Served(process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}/metrics", log)
        await wait_until(
            lambda: _answers(served.url), timeout=30, what=f"epick serve ({log.read_text()[-500:]})"
        )
        return served

    yield start
    for process in started:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


async def _route(session: aiohttp.ClientSession, url: str, prefix: str, i: int) -> tuple[str, str]:
    payload = {"model": "sim-model", "prompt": f"{prefix} question {i}", "max_tokens": 2}
    async with session.post(url + "/v1/completions", json=payload) as r:
        assert r.status == 200, await r.text()
        return r.headers[ENDPOINT_HEADER], r.headers[WORKER_HEADER]


async def _rounds(url: str, rounds: int) -> list[tuple[int, str, str]]:
    """(prefix, endpoint, worker) of each request: every prefix once per round, concurrently, each
    on a fresh connection (so the kernel hands them to either worker)."""
    found = []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for r in range(rounds):
            routes = await asyncio.gather(*(_route(session, url, p, r) for p in PREFIXES))
            found += [(p, endpoint, worker) for p, (endpoint, worker) in enumerate(routes)]
    return found


async def test_two_workers_route_every_prefix_as_one_process_would(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]]
) -> None:
    sims = [await make_sim(time_scale=1.0) for _ in range(4)]  # a prefill takes milliseconds: real time
    served = await serve([f"127.0.0.1:{s.port}" for s in sims], "--workers", "2", "--min-workers", "2")
    assert len(served.workers()) == 2
    # First sight of each prefix, one at a time: recorded by whichever worker took it.
    first = {p: endpoint for p, endpoint, _ in await _rounds_one_by_one(served.url)}
    routes = await _rounds(served.url, 12)
    by_prefix: dict[int, set[str]] = defaultdict(set)
    for p, endpoint, _ in routes:
        by_prefix[p].add(endpoint)
    assert {p: endpoints for p, endpoints in by_prefix.items()} == {
        p: {first[p]} for p in range(len(PREFIXES))
    }
    assert set(Counter(worker for _, _, worker in routes)) == {"0", "1"}  # both workers decided
    async with aiohttp.ClientSession() as session, session.get(served.metrics) as r:
        families = {f.name: f for f in text_string_to_metric_families(await r.text())}
    total = sum(s.value for s in families["inference_objective_request"].samples if s.name.endswith("_total"))
    assert total == len(routes) + len(PREFIXES)  # both workers' counts, merged


async def _rounds_one_by_one(url: str) -> list[tuple[int, str, str]]:
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        return [(p, *await _route(session, url, prefix, -1)) for p, prefix in enumerate(PREFIXES)]


async def test_a_killed_worker_comes_back_with_the_shared_state(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]]
) -> None:
    sims = [await make_sim(time_scale=1.0) for _ in range(4)]
    served = await serve([f"127.0.0.1:{s.port}" for s in sims], "--workers", "2", "--min-workers", "2")
    first = {p: endpoint for p, endpoint, _ in await _rounds_one_by_one(served.url)}
    await _rounds(served.url, 3)
    victim, survivor = served.workers()
    loads = served.log.read_text().count("loaded the shared state")
    os.kill(victim, signal.SIGKILL)
    await wait_until(
        lambda: len(served.workers()) == 2 and victim not in served.workers(), timeout=30, what="a new worker"
    )
    await wait_until(
        lambda: served.log.read_text().count("loaded the shared state") > loads,
        timeout=30,
        what="the snapshot",
    )
    # The service answers throughout; the new worker decides as the old one would have.
    routes = await _rounds(served.url, 12)
    assert [(p, e, w) for p, e, w in routes if e != first[p]] == [], first
    assert len({worker for _, _, worker in routes}) == 2
    assert "exited with status -9; starting it again" in served.log.read_text()
    assert survivor in served.workers()


async def test_while_a_worker_is_down_another_accepts_on_its_socket(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]], tmp_path: Path
) -> None:
    """New connections the kernel hands to a dead worker's socket do not wait for its successor:
    a running worker accepts on it until the successor is back, then stops. (The config is moved
    away meanwhile, so the successor cannot start until it is put back.)"""
    import re

    sim = await make_sim(time_scale=1.0)
    served = await serve([f"127.0.0.1:{sim.port}"], "--workers", "2", "--min-workers", "2")
    config = tmp_path / "prefix-only.yaml"
    config.rename(tmp_path / "away.yaml")
    # (A worker accepts on the other's socket at start too, until the other has joined.)
    await wait_until(lambda: "stops accepting on worker" in served.log.read_text(), timeout=30, what="both")
    before = len(served.log.read_text())
    os.kill(served.workers()[0], signal.SIGKILL)
    pattern = re.compile(r"worker (\d) accepts on worker (\d)'s socket while it is down")
    await wait_until(
        lambda: pattern.search(served.log.read_text()[before:]) is not None, timeout=30, what="a cover"
    )
    match = pattern.search(served.log.read_text()[before:])
    assert match is not None
    cover, down = match.groups()
    connector = aiohttp.TCPConnector(force_close=True)  # fresh connections: on either socket
    payload = {"model": "sim-model", "prompt": "hello", "max_tokens": 1}
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for _ in range(12):
            async with session.post(served.url + "/v1/completions", json=payload) as r:
                assert r.status == 200, await r.text()
                assert r.headers[WORKER_HEADER] == cover
    (tmp_path / "away.yaml").rename(config)
    back = f"worker {cover} stops accepting on worker {down}'s socket: it is back"
    await wait_until(lambda: back in served.log.read_text(), timeout=30, what="the successor")


async def test_the_port_cannot_be_bound_twice(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]]
) -> None:
    sim = await make_sim()
    served = await serve([f"127.0.0.1:{sim.port}"], "--workers", "2", "--min-workers", "2")
    port = served.url.rsplit(":", 1)[1]
    for workers in ("1", "2"):
        second = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "epick.cli.main", "serve", "--endpoints", f"127.0.0.1:{sim.port}",
            "--proxy-port", port, "--metrics-port", "0", "--no-extproc", "--host", "127.0.0.1",
            "--workers", workers, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 2
        assert f"cannot listen on 127.0.0.1:{port} for the proxy" in err.decode(), err.decode()


def test_flow_control_is_refused_with_workers(capsys: pytest.CaptureFixture[str]) -> None:
    from epick.cli.main import main

    config = Path(__file__).parents[2] / "config" / "flow-control.yaml"
    code = main(["serve", "--endpoints", "127.0.0.1:1", "--config-file", str(config), "--workers", "2"])
    assert code == 2
    assert "flow control cannot run with workers above 1" in capsys.readouterr().err


def test_the_worker_link_names_what_stays_per_worker(caplog: pytest.LogCaptureFixture) -> None:
    from epick.config import load_config_text
    from epick.framework import NamedPlugin, Reads
    from epick.plugins import in_tree_registry
    from epick.plugins.registry import PluginSpec

    class OutOfTree(NamedPlugin):  # reads HISTORY, its spec says nothing of what it keeps
        plugin_type = "my-scorer"
        reads = Reads.HISTORY

        def score(self, request: object, cycle_state: object, endpoints: list[object]) -> list[float]:
            return [0.0] * len(endpoints)

    registry = in_tree_registry()
    registry.register(PluginSpec("my-scorer", lambda name, params, handle: OutOfTree(name)))
    config = load_config_text(
        """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
- type: inflight-load-producer
- {name: header-sessions, type: session-affinity-filter}
- {name: id-sessions, type: session-affinity-filter, parameters: {strategy: session_id}}
- {name: mine, type: my-scorer}
- type: max-score-picker
""",
        seed=1,
        registry=registry,
    )
    link = WorkerLink("/nonexistent", 0, lambda: config)
    with caplog.at_level("WARNING"):
        link.attach()
    assert "id-sessions (session-affinity-filter): its session bindings" in caplog.text
    assert "mine (my-scorer): state it does not declare" in caplog.text
    for shared in ("prefix-cache-scorer", "no-hit-lru-scorer", "inflight-load-producer", "header-sessions"):
        assert f"{shared} (" not in caplog.text
    assert set(link._replicated) == {"prefix-cache-scorer", "no-hit-lru-scorer", "inflight-load-producer"}


async def test_every_worker_serves_ext_proc_on_the_shared_ports(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]]
) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    sim = await make_sim()
    grpc_port, health_port = free_port(), free_port()
    served = await serve(
        [f"127.0.0.1:{sim.port}"], "--workers", "2", "--min-workers", "2", "--extproc",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--no-secure-serving",
    )  # fmt: skip
    assert len(served.workers()) == 2

    async def serving(port: int) -> bool:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
            except grpc.aio.AioRpcError:
                return False
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

    for port in (grpc_port, health_port):
        for _ in range(200):  # both workers bind in their own time
            if await serving(port):
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"nothing serves gRPC health on {port}")
    # The supervisor holds the ports: a lone epick cannot take them.
    second = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "epick.cli.main", "serve", "--endpoints", f"127.0.0.1:{sim.port}", "--no-proxy",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()), "--metrics-port", "0",
        "--host", "127.0.0.1", "--no-secure-serving", stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(second.communicate(), 60)
    assert second.returncode == 2 and f"cannot listen on 127.0.0.1:{grpc_port} for gRPC" in err.decode(), err


ONE_AT_A_TIME = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: concurrency-detector
  parameters:
    maxConcurrency: 1
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: concurrency-detector
  - pluginRef: max-score-picker
"""


async def test_the_workers_count_each_others_requests_in_flight(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]], tmp_path: Path
) -> None:
    """One endpoint that takes one request at a time (`concurrency-detector` as a filter): while a
    long stream holds it, every worker refuses, not only the one that sent it; once it ends, every
    worker sends again."""
    sim = await make_sim(time_scale=1.0)
    config = tmp_path / "one-at-a-time.yaml"
    config.write_text(ONE_AT_A_TIME)
    fixed = ("--workers", "2", "--min-workers", "2")
    served = await serve([f"127.0.0.1:{sim.port}"], *fixed, "--config-file", str(config))

    async def answers(count: int) -> Counter[str]:
        """Who answered `count` short requests, each on a fresh connection (either worker): the
        worker's index when it sent the request, else the status."""
        connector = aiohttp.TCPConnector(force_close=True)
        payload = {"model": "sim-model", "prompt": "short", "max_tokens": 1}
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one() -> str:
                async with session.post(served.url + "/v1/completions", json=payload) as r:
                    await r.read()
                    return r.headers[WORKER_HEADER] if r.status == 200 else str(r.status)

            return Counter([await one() for _ in range(count)])

    async def all_refused() -> bool:
        return not {"0", "1"} & set(await answers(16))

    async with aiohttp.ClientSession() as session:
        long = {"model": "sim-model", "prompt": "long", "max_tokens": 4000, "stream": True}
        async with session.post(served.url + "/v1/completions", json=long) as stream:
            assert stream.status == 200
            await stream.content.readline()  # streaming: counted on the endpoint
            holder = stream.headers[WORKER_HEADER]
            for _ in range(100):  # the count reaches the other worker within moments
                if await all_refused():
                    break
            else:
                raise AssertionError(f"a worker besides worker {holder} still sends to the busy endpoint")
        # The stream is closed: its release reaches both workers.
    # Short requests from one worker can still meet the other's last one in flight (its release
    # travelling): what matters is that each worker sends again.
    sent: set[str] = set()
    for _ in range(100):
        sent |= {"0", "1"} & set(await answers(16))
        if sent == {"0", "1"}:
            break
    else:
        raise AssertionError(f"only workers {sorted(sent)} sent again after the stream ended")
    assert "each worker keeps its own" not in served.log.read_text()


# --- how many workers by default ------------------------------------------------------------------


def _affinity() -> int:
    return len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({}, None),  # no cgroup files: the affinity
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "50000 100000\n"}, 1),  # half a core: one
        ({"cpu.max": "150000 100000\n"}, 2),  # a core and a half: rounded up
        ({"cpu.max": "garbage\n"}, None),
        ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no limit
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),
    ],
)
def test_the_cores_available_are_the_affinity_capped_by_the_cgroup_quota(
    tmp_path: Path, files: dict[str, str], expected: int | None
) -> None:
    from epick.service.workers import cores_available

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    affinity = _affinity()
    assert cores_available(tmp_path) == (affinity if expected is None else min(affinity, expected))


def test_the_default_is_one_worker_per_core_unless_something_would_be_split() -> None:
    from epick.config import load_config, load_config_text
    from epick.service.workers import default_workers

    config = load_config(None, seed=1)  # the default config shares all it keeps
    assert default_workers(4, config, grpc_ports_fixed=True) == (4, "4 cores are available")
    assert default_workers(1, config, grpc_ports_fixed=True)[0] == 1
    flow = load_config(Path(__file__).parents[2] / "config" / "flow-control.yaml", seed=1)
    count, reason = default_workers(4, flow, grpc_ports_fixed=True)
    assert count == 1 and "flow control" in reason
    count, reason = default_workers(4, config, grpc_ports_fixed=False)
    assert count == 1 and "gRPC ports" in reason
    sessions = load_config_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- {name: sessions, type: session-affinity-filter, parameters: {strategy: session_id}}\n"
        "- type: max-score-picker\n",
        seed=1,
    )
    count, reason = default_workers(4, sessions, grpc_ports_fixed=True)
    assert count == 1 and "sessions (session-affinity-filter): its session bindings" in reason


@pytest.mark.parametrize(
    ("argv", "expected", "why"),
    [
        ([], 1, None),  # one worker unless asked (docs/performance.md, "Workers")
        (["--workers", "auto"], 3, "3 cores are available"),
        (["--workers", "1"], 1, None),
        (["--workers", "2"], 2, None),
        (["--workers", "auto", "--config-file", "config/flow-control.yaml"], 1, "flow control"),  # no error
        (["--workers", "auto", "--grpc-port", "0"], 1, "gRPC ports"),
        (["--no-proxy", "--no-extproc"], 1, None),
    ],
)
def test_serve_runs_the_default_workers_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, argv: list[str], expected: int,
    why: str | None,
) -> None:  # fmt: skip
    from epick.cli.main import build_parser
    from epick.cli.serve import settings_from
    from epick.service import run

    monkeypatch.chdir(Path(__file__).parents[2])
    monkeypatch.setattr(run, "cores_available", lambda: 3)
    args = build_parser().parse_args(["serve", "--endpoints", "127.0.0.1:1", *argv])
    with caplog.at_level("INFO", logger="epick.serve"):
        assert run.worker_count(settings_from(args))[0] == expected
    if why is not None:
        assert f"serving with {expected} worker process" in caplog.text and why in caplog.text
    else:
        assert "serving with" not in caplog.text


async def test_a_decision_first_applies_what_reached_the_link(tmp_path: Path) -> None:
    """`catch_up` (called before each scheduling) reads the hub's socket without waiting for the
    event loop: a burst of requests decided in one turn of the loop sees the other workers'
    decisions that arrived meanwhile. Its own leave together at the end of the turn."""
    hub: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Future()

    async def serve_hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert await read_frame(reader) == {"t": "hello", "worker": 1}
        writer.write(frame({"t": "snapshot", "for": 1, "items": {}}))
        hub.set_result((reader, writer))

    path = tmp_path / "hub.sock"
    server = await asyncio.start_unix_server(serve_hub, path)
    scorer = PrefixCacheScorer()
    config = load_default_config(seed=1)
    config.plugins["prefix-cache-scorer"] = scorer
    link = WorkerLink(str(path), 1, lambda: config)
    await link.connect()
    reader, writer = await hub
    writer.write(frame({"t": "u", "from": 0, "items": [["prefix-cache-scorer", ["ep-0", [5, 6]]]]}))
    assert scorer.index.match([5, 6]) == {}  # in the socket; the loop has not turned
    link.catch_up()
    assert scorer.index.match([5, 6]) == {"ep-0": 2}
    scorer.index.add("ep-1", [9])
    scorer.index.add("ep-2", [10])
    assert await read_frame(reader) == {
        "t": "u",
        "from": 1,
        "items": [["prefix-cache-scorer", ["ep-1", [9]]], ["prefix-cache-scorer", ["ep-2", [10]]]],
    }
    await link.stop()
    writer.close()
    server.close()
    await server.wait_closed()


async def test_a_dead_workers_socket_and_those_it_covered_go_to_running_workers() -> None:
    """The hub's bookkeeping of covers: worker 0 dies (1 covers it), then 1 dies (2 covers both),
    then 0 is back (2 lets its socket go)."""
    import msgpack

    from epick.service.workers import Supervisor

    class Link:
        def __init__(self) -> None:
            self.sent: list[dict[str, object]] = []

        def write(self, data: bytes) -> None:
            self.sent.append(msgpack.unpackb(data[5:]))

    from epick.proxy.server import ProxyOptions
    from epick.service import Settings

    settings = Settings(proxy=ProxyOptions(host="127.0.0.1", port=0), metrics_port=None)
    supervisor = Supervisor(settings, 3)
    supervisor.sockets = [object(), object(), object()]  # type: ignore[list-item]
    links = [Link(), Link(), Link()]
    for worker, link in zip(supervisor.workers, links, strict=True):
        worker.writer, worker.wanted, worker.ready = link, True, True  # type: ignore[assignment]
    supervisor.workers[0].writer = None
    supervisor._assign()
    assert supervisor.covered == {0: 1} and links[1].sent == [{"t": "accept", "socket": 0}]
    supervisor.workers[1].writer = None
    supervisor._assign()
    assert supervisor.covered == {0: 2, 1: 2}
    assert links[2].sent == [{"t": "accept", "socket": 0}, {"t": "accept", "socket": 1}]
    supervisor.workers[0].writer = links[0]  # type: ignore[assignment]
    supervisor._assign()
    assert supervisor.covered == {1: 2} and links[2].sent[-1] == {"t": "release", "socket": 0}
    supervisor._assign()  # nothing changed: nothing said
    assert len(links[2].sent) == 3 and links[0].sent == []
    supervisor.stopping = True
    supervisor.workers[2].writer = None
    supervisor._assign()  # stopping: nobody takes over
    assert links[0].sent == []


async def test_a_retiring_workers_socket_goes_to_a_serving_worker_before_it_is_told() -> None:
    """Scaling down: the last worker added is no longer wanted; its socket is covered, the others
    learn their new turns, then it is told to retire (so no connection waits on its socket)."""
    import msgpack

    from epick.proxy.server import ProxyOptions
    from epick.service import Settings
    from epick.service.workers import Supervisor

    class Link:
        def __init__(self, sent: list[tuple[int, dict[str, object]]], index: int) -> None:
            self.log, self.index = sent, index

        def write(self, data: bytes) -> None:
            self.log.append((self.index, msgpack.unpackb(data[5:])))

    settings = Settings(proxy=ProxyOptions(host="127.0.0.1", port=0), metrics_port=None)
    supervisor = Supervisor(settings, 3, least=1)
    supervisor.sockets = [object(), object(), object()]  # type: ignore[list-item]
    sent: list[tuple[int, dict[str, object]]] = []
    for worker in supervisor.workers[:2]:
        worker.writer, worker.wanted, worker.ready = Link(sent, worker.index), True, True  # type: ignore[assignment]
    supervisor._assign()
    assert supervisor.covered == {2: 0}  # never started: worker 0 accepts on its socket
    sent.clear()
    supervisor._retire(0.1)
    assert sent == [
        (0, {"t": "accept", "socket": 1}),
        (0, {"t": "active", "position": 0, "count": 1, "linked": 2}),
        (1, {"t": "active", "position": -1, "count": 1, "linked": 2}),  # draining: no turns
        (1, {"t": "retire"}),
    ]
    assert supervisor.covered == {1: 0, 2: 0} and supervisor.scaled == {"up": 0, "down": 1}


def test_the_sockets_are_spread_evenly_over_the_serving_workers() -> None:
    """Eight sockets: one worker serving accepts on all; as workers join, covered sockets move to
    them until no worker accepts on more than one socket more than another."""
    import msgpack

    from epick.proxy.server import ProxyOptions
    from epick.service import Settings
    from epick.service.workers import Supervisor

    class Link:
        def write(self, data: bytes) -> None:
            msgpack.unpackb(data[5:])

    settings = Settings(proxy=ProxyOptions(host="127.0.0.1", port=0), metrics_port=None)
    supervisor = Supervisor(settings, 8, least=1)
    supervisor.sockets = [object()] * 8  # type: ignore[list-item]

    def shares() -> list[int]:
        serving = supervisor._serving()
        return sorted(1 + sum(by == w.index for by in supervisor.covered.values()) for w in serving)

    for joined in range(1, 9):
        worker = supervisor.workers[joined - 1]
        worker.writer, worker.wanted, worker.ready = Link(), True, True  # type: ignore[assignment]
        supervisor._assign()
        assert sum(shares()) == 8 and max(shares()) - min(shares()) <= 1, (joined, shares())
    assert supervisor.covered == {}
    for leaving in range(7, 0, -1):  # retired, last first
        supervisor.workers[leaving].wanted = False
        supervisor._assign()
        assert sum(shares()) == 8 and max(shares()) - min(shares()) <= 1, (leaving, shares())


def test_a_worker_that_ran_healthy_restarts_after_the_first_backoff() -> None:
    from epick.service.workers.supervisor import FIRST_BACKOFF, HEALTHY_RUN_S, MAX_BACKOFF, restart_delay

    assert restart_delay(MAX_BACKOFF, ran=HEALTHY_RUN_S + 55) == FIRST_BACKOFF  # 85 s healthy: 0.5 s
    assert restart_delay(4.0, ran=1.0) == 4.0  # dying at once: the grown backoff holds


async def test_every_worker_serves_the_same_self_signed_certificate(
    make_sim: MakeSim, serve: Callable[..., Awaitable[Served]]
) -> None:
    """Without --cert-path, one self-signed pair for all workers: a gateway that pins or caches the
    certificate sees the same one on every connection, whichever worker accepts it."""
    import ssl

    sim = await make_sim()
    grpc_port = free_port()
    served = await serve(
        [f"127.0.0.1:{sim.port}"], "--workers", "2", "--min-workers", "2", "--extproc",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()),
    )  # fmt: skip
    assert len(served.workers()) == 2
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    seen: set[bytes] = set()
    connections = 0
    for _ in range(200):
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", grpc_port, ssl=context)
        except OSError:
            await asyncio.sleep(0.05)  # not listening yet
            continue
        seen.add(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
        writer.close()
        connections += 1
        if len(seen) > 1 or connections >= 24:  # both workers accept, by SO_REUSEPORT's hash
            break
    assert len(seen) == 1


def test_merged_running_requests_are_summed_over_the_workers() -> None:
    """Each worker counts its own requests in flight: the page shows them all (what llm-d's autoscaling
    guides query), not the largest worker's."""

    def page(running: int) -> str:
        return (
            "# TYPE inference_objective_running_requests gauge\n"
            f'inference_objective_running_requests{{model_name="m"}} {running}.0\n'
            "# TYPE llm_d_epp_request_running gauge\n"
            f'llm_d_epp_request_running{{fairness_id="f",model_name="m",priority="0",target_model_name="m"}} '
            f"{running}.0\n"
            "# TYPE inference_pool_ready_pods gauge\n"
            'inference_pool_ready_pods{name="p"} 4.0\n'
        )

    merged = {s.name: s.value for f in MergedPages([page(3), page(5)]).collect() for s in f.samples}
    assert merged["inference_objective_running_requests"] == 8.0
    assert merged["llm_d_epp_request_running"] == 8.0
    assert merged["inference_pool_ready_pods"] == 4.0


@pytest.mark.parametrize("value", ["0", "-1", "two", ""])
def test_serve_refuses_a_worker_count_that_is_not_one(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from epick.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--endpoints", "127.0.0.1:1", "--workers", value])
    assert "--workers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "says"),
    [("0", "min-workers must be at least 1 (got 0)"), ("auto", "expected a number of workers, got 'auto'")],
)
def test_serve_refuses_a_least_worker_count_that_is_not_one(
    value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from epick.cli.main import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--endpoints", "127.0.0.1:1", "--min-workers", value])
    assert says in capsys.readouterr().err


def test_epp_with_leader_election_refuses_more_than_one_worker_by_name() -> None:
    from epick.cli.epp import EppError, epp_workers

    assert epp_workers(0, leader_election=True) == 1
    with pytest.raises(EppError, match="give --min-workers 1 or none"):
        epp_workers(0, leader_election=True, least=2)
    with pytest.raises(EppError, match="give --workers 1 or none"):
        epp_workers(3, leader_election=True)
