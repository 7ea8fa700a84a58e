"""`token-producer`: the request's token ids, once, from the model's tokenizer files, the estimate,
or a model server's /tokenize (the call made by the request-control layer)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from epick.config import load_config_text
from epick.framework import CycleState
from epick.plugins.tokens.backends import pack_bytes
from epick.plugins.tokens.producer import TokenProducer, TokenProducerParameters
from epick.requestcontrol.path import RequestPath
from epick.requestcontrol.tokenize import RemoteTokenization
from epick.tokenization import TokenizerNotFoundError, load
from tests.builders import make_endpoint, make_request

DATA = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a KV cache?"}]


def local_producer() -> TokenProducer:
    return TokenProducer(backend="local", tokenizer_source=str(DATA))


def test_local_backend_tokenizes_a_chat_with_its_template() -> None:
    request = make_request(messages=MESSAGES)
    local_producer().produce(request, CycleState(), [])
    assert request.body.tokenized is not None
    assert request.body.tokenized.prompts == (tuple(load(str(DATA)).encode_chat(MESSAGES)),)


def test_local_backend_completions_one_prompt_each_and_client_ids_pass_through() -> None:
    tok = load(str(DATA))
    request = make_request(prompt=["first prompt", "second"])  # type: ignore[arg-type]
    local_producer().produce(request, CycleState(), [])
    assert request.body.tokenized is not None
    assert request.body.tokenized.prompts == (tuple(tok.encode("first prompt")), tuple(tok.encode("second")))
    ids = make_request(prompt=[5, 6, 7])  # type: ignore[arg-type]
    local_producer().produce(ids, CycleState(), [])
    assert ids.body.tokenized is not None and ids.body.tokenized.prompts == ((5, 6, 7),)


def test_cache_salt_travels_with_the_tokens() -> None:
    request = make_request("salted prompt", cache_salt="tenant-a")
    local_producer().produce(request, CycleState(), [])
    assert request.body.tokenized is not None and request.body.tokenized.cache_salt == "tenant-a"


def test_estimate_packs_four_bytes_to_a_token() -> None:
    assert pack_bytes(b"abcd") == (0x64636261,)
    assert pack_bytes(b"abcde") == (0x64636261, 0x65)
    request = make_request("abcd")
    TokenProducer(backend="estimate").produce(request, CycleState(), [])
    assert request.body.tokenized is not None and request.body.tokenized.prompts == ((0x64636261,),)


def test_backend_chosen_as_upstream_chooses_it() -> None:
    def backend(params: dict[str, Any]) -> str:
        return TokenProducerParameters.model_validate(params).backend()

    assert backend({}) == "estimate"
    assert backend({"modelName": "m"}) == "vllm"
    assert backend({"vllm": {"http": "http://h:8000"}}) == "vllm"
    assert backend({"modelName": "m", "udsTokenizerConfig": {"socketFile": "/tmp/s"}}) == "uds"
    assert backend({"modelName": "m", "udsTokenizerConfig": {}}) == "vllm"  # no socket: not the sidecar
    assert backend({"local": {"path": "/models/m"}}) == "local"
    assert TokenProducerParameters.model_validate({"vllm": {"http": "http://h:1"}}).vllm.url == "http://h:1"  # type: ignore[union-attr]


def test_a_missing_tokenizer_fails_the_producer_and_the_request_is_still_scheduled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = load_config_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: token-producer\n  parameters: {local: {path: /nonexistent/model}}\n"
        "- type: precise-prefix-cache-producer\n- type: queue-scorer\n"
    )
    path = RequestPath(config)
    with caplog.at_level(logging.ERROR):
        result = path.decide(
            make_request("hello"), [make_endpoint("a"), make_endpoint("b", address="10.0.0.2")]
        )
    assert result.targets
    assert "/nonexistent/model/tokenizer.json" in caplog.text and "nothing is downloaded" in caplog.text
    with pytest.raises(TokenizerNotFoundError):
        TokenProducer(backend="local", tokenizer_source="/nonexistent/model").local_backend()


def test_a_request_already_tokenized_is_not_tokenized_again() -> None:
    request = make_request("text")
    producer = local_producer()
    producer.produce(request, CycleState(), [])
    first = request.body.tokenized
    producer.produce(request, CycleState(), [])
    assert request.body.tokenized is first


# The vLLM backend: what it asks, and the request-control layer's call.


def test_vllm_backend_asks_render_then_tokenize_per_prompt_and_for_chats() -> None:
    producer = TokenProducer(backend="vllm", model_name="Qwen/Qwen3-0.6B", url="http://h:8000/", timeout=2.0)
    call = producer.tokenize_call(make_request(messages=MESSAGES, tools=[{"type": "function"}]))
    assert call is not None and call.url == "http://h:8000/v1/chat/completions/render" and call.timeout == 2.0
    assert call.fallback is not None and call.fallback.url == "http://h:8000/tokenize"
    assert call.fallback.payloads == call.payloads
    [chat] = call.payloads
    assert chat["model"] == "Qwen/Qwen3-0.6B" and chat["messages"] == MESSAGES
    assert chat["add_generation_prompt"] is True and chat["add_special_tokens"] is False and chat["tools"]
    call = producer.tokenize_call(make_request(prompt=["a", "b"]))  # type: ignore[arg-type]
    assert call is not None and [p["prompt"] for p in call.payloads] == ["a", "b"]
    assert call.url == "http://h:8000/v1/completions/render"
    assert producer.tokenize_call(make_request(prompt=[1, 2])) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'tokens' or 'token_ids'"):
        producer.tokenized(make_request("x"), [{"count": 1}])
    with pytest.raises(ValueError, match="2 prompts, not one"):
        producer.tokenized(make_request("x"), [[{"token_ids": [1]}, {"token_ids": [2]}]])  # type: ignore[list-item]
    rendered = make_request("x")
    producer.tokenized(rendered, [[{"token_ids": [7, 8]}]])  # type: ignore[list-item]
    assert rendered.body.tokenized is not None and rendered.body.tokenized.prompts == ((7, 8),)
    # Without the call's answer the producer fails: upstream's rule, the request goes on untokenized.
    with pytest.raises(RuntimeError, match="tokenization failed"):
        producer.produce(make_request("x"), CycleState(), [])


@pytest.fixture
async def tokenize_server(unused_tcp_port: int) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A /tokenize answering as vLLM does (one token per character), recording what it was asked."""
    asked: list[dict[str, Any]] = []

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        asked.append(body)
        if body.get("prompt") == "fail":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        text = body.get("prompt") or "".join(m["content"] for m in body["messages"])
        return web.json_response(
            {"count": len(text), "max_model_len": 4096, "tokens": [ord(c) for c in text]}
        )

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    yield f"http://127.0.0.1:{unused_tcp_port}", asked
    await runner.cleanup()


async def test_remote_tokenization_sets_tokens_or_logs_why_not(
    tokenize_server: tuple[str, list[dict[str, Any]]], caplog: pytest.LogCaptureFixture
) -> None:
    url, asked = tokenize_server
    producer = TokenProducer(backend="vllm", url=url)
    remote = RemoteTokenization()
    try:
        request = make_request("hi!")
        await remote.tokenize(request, [producer])
        assert request.body.tokenized is not None and request.body.tokenized.prompts == ((104, 105, 33),)
        assert asked[-1] == {"model": "m", "prompt": "hi!", "add_special_tokens": True}
        failing = make_request("fail")
        with caplog.at_level(logging.WARNING):
            await remote.tokenize(failing, [producer])
        assert failing.body.tokenized is None and "status 500" in caplog.text and remote.failures == 1
        dead = TokenProducer(backend="vllm", url="http://127.0.0.1:1", timeout=1.0)
        await remote.tokenize(make_request("x"), [dead])
        assert remote.failures == 2
        assert remote.missing == {
            f"{url}/v1/completions/render"
        }  # this server has no render: not asked again
    finally:
        await remote.close()


async def test_remote_tokenization_asks_the_render_endpoints_of_a_server_that_has_them(
    make_sim: Any,
) -> None:
    """`epick sim-server` answers vLLM's render endpoints: the tokens are those its /tokenize gives."""
    sim = await make_sim(port=0)
    producer = TokenProducer(backend="vllm", url=f"http://127.0.0.1:{sim.port}", model_name="sim-model")
    remote = RemoteTokenization()
    try:
        chat = make_request(messages=MESSAGES)
        completion = make_request("hello render")
        await remote.tokenize(chat, [producer])
        await remote.tokenize(completion, [producer])
        assert remote.failures == 0 and remote.missing == set()
        async with aiohttp.ClientSession() as http:
            for request, body in (
                (chat, {"model": "sim-model", "messages": MESSAGES}),
                (completion, {"model": "sim-model", "prompt": "hello render"}),
            ):
                async with http.post(f"http://127.0.0.1:{sim.port}/tokenize", json=body) as r:
                    expected = tuple((await r.json())["tokens"])
                assert request.body.tokenized is not None and request.body.tokenized.prompts == (expected,)
    finally:
        await remote.close()
