"""Workload generators: determinism, the shapes they promise, trace parsing, building by name."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from epick.simulate import vocab
from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads import (
    BASE_MODEL,
    TRACE_BLOCK_TOKENS,
    WORKLOADS,
    LongDocQA,
    LoraMix,
    MultiTurn,
    SharedPrefix,
    ShareGPTLike,
    Trace,
    Workload,
    WorkloadError,
    assistant_tokens,
    build_workload,
    trace_block_tokens,
    word_token,
    workload_parameters,
)

SMALL: list[Workload] = [
    SharedPrefix(groups=5, prompts_per_group=4, system_tokens=50, question_tokens=10, output_tokens=7),
    MultiTurn(sessions=4, turns=3, system_tokens=30, user_tokens=5, output_tokens=6, think_time_s=2.0),
    ShareGPTLike(n=30),
    LoraMix(n=30, adapters=4, prompt_tokens=20, output_tokens=5),
    LongDocQA(documents=3, questions_per_document=4, document_tokens=200, question_tokens=8, output_tokens=9),
]


def generate(workload: Workload, seed: int = 1) -> list[SimRequestSpec]:
    return list(workload.requests(random.Random(seed)))


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


# Common properties


@pytest.mark.parametrize("workload", SMALL, ids=lambda w: w.kind)
def test_deterministic_per_seed(workload: Workload) -> None:
    first, again, other = generate(workload, 1), generate(workload, 1), generate(workload, 2)
    assert first == again
    assert [r.tokens for r in first] != [r.tokens for r in other]


@pytest.mark.parametrize("workload", SMALL, ids=lambda w: w.kind)
def test_size_is_the_number_of_requests(workload: Workload) -> None:
    assert workload.size == len(generate(workload)) > 0


@pytest.mark.parametrize("workload", SMALL, ids=lambda w: w.kind)
def test_stream_is_independent_of_later_draws(workload: Workload) -> None:
    rng = random.Random(7)
    stream = workload.requests(rng)
    rng.random()  # the caller uses its generator for something else before reading the stream
    assert list(stream) == generate(workload, 7)


@pytest.mark.parametrize("workload", SMALL, ids=lambda w: w.kind)
def test_text_and_tokens_correspond(workload: Workload) -> None:
    requests = generate(workload)
    for r in requests:
        assert r.prompt == vocab.text(r.tokens)
        assert len(r.prompt.split()) == len(r.tokens)
        assert all(0 <= t < vocab.VOCAB_SIZE for t in r.tokens)
        assert r.output_tokens >= 1
    assert len({r.request_id for r in requests}) == len(requests)


@pytest.mark.parametrize("workload", SMALL, ids=lambda w: w.kind)
def test_lazy(workload: Workload) -> None:
    stream = workload.requests(random.Random(1))
    first = next(stream)
    assert isinstance(first, SimRequestSpec)


def test_lazy_for_a_million_requests() -> None:
    stream = SharedPrefix(groups=1000, prompts_per_group=1000, system_tokens=4, question_tokens=4).requests(
        random.Random(1)
    )
    assert len(list(itertools.islice(stream, 3))) == 3


# Shared prefix


def test_shared_prefix_shape() -> None:
    w = SharedPrefix(groups=6, prompts_per_group=5, system_tokens=40, question_tokens=12, output_tokens=9)
    requests = generate(w)
    assert len(requests) == 30
    assert all(len(r.tokens) == 52 and r.output_tokens == 9 for r in requests)
    by_group: dict[str, list[SimRequestSpec]] = defaultdict(list)
    for r in requests:
        by_group[r.request_id.split("-")[1]].append(r)
    assert len(by_group) == 6 and all(len(g) == 5 for g in by_group.values())
    systems = []
    for group in by_group.values():
        system = group[0].tokens[:40]
        systems.append(system)
        for a, b in itertools.combinations(group, 2):
            assert common_prefix(a.tokens, b.tokens) == 40  # exactly the system prompt
    for x, y in itertools.combinations(systems, 2):
        assert common_prefix(x, y) == 0


def test_shared_prefix_reuses_the_system_prompt_and_text() -> None:
    requests = generate(SharedPrefix(groups=1, prompts_per_group=3, system_tokens=20, question_tokens=5))
    prefix_text = vocab.text(requests[0].tokens[:20])
    assert all(r.prompt.startswith(prefix_text + " ") for r in requests)


def test_shared_prefix_shuffle() -> None:
    w = SharedPrefix(groups=8, prompts_per_group=8, system_tokens=4, question_tokens=4)
    ordered = [r.request_id for r in generate(SharedPrefix(**{**_fields(w), "shuffle": False}))]
    assert ordered == [f"sp-g{g}-p{p}" for g in range(8) for p in range(8)]
    shuffled = [r.request_id for r in generate(w)]
    assert shuffled != ordered and sorted(shuffled) == sorted(ordered)


def test_shared_prefix_without_system_prompt() -> None:
    requests = generate(SharedPrefix(groups=2, prompts_per_group=2, system_tokens=0, question_tokens=3))
    assert all(len(r.tokens) == 3 and r.prompt == vocab.text(r.tokens) for r in requests)


def _fields(w: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(w, f.name) for f in dataclasses.fields(w)}


# Multi-turn


def test_multi_turn_history_and_chain() -> None:
    w = MultiTurn(sessions=3, turns=4, system_tokens=20, user_tokens=5, output_tokens=7, think_time_s=1.0)
    requests = generate(w)
    assert len(requests) == 12
    seen: set[str] = set()
    sessions: dict[str | None, list[SimRequestSpec]] = defaultdict(list)
    for r in requests:
        assert r.after is None or r.after in seen  # a request follows the one it waits for
        seen.add(r.request_id)
        sessions[r.session].append(r)
    assert set(sessions) == {"session-0", "session-1", "session-2"}
    for s, turns in enumerate(sessions.values()):
        assert turns[0].after is None and turns[0].think_time == 0.0
        assert len(turns[0].tokens) == 25
        for t in range(1, 4):
            prev, cur = turns[t - 1], turns[t]
            assert cur.after == prev.request_id == f"mt-s{s}-t{t - 1}"
            assert cur.think_time > 0
            answer = assistant_tokens(s, t - 1, 7)
            assert w.output_plan(prev) == answer
            assert cur.tokens[: len(prev.tokens) + 7] == prev.tokens + answer
            assert len(cur.tokens) == 20 + (t + 1) * 5 + t * 7
    # different sessions have different system prompts
    firsts = [turns[0].tokens for turns in sessions.values()]
    assert all(common_prefix(a, b) == 0 for a, b in itertools.combinations(firsts, 2))


def test_multi_turn_think_time_mean() -> None:
    w = MultiTurn(sessions=800, turns=3, system_tokens=1, user_tokens=1, output_tokens=1, think_time_s=3.0)
    thinks = [r.think_time for r in generate(w) if r.after is not None]
    assert len(thinks) == 1600
    assert statistics.fmean(thinks) == pytest.approx(3.0, rel=0.1)
    assert statistics.median(thinks) == pytest.approx(3.0 * 0.6931, rel=0.15)  # exponential


def test_multi_turn_no_think_time() -> None:
    w = MultiTurn(sessions=2, turns=3, system_tokens=1, user_tokens=1, output_tokens=1, think_time_s=0.0)
    assert all(r.think_time == 0.0 for r in generate(w))


def test_assistant_tokens() -> None:
    assert assistant_tokens(3, 2, 10) == assistant_tokens(3, 2, 10)
    assert assistant_tokens(3, 2, 10)[:4] == assistant_tokens(3, 2, 4)
    assert assistant_tokens(3, 2, 10) != assistant_tokens(3, 1, 10) != assistant_tokens(2, 2, 10)
    assert MultiTurn().assistant_tokens(1, 1, 5) == assistant_tokens(1, 1, 5)
    other = SimRequestSpec("x", "e", (0,), 3)
    assert MultiTurn().output_plan(other) == ()
    assert SharedPrefix().output_plan(other) == ()


# ShareGPT-like


def test_sharegpt_like_lengths() -> None:
    w = ShareGPTLike(n=4000)
    requests = generate(w)
    assert len(requests) == 4000
    inputs = [len(r.tokens) for r in requests]
    outputs = [r.output_tokens for r in requests]
    assert statistics.median(inputs) == pytest.approx(100, rel=0.08)
    assert statistics.median(outputs) == pytest.approx(250, rel=0.08)
    assert statistics.fmean(inputs) == pytest.approx(165, rel=0.12)
    assert statistics.fmean(outputs) == pytest.approx(344, rel=0.12)
    assert min(inputs) >= 1 and max(inputs) <= 4096 and max(inputs) > 1000  # long tail, capped
    assert min(outputs) >= 1 and max(outputs) <= 2048
    assert len({tuple(r.tokens) for r in requests}) == 4000


def test_sharegpt_like_caps() -> None:
    w = ShareGPTLike(n=200, input_median=500, input_max=300, output_median=80, output_sigma=0.0)
    requests = generate(w)
    assert max(len(r.tokens) for r in requests) == 300
    assert {r.output_tokens for r in requests} == {80}


# LoRA mix


def test_lora_mix_popularity() -> None:
    w = LoraMix(n=6000, adapters=5, zipf_s=1.0, base_model_share=0.25, prompt_tokens=3, output_tokens=2)
    assert w.adapter_names == ("lora-0", "lora-1", "lora-2", "lora-3", "lora-4")
    requests = generate(w)
    counts = Counter(r.model for r in requests)
    assert set(counts) == {BASE_MODEL, *w.adapter_names}
    assert counts[BASE_MODEL] / 6000 == pytest.approx(0.25, abs=0.02)
    popularity = [counts[name] for name in w.adapter_names]
    assert popularity == sorted(popularity, reverse=True)
    lora_total = 6000 - counts[BASE_MODEL]
    for name, weight in zip(w.adapter_names, w.adapter_weights(), strict=True):
        assert counts[name] / lora_total == pytest.approx(weight, abs=0.025)
    assert w.adapter_weights()[0] / w.adapter_weights()[1] == pytest.approx(2.0)
    assert all(len(r.tokens) == 3 and r.output_tokens == 2 for r in requests)


def test_lora_mix_extremes() -> None:
    assert {r.model for r in generate(LoraMix(n=50, base_model_share=1.0))} == {BASE_MODEL}
    assert BASE_MODEL not in {r.model for r in generate(LoraMix(n=50, base_model_share=0.0))}
    assert LoraMix(adapters=4, zipf_s=0.0).adapter_weights() == (0.25, 0.25, 0.25, 0.25)


# Long-document QA


def test_long_doc_qa_sharing() -> None:
    w = LongDocQA(documents=3, questions_per_document=6, document_tokens=300, question_tokens=10)
    requests = generate(w)
    assert len(requests) == 18
    docs: dict[str, list[SimRequestSpec]] = defaultdict(list)
    for r in requests:
        assert len(r.tokens) == 310
        docs[r.request_id.split("-")[1]].append(r)
    assert sorted(docs) == ["d0", "d1", "d2"]
    for group in docs.values():
        assert len(group) == 6
        assert all(common_prefix(a.tokens, b.tokens) == 300 for a, b in itertools.combinations(group, 2))
    order = [r.request_id.split("-")[1] for r in requests]
    assert order != sorted(order)  # interleaved


# Trace


def write_trace(tmp_path: Path, lines: list[Any]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_trace_replay(tmp_path: Path) -> None:
    path = write_trace(
        tmp_path,
        [
            {"arrival": 0, "prompt": "hello  world hello", "output_tokens": 5, "extra": 1},
            "",
            {"arrival": 0.5, "prompt_block_ids": [7, 8], "output_tokens": 3, "model": "lora-1"},
            {
                "arrival": 0.5,
                "prompt_block_ids": [7, 9],
                "output_tokens": 2,
                "session": "a",
                "request_id": "x",
            },
        ],
    )
    a, b, c = generate(Trace(path))
    assert a == SimRequestSpec(
        "trace-1",
        "hello  world hello",
        (word_token("hello"), word_token("world"), word_token("hello")),
        5,
        arrival=0.0,
    )
    assert a.tokens[0] == a.tokens[2] != a.tokens[1]
    assert b.request_id == "trace-3" and b.model == "lora-1" and b.arrival == 0.5
    assert b.tokens == trace_block_tokens(7) + trace_block_tokens(8)
    assert len(trace_block_tokens(7)) == TRACE_BLOCK_TOKENS
    assert common_prefix(b.tokens, c.tokens) == TRACE_BLOCK_TOKENS
    assert b.prompt == vocab.text(b.tokens) and len(b.prompt.split()) == len(b.tokens)
    assert c.request_id == "x" and c.session == "a" and c.model == BASE_MODEL
    assert generate(Trace(path), 1) == generate(Trace(path), 2)  # the seed plays no part


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ({"prompt": "a", "output_tokens": 1}, "arrival"),
        ({"arrival": "soon", "prompt": "a", "output_tokens": 1}, "arrival"),
        ({"arrival": -1, "prompt": "a", "output_tokens": 1}, "arrival"),
        ({"arrival": 1, "prompt": "a"}, "output_tokens"),
        ({"arrival": 1, "prompt": "a", "output_tokens": 0}, "output_tokens"),
        ({"arrival": 1, "prompt": "a", "output_tokens": 2.5}, "output_tokens"),
        ({"arrival": 1, "output_tokens": 1}, "prompt"),
        ({"arrival": 1, "prompt": "  ", "output_tokens": 1}, "prompt"),
        ({"arrival": 1, "prompt": 5, "output_tokens": 1}, "prompt"),
        ({"arrival": 1, "prompt": "a", "prompt_block_ids": [1], "output_tokens": 1}, "prompt"),
        ({"arrival": 1, "prompt_block_ids": [], "output_tokens": 1}, "prompt_block_ids"),
        ({"arrival": 1, "prompt_block_ids": [1, "2"], "output_tokens": 1}, "prompt_block_ids"),
        ({"arrival": 1, "prompt": "a", "output_tokens": 1, "model": 3}, "model"),
        ({"arrival": 1, "prompt": "a", "output_tokens": 1, "request_id": "r0"}, "request_id"),  # duplicate
        ({"arrival": 0.5, "prompt": "a", "output_tokens": 1}, "arrival"),  # before the previous
    ],
)
def test_trace_bad_field(tmp_path: Path, line: dict[str, Any], field: str) -> None:
    path = write_trace(
        tmp_path, [{"arrival": 1, "prompt": "ok", "output_tokens": 1, "request_id": "r0"}, line]
    )
    stream = Trace(path).requests(random.Random(0))
    assert next(stream).request_id == "r0"
    with pytest.raises(WorkloadError) as e:
        next(stream)
    assert f"{path}:2:" in str(e.value) and f"'{field}'" in str(e.value)


@pytest.mark.parametrize(("line", "words"), [("{not json", "not valid JSON"), ("[1, 2]", "JSON object")])
def test_trace_bad_line(tmp_path: Path, line: str, words: str) -> None:
    path = write_trace(tmp_path, [line])
    with pytest.raises(WorkloadError, match=rf"{path}:1: .*{words}"):
        generate(Trace(path))


def test_trace_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="no such file"):
        Trace(tmp_path / "absent.jsonl")


# Building by name


def test_build_workload_converts_params(tmp_path: Path) -> None:
    w = build_workload(
        "shared-prefix",
        {"groups": "150", "prompts-per-group": 5, "system_tokens": "6000", "shuffle": "false"},
    )
    assert w == SharedPrefix(groups=150, prompts_per_group=5, system_tokens=6000, shuffle=False)
    assert build_workload("multi-turn", {"think-time-s": "2.5", "turns": 3.0}) == MultiTurn(
        think_time_s=2.5, turns=3
    )
    assert build_workload("lora-mix", {"zipf-s": 1, "base-model-share": "0.5"}) == LoraMix(
        zipf_s=1.0, base_model_share=0.5
    )
    path = write_trace(tmp_path, [{"arrival": 0, "prompt": "a", "output_tokens": 1}])
    assert build_workload("trace", {"path": str(path)}) == Trace(path)
    assert set(WORKLOADS) == {
        "shared-prefix",
        "multi-turn",
        "sharegpt-like",
        "lora-mix",
        "long-doc-qa",
        "trace",
    }
    for kind in WORKLOADS:
        if kind != "trace":
            assert build_workload(kind, {}) == WORKLOADS[kind]()


def test_workload_parameters() -> None:
    assert workload_parameters("shared-prefix") == {
        "groups": 64,
        "prompts-per-group": 16,
        "system-tokens": 2048,
        "question-tokens": 128,
        "output-tokens": 256,
        "shuffle": True,
    }
    assert workload_parameters("trace") == {"path": None}


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("nope", {}, "unknown workload 'nope'; valid: shared-prefix, multi-turn, sharegpt-like"),
        ("shared-prefix", {"gropus": 3}, "unknown parameter 'gropus'.*valid: groups, prompts-per-group"),
        ("shared-prefix", {"groups": "many"}, "groups must be an integer"),
        ("shared-prefix", {"groups": 0}, "groups must be at least 1"),
        ("shared-prefix", {"shuffle": "maybe"}, "shuffle must be true or false"),
        ("multi-turn", {"think-time-s": "-1"}, "think-time-s must be at least 0"),
        ("multi-turn", {"think-time-s": "nan"}, "think-time-s must be a finite number"),
        ("lora-mix", {"base-model-share": 1.5}, "base-model-share must be between 0.0 and 1.0"),
        ("sharegpt-like", {"input-median": 0}, "input-median must be greater than 0"),
        ("long-doc-qa", {"documents": 2.5}, "documents must be an integer"),
        ("trace", {}, "needs parameter path"),
        ("trace", {"path": "/no/such/trace.jsonl"}, "no such file"),
    ],
)
def test_build_workload_errors(kind: str, params: dict[str, str | int | float], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        build_workload(kind, params)


def test_text_of_a_token_outside_the_vocabulary_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="token ids must be between 0 and 65535"):
        vocab.text((1, vocab.VOCAB_SIZE))
    assert vocab.text(()) == "" and vocab.text((0, 1)) == f"{vocab.word(0)} {vocab.word(1)}"
