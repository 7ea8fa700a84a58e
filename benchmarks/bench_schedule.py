"""schedule() latency and decisions/s: the default config beside a random-picker-only baseline.

For 8, 64, 256 and 1024 endpoints and prompts of 1k, 8k and 32k tokens (characters / 4), each
config schedules a stream of requests from 32 shared-prefix groups over endpoints with random
metrics; after each decision the PreRequest hooks run (as in the service), so the prefix index grows
as it would in production. Only `schedule()` is timed. Run: `make bench` (or with --quick).

A second table times the whole decision the service makes (`RequestPath.decide`: data producers,
`schedule()`, PreRequest hooks) for config/predicted-latency.yaml, its predictor trained (400
observed responses, so LightGBM answers, not the analytic fallback), beside the default config.

The default config runs twice: on a plain list of endpoints (no snapshot version: every scorer runs
for every request) and on a versioned `Snapshot`, as the service's data layer hands it out between
two scrapes (scorers that declare they read only metrics run once per version).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from epick.cli.simulate_policies import CONFIG_POLICIES
from epick.config import LoadedConfig, load_config_file, load_config_text, load_default_config
from epick.framework import CycleState, Endpoint, InferenceRequest, Metrics, Snapshot
from epick.plugins.latency.predictor import Features
from epick.plugins.latency.producer import PredictedLatencyProducer
from epick.requestcontrol.path import RequestPath

RANDOM_ONLY = CONFIG_POLICIES["random"]
PREDICTED_LATENCY = Path(__file__).parents[1] / "config" / "predicted-latency.yaml"

GROUPS = 32
WORDS = ["alpha", "beta", "gamma", "delta", "kv", "cache", "prefix", "token", "batch", "decode", "prefill"]


def endpoints(n: int, rng: random.Random) -> list[Endpoint]:
    return [
        Endpoint(
            f"pod-{i}",
            f"10.0.{i // 256}.{i % 256}",
            8000,
            {},
            Metrics(
                waiting_queue_size=rng.randint(0, 10),
                running_requests_size=rng.randint(0, 64),
                kv_cache_usage_percent=rng.random(),
            ),
        )
        for i in range(n)
    ]


def prompts(tokens: int, count: int, rng: random.Random) -> list[InferenceRequest]:
    chars = tokens * 4
    systems = []
    for _ in range(GROUPS):
        text = " ".join(rng.choice(WORDS) for _ in range(chars // 5))
        systems.append(text[: int(chars * 0.75)])
    out = []
    for i in range(count):
        system = systems[rng.randrange(GROUPS)]
        question = " ".join(rng.choice(WORDS) for _ in range((chars - len(system)) // 5 + 1))
        prompt = (system + question)[:chars]
        out.append(InferenceRequest.from_openai({"model": "llama", "prompt": prompt}, request_id=f"r{i}"))
    return out


def measure(
    config: LoadedConfig, eps: list[Endpoint] | Snapshot, requests: list[InferenceRequest]
) -> tuple[float, float, float]:
    scheduler = config.scheduler
    hooks = config.hooks.pre_request
    latencies = []
    clock = time.perf_counter
    for request in requests:
        start = clock()
        result = scheduler.schedule(request, eps)
        latencies.append(clock() - start)
        for hook in hooks:
            hook.pre_request(request, result, CycleState())
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return p50, p99, len(latencies) / sum(latencies)


def measure_decide(
    config: LoadedConfig, eps: list[Endpoint], requests: list[InferenceRequest]
) -> tuple[float, float, float]:
    path = RequestPath(config)
    latencies = []
    clock = time.perf_counter
    for request in requests:
        start = clock()
        path.decide(request, eps)
        latencies.append(clock() - start)
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return p50, p99, len(latencies) / sum(latencies)


def trained_predicted_latency(rng: random.Random) -> LoadedConfig:
    config = load_config_file(PREDICTED_LATENCY, seed=1)
    for plugin in config.plugins.values():
        if isinstance(plugin, PredictedLatencyProducer):
            for _ in range(400):
                row = Features(rng.random(), rng.randrange(100, 8000), rng.randrange(10), rng.randrange(64))
                plugin.predictor.observe_ttft(row, 20 + row.input_tokens * 0.05 + row.waiting * 30)
                plugin.predictor.observe_tpot(row, 6 + row.running * 0.05 + row.kv_cache * 17)
            assert plugin.predictor.trained == (True, True)
    return config


def decide_table(args: argparse.Namespace, rng: random.Random) -> Table:
    table = Table(title="RequestPath.decide latency, one core (ms); ratio = predicted-latency / default")
    for col in ("endpoints", "config", "p50 ms", "p99 ms", "decisions/s", "p50 ratio"):
        table.add_column(col, justify="right")
    for n in (8, 64, 256):
        eps = endpoints(n, rng)
        count = max(50, (400 if args.quick else 2000) * 64 // max(n, 64))
        requests = prompts(1000, count + 50, rng)
        cells = {}
        for label, config in (
            ("default", load_default_config(seed=1)),
            ("predicted-latency", trained_predicted_latency(rng)),
        ):
            measure_decide(config, eps, requests[:50])
            cells[label] = measure_decide(config, eps, requests[50:])
        base = cells["default"][0]
        for label, (p50, p99, rate) in cells.items():
            table.add_row(
                str(n), label, f"{p50 * 1e3:.3f}", f"{p99 * 1e3:.3f}", f"{rate:,.0f}", f"{p50 / base:.1f}x"
            )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests per cell")
    parser.add_argument("--endpoints", default="8,64,256,1024")
    parser.add_argument("--tokens", default="1000,8000,32000")
    args = parser.parse_args()
    console = Console()
    table = Table(title="schedule() latency, one core (ms); ratio = default / random-only")
    for col in ("endpoints", "prompt tokens", "config", "p50 ms", "p99 ms", "decisions/s", "p50 ratio"):
        table.add_column(col, justify="right")
    rng = random.Random(42)
    for n in (int(x) for x in args.endpoints.split(",")):
        eps = endpoints(n, rng)
        for tokens in (int(x) for x in args.tokens.split(",")):
            count = max(50, (400 if args.quick else 2000) * 64 // max(n, 64))
            requests = prompts(tokens, count + 50, rng)
            cells = {}
            snapshot = Snapshot(tuple(eps), version=1)
            for label, config, candidates in (
                ("random-only", load_config_text(RANDOM_ONLY, seed=1), eps),
                ("default", load_default_config(seed=1), eps),
                ("default, snapshot", load_default_config(seed=1), snapshot),
            ):
                measure(config, candidates, requests[:50])  # warm up: caches, index
                cells[label] = measure(config, candidates, requests[50:])
            base = cells["random-only"][0]
            for label, (p50, p99, rate) in cells.items():
                table.add_row(
                    str(n),
                    str(tokens),
                    label,
                    f"{p50 * 1e3:.3f}",
                    f"{p99 * 1e3:.3f}",
                    f"{rate:,.0f}",
                    f"{p50 / base:.1f}x",
                )
        table.add_section()
    console.print(table)
    console.print(decide_table(args, rng))


if __name__ == "__main__":
    main()
