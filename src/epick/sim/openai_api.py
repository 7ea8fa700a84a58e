"""vLLM's OpenAI-compatible HTTP surface, as the sim server speaks it: reading request bodies and
prompts (completions and chat), and writing responses, stream chunks (server-sent events), usage and
model cards in OpenAI's shape.
"""

from __future__ import annotations

import json
import time
from typing import Any

from aiohttp import web

from epick.sim import errors, tokenizer
from epick.sim.engine import SimRequest


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; a 400 in OpenAI's error shape when it is not one."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError, LookupError):
        raise errors.bad_request("the request body is not valid JSON (or its charset is unknown)") from None
    if not isinstance(body, dict):
        raise errors.bad_request("the request body must be a JSON object")
    return body


def completion_prompt(body: dict[str, Any]) -> list[int]:
    """The token ids of a completions request's `prompt`: a string, one string in a list, or token ids."""
    prompt = body.get("prompt")
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        tokens = [t % tokenizer.VOCAB_SIZE for t in prompt]
    elif isinstance(prompt, str):
        tokens = tokenizer.tokenize(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise errors.bad_request("only one prompt per request is supported", "prompt")
        tokens = tokenizer.tokenize(prompt[0])
    else:
        raise errors.bad_request("'prompt' must be a string or a list of token ids", "prompt")
    return tokens


def chat_prompt(body: dict[str, Any]) -> list[int]:
    """The token ids of a chat request: its `messages` rendered with the chat template, tokenized."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise errors.bad_request("'messages' must be a non-empty list of objects", "messages")
    return tokenizer.tokenize(tokenizer.render_chat(messages))


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
