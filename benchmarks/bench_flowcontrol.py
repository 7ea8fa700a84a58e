"""Flow control's overhead per request: enqueue (`submit`) and dispatch (`dispatch_once`), p50/p99,
with 1,000 flows and 10,000 queued requests, for each fairness policy.

Each run fills a saturated controller with 10,000 requests spread over 1,000 tenants (fairness ids)
and three priorities, timing every `submit`; then opens the pool and drains it, timing every
`dispatch_once` (a full cycle: saturation, usage limits, the fairness pick, the ordering head). The
baseline, in the same process, is the least a queue can do: a `collections.deque` append and
popleft per request. Ratios are against it. Run: `make bench` (or with --quick).
"""

from __future__ import annotations

import argparse
import collections
import random
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from epick.config import load_config_text
from epick.flowcontrol import FlowController
from epick.framework import Endpoint, InferenceRequest, Metrics, NamedPlugin, RequestBody

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: {fairness}
- type: fcfs-ordering-policy
- type: {usage}
{usage_params}
flowControl:
  usageLimitPolicyPluginRef: {usage}
  defaultPriorityBand: {{fairnessPolicyRef: {fairness}, maxRequests: 100000}}
  priorityBands:
  - {{priority: 10, fairnessPolicyRef: {fairness}, maxRequests: 100000}}
  - {{priority: 0, fairnessPolicyRef: {fairness}, maxRequests: 100000}}
  - {{priority: -10, fairnessPolicyRef: {fairness}, maxRequests: 100000}}
"""
CASES = [
    ("global-strict-fairness-policy", "static-usage-limit-policy", ""),
    ("round-robin-fairness-policy", "static-usage-limit-policy", ""),
    ("program-aware-fairness", "static-usage-limit-policy", ""),
    ("round-robin-fairness-policy", "priority-holdback-policy", "  parameters: {minCeiling: 0.5}"),
]


class Dial(NamedPlugin):
    plugin_type = "bench-dial"

    def __init__(self) -> None:
        super().__init__()
        self.value = 1.0

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.value


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def requests(n: int, flows: int, rng: random.Random) -> list[tuple[InferenceRequest, str]]:
    body = RequestBody.completion("x" * 256)
    out = []
    for i in range(n):
        request = InferenceRequest("m", body, f"r{i}", priority=rng.choice((10, 0, -10)), size=256)
        out.append((request, f"tenant-{rng.randrange(flows)}"))
    return out


def run(
    fairness: str, usage: str, usage_params: str, n: int, flows: int
) -> tuple[float, float, float, float]:
    config = load_config_text(
        CONFIG.format(fairness=fairness, usage=usage, usage_params=usage_params), seed=0
    )
    assert config.flow_control is not None
    dial = Dial()
    fc = FlowController(config.flow_control, dial, clock=time.monotonic)
    pool = [Endpoint("a", "10.0.0.1", 8000, {}, Metrics())]
    work = requests(n, flows, random.Random(1))
    clock = time.perf_counter
    enqueue = []
    for request, tenant in work:
        start = clock()
        fc.submit(request, fairness_id=tenant)
        enqueue.append(clock() - start)
    assert fc.queued == n, f"{fc.queued} queued of {n}"
    dial.value = 0.0
    dispatch = []
    while fc.queued:
        start = clock()
        fc.dispatch_once(pool)
        dispatch.append(clock() - start)
    return (*percentiles(enqueue), *percentiles(dispatch))


def baseline(n: int) -> tuple[float, float, float, float]:
    queue: collections.deque[int] = collections.deque()
    clock = time.perf_counter
    enqueue, dispatch = [], []
    for i in range(n):
        start = clock()
        queue.append(i)
        enqueue.append(clock() - start)
    while queue:
        start = clock()
        queue.popleft()
        dispatch.append(clock() - start)
    return (*percentiles(enqueue), *percentiles(dispatch))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 requests over 100 flows")
    args = parser.parse_args()
    n, flows = (1_000, 100) if args.quick else (10_000, 1_000)
    base = baseline(n)
    table = Table(title=f"flow control: {n:,} queued requests over {flows:,} flows (µs per request)")
    for column in ("fairness / usage limit", "enqueue p50", "p99", "dispatch p50", "p99", "vs deque (p50)"):
        table.add_column(column, justify="right" if column != "fairness / usage limit" else "left")
    us = 1e6
    table.add_row("deque (baseline)", *(f"{v * us:.2f}" for v in base), "1×")
    for fairness, usage, params in CASES:
        e50, e99, d50, d99 = run(fairness, usage, params, n, flows)
        ratio = (e50 + d50) / (base[0] + base[2])
        label = (
            f"{fairness.removesuffix('-policy').removesuffix('-fairness')} / {usage.removesuffix('-policy')}"
        )
        table.add_row(label, f"{e50 * us:.1f}", f"{e99 * us:.1f}", f"{d50 * us:.1f}",
                      f"{d99 * us:.1f}", f"{ratio:,.0f}×")  # fmt: skip
    Console(width=130).print(table)


if __name__ == "__main__":
    main()
