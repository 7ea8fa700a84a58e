"""KV-cache events as a subscriber sees them: a ZMQ SUB on the server's PUB endpoint, vLLM's wire format
(vLLM 0.34's by default: events are maps tagged by "type"). The block hashes themselves are checked
against vLLM's hashing in test_vllm_events.py."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack
import pytest
import zmq
import zmq.asyncio

from epick.sim.server import SimServer, serve
from tests.sim.conftest import BLOCK, ServerFactory, free_consecutive_ports, free_port, options, token_prompt

MODEL = "sim-model"
Event = dict[str, Any]


@dataclass
class Message:
    topic: bytes
    seq: int
    timestamp: float
    events: list[Event]
    dp_rank: int


class Subscriber:
    """A SUB socket on a server's KV-event endpoint, subscribed to every `kv@` topic."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.socket = ctx.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"kv@")
        self.socket.connect(endpoint)
        self.received: list[Message] = []

    async def recv(self, timeout: float = 2.0) -> Message:
        frames = await asyncio.wait_for(self.socket.recv_multipart(), timeout)
        assert len(frames) == 3, frames
        topic, seq, payload = frames
        assert len(seq) == 8
        decoded = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        assert isinstance(decoded, list) and len(decoded) == 3, decoded
        ts, events, dp_rank = decoded
        assert all(isinstance(e, dict) and "type" in e for e in events), events
        message = Message(topic, int.from_bytes(seq, "big"), ts, events, dp_rank)
        self.received.append(message)
        return message

    async def events_until(self, done: Callable[[list[Event]], bool], timeout: float = 3.0) -> list[Event]:
        """Receive messages until the events gathered (from now on) satisfy `done`."""
        gathered: list[Event] = []
        async with asyncio.timeout(timeout):
            while not done(gathered):
                gathered.extend((await self.recv(timeout)).events)
        return gathered

    async def drain(self) -> None:
        while await self.socket.poll(timeout=50):
            await self.recv()


class Client:
    def __init__(self, http: aiohttp.ClientSession, server: SimServer) -> None:
        self.http = http
        self.server = server

    async def complete(
        self, prompt: list[int], max_tokens: int = 1, model: str | None = None
    ) -> dict[str, Any]:
        body = {"model": model or self.server.options.model, "prompt": prompt, "max_tokens": max_tokens}
        async with self.http.post(self.server.url + "/v1/completions", json=body) as r:
            assert r.status == 200, await r.text()
            result: dict[str, Any] = await r.json()
            return result


_warmup_ids = itertools.count()


async def connect(sub: Subscriber, client: Client, attempts: int = 40) -> None:
    """Beat ZMQ's slow joiner: send distinct small requests until one's events arrive, then drain.

    Each warm-up prompt fills two new blocks, so it publishes a BlockStored; until the subscription
    has reached the publisher those messages are dropped.
    """
    for _ in range(attempts):
        start = 30_000 + (next(_warmup_ids) * 2 * BLOCK) % 1_900
        await client.complete(token_prompt(start, 2 * BLOCK))
        if await sub.socket.poll(timeout=100):
            await sub.drain()
            sub.received.clear()
            return
    pytest.fail("no KV event reached the subscriber")


def kinds(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


def stored(events: list[Event]) -> list[Event]:
    return [e for e in events if e["type"] == "BlockStored"]


def stored_hashes(events: list[Event]) -> list[int]:
    return [h for e in stored(events) for h in e["block_hashes"]]


def removed_hashes(events: list[Event]) -> list[int]:
    return [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]


def has_stored_tokens(tokens: list[int]) -> Callable[[list[Event]], bool]:
    """True once the BlockStored events gathered cover `tokens` (whole blocks of them)."""
    n = len(tokens) // BLOCK * BLOCK
    return lambda events: any(t[:n] == tokens[:n] for t in _chains(events))


def _chains(events: list[Event]) -> list[list[int]]:
    return [e["token_ids"] for e in stored(events)]


@pytest.fixture
async def zmq_ctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


@dataclass
class Setup:
    server: SimServer
    sub: Subscriber
    client: Client
    endpoint: str


@pytest.fixture
async def make_kv(
    make_server: ServerFactory, zmq_ctx: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> Callable[..., Any]:
    async def make(**kw: Any) -> Setup:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        server = await make_server(kv_events_endpoint=endpoint, **kw)
        sub = Subscriber(zmq_ctx, endpoint)
        client = Client(http, server)
        await connect(sub, client)
        return Setup(server, sub, client, endpoint)

    return make


async def test_block_stored_wire_format(make_kv: Callable[..., Any]) -> None:
    kv: Setup = await make_kv(model="wire-model")
    prompt = token_prompt(1000, 3 * BLOCK + 5)  # three full blocks and a partial one
    result = await kv.client.complete(prompt, max_tokens=1, model="wire-model")
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    events = await kv.sub.events_until(has_stored_tokens(prompt))

    message = kv.sub.received[-1]
    assert message.topic == f"kv@127.0.0.1:{kv.server.port}@wire-model".encode()
    assert isinstance(message.timestamp, float) and message.timestamp > 1.6e9
    assert message.dp_rank == 0
    [event] = stored(events)
    # vLLM 0.34 omits fields at their default (extra_keys, group_idx), not the required ones.
    assert set(event) == {
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
        "lora_name",
    }  # fmt: skip
    hashes, parent, token_ids = event["block_hashes"], event["parent_block_hash"], event["token_ids"]
    block_size, lora_id, medium = event["block_size"], event["lora_id"], event["medium"]
    assert len(hashes) == 3
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    assert len(set(hashes)) == 3
    assert parent is None  # a new chain
    assert token_ids == prompt[: 3 * BLOCK]
    assert len(token_ids) == len(hashes) * block_size
    assert block_size == BLOCK
    assert lora_id is None
    assert event["lora_name"] is None
    assert medium == "GPU"


async def test_extension_links_to_parent_and_repeat_stores_nothing(make_kv: Callable[..., Any]) -> None:
    kv: Setup = await make_kv()
    first = token_prompt(2000, 2 * BLOCK)
    await kv.client.complete(first)
    [head] = stored(await kv.sub.events_until(has_stored_tokens(first)))
    longer = first + token_prompt(3000, 2 * BLOCK + 3)
    result = await kv.client.complete(longer)
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == 2 * BLOCK
    tail_tokens = longer[2 * BLOCK : 4 * BLOCK]
    events = await kv.sub.events_until(lambda evs: any(t == tail_tokens for t in _chains(evs)))
    [tail] = stored(events)
    assert tail["parent_block_hash"] == head["block_hashes"][-1]  # the last block of the cached prefix
    assert len(tail["block_hashes"]) == 2
    assert not set(tail["block_hashes"]) & set(head["block_hashes"])

    # The same prompt again: every full block is cached, so it publishes nothing; the next
    # request's event is the next message.
    seq_before = kv.sub.received[-1].seq
    marker = token_prompt(4000, BLOCK)
    await kv.client.complete(longer)
    await kv.client.complete(marker)
    events = await kv.sub.events_until(has_stored_tokens(marker))
    assert [e["token_ids"] for e in events] == [marker]
    assert kv.sub.received[-1].seq == seq_before + 1


async def test_sequence_numbers_increase_by_one(make_kv: Callable[..., Any]) -> None:
    kv: Setup = await make_kv()
    prompts = [token_prompt(5000 + 100 * i, 2 * BLOCK) for i in range(8)]
    for p in prompts:
        await kv.client.complete(p, max_tokens=2)
    await kv.sub.events_until(has_stored_tokens(prompts[-1]))
    seqs = [m.seq for m in kv.sub.received]
    assert len(seqs) >= len(prompts)
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    topics = {m.topic for m in kv.sub.received}
    assert topics == {f"kv@127.0.0.1:{kv.server.port}@{MODEL}".encode()}


async def test_eviction_publishes_block_removed(make_kv: Callable[..., Any]) -> None:
    # 8 blocks of 16 tokens; each request (3 blocks + 5 tokens of prompt) takes 4 blocks, 3 of them full.
    kv: Setup = await make_kv(engine={"num_gpu_blocks": 8, "block_size": BLOCK})
    async with kv.client.http.post(kv.server.url + "/reset_prefix_cache") as r:
        assert r.status == 200  # forget the warm-up: every block is free and unhashed
    cleared = await kv.sub.events_until(lambda evs: "AllBlocksCleared" in kinds(evs))
    assert kinds(cleared) == ["AllBlocksCleared"]
    prompts = [token_prompt(6000 + 100 * i, 3 * BLOCK + 5) for i in range(4)]
    stored_by_prompt = []
    events: list[Event] = []
    for p in prompts:
        await kv.client.complete(p)
        new = await kv.sub.events_until(has_stored_tokens(p))
        events += new
        stored_by_prompt.append(stored_hashes(new))
    assert all(len(h) == 3 for h in stored_by_prompt)
    # The first two requests fill the cache. The third evicts the least recently freed blocks,
    # the first request's; the fourth, the second's.
    removals = [e for e in events if e["type"] == "BlockRemoved"]
    assert [set(e["block_hashes"]) for e in removals] == [set(stored_by_prompt[0]), set(stored_by_prompt[1])]
    assert all(e["medium"] == "GPU" for e in removals)
    stored_, removed_ = "BlockStored", "BlockRemoved"
    assert kinds(events) == [stored_, stored_, removed_, stored_, removed_, stored_]
    # What was removed is no longer cached; what is still stored is.
    r = await kv.client.complete(prompts[0])
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    r = await kv.client.complete(prompts[3])
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * BLOCK


async def test_reset_prefix_cache_publishes_all_blocks_cleared(make_kv: Callable[..., Any]) -> None:
    kv: Setup = await make_kv()
    prompt = token_prompt(7000, 4 * BLOCK)
    await kv.client.complete(prompt)
    await kv.sub.events_until(has_stored_tokens(prompt))
    async with kv.client.http.post(kv.server.url + "/reset_prefix_cache") as r:
        assert r.status == 200
    message = await kv.sub.recv()
    assert message.events == [{"type": "AllBlocksCleared"}]
    assert message.seq == kv.sub.received[-2].seq + 1
    # After the reset the same prompt is stored afresh, as a new chain.
    await kv.client.complete(prompt)
    [event] = stored(await kv.sub.events_until(has_stored_tokens(prompt)))
    assert event["parent_block_hash"] is None
    assert event["token_ids"] == prompt


async def test_lora_requests_carry_the_adapter_id(make_kv: Callable[..., Any]) -> None:
    kv: Setup = await make_kv(lora_modules=("alpha=/a", "beta=/b"))
    prompt = token_prompt(8000, 2 * BLOCK)
    ids = {}
    for model in ("beta", MODEL):
        await kv.client.complete(prompt, model=model)
        [event] = stored(await kv.sub.events_until(has_stored_tokens(prompt)))
        ids[model] = (event["lora_id"], event["lora_name"])
    assert ids == {"beta": (kv.server.loras["beta"], "beta"), MODEL: (None, None)}
    assert ids["beta"][0] == 2


async def test_serve_count_two_publishes_on_consecutive_ports(
    zmq_ctx: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> None:
    http_base = free_consecutive_ports(2)
    zmq_base = free_consecutive_ports(2)
    while abs(zmq_base - http_base) < 2:
        zmq_base = free_consecutive_ports(2)
    opts = options(port=http_base, count=2, kv_events_endpoint=f"tcp://127.0.0.1:{zmq_base}")
    ready: asyncio.Future[list[SimServer]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(opts, ready=ready.set_result))
    try:
        servers = await asyncio.wait_for(asyncio.shield(ready), 5)
        for i, server in enumerate(servers):
            sub = Subscriber(zmq_ctx, f"tcp://127.0.0.1:{zmq_base + i}")
            client = Client(http, server)
            await connect(sub, client)
            prompt = token_prompt(9000 + 100 * i, 2 * BLOCK)
            await client.complete(prompt)
            await sub.events_until(has_stored_tokens(prompt))
            assert {m.topic for m in sub.received} == {f"kv@127.0.0.1:{http_base + i}@{MODEL}".encode()}
            sub.socket.close(linger=0)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
