"""Building an InferenceRequest from OpenAI bodies, and rejecting bad ones by name."""

from __future__ import annotations

import json
import os

import pytest

from epick.framework import BadRequestError, InferenceRequest, RequestBody, new_request_id


def test_completion_request() -> None:
    r = InferenceRequest.from_openai(
        {"model": "m", "prompt": "hi there", "stream": True, "max_tokens": 9, "cache_salt": "s"},
        headers={"X-Gateway-Inference-Objective": "chat"},
    )
    assert r.body.kind == "completion"
    assert r.body.prefix_text == "hi there"
    assert r.body.stream and r.body.max_tokens == 9 and r.body.cache_salt == "s"
    assert r.headers == {"x-gateway-inference-objective": "chat"}
    assert r.objective == "chat"
    assert r.estimated_prompt_tokens == len("hi there") // 4  # 8 chars / 4 = 2


def test_chat_request_hashes_compact_messages_json() -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hé"}]
    r = InferenceRequest.from_openai({"model": "m", "messages": msgs})
    assert r.body.kind == "chat"
    assert r.body.prefix_text == json.dumps(msgs, separators=(",", ":"), ensure_ascii=False)
    assert [m.role for m in r.body.messages] == ["system", "user"]


def test_kind_from_caller_wins() -> None:
    r = InferenceRequest.from_openai(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, kind="chat"
    )
    assert r.body.kind == "chat"
    with pytest.raises(BadRequestError, match="prompt"):
        InferenceRequest.from_openai(
            {"model": "m", "messages": [{"role": "user", "content": "x"}]}, kind="completion"
        )


def test_prompt_forms() -> None:
    assert InferenceRequest.from_openai({"model": "m", "prompt": ["a", "b"]}).body.prompt == "ab"
    assert InferenceRequest.from_openai({"model": "m", "prompt": [1, 2, 3]}).body.prompt == "1 2 3"
    assert (
        InferenceRequest.from_openai(
            {"model": "m", "max_completion_tokens": 4, "prompt": "x"}
        ).body.max_tokens
        == 4
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1, 2], "JSON object"),
        ({"prompt": "x"}, "'model'"),
        ({"model": "", "prompt": "x"}, "'model'"),
        ({"model": 3, "prompt": "x"}, "'model'"),
        ({"model": "m"}, "'prompt'"),
        ({"model": "m", "prompt": 5}, "'prompt'"),
        ({"model": "m", "prompt": [1, "a"]}, "'prompt'"),
        ({"model": "m", "messages": []}, "'messages'"),
        ({"model": "m", "messages": [{"content": "x"}]}, r"messages\[0\]"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, r"messages\[0\].content"),
        ({"model": "m", "prompt": "x", "stream": "yes"}, "'stream'"),
        ({"model": "m", "prompt": "x", "max_tokens": -1}, "'max_tokens'"),
        ({"model": "m", "prompt": "x", "cache_salt": 1}, "'cache_salt'"),
    ],
)
def test_bad_bodies_are_named(body: object, message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        InferenceRequest.from_openai(body)  # type: ignore[arg-type]


def test_request_ids_are_32_hex_digits_and_distinct() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len(set(ids)) == len(ids)
    request = InferenceRequest("m", RequestBody(kind="completion"))
    assert len(request.request_id) == 32 and request.request_id not in ids


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_process_does_not_repeat_its_parents_request_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, ",".join(new_request_id() for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        child = set(f.read().split(","))
    parent = {new_request_id() for _ in range(3)}
    assert len(child) == 3
    assert not child & parent
