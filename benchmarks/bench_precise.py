"""The precise prefix index: events ingested per second per core, one scheduling decision with the
precise producer at 64 endpoints and an 8k-token prompt (tokenization timed apart), the same decision
on an index shared through Redis (a redis-server on loopback, when one is installed), and the index's
memory per million blocks.

Baselines, in the same process: ingesting is compared with merely unpacking the same msgpack
payloads; a decision with the precise producer and `prefix-cache-scorer` is compared with the same
profile without them (queue and KV scorers only). The target for a decision, excluding
tokenization, is a p50 of 0.5 ms. Run: `make bench` (or with --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import shutil
import socket
import subprocess
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

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
from epick.kvcache.upstream_keys import UpstreamTokenProcessor
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer, SharedPrecisePrefixCacheProducer
from epick.requestcontrol.path import RequestPath
from epick.tokenization import load

T = TypeVar("T")
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


def fill(producer: PrecisePrefixCacheProducer, prompt: tuple[int, ...], pods: list[Endpoint]) -> None:
    """Every endpoint holds some of the prompt's prefix (a long run on a few), and other blocks."""
    rng = random.Random(3)
    keys = producer.processor.keys(prompt, "m")
    for i, ep in enumerate(pods):
        held = len(keys) if i % 16 == 0 else rng.randrange(len(keys))
        producer.index.add(keys[:held], (f"{ep.address}:{ep.port}", "gpu"))
        producer.index.add([rng.getrandbits(64) for _ in range(2000)], (f"{ep.address}:{ep.port}", "gpu"))


def decisions(config_text: str, n: int, prompt: tuple[int, ...], pods: list[Endpoint]) -> tuple[float, float]:
    config = load_config_text(config_text, seed=0)
    producer = config.plugins.get("precise-prefix-cache-producer")
    if isinstance(producer, PrecisePrefixCacheProducer):
        fill(producer, prompt, pods)
    path = RequestPath(config)
    samples = []
    for i in range(n):
        request = InferenceRequest("m", RequestBody.completion("x"), f"r{i}")
        request.body.set_tokenized(TokenizedPrompt((prompt,)))
        start = time.perf_counter()
        path.decide(request, pods)
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def shared(text: str, url: str) -> str:
    """`text` with its precise producer's index on the Redis at `url`."""
    old = "parameters: {tokenProcessorConfig: {blockSize: 64}}"
    index = f"indexerConfig: {{kvBlockIndexConfig: {{redisConfig: {{address: '{url}'}}}}}}"
    new = f"parameters: {{tokenProcessorConfig: {{blockSize: 64}}, {index}}}"
    assert old in text
    return text.replace(old, new)


async def shared_decisions(
    url: str, n: int, prompt: tuple[int, ...], pods: list[Endpoint]
) -> tuple[float, float]:
    """As `decisions`, on the shared index: each decision reads the prompt's keys from Redis first
    (the one round trip the front end awaits), then decides."""
    config = load_config_text(shared(PRECISE, url), seed=0)
    producer = config.plugins["precise-prefix-cache-producer"]
    assert isinstance(producer, SharedPrecisePrefixCacheProducer)
    fill(producer, prompt, pods)
    while producer.index._ops or (producer.index._writer is not None and not producer.index._writer.done()):
        await asyncio.sleep(0.01)
    path = RequestPath(config)
    samples = []
    for i in range(n):
        request = InferenceRequest("m", RequestBody.completion("x"), f"r{i}")
        request.body.set_tokenized(TokenizedPrompt((prompt,)))
        start = time.perf_counter()
        await producer.collect(request, pods)
        path.decide(request, pods)
        samples.append(time.perf_counter() - start)
    assert sum(producer.index.stats.fallbacks.values()) == 0, producer.index.stats
    await producer.aclose()
    return percentiles(samples)


def with_redis(run: Callable[[str], Awaitable[T]]) -> T | None:
    """`run(url)` against a redis-server started on a free loopback port (None when there is none)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.01)
        return asyncio.run(run(f"redis://127.0.0.1:{port}/0"))
    finally:
        proc.kill()
        proc.wait()


def key_cost(prompt: tuple[int, ...]) -> list[tuple[str, float]]:
    """Milliseconds to compute the prompt's block keys: epick's own, and llm-d's two chains."""
    out = []
    for name, processor in (
        ("epick's own (in-memory index)", TokenProcessor(64, "")),
        ("llm-d cbor-fnv (shared index, upstream's default)", UpstreamTokenProcessor(64, "", "cbor-fnv")),
        ("llm-d xxh64 (shared index)", UpstreamTokenProcessor(64, "", "xxh64")),
    ):
        samples = []
        for _ in range(20):
            start = time.perf_counter()
            processor.keys(prompt, "m")
            samples.append(time.perf_counter() - start)
        out.append((name, percentiles(samples)[0] * 1e3))
    return out


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

    found = with_redis(lambda url: shared_decisions(url, runs, prompt, pods))
    table = Table(title="the same decision on an index shared through Redis (loopback), keys read first (ms)")
    for column in ("index", "p50", "p99", "vs in-memory (p50)"):
        table.add_column(column, justify="right" if column != "index" else "left")
    table.add_row("in memory (baseline, above)", f"{p50 * 1e3:.3f}", f"{p99 * 1e3:.3f}", "1×")
    if found is None:
        table.add_row("Redis: skipped, no redis-server installed", "", "", "")
    else:
        s50, s99 = found
        table.add_row(
            "Redis: one pipelined read + decide", f"{s50 * 1e3:.3f}", f"{s99 * 1e3:.3f}", f"{s50 / p50:.1f}×"
        )
    for name, ms in key_cost(prompt):
        table.add_row(f"block keys of the prompt: {name}", f"{ms:.3f}", "", "")
    console.print(table)

    per_million = memory_per_million(blocks)
    console.print(
        f"index memory: {per_million / 2**20:,.0f} MiB per million blocks "
        f"(one endpoint each; measured on {blocks:,})"
    )


if __name__ == "__main__":
    main()
