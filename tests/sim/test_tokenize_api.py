"""vLLM's /tokenize and /detokenize on the sim server, and `--tokenizer`: prompts and chats encoded with a
model's own tokenizer (tests/data/tokenizer, a small byte-level BPE with a ChatML template)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epick.sim import tokenizer
from epick.sim.engine import SimRequest
from epick.sim.server import SimServer
from epick.tokenization import Tokenizer, load
from tests.sim.conftest import ServerFactory

MODEL = "sim-model"
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture
def tok() -> Tokenizer:
    return load(str(TOKENIZER_DIR))


@pytest.fixture
async def real(make_server: ServerFactory) -> SimServer:
    """A server with the test tokenizer and one LoRA adapter."""
    return await make_server(tokenizer=str(TOKENIZER_DIR), lora_modules=("alpha=/adapters/alpha",))


async def post(http: aiohttp.ClientSession, server: SimServer, path: str, body: Any) -> tuple[int, Any]:
    kw: dict[str, Any] = {"data": body} if isinstance(body, str | bytes) else {"json": body}
    async with http.post(server.url + path, **kw) as r:
        return r.status, await r.json()


def recording(server: SimServer) -> list[SimRequest]:
    """The requests the server hands its engine, from now on."""
    seen: list[SimRequest] = []
    add = server.engine.add_request

    def record(req: SimRequest) -> None:
        seen.append(req)
        add(req)

    server.engine.add_request = record  # type: ignore[method-assign]
    return seen


# The built-in tokenizer (no --tokenizer).


async def test_tokenize_and_detokenize_with_the_built_in_tokenizer(
    server: SimServer, http: aiohttp.ClientSession
) -> None:
    text = "Hello, world! The quick brown fox."
    status, body = await post(http, server, "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200
    ids = tokenizer.tokenize(text)
    assert body == {
        "count": len(ids),
        "max_model_len": server.options.engine.max_model_len,
        "tokens": ids,
        "token_strs": None,
    }
    status, body = await post(http, server, "/tokenize", {"prompt": text, "return_token_strs": True})
    assert status == 200
    assert body["tokens"] == ids
    assert body["token_strs"] == [tokenizer.decode([t]) for t in ids]

    status, body = await post(http, server, "/tokenize", {"messages": MESSAGES})
    assert status == 200
    assert body["tokens"] == tokenizer.tokenize(tokenizer.render_chat(MESSAGES))

    plan = tokenizer.output_plan("seed", 5)
    status, body = await post(http, server, "/detokenize", {"model": MODEL, "tokens": plan})
    assert status == 200
    assert body == {"prompt": tokenizer.decode(plan)}


# A model's tokenizer (--tokenizer).


async def test_tokenize_prompt_with_a_model_tokenizer(
    real: SimServer, http: aiohttp.ClientSession, tok: Tokenizer
) -> None:
    text = "The model caches the prefix of every request."
    status, body = await post(
        http, real, "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True}
    )
    assert status == 200
    ids = tok.encode(text, add_special_tokens=True)
    assert body == {
        "count": len(ids),
        "max_model_len": real.options.engine.max_model_len,
        "tokens": ids,
        "token_strs": tok.token_strings(ids),
    }
    assert body["token_strs"][1].startswith("Ġ")  # the tokenizer's own pieces, not decoded text
    status, body = await post(http, real, "/tokenize", {"prompt": text, "add_special_tokens": False})
    assert status == 200 and body["tokens"] == tok.encode(text, add_special_tokens=False)
    assert body["token_strs"] is None


async def test_tokenize_chat_with_a_model_tokenizer(
    real: SimServer, http: aiohttp.ClientSession, tok: Tokenizer
) -> None:
    status, body = await post(http, real, "/tokenize", {"model": "alpha", "messages": MESSAGES})
    assert status == 200
    ids = tok.encode_chat(MESSAGES)
    assert body["tokens"] == ids and body["count"] == len(ids)
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")

    request = {"messages": MESSAGES, "add_generation_prompt": False}
    status, body = await post(http, real, "/tokenize", request)
    assert status == 200 and body["tokens"] == tok.encode_chat(MESSAGES, add_generation_prompt=False)
    assert len(body["tokens"]) < len(ids)

    partial = [*MESSAGES, {"role": "assistant", "content": "The capital is"}]
    request = {"messages": partial, "add_generation_prompt": False, "continue_final_message": True}
    status, body = await post(http, real, "/tokenize", request)
    assert status == 200
    expected = tok.encode_chat(partial, add_generation_prompt=False, continue_final_message=True)
    assert body["tokens"] == expected
    assert tok.decode(expected, skip_special_tokens=False).endswith("The capital is")


async def test_detokenize_with_a_model_tokenizer(
    real: SimServer, http: aiohttp.ClientSession, tok: Tokenizer
) -> None:
    ids = tok.encode_chat(MESSAGES)
    status, body = await post(http, real, "/detokenize", {"model": MODEL, "tokens": ids})
    assert status == 200
    assert body == {"prompt": tok.decode(ids, skip_special_tokens=False)}
    assert body["prompt"].startswith("<|im_start|>system\nYou are a helpful assistant.")


async def test_chat_request_prompt_is_the_tokenizers_encode_chat(
    real: SimServer, http: aiohttp.ClientSession, tok: Tokenizer
) -> None:
    seen = recording(real)
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6}
    status, response = await post(http, real, "/v1/chat/completions", body)
    assert status == 200, response
    [req] = seen
    assert list(req.prompt_token_ids) == tok.encode_chat(MESSAGES)
    assert response["usage"]["prompt_tokens"] == len(tok.encode_chat(MESSAGES))
    # The generated ids are the tokenizer's, and the text is their decoding.
    out = req.tokens(req.num_prompt_tokens, req.num_prompt_tokens + 6)
    assert all(0 <= t < tok.vocab_size for t in out)
    assert response["choices"][0]["message"]["content"] == tok.decode(out)
    assert len(response["choices"][0]["message"]["content"].split()) >= 1

    # The chat options vLLM reads reach the template.
    seen.clear()
    partial = [*MESSAGES, {"role": "assistant", "content": "Paris is"}]
    body = {
        "model": MODEL,
        "messages": partial,
        "max_tokens": 2,
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    status, response = await post(http, real, "/v1/chat/completions", body)
    assert status == 200, response
    [req] = seen
    assert list(req.prompt_token_ids) == tok.encode_chat(
        partial, add_generation_prompt=False, continue_final_message=True
    )


async def test_completion_prompt_with_a_model_tokenizer(
    real: SimServer, http: aiohttp.ClientSession, tok: Tokenizer
) -> None:
    seen = recording(real)
    text = "Once upon a time"
    status, response = await post(
        http, real, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 4}
    )
    assert status == 200, response
    ids = tok.encode(text)
    assert list(seen[0].prompt_token_ids) == ids
    assert response["usage"]["prompt_tokens"] == len(ids)

    ids = tok.encode("given as token ids")
    status, response = await post(
        http, real, "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 1}
    )
    assert status == 200, response
    assert list(seen[1].prompt_token_ids) == ids

    body = {"model": MODEL, "prompt": [1, tok.vocab_size], "max_tokens": 1}
    status, response = await post(http, real, "/v1/completions", body)
    assert status == 400
    assert response["error"]["message"] == f"Token id {tok.vocab_size} is out of vocabulary"


async def test_bad_tokenizer_path_is_refused(make_server: ServerFactory, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--tokenizer"):
        await make_server(tokenizer=str(tmp_path / "missing"))


# Errors, as vLLM writes them: {"error": {message, type, param, code}}, code = the status.


async def test_tokenize_unknown_model_is_404(real: SimServer, http: aiohttp.ClientSession) -> None:
    for path, body in (("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})):
        status, response = await post(http, real, path, {"model": "nope", **body})
        assert status == 404
        assert response == {
            "error": {
                "message": "The model `nope` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ),
        ({"messages": MESSAGES, "chat_template": "{{ messages }}"}, "untrusted chat template"),
        ({"messages": []}, "'messages'"),
        ({"messages": MESSAGES, "tools": "x"}, "'tools'"),
        ({"messages": MESSAGES, "chat_template_kwargs": [1]}, "'chat_template_kwargs'"),
        ({"prompt": 3}, "'prompt'"),
        ({"prompt": "x", "add_special_tokens": "yes"}, "'add_special_tokens'"),
        ({"prompt": "x", "return_token_strs": 1}, "'return_token_strs'"),
        ({"model": MODEL}, "'prompt' or 'messages'"),
        ({"prompt": "x", "model": 7}, "'model'"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
    ],
)
async def test_tokenize_bad_requests_are_400(
    real: SimServer, http: aiohttp.ClientSession, body: Any, message: str
) -> None:
    status, response = await post(http, real, "/tokenize", body)
    assert status == 400
    error = response["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert message in error["message"]


@pytest.mark.parametrize("tokens", [None, "1 2", [1, "2"], [1, -1], [True], [10**9]])
async def test_detokenize_bad_tokens_are_400(
    real: SimServer, http: aiohttp.ClientSession, tokens: Any
) -> None:
    status, response = await post(http, real, "/detokenize", {"tokens": tokens})
    assert status == 400
    assert response["error"]["code"] == 400 and response["error"]["param"] == "tokens"


async def test_chat_completions_apply_vllms_chat_checks(real: SimServer, http: aiohttp.ClientSession) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "continue_final_message": True, "max_tokens": 1}
    status, response = await post(http, real, "/v1/chat/completions", body)
    assert status == 400
    assert response["error"]["message"] == (
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    )
    body = {"model": MODEL, "messages": MESSAGES, "chat_template": "{{ 1 }}", "max_tokens": 1}
    status, response = await post(http, real, "/v1/chat/completions", body)
    assert status == 400 and response["error"]["param"] == "chat_template"


@pytest.mark.parametrize("salt", ["", 5])
async def test_cache_salt_must_be_a_non_empty_string(
    server: SimServer, http: aiohttp.ClientSession, salt: Any
) -> None:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 1, "cache_salt": salt}
    status, response = await post(http, server, "/v1/completions", body)
    assert status == 400 and response["error"]["param"] == "cache_salt"


# vLLM's render endpoints (the shapes llm-d-router's docs/communication.md records from vLLM).


async def test_render_answers_the_prompts_token_ids_as_the_generation_endpoints_see_them(
    real: SimServer, http: aiohttp.ClientSession, tok: Tokenizer
) -> None:
    seen = recording(real)
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "cache_salt": "s1"}
    status, rendered = await post(http, real, "/v1/chat/completions/render", chat)
    assert status == 200
    assert isinstance(rendered, dict) and rendered["request_id"].startswith("chatcmpl-")
    assert rendered["token_ids"] == tok.encode_chat(MESSAGES)
    assert rendered["features"] == {
        "mm_hashes": {"image": []},
        "mm_placeholders": {"image": []},
        "kwargs_data": {"image": []},
    }
    assert (
        rendered["model"] == MODEL
        and rendered["cache_salt"] == "s1"
        and rendered["kv_transfer_params"] is None
    )
    assert rendered["sampling_params"]["max_tokens"] == 3
    status, rendered_list = await post(
        http, real, "/v1/completions/render", {"model": MODEL, "prompt": "hello world"}
    )
    assert status == 200
    assert isinstance(rendered_list, list) and len(rendered_list) == 1
    assert rendered_list[0]["token_ids"] == tok.encode("hello world") and rendered_list[0]["features"] is None
    assert rendered_list[0]["request_id"].startswith("cmpl-")
    status, two = await post(http, real, "/v1/completions/render", {"model": MODEL, "prompt": ["a b", "c"]})
    assert status == 200 and [r["token_ids"] for r in two] == [tok.encode("a b"), tok.encode("c")]
    # the same ids the generation endpoint would hand its engine, and nothing generated
    async with http.post(real.url + "/v1/chat/completions", json=chat) as r:
        assert r.status == 200
    assert seen[-1].prompt_token_ids == tok.encode_chat(MESSAGES)
    assert len(seen) == 1


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/completions/render", {"model": MODEL, "prompt": 3}, 400),
        ("/v1/chat/completions/render", {"model": MODEL, "messages": []}, 400),
        ("/v1/completions/render", {"model": "other", "prompt": "x"}, 404),
    ],
)
async def test_render_refuses_what_vllm_refuses(
    real: SimServer, http: aiohttp.ClientSession, path: str, body: Any, status: int
) -> None:
    got, answer = await post(http, real, path, body)
    assert got == status, answer
