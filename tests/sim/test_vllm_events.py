"""The sim server's KV events are vLLM's: checked from the wire with a decoder and vLLM's block hashing
written here, independently of epick's code, from vLLM 0.34's definitions.

Wire (vllm/distributed/kv_events.py): frames [topic, sequence (8 bytes, big-endian, from 0),
msgpack(EventBatch)]; EventBatch is an array [ts: float, events: list, data_parallel_rank: int|None];
an event is a map tagged by "type" (msgspec `tag=True`, `omit_defaults`), or, before 0.34, an array
[tag, *fields] in field order.

Hashes (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py): a full block's hash is
hash_fn((parent, tuple(token_ids), extra_keys)), parent being the previous block's digest or NONE_HASH =
hash_fn(PYTHONHASHSEED or "vllm-none-hash"); sha256 hashes pickle protocol 5, sha256_cbor canonical
CBOR, xxhash XXH3-128 of the pickle. Extra keys: ("lora", name, path) on every block of a LoRA
request, then ("cache_salt", salt) on the first block; None when there are none. The event carries
int.from_bytes(digest[-8:], "big").
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import cbor2
import msgpack
import pytest
import xxhash
import zmq
import zmq.asyncio

from epick.sim.server import SimServer
from epick.tokenization import Tokenizer, load
from tests.sim.conftest import ServerFactory, free_port, token_prompt

MODEL = "sim-model"
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "tokenizer"

# The decoder: vLLM 0.34's schema.

STORED_FIELDS = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
    "extra_keys", "group_idx",
)  # fmt: skip
STORED_REQUIRED = STORED_FIELDS[:7]  # the fields without a default: never omitted
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
FIELDS = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS, "AllBlocksCleared": ()}
REQUIRED = {"BlockStored": STORED_REQUIRED, "BlockRemoved": REMOVED_FIELDS[:2], "AllBlocksCleared": ()}


def decode_event(raw: Any, layout: str) -> dict[str, Any]:
    if layout == "map":
        assert isinstance(raw, dict), raw
        tag = raw["type"]
        assert set(raw) - {"type"} <= set(FIELDS[tag]), raw
        event = dict(raw)
    else:
        assert isinstance(raw, list) and raw, raw
        tag, *values = raw
        assert len(values) <= len(FIELDS[tag]), raw
        event = {"type": tag, **dict(zip(FIELDS[tag], values, strict=False))}
    assert all(name in event for name in REQUIRED[tag]), event
    return event


@dataclass
class Batch:
    topic: bytes
    seq: int
    ts: float
    events: list[dict[str, Any]]
    dp_rank: int | None


def decode_message(frames: list[bytes], layout: str) -> Batch:
    assert len(frames) == 3, frames
    topic, seq, payload = frames
    assert len(seq) == 8
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    assert isinstance(batch, list) and 2 <= len(batch) <= 3, batch
    ts, events = batch[0], batch[1]
    assert isinstance(ts, float) and isinstance(events, list)
    rank = batch[2] if len(batch) == 3 else None
    return Batch(topic, int.from_bytes(seq, "big"), ts, [decode_event(e, layout) for e in events], rank)


# vLLM's block hashes.


def hash_fn(algorithm: str) -> Callable[[Any], bytes]:
    if algorithm == "sha256":
        return lambda v: hashlib.sha256(pickle.dumps(v, protocol=5)).digest()
    if algorithm == "sha256_cbor":
        return lambda v: hashlib.sha256(cbor2.dumps(v, canonical=True)).digest()
    if algorithm == "xxhash":
        return lambda v: xxhash.xxh3_128_digest(pickle.dumps(v, protocol=5))
    raise AssertionError(algorithm)


@dataclass
class VLLMHashing:
    algorithm: str
    seed: str  # PYTHONHASHSEED, or vLLM's default for sha256
    block_size: int
    lora: tuple[str, str] | None = None
    cache_salt: str | None = None
    fn: Callable[[Any], bytes] = field(init=False)
    none_hash: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.fn = hash_fn(self.algorithm)
        self.none_hash = self.fn(self.seed)

    def extra_keys(self, block_index: int) -> tuple[Any, ...] | None:
        keys: list[Any] = []
        if self.lora is not None:
            keys.append(("lora", *self.lora))
        if block_index == 0 and self.cache_salt:
            keys.append(("cache_salt", self.cache_salt))
        return tuple(keys) if keys else None

    def digests(self, tokens: list[int]) -> list[bytes]:
        """The digests of the full blocks of a request's tokens, from its start."""
        bs, out, parent = self.block_size, [], self.none_hash
        for i in range(len(tokens) // bs):
            parent = self.fn((parent, tuple(tokens[i * bs : (i + 1) * bs]), self.extra_keys(i)))
            out.append(parent)
        return out


def as_event(digest: bytes) -> int:
    return int.from_bytes(digest[-8:], "big")


# A subscriber that sees every message from the first (sequence 0).


class Subscriber:
    def __init__(self, socket: zmq.asyncio.Socket, layout: str) -> None:
        self.socket = socket
        self.layout = layout
        self.batches: list[Batch] = []

    async def next(self, timeout: float = 3.0) -> Batch:
        frames = await asyncio.wait_for(self.socket.recv_multipart(), timeout)
        batch = decode_message(frames, self.layout)
        self.batches.append(batch)
        return batch

    async def until(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 5.0
    ) -> list[dict[str, Any]]:
        """Events received (from now on) until `done` holds for them."""
        events: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while not done(events):
                events += (await self.next()).events
        return events

    @property
    def events(self) -> list[dict[str, Any]]:
        return [e for b in self.batches for e in b.events]


@pytest.fixture
async def zmq_ctx() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.destroy(linger=0)


async def subscribe(ctx: zmq.asyncio.Context, server: SimServer, endpoint: str, layout: str) -> Subscriber:
    """A SUB socket on the server's endpoint, connected before the server publishes anything: probe
    messages are sent on the server's PUB socket itself (they take no sequence number) until one
    arrives, then a last probe marks where the server's own messages begin."""
    socket = ctx.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv@")
    socket.connect(endpoint)
    assert server._publisher is not None
    pub = server._publisher.socket
    try:
        async with asyncio.timeout(5):
            while True:
                pub.send_multipart([b"kv@probe", b"", b""])
                if await socket.poll(timeout=20):
                    break
            pub.send_multipart([b"kv@probe-end", b"", b""])
            while (await socket.recv_multipart())[0] != b"kv@probe-end":
                pass
    except BaseException:
        socket.close(linger=0)
        raise
    return Subscriber(socket, layout)


@dataclass
class Setup:
    server: SimServer
    sub: Subscriber
    http: aiohttp.ClientSession

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.http.post(self.server.url + path, json=body) as r:
            assert r.status == 200, await r.text()
            result: dict[str, Any] = await r.json()
            return result


@pytest.fixture
async def make_kv(
    make_server: ServerFactory, zmq_ctx: zmq.asyncio.Context, http: aiohttp.ClientSession
) -> AsyncIterator[Callable[..., Any]]:
    subs: list[Subscriber] = []  # held to the end: the context holds its sockets only weakly

    async def make(layout: str = "map", **kw: Any) -> Setup:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        if layout != "map":
            kw["kv_events_encoding"] = layout
        server = await make_server(kv_events_endpoint=endpoint, **kw)
        subs.append(await subscribe(zmq_ctx, server, endpoint, layout))
        return Setup(server, subs[-1], http)

    yield make
    for sub in subs:
        sub.socket.close(linger=0)


def stored(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "BlockStored"]


def covers(tokens: list[int], block_size: int) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether the BlockStored events gathered hold the full blocks of `tokens` (in one chain)."""
    n = len(tokens) // block_size * block_size
    return lambda events: sum(len(e["token_ids"]) for e in stored(events)) >= n


def check_chain(events: list[dict[str, Any]], vllm: VLLMHashing) -> dict[int, bytes]:
    """Check each BlockStored's hashes against vLLM's, chaining from its parent's digest (NONE_HASH
    for a first block); the digests by event hash."""
    known: dict[int, bytes] = {}
    bs = vllm.block_size
    for e in stored(events):
        assert e["block_size"] == bs
        assert len(e["token_ids"]) == bs * len(e["block_hashes"])
        parent = e["parent_block_hash"]
        if parent is None:
            digest, first = vllm.none_hash, 0
        else:
            digest, first = known[parent], 1
        for j, h in enumerate(e["block_hashes"]):
            tokens = tuple(e["token_ids"][j * bs : (j + 1) * bs])
            digest = vllm.fn((digest, tokens, vllm.extra_keys(first + j)))
            assert h == as_event(digest)
            known[h] = digest
    return known


SEED_UNSET = "vllm-none-hash"
LONG_MESSAGES = [
    {"role": "system", "content": "You are a careful assistant who answers in one short sentence."},
    {"role": "user", "content": "Which block of the prefix cache does a request reuse, and why is it safe?"},
]


async def test_chat_events_carry_vllms_sha256_block_hashes(
    make_kv: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kv: Setup = await make_kv(tokenizer=str(TOKENIZER_DIR))
    tok: Tokenizer = load(str(TOKENIZER_DIR))
    prompt = tok.encode_chat(LONG_MESSAGES)
    bs = kv.server.options.engine.block_size
    assert len(prompt) >= 3 * bs
    await kv.post("/v1/chat/completions", {"model": MODEL, "messages": LONG_MESSAGES, "max_tokens": 1})
    events = await kv.sub.until(covers(prompt, bs))

    [event] = stored(events)
    n = len(prompt) // bs
    vllm = VLLMHashing("sha256", SEED_UNSET, bs)
    assert event["token_ids"] == prompt[: n * bs]  # the chat's tokens, as the tokenizer encodes them
    assert event["block_hashes"] == [as_event(d) for d in vllm.digests(prompt)]
    assert event["parent_block_hash"] is None
    assert event["block_size"] == bs
    assert event["medium"] == "GPU"
    assert event["lora_id"] is None and event["lora_name"] is None
    assert "extra_keys" not in event  # none: left out, as msgspec omits a default
    [batch] = kv.sub.batches
    assert batch.seq == 0
    assert batch.topic == f"kv@127.0.0.1:{kv.server.port}@{MODEL}".encode()
    assert batch.dp_rank == 0

    # A longer conversation continues the chain from the cached prefix's last block.
    longer = [*LONG_MESSAGES, {"role": "assistant", "content": "The longest cached prefix."}]
    longer += [{"role": "user", "content": "And what evicts a block from the cache in the end?"}]
    prompt2 = tok.encode_chat(longer)
    assert prompt2[: n * bs] == prompt[: n * bs]
    result = await kv.post("/v1/chat/completions", {"model": MODEL, "messages": longer, "max_tokens": 1})
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] >= (n - 1) * bs
    events = await kv.sub.until(covers(prompt2[n * bs :], bs))
    [tail] = stored(events)
    expected = vllm.digests(prompt2)
    assert tail["parent_block_hash"] == as_event(expected[n - 1])
    assert tail["block_hashes"] == [as_event(d) for d in expected[n:]]
    assert tail["token_ids"] == prompt2[n * bs : len(expected) * bs]
    assert [b.seq for b in kv.sub.batches] == list(range(len(kv.sub.batches)))


async def test_generated_blocks_chain_on_and_sequence_numbers_count_from_zero(
    make_kv: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    kv: Setup = await make_kv(tokenizer=str(TOKENIZER_DIR))
    tok = load(str(TOKENIZER_DIR))
    vllm = VLLMHashing("sha256", "1234", kv.server.options.engine.block_size)
    prompts = [f"Request number {i} asks the simulated server for a few more tokens." for i in range(4)]
    for text in prompts:
        # 40 generated tokens: the blocks they fill are cached (and published) too.
        await kv.post("/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 40})
    wanted = sum((len(tok.encode(t)) + 40 - 1) // vllm.block_size for t in prompts)
    events = await kv.sub.until(lambda evs: sum(len(e["block_hashes"]) for e in stored(evs)) >= wanted)
    known = check_chain(events, vllm)
    assert len(known) == wanted
    roots = [e for e in stored(events) if e["parent_block_hash"] is None]
    assert len(roots) == len(prompts)
    for text, root in zip(prompts, roots, strict=True):  # each chain starts with its prompt's tokens
        ids = tok.encode(text)
        assert root["token_ids"][: len(ids)] == ids[: len(root["token_ids"])]
    assert all(0 <= t < tok.vocab_size for e in stored(events) for t in e["token_ids"])
    assert [b.seq for b in kv.sub.batches] == list(range(len(kv.sub.batches)))


async def test_lora_and_cache_salt_extra_keys_with_sha256_cbor(
    make_kv: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    kv: Setup = await make_kv(
        prefix_caching_hash_algo="sha256_cbor",
        lora_modules=("beta=/adapters/beta",),
        engine={"block_size": 8},
    )
    prompt = token_prompt(100, 3 * 8 + 3)
    body = {"model": "beta", "prompt": prompt, "max_tokens": 1, "cache_salt": "tenant-a"}
    await kv.post("/v1/completions", body)
    [event] = stored(await kv.sub.until(covers(prompt, 8)))
    vllm = VLLMHashing("sha256_cbor", "0", 8, lora=("beta", "/adapters/beta"), cache_salt="tenant-a")
    assert event["block_hashes"] == [as_event(d) for d in vllm.digests(prompt)]
    assert event["lora_id"] == kv.server.loras["beta"] and event["lora_name"] == "beta"
    assert event["block_size"] == 8
    # vLLM's event extra keys: one entry per block, tags stripped (to_event_extra_keys).
    assert event["extra_keys"] == [["beta", "tenant-a"], ["beta"], ["beta"]]

    # Another salt: nothing is shared, and the hashes are that salt's.
    body["cache_salt"] = "tenant-b"
    result = await kv.post("/v1/completions", body)
    assert result["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    [event] = stored(await kv.sub.until(covers(prompt, 8)))
    vllm.cache_salt = "tenant-b"
    assert event["block_hashes"] == [as_event(d) for d in vllm.digests(prompt)]
    # No salt, base model: neither key.
    await kv.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    [event] = stored(await kv.sub.until(covers(prompt, 8)))
    plain = VLLMHashing("sha256_cbor", "0", 8)
    assert event["block_hashes"] == [as_event(d) for d in plain.digests(prompt)]


async def test_array_layout_with_xxhash(make_kv: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    kv: Setup = await make_kv("array", prefix_caching_hash_algo="xxhash")
    prompt = token_prompt(500, 2 * 16 + 1)
    await kv.post("/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    [event] = stored(await kv.sub.until(covers(prompt, 16)))
    vllm = VLLMHashing("xxhash", "42", 16)
    assert event["block_hashes"] == [as_event(d) for d in vllm.digests(prompt)]
    assert event["medium"] == "GPU" and event["token_ids"] == prompt[:32]
    assert kv.sub.batches[0].seq == 0


async def test_block_removed_carries_the_vllm_hash_and_mappings_stay_bounded(
    make_kv: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    # 8 blocks of 16 tokens; each prompt (3 blocks + 5 tokens) holds 4 blocks, 3 of them full.
    kv: Setup = await make_kv(engine={"num_gpu_blocks": 8})
    vllm = VLLMHashing("sha256", SEED_UNSET, 16)
    prompts = [token_prompt(6000 + 100 * i, 3 * 16 + 5) for i in range(4)]
    for p in prompts:
        await kv.post("/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": 1})
        await kv.sub.until(covers(p, 16))
    events = kv.sub.events
    removed = [e for e in events if e["type"] == "BlockRemoved"]
    expected = [[as_event(d) for d in vllm.digests(p)] for p in prompts]
    assert [e["block_hashes"] for e in stored(events)] == expected
    # The third request evicts the first one's blocks, the fourth the second one's.
    assert [sorted(e["block_hashes"]) for e in removed] == [sorted(expected[0]), sorted(expected[1])]
    assert all(e["medium"] == "GPU" for e in removed)
    hashes = kv.server._hashes
    assert hashes is not None
    assert sorted(hashes.digests.values()) == sorted(d for p in prompts[2:] for d in vllm.digests(p))

    async with kv.http.post(kv.server.url + "/reset_prefix_cache") as r:
        assert r.status == 200
    events = (await kv.sub.next()).events
    assert events == [{"type": "AllBlocksCleared"}]
    assert hashes.digests == {}
    assert [b.seq for b in kv.sub.batches] == list(range(len(kv.sub.batches)))


def test_a_parent_evicted_meanwhile_is_hashed_again_from_its_request() -> None:
    """A block whose parent's engine block was evicted meanwhile (a duplicate of a block the request
    computed itself) still chains on from the parent's vLLM hash, found from the request's tokens."""
    from epick.kvcache import BlockRemoved, BlockStored
    from epick.sim.engine import BlockRemoved as Removed
    from epick.sim.engine import BlockStored as Stored
    from epick.sim.engine import SimRequest
    from epick.sim.engine.kv_cache import chain_hashes
    from epick.sim.kv_events import VLLMHashes

    tokens = token_prompt(10, 48)
    req = SimRequest("r", tokens, 1)
    req.block_hashes = chain_hashes(tokens, 0, 3, block_size=16, parent=None, lora_id=None)
    h0, h1, h2 = req.block_hashes
    live = [req]
    translator = VLLMHashes(16, "sha256", "7", requests=lambda: live)
    expected = [as_event(d) for d in VLLMHashing("sha256", "7", 16).digests(tokens)]
    out = translator.translate(
        [
            Stored([h0], None, tokens[:16], 16, None),
            Removed([h0]),
            Stored([h1, h2], h0, tokens[16:], 16, None),
        ]
    )
    first, removed, rest = out
    assert isinstance(first, BlockStored) and isinstance(removed, BlockRemoved)
    assert isinstance(rest, BlockStored)
    assert first.block_hashes == (expected[0],) and removed.block_hashes == (expected[0],)
    assert rest.parent_block_hash == expected[0]
    assert rest.block_hashes == tuple(expected[1:])
    assert set(translator.digests) == {h1, h2}
    # Nobody to ask: the event is left out rather than published with a wrong hash.
    live.clear()
    translator.digests.clear()
    assert translator.translate([Stored([h2], h1, tokens[32:], 16, None)]) == []
    assert translator.translate([Removed([h1])]) == []  # not cached: nothing to remove


def test_event_flags_reach_the_server_options() -> None:
    from epick.cli.main import build_parser
    from epick.cli.sim_server import options_from

    argv = ["sim-server", "--kv-events-encoding", "array", "--prefix-caching-hash-algo", "xxhash_cbor"]
    options = options_from(build_parser().parse_args([*argv, "--tokenizer", str(TOKENIZER_DIR)]))
    assert (options.kv_events_encoding, options.prefix_caching_hash_algo) == ("array", "xxhash_cbor")
    assert options.tokenizer == str(TOKENIZER_DIR)
    default = options_from(build_parser().parse_args(["sim-server"]))
    assert (default.kv_events_encoding, default.prefix_caching_hash_algo, default.tokenizer) == (
        "map",
        "sha256",
        None,
    )


@pytest.mark.parametrize("argv", [["--kv-events-encoding", "json"], ["--prefix-caching-hash-algo", "md5"]])
def test_bad_event_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from epick.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["sim-server", *argv])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_missing_tokenizer_is_an_error_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from epick.cli.main import main

    assert main(["sim-server", "--port", "0", "--tokenizer", str(tmp_path / "none")]) == 2
    assert "--tokenizer" in capsys.readouterr().err
