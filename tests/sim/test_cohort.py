"""The cohort engine against the reference (one `Engine.step` per event), on random workloads.

Both engines get the same requests at the same times; every request must get its first token and
finish at the same times with the same prefix hit, the engines must count the same steps, busy time
and hits, leave the same prefix cache behind, and publish the same metrics whenever they are read.
The workloads are small on purpose: tiny KV caches (eviction and preemption), small token budgets
(chunked prefill, budgets running out), few sequence and LoRA slots, shared prefixes, prompts
whose KV is transferred from a prefill server.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from typing import Any

import pytest

from epick.sim.engine import EngineConfig, SimRequest
from epick.sim.engine.cohort import CohortEngine
from epick.sim.engine.timed import SteppedEngine, TimedEngine


@dataclasses.dataclass
class Arrival:
    time: float
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    lora: str | None
    plan: tuple[int, ...]
    remote_prefill: bool  # the prompt's KV arrives from a prefill server


def random_case(seed: int) -> tuple[EngineConfig, list[Arrival]]:
    rng = random.Random(seed)
    bs = rng.choice([2, 4, 16])
    config = EngineConfig(
        num_gpu_blocks=rng.choice([60, 120, 400, 5000]),
        block_size=bs,
        max_num_seqs=rng.choice([2, 4, 16]),
        max_num_batched_tokens=rng.choice([24, 64, 512]),
        max_loras=rng.choice([1, 2]),
        kv_events=False,
        cache_output_blocks=rng.random() < 0.5,
    )
    prefixes = [tuple(rng.randrange(1000) for _ in range(rng.randrange(1, 40))) for _ in range(3)]
    loras = [None, None, "a", "b", "c"] if rng.random() < 0.4 else [None]
    rate = rng.choice([5.0, 40.0, 400.0])
    t = 0.0
    arrivals = []
    for i in range(rng.randrange(20, 70)):
        t += rng.expovariate(rate)
        prompt = rng.choice(prefixes) + tuple(rng.randrange(1000) for _ in range(rng.randrange(0, 30)))
        max_tokens = rng.choice([1, 2, 5, 17, 40])
        if -(-(len(prompt) + max_tokens) // bs) > config.num_gpu_blocks:
            continue
        plan = tuple(rng.randrange(1000) for _ in range(rng.choice([1, 3])))
        remote = rng.random() < 0.2
        arrivals.append(Arrival(t, f"r{i}", prompt, max_tokens, rng.choice(loras), plan, remote))
    return config, arrivals


def drive(engine: TimedEngine, arrivals: list[Arrival], probes: list[float]) -> dict[str, Any]:
    """Run the arrivals through the engine in time order; read its metrics at each probe time."""
    events: list[tuple[float, int, int, Any]] = []
    for i, a in enumerate(arrivals):
        heapq.heappush(events, (a.time, 0, i, a))
    for i, t in enumerate(probes):
        heapq.heappush(events, (t, 1, i, None))
    version = 0
    requests: dict[str, SimRequest] = {}
    finished: dict[str, float] = {}
    metrics = []
    while events:
        now, kind, seq, data = heapq.heappop(events)
        if kind == 0:
            req = SimRequest(
                data.request_id,
                data.prompt,
                data.max_tokens,
                arrival_time=now,
                lora=data.lora,
                lora_id=None if data.lora is None else ord(data.lora),
                output_plan=data.plan,
                remote_prefill=data.remote_prefill,
            )
            requests[req.request_id] = req
            at = engine.submit(req, now)
        elif kind == 1:
            metrics.append(engine.observe(now))
            continue
        else:
            if seq != version:
                continue  # superseded
            done, at = engine.advance(now)
            for req in done:
                finished[req.request_id] = now
        if at is not None:
            version += 1
            heapq.heappush(events, (at, 2, version, None))
    assert isinstance(engine, SteppedEngine | CohortEngine)
    pool = engine.pool
    return {
        "requests": {
            rid: (r.first_token_time, finished.get(rid), r.num_cached_tokens, r.num_output_tokens)
            for rid, r in requests.items()
        },
        "preemptions": sorted(r.num_preemptions for r in requests.values()),
        "stats": (engine.steps, engine.scheduler.prefix_queries, engine.scheduler.prefix_hits),
        "busy": engine.busy_time,
        "cached": set(pool.cached),
        "free_queue": pool.free_hashes(),
        "metrics": [(m.waiting, m.running, m.kv_usage) for m in metrics],
    }


def assert_same(reference: dict[str, Any], cohort: dict[str, Any]) -> None:
    assert reference["requests"].keys() == cohort["requests"].keys()
    for rid, ref in reference["requests"].items():
        got = cohort["requests"][rid]
        assert got[2:] == ref[2:], rid
        assert got[:2] == pytest.approx(ref[:2], rel=1e-9, abs=1e-12), rid
    for key in ("preemptions", "stats", "cached", "free_queue"):
        assert cohort[key] == reference[key], key
    assert cohort["busy"] == pytest.approx(reference["busy"], rel=1e-9)
    assert [m[:2] for m in cohort["metrics"]] == [m[:2] for m in reference["metrics"]]
    assert [m[2] for m in cohort["metrics"]] == pytest.approx([m[2] for m in reference["metrics"]], rel=1e-9)


@pytest.mark.parametrize("seed", range(60))
def test_cohort_engine_matches_the_reference(seed: int) -> None:
    config, arrivals = random_case(seed)
    end = arrivals[-1].time + 5 if arrivals else 1.0
    probes = [random.Random(seed).uniform(0, end) for _ in range(40)]
    reference = drive(SteppedEngine(config), arrivals, probes)
    cohort = drive(CohortEngine(config), arrivals, probes)
    assert all(r[1] is not None for r in reference["requests"].values()), "every request finishes"
    assert_same(reference, cohort)


def test_the_random_cases_reach_every_path() -> None:
    """Preemption, chunked prefill, runs, runs cut by arrivals and reference steps all occur above."""
    seen = dict.fromkeys(("preempted", "chunked", "runs", "runs cut", "reference steps"), 0)
    for seed in range(60):
        config, arrivals = random_case(seed)
        engine = CohortEngine(config)
        result = drive(engine, arrivals, [])
        seen["preempted"] += sum(result["preemptions"])
        seen["chunked"] += any(len(a.prompt) > config.max_num_batched_tokens for a in arrivals)
        seen["runs"] += engine.runs
        seen["runs cut"] += engine.runs_cut
        seen["reference steps"] += engine.reference_steps
    assert all(seen.values()), seen
