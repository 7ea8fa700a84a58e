"""The precise prefix index: events ingested per second per core, one scheduling decision with the
precise producer at 64 endpoints and an 8k-token prompt (tokenization timed apart), and the index's
memory per million blocks.

Baselines, in the same process: ingesting is compared with merely unpacking the same msgpack
payloads; a decision with the precise producer and `prefix-cache-scorer` is compared with the same
profile without them (queue and KV scorers only). The target for a decision, excluding
tokenization, is a p50 of 0.5 ms. Run: `make bench` (or with --quick).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from pathlib import Path

import msgpack
from rich.console import Console
from rich.table import Table

from epick.config import load_config_text
from epick.framework import Endpoint, InferenceRequest, Metrics, RequestBody, TokenizedPrompt
from epick.kvcache import (
    BlockIndex,
    BlockStored,
    EventBatch,
    EventTracker,
    TokenProcessor,
    decode_batch,
    encode_batch,
)
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
from epick.requestcontrol.path import RequestPath
from epick.tokenization import load

TOKENIZER = Path(__file__).resolve().parents[1] / "tests" / "data" / "tokenizer"
HEADER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
PRECISE = (
    HEADER
    + """plugins:
- type: precise-prefix-cache-producer
  parameters: {tokenProcessorConfig: {blockSize: 64}}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""
)
LOAD_ONLY = (
    HEADER
    + """plugins:
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""
)


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def payloads(n: int, rng: random.Random) -> list[bytes]:
    """n batches as vLLM publishes them: each stores one request's 4 new blocks of 16 tokens."""
    out = []
    for i in range(n):
        tokens = tuple(rng.randrange(150_000) for _ in range(64))
        event = BlockStored(tuple(rng.getrandbits(64) for _ in range(4)), None, tokens, 16, None, "GPU", None)
        out.append(encode_batch(EventBatch(float(i), (event,), 0)))
    return out


def ingest(n: int) -> tuple[float, float]:
    """(events per second applied, events per second merely unpacked)."""
    batches = payloads(n, random.Random(1))
    tracker = EventTracker(BlockIndex(), TokenProcessor(16, ""))
    start = time.perf_counter()
    for payload in batches:
        msgpack.unpackb(payload)
    unpacked = time.perf_counter() - start
    start = time.perf_counter()
    for i, payload in enumerate(batches):
        tracker.apply(f"10.0.{i % 64}.1:8000", "m", decode_batch(payload))
    applied = time.perf_counter() - start
    return n / applied, n / unpacked


def endpoints(n: int) -> list[Endpoint]:
    rng = random.Random(2)
    return [
        Endpoint(
            f"pod-{i}",
            f"10.0.{i}.1",
            8000,
            {},
            Metrics(waiting_queue_size=rng.randrange(8), kv_cache_usage_percent=rng.random()),
        )
        for i in range(n)
    ]


def decisions(config_text: str, n: int, prompt: tuple[int, ...], pods: list[Endpoint]) -> tuple[float, float]:
    config = load_config_text(config_text, seed=0)
    producer = config.plugins.get("precise-prefix-cache-producer")
    if isinstance(producer, PrecisePrefixCacheProducer):
        # Every endpoint holds some of the prompt's prefix (a long run on a few), and other blocks.
        rng = random.Random(3)
        keys = producer.processor.keys(prompt, "m")
        for i, ep in enumerate(pods):
            held = len(keys) if i % 16 == 0 else rng.randrange(len(keys))
            producer.index.add(keys[:held], (f"{ep.address}:{ep.port}", "gpu"))
            producer.index.add([rng.getrandbits(64) for _ in range(2000)], (f"{ep.address}:{ep.port}", "gpu"))
    path = RequestPath(config)
    samples = []
    for i in range(n):
        request = InferenceRequest("m", RequestBody.completion("x"), f"r{i}")
        request.body.set_tokenized(TokenizedPrompt((prompt,)))
        start = time.perf_counter()
        path.decide(request, pods)
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def memory_per_million(blocks: int) -> float:
    gc.collect()
    tracemalloc.start()
    index = BlockIndex()
    before = tracemalloc.get_traced_memory()[0]
    rng = random.Random(4)
    for start in range(0, blocks, 64):
        index.add([rng.getrandbits(64) for _ in range(64)], (f"10.0.{start % 64}.1:8000", "gpu"))
        index.map_engine(rng.getrandbits(64), (start,))
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return used / blocks * 1_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer events, decisions and blocks")
    args = parser.parse_args()
    events, runs, blocks = (5_000, 200, 100_000) if args.quick else (50_000, 2_000, 500_000)
    console = Console(width=120)

    applied, unpacked = ingest(events)
    table = Table(title=f"KV events ingested ({events:,} batches of 4 blocks; one core)")
    for column in ("what", "batches/s", "blocks/s", "vs unpacking"):
        table.add_column(column, justify="right" if column != "what" else "left")
    table.add_row("msgpack.unpackb only (baseline)", f"{unpacked:,.0f}", f"{unpacked * 4:,.0f}", "1×")
    table.add_row(
        "decode + apply to the index",
        f"{applied:,.0f}",
        f"{applied * 4:,.0f}",
        f"{unpacked / applied:.1f}× slower",
    )
    console.print(table)

    tokenizer = load(str(TOKENIZER))
    text = " ".join(f"word{i % 997}" for i in range(4_000))
    start = time.perf_counter()
    prompt = tuple(tokenizer.encode(text))[:8192]
    tokenize_ms = (time.perf_counter() - start) * 1e3
    pods = endpoints(64)
    base50, base99 = decisions(LOAD_ONLY, runs, prompt, pods)
    p50, p99 = decisions(PRECISE, runs, prompt, pods)
    table = Table(
        title=f"one decision, 64 endpoints, a {len(prompt):,}-token prompt (ms; tokenization apart)"
    )
    for column in ("config", "p50", "p99", "vs load-only (p50)", "target p50 ≤ 0.5 ms"):
        table.add_column(column, justify="right" if column != "config" else "left")
    table.add_row("queue + KV scorers (baseline)", f"{base50 * 1e3:.3f}", f"{base99 * 1e3:.3f}", "1×", "")
    table.add_row(
        "precise producer + prefix-cache-scorer + queue + KV",
        f"{p50 * 1e3:.3f}", f"{p99 * 1e3:.3f}", f"{p50 / base50:.1f}×", "met" if p50 <= 0.0005 else "NOT met",
    )  # fmt: skip
    table.add_row(
        f"tokenizing the prompt once (test tokenizer, {len(prompt):,} tokens)",
        f"{tokenize_ms:.3f}",
        "",
        "",
        "",
    )
    console.print(table)

    per_million = memory_per_million(blocks)
    console.print(
        f"index memory: {per_million / 2**20:,.0f} MiB per million blocks "
        f"(one endpoint each; measured on {blocks:,})"
    )


if __name__ == "__main__":
    main()
