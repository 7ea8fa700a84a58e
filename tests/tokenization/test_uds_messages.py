"""The tokenizer sidecar's messages, byte for byte as llm-d-kv-cache's generated classes write them
(tests/data/uds/golden.json), and the calls a token producer makes of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epick.plugins.tokens import uds
from epick.tokenization.uds_messages import RENDER_CHAT, RENDER_COMPLETION, TOKENIZE, message
from tests.builders import make_request

GOLDEN = json.loads((Path(__file__).resolve().parents[1] / "data" / "uds" / "golden.json").read_text())[
    "messages"
]
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "input_audio", "input_audio": {"data": "..."}},  # not sent, as upstream's client
        ],
    },
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]},
]


def golden(name: str) -> bytes:
    return bytes.fromhex(GOLDEN[name])


def test_a_chat_is_asked_as_upstreams_client_asks_it() -> None:
    request = make_request(
        model="Qwen/Qwen3-0.6B",
        messages=MESSAGES,
        tools=[{"type": "function"}],
        chat_template="{{ x }}",
        add_generation_prompt=True,
        chat_template_kwargs={"enable_thinking": False},
    )
    call = uds.chat_call(request, "Qwen/Qwen3-0.6B", "unix:///tmp/s.sock")
    assert call.method == RENDER_CHAT and call.url == "unix:///tmp/s.sock"
    assert call.payloads == (golden("RenderChatCompletionRequest"),)
    assert call.timeout == uds.MEDIA_TIMEOUT  # a message's content is a list of parts


def test_add_generation_prompt_is_sent_only_when_the_client_set_it() -> None:
    call = uds.chat_call(make_request(messages=[{"role": "user", "content": "hi"}]), "m", "unix:///s")
    sent = message("RenderChatCompletionRequest").FromString(call.payloads[0])
    assert not sent.HasField("add_generation_prompt")  # the sidecar then takes vLLM's default, true
    assert call.timeout == uds.TEXT_TIMEOUT


def test_a_completion_renders_each_prompt_with_tokenize_as_the_fallback() -> None:
    call = uds.completion_call(make_request("hello world"), "m", "unix:///s")
    assert call.method == RENDER_COMPLETION and call.payloads == (golden("RenderCompletionRequest"),)
    assert call.fallback is not None and call.fallback.method == TOKENIZE
    several = uds.completion_call(make_request(prompt=["a", "b"]), "m", "unix:///s")  # type: ignore[arg-type]
    assert len(several.payloads) == 2
    tokenize = uds.completion_call(make_request("hi"), "m", "unix:///s").fallback
    assert tokenize is not None and tokenize.payloads == (golden("TokenizeRequest"),)


def test_the_replies_read_as_the_json_answers_would() -> None:
    chat = uds.chat_call(make_request(messages=[{"role": "user", "content": "x"}]), "m", "unix:///s")
    assert chat.reply is not None
    assert chat.reply(golden("RenderChatCompletionResponse")) == {"token_ids": [1, 200, 70000]}
    completion = uds.completion_call(make_request("x"), "m", "unix:///s")
    assert completion.reply is not None and completion.fallback is not None
    with pytest.raises(ValueError, match="RenderCompletion failed: nope"):
        completion.reply(golden("RenderCompletionResponse"))
    assert completion.fallback.reply is not None
    assert completion.fallback.reply(golden("TokenizeResponse")) == {"tokens": [9, 8]}
    initialize = uds.initialize_call("m", "unix:///s")
    assert initialize.payloads == (golden("InitializeTokenizerRequest"),)
    assert initialize.reply is not None
    with pytest.raises(ValueError, match="Failed to initialize renderer for model: m"):
        initialize.reply(golden("InitializeTokenizerResponse"))


def test_the_features_of_a_chat_reply_decode() -> None:
    reply = message("RenderChatCompletionResponse").FromString(golden("RenderChatCompletionResponse"))
    assert list(reply.features.mm_hashes["image"].values) == ["h1", "h2"]
    assert [(r.offset, r.length) for r in reply.features.mm_placeholders["image"].ranges] == [(3, 4)]


def test_the_tokenizer_name_comes_from_the_map_when_one_is_given() -> None:
    assert uds.tokenizer_name("m", {}) == "m"
    assert uds.tokenizer_name("m", {"m": "/models/m/tokenizer.json"}) == "/models/m"
    assert uds.tokenizer_name("m", {"m": "org/other"}) == "org/other"
    with pytest.raises(KeyError):
        uds.tokenizer_name("x", {"m": "org/other"})
    assert uds.target("/tmp/tokenizer/tokenizer-uds.socket") == "unix:///tmp/tokenizer/tokenizer-uds.socket"
    assert uds.target("127.0.0.1:5000", use_tcp=True) == "127.0.0.1:5000"
