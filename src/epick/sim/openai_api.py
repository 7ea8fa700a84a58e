"""vLLM's OpenAI-compatible HTTP surface, as the sim server speaks it: reading request bodies and
prompts (completions and chat), and writing responses, stream chunks (server-sent events), usage and
model cards in OpenAI's shape.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from epick.sim import errors
from epick.sim.engine import SimRequest
from epick.sim.tokenizing import BUILTIN, SimTokenizer


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; a 400 in OpenAI's error shape when it is not one."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, LookupError):
        raise errors.bad_request("the request body is not valid JSON (or its charset is unknown)") from None
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body


def flag(body: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean field of a request body (absent or null: the default)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise errors.bad_request(f"'{name}' must be a boolean", name)
    return value


def completion_prompt(body: dict[str, Any], tok: SimTokenizer = BUILTIN) -> list[int]:
    """The token ids of a completions request's `prompt`: a string, one string in a list, or token ids.
    Text is encoded with the special tokens unless `add_special_tokens` is false (vLLM's default)."""
    prompt = body.get("prompt")
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return tok.prompt_ids(prompt)
    special = flag(body, "add_special_tokens", True)
    if isinstance(prompt, str):
        return tok.encode(prompt, add_special_tokens=special)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise errors.bad_request("only one prompt per request is supported", "prompt")
        return tok.encode(prompt[0], add_special_tokens=special)
    raise errors.bad_request("'prompt' must be a string or a list of token ids", "prompt")


def chat_prompt(body: dict[str, Any], tok: SimTokenizer = BUILTIN) -> list[int]:
    """The token ids of a chat request: its `messages` rendered with the chat template, tokenized,
    with the options vLLM reads (`add_generation_prompt`, `continue_final_message`,
    `add_special_tokens`, `tools`, `chat_template_kwargs`). A `chat_template` in the request is
    refused, as vLLM refuses one without `--trust-request-chat-template`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise errors.bad_request("'messages' must be a non-empty list of objects", "messages")
    generation_prompt = flag(body, "add_generation_prompt", True)
    continue_final = flag(body, "continue_final_message", False)
    if generation_prompt and continue_final:
        raise errors.bad_request(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    if body.get("chat_template") is not None:
        raise errors.bad_request(
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template.",
            "chat_template",
        )
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise errors.bad_request("'tools' must be a list of objects", "tools")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise errors.bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    return tok.encode_chat(
        messages,
        add_generation_prompt=generation_prompt,
        continue_final_message=continue_final,
        add_special_tokens=flag(body, "add_special_tokens", False),
        tools=tools,
        chat_template_kwargs=kwargs,
    )


def cache_salt(body: dict[str, Any]) -> str:
    """vLLM's `cache_salt` ("" when absent): a non-empty string that keeps the request's cached
    blocks apart from other salts'."""
    salt = body.get("cache_salt")
    if salt is None:
        return ""
    if not isinstance(salt, str) or not salt:
        raise errors.bad_request(
            "Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt"
        )
    return salt


def finish_reason(req: SimRequest) -> str:
    return req.finish_reason.value if req.finish_reason else "length"


def usage(req: SimRequest) -> dict[str, Any]:
    cached = max(req.num_cached_tokens, 0)
    return {
        "prompt_tokens": req.num_prompt_tokens,
        "completion_tokens": req.num_output_tokens,
        "total_tokens": req.num_prompt_tokens + req.num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _model_card(model_id: str, root: str, parent: str | None, created: int, max_len: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_len,
    }


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class _Writer:
    object_name = ""
    chunk_name = ""

    def __init__(self, model: str, request_id: str) -> None:
        self.model = model
        self.id = request_id
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def opening(self) -> list[dict[str, Any]]:
        return []

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        chunk = self._envelope(self.chunk_name, [])
        chunk["usage"] = usage
        return chunk

    def delta(self, text: str, finish: str | None) -> dict[str, Any]:
        raise NotImplementedError

    def full(self, text: str, finish: str, usage: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError


class _CompletionWriter(_Writer):
    object_name = "text_completion"
    chunk_name = "text_completion"

    def delta(self, text: str, finish: str | None) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        )

    def full(self, text: str, finish: str, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope(
            self.object_name, [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]
        )
        body["usage"] = usage
        return body


class _ChatWriter(_Writer):
    object_name = "chat.completion"
    chunk_name = "chat.completion.chunk"

    def opening(self) -> list[dict[str, Any]]:
        return [
            self._envelope(
                self.chunk_name,
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
            )
        ]

    def delta(self, text: str, finish: str | None) -> dict[str, Any]:
        return self._envelope(
            self.chunk_name, [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
        )

    def full(self, text: str, finish: str, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope(
            self.object_name,
            [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        )
        body["usage"] = usage
        return body
