"""The engine model in virtual time: caching, queueing, eviction, preemption, LoRA slots, P/D."""

from __future__ import annotations

import pytest

from epick.sim.engine import (
    BlockPool,
    BlockRemoved,
    BlockStored,
    CostModel,
    Engine,
    EngineConfig,
    KVEvent,
    SimRequest,
)

COST = CostModel(overhead_s=0.005, prefill_token_s=0.0001, decode_seq_s=0.0, context_token_s=0.0,
                 transfer_token_s=0.00001, lora_load_s=0.0)  # fmt: skip


def make_engine(**kwargs: object) -> Engine:
    config = {"num_gpu_blocks": 1000, "block_size": 16, "cost": COST, **kwargs}
    return Engine(EngineConfig(**config))  # type: ignore[arg-type]


def req(rid: str, tokens: list[int], max_tokens: int = 4, at: float = 0.0, **kw: object) -> SimRequest:
    return SimRequest(rid, list(tokens), max_tokens, arrival_time=at, **kw)  # type: ignore[arg-type]


def run(engine: Engine, now: float = 0.0) -> tuple[float, list[KVEvent]]:
    """Step until idle; returns the end time and every KV event published."""
    events: list[KVEvent] = []
    while engine.has_work:
        result = engine.step(now)
        assert result.num_scheduled > 0, "work that cannot run"
        now = result.end
        events += result.events
    return now, events


def assert_pool_consistent(engine: Engine) -> None:
    pool = engine.pool
    assert all(r >= 0 for r in pool.ref_count)
    assert set(pool.free_block_ids()) == {b for b, r in enumerate(pool.ref_count) if r == 0}
    for h, b in pool.cached.items():
        assert pool.block_hash[b] == h


def test_cached_prefix_lowers_ttft_and_counts_hits() -> None:
    e = make_engine()
    prompt = list(range(320))  # 20 blocks
    a = req("a", prompt)
    e.add_request(a)
    t, _ = run(e)
    b = req("b", prompt[:310] + [9999] * 10, at=t)
    e.add_request(b)
    run(e, t)
    # a: 320 prefill tokens -> 0.005 + 320*0.0001 = 0.037 s; b: 19 blocks (304 tokens) cached,
    # 16 computed -> 0.005 + 16*0.0001 = 0.0066 s
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 304
    assert a.first_token_time == pytest.approx(0.037)
    assert b.first_token_time is not None and b.first_token_time - t == pytest.approx(0.0066)
    assert e.scheduler.prefix_queries == 640 and e.scheduler.prefix_hits == 304
    assert_pool_consistent(e)


def test_fully_cached_prompt_still_computes_its_last_block() -> None:
    e = make_engine()
    prompt = list(range(64))
    e.add_request(req("a", prompt))
    t, _ = run(e)
    b = req("b", prompt, at=t)
    e.add_request(b)
    run(e, t)
    assert b.num_cached_tokens == 48  # (64 - 1) // 16 = 3 blocks; the 4th is recomputed


def test_overload_builds_a_waiting_queue_and_drains_fcfs() -> None:
    e = make_engine(max_num_seqs=2)
    reqs = [req(f"r{i}", [i] * 20, max_tokens=3) for i in range(5)]
    for r in reqs:
        e.add_request(r)
    e.step(0.0)
    assert (e.num_running, e.num_waiting) == (2, 3)
    run(e)
    firsts = [r.first_token_time for r in reqs]
    assert firsts == sorted(firsts)  # served in arrival order
    assert all(r.num_output_tokens == 3 for r in reqs)


def test_chunked_prefill_respects_the_token_budget() -> None:
    e = make_engine(max_num_batched_tokens=100)
    r = req("long", list(range(350)), max_tokens=1)
    e.add_request(r)
    steps = []
    now = 0.0
    while e.has_work:
        result = e.step(now)
        steps.append(result.prefill_tokens)
        now = result.end
    assert steps == [100, 100, 100, 50]  # 350 tokens in chunks of at most 100
    assert r.num_output_tokens == 1


def test_full_cache_evicts_least_recently_freed_blocks_and_publishes_removal() -> None:
    e = make_engine(num_gpu_blocks=6)
    # Each prompt fills 2 blocks (32 tokens) plus one block for output: 3 blocks while running.
    stored: dict[str, list[int]] = {}
    now = 0.0
    events: list[KVEvent] = []
    for name in ("a", "b", "c"):
        r = req(name, [ord(name)] * 32, max_tokens=2, at=now)
        e.add_request(r)
        now, ev = run(e, now)
        events += ev
        stored[name] = r.block_hashes[:2]
    removed = [h for ev in events if isinstance(ev, BlockRemoved) for h in ev.block_hashes]
    # 6 blocks: a and b fit; c needs blocks, so a's (least recently freed) go first.
    assert set(stored["a"]) <= set(removed)
    assert not set(stored["b"]) & set(removed)
    kept = req("b2", [ord("b")] * 32 + [1], at=now)
    e.add_request(kept)
    run(e, now)
    assert kept.num_cached_tokens == 32  # b is still cached
    assert_pool_consistent(e)


def test_block_stored_events_chain_hashes_and_carry_tokens() -> None:
    e = make_engine()
    r = req("a", list(range(40)), max_tokens=1)
    e.add_request(r)
    _, events = run(e)
    stored = [ev for ev in events if isinstance(ev, BlockStored)]
    assert len(stored) == 1  # one batched event for the request's two full blocks
    ev = stored[0]
    assert ev.block_hashes == r.block_hashes[:2]
    assert ev.parent_block_hash is None and ev.block_size == 16
    assert ev.token_ids == list(range(32))


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    e = make_engine(num_gpu_blocks=8, max_num_seqs=4)
    # Two requests of 3 prompt blocks each that grow by 40 tokens: together they need 2 * 6 > 8 blocks.
    a = req("a", [1] * 48, max_tokens=40)
    b = req("b", [2] * 48, max_tokens=40)
    e.add_request(a)
    e.add_request(b)
    run(e)
    assert e.num_preemptions >= 1
    assert b.num_preemptions >= 1 and a.num_preemptions == 0  # the newest is preempted
    assert a.num_output_tokens == 40 and b.num_output_tokens == 40
    assert_pool_consistent(e)
    assert e.pool.num_free == 8


def test_lora_slots_limit_adapters_in_a_batch() -> None:
    e = make_engine(max_loras=1)
    x1 = req("x1", [1] * 20, max_tokens=5, lora="x", lora_id=1)
    y1 = req("y1", [2] * 20, max_tokens=5, lora="y", lora_id=2)
    x2 = req("x2", [3] * 20, max_tokens=5, lora="x", lora_id=1)
    for r in (x1, y1, x2):
        e.add_request(r)
    e.step(0.0)
    # One slot: x1 and x2 run together; y1 waits without blocking x2.
    assert {r.request_id for r in e.scheduler.running} == {"x1", "x2"}
    assert e.running_loras() == ["x"] and e.waiting_loras() == ["y"]
    run(e)
    assert y1.first_scheduled_time is not None and x1.finish_time is not None
    assert y1.first_scheduled_time >= x1.finish_time


def test_lora_blocks_do_not_share_cache_with_the_base_model() -> None:
    e = make_engine()
    prompt = list(range(64))
    e.add_request(req("base", prompt))
    t, _ = run(e)
    lora = req("lora", prompt, at=t, lora="x", lora_id=7)
    e.add_request(lora)
    run(e, t)
    assert lora.num_cached_tokens == 0


def test_remote_prefill_is_charged_as_transfer() -> None:
    e = make_engine()
    r = req("d", list(range(500)), max_tokens=2, remote_prefill=True)
    e.add_request(r)
    first = e.step(0.0)
    # 500 tokens received: 0.005 + 500 * 0.00001 = 0.010 s, no prefill cost, and a first token.
    assert first.prefill_tokens == 0
    assert first.duration == pytest.approx(0.010)
    assert r.num_output_tokens == 1


def test_step_contract_idle_engine_returns_empty_step() -> None:
    e = make_engine()
    result = e.step(5.0)
    assert result.duration == 0.0 and result.outputs == [] and result.num_scheduled == 0


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "message"),
    [([], 1, "empty"), ([1], 0, "max_tokens"), ([1] * 100, 100_000, "max_model_len")],
)
def test_add_request_rejects_impossible_requests(tokens: list[int], max_tokens: int, message: str) -> None:
    e = make_engine(max_model_len=1000)
    with pytest.raises(ValueError, match=message):
        e.add_request(req("x", tokens, max_tokens))


def test_abort_frees_blocks() -> None:
    e = make_engine()
    r = req("a", [1] * 100, max_tokens=50)
    e.add_request(r)
    e.step(0.0)
    assert e.abort("a")
    assert e.pool.num_free == 1000 and not e.has_work


def test_cost_model_is_linear_in_its_terms() -> None:
    c = CostModel(
        overhead_s=1, prefill_token_s=2, decode_seq_s=3, context_token_s=4, transfer_token_s=5, lora_load_s=6
    )
    # 1 + 2*10 + 3*2 + 4*100 + 5*7 + 6*1 = 468
    assert c.step_time(10, 2, 100, 7, 1) == 468


def test_anonymous_blocks_keep_their_place_in_the_free_queue() -> None:
    pool = BlockPool(8, 4)
    named = pool.allocate(2)  # blocks 0, 1
    pool.cache_full_block(named[0], 100, None, [1, 2, 3, 4], None)
    pool.take_anonymous(3)  # three of the fresh ones, unnamed
    assert pool.num_free == 3
    pool.release_anonymous(2)
    pool.release(named[::-1])  # 1 (no hash), then 0 (hash 100)
    pool.release_anonymous(1)
    # head first: 3 fresh blocks, a run of 2, block 1, block 0 (cached), a run of 1
    assert pool.free_hashes() == [None, None, None, None, None, None, 100, None]
    assert pool.num_free == 8
    pool.take_anonymous(4)  # the fresh ones, then one of the run
    assert pool.free_hashes() == [None, None, 100, None]
    ids = pool.allocate(3)  # the rest of the run (named now), then block 1, then block 0: evicted
    assert len(set(ids)) == 3 and ids[1:] == [1, 0]
    assert pool.lookup(100) is None and pool.drain_events()[-1] == BlockRemoved([100])
    assert pool.num_free == 1 and pool.free_hashes() == [None]
    held = pool.name_anonymous(4)  # the four still held anonymously get ids: all 7 in use differ
    assert len(set(held + ids)) == 7 and all(pool.ref_count[b] == 1 for b in held + ids)
    assert pool.name_anonymous(0) == []
