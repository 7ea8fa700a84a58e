"""KV events over ZMQ into the precise index: per-endpoint sockets that follow discovery, a central
bound socket, sequence gaps (replayed, or the endpoint's blocks dropped), restarts and garbage."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import zmq
import zmq.asyncio

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.kvevents import END_OF_REPLAY, KVEventSubscribers
from epick.kvcache import BlockHasher, BlockStored, EventBatch, encode_batch, event_hash
from epick.plugins.prefix.precise import PrecisePrefixCacheProducer
from epick.plugins.prefix.precise_parameters import PreciseParameters

TOKENS = tuple(range(500, 564))  # 4 blocks of 16
POD = "127.0.0.1:8000"


def batch_for(tokens: tuple[int, ...], parent: bytes | None = None, first: int = 0) -> tuple[bytes, bytes]:
    """An encoded batch storing `tokens`, and the last block's digest (to chain the next one on)."""
    hasher = BlockHasher(16, "sha256_cbor", "0")
    digests = hasher.block_hashes(tokens, parent=parent, first_block=first)
    event = BlockStored(
        tuple(event_hash(d) for d in digests),
        None if parent is None else event_hash(parent),
        tokens,
        16,
        None,
        "GPU",
        None,
    )
    return encode_batch(EventBatch(1.0, (event,), 0)), digests[-1]


def held(producer: PrecisePrefixCacheProducer, tokens: tuple[int, ...] = TOKENS) -> int:
    found = producer.index.lookup(producer.processor.keys(tokens, "m"))
    return len(found)


async def until(condition: Callable[[], bool], what: str, publish: Callable[[], Any] | None = None) -> None:
    for _ in range(500):
        if condition():
            return
        if publish is not None:
            publish()
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


def producer(**events: Any) -> PrecisePrefixCacheProducer:
    return PrecisePrefixCacheProducer(params=PreciseParameters.model_validate({"kvEventsConfig": events}))


@dataclass
class Engine:
    """One endpoint (pod-a, 127.0.0.1:8000) whose engine publishes on `pub`, subscribed to."""

    pub: zmq.asyncio.Socket
    datastore: Datastore
    sink: PrecisePrefixCacheProducer
    subscribers: KVEventSubscribers


@pytest.fixture
async def engine(context: zmq.asyncio.Context, unused_tcp_port: int) -> AsyncIterator[Engine]:
    pub = context.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{unused_tcp_port}")
    datastore = Datastore()
    datastore.upsert(EndpointSpec("pod-a", "127.0.0.1", 8000, {}))
    sink = producer(discoverPods=True, podDiscoveryConfig={"socketPort": unused_tcp_port})
    subscribers = KVEventSubscribers(datastore, context)
    await subscribers.start([sink])
    yield Engine(pub, datastore, sink, subscribers)
    await subscribers.stop()
    pub.close(linger=0)


async def test_per_endpoint_socket_applies_events_and_follows_discovery(engine: Engine) -> None:
    pub, datastore, sink, subscribers = engine.pub, engine.datastore, engine.sink, engine.subscribers
    payload, _ = batch_for(TOKENS)
    topic = b"kv@somewhere-else:1@m"  # per endpoint, the endpoint is who it is, whatever the topic
    await until(
        lambda: held(sink) == 4, "the first batch", lambda: pub.send_multipart([topic, bytes(8), payload])
    )
    assert sink.tracker.stats.stored >= 1 and subscribers.stats.gaps == 0
    # The endpoint leaves: its blocks leave the index, and its socket closes.
    datastore.remove("pod-a")
    assert held(sink) == 0 and not subscribers._per_endpoint


async def test_gap_without_replay_drops_the_endpoint_and_restart_too(engine: Engine) -> None:
    pub, sink, subscribers = engine.pub, engine.sink, engine.subscribers
    first, _ = batch_for(TOKENS)
    topic = b"kv@127.0.0.1:8000@m"
    await until(lambda: held(sink) == 4, "seq 0", lambda: pub.send_multipart([topic, bytes(8), first]))
    other = tuple(range(900, 932))
    later, _ = batch_for(other)
    pub.send_multipart([topic, (5).to_bytes(8, "big"), later])  # 1..4 missed
    await until(lambda: subscribers.stats.gaps == 1, "the gap")
    assert held(sink) == 0 and held(sink, other) == 2  # what was known is dropped; the new batch applied
    assert subscribers.stats.resets == 1
    pub.send_multipart([topic, (2).to_bytes(8, "big"), first])  # back in time: the engine restarted
    await until(lambda: subscribers.stats.resets == 2, "the restart")
    assert held(sink) == 4 and held(sink, other) == 0
    # Garbage is counted and skipped; the stream goes on.
    pub.send_multipart([topic, b"\x00", b"junk"])
    pub.send_multipart([topic, (3).to_bytes(8, "big"), b"\xc1"])
    pub.send_multipart([b"kv@x@m", b"only two frames"])
    await until(lambda: subscribers.stats.bad == 3, "the bad messages")
    pub.send_multipart([topic, (3).to_bytes(8, "big"), later])
    await until(lambda: held(sink, other) == 2, "a good message after the bad ones")


async def test_gap_with_a_replay_socket_is_filled(
    context: zmq.asyncio.Context, unused_tcp_port_factory: Callable[[], int]
) -> None:
    pub_port, replay_port = unused_tcp_port_factory(), unused_tcp_port_factory()
    pub = context.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    router = context.socket(zmq.ROUTER)
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    datastore = Datastore()
    datastore.upsert(EndpointSpec("pod-a", "127.0.0.1", 8000, {}))
    sink = producer(podDiscoveryConfig={"socketPort": pub_port, "replaySocketPort": replay_port})
    subscribers = KVEventSubscribers(datastore, context)
    await subscribers.start([sink])
    topic = b"kv@127.0.0.1:8000@m"
    first, parent = batch_for(TOKENS[:32])
    second, _ = batch_for(TOKENS[32:], parent=parent, first=2)
    unrelated, _ = batch_for(tuple(range(900, 916)))

    async def serve_replay() -> list[int]:
        client, empty, start = await router.recv_multipart()
        assert empty == b""
        # vLLM 0.34's replay: [client, "", topic, seq, payload] per buffered batch, then the end marker.
        await router.send_multipart([client, b"", topic, (1).to_bytes(8, "big"), second])
        await router.send_multipart([client, b"", topic, (2).to_bytes(8, "big"), unrelated])
        await router.send_multipart([client, b"", b"", END_OF_REPLAY, b""])
        return [int.from_bytes(start, "big")]

    try:
        await until(lambda: held(sink) == 2, "seq 0", lambda: pub.send_multipart([topic, bytes(8), first]))
        replay = asyncio.get_running_loop().create_task(serve_replay())
        pub.send_multipart([topic, (2).to_bytes(8, "big"), unrelated])  # seq 1 missed
        assert await asyncio.wait_for(replay, 5) == [1]
        await until(lambda: subscribers.stats.replays == 1 and held(sink) == 4, "the replayed batch")
        assert subscribers.stats.resets == 0
    finally:
        await subscribers.stop()
        pub.close(linger=0)
        router.close(linger=0)


async def test_central_socket_takes_the_endpoint_from_the_topic(
    context: zmq.asyncio.Context, unused_tcp_port: int
) -> None:
    datastore = Datastore()
    datastore.upsert(EndpointSpec("pod-a", "10.1.1.1", 8000, {}))
    sink = producer(zmqEndpoint=f"tcp://127.0.0.1:{unused_tcp_port}", discoverPods=False)
    subscribers = KVEventSubscribers(datastore, context)
    await subscribers.start([sink])
    engine = context.socket(zmq.PUB)
    engine.connect(f"tcp://127.0.0.1:{unused_tcp_port}")  # vLLM connects when its endpoint names a host
    try:
        payload, _ = batch_for(TOKENS)
        send = lambda: engine.send_multipart([b"kv@10.1.1.1:8000@m", bytes(8), payload])  # noqa: E731
        await until(lambda: held(sink) == 4, "the central batch", send)
        assert sink.index.lookup(sink.processor.keys(TOKENS, "m"))[0] == (("10.1.1.1:8000", "gpu"),)
        datastore.remove("pod-a")  # an endpoint that leaves leaves the index in this mode too
        assert held(sink) == 0
    finally:
        await subscribers.stop()
        engine.close(linger=0)


async def test_the_collector_reports_what_the_subscribers_counted(engine: Engine) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from epick.datalayer.kvevents import KVEventsCollector

    pub, sink, subscribers = engine.pub, engine.sink, engine.subscribers
    registry = CollectorRegistry()
    registry.register(KVEventsCollector(subscribers))
    payload, _ = batch_for(TOKENS)
    topic = b"kv@127.0.0.1:8000@m"
    await until(lambda: held(sink) == 4, "seq 0", lambda: pub.send_multipart([topic, bytes(8), payload]))
    pub.send_multipart([topic, (1).to_bytes(8, "big"), b"junk"])
    await until(lambda: subscribers.stats.bad == 1, "the bad message")
    text = generate_latest(registry).decode()
    assert "llm_d_epp_kv_cache_events_active_subscribers 1.0" in text
    labels = 'operation="decode",pod_identifier="127.0.0.1:8000"'
    assert f"llm_d_epp_kv_cache_events_zmq_errors_total{{{labels}}} 1.0" in text
    assert 'llm_d_epp_kv_cache_events_messages_received_total{pod_identifier="127.0.0.1:8000"}' in text
