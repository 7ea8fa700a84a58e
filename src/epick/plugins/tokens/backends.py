"""Where a token producer's token ids come from: the model's tokenizer files (`local`), the bytes of
the prompt packed four to a token (`estimate`, upstream's default), or a model server's `/tokenize`
(`vllm`; the call itself is made by the request-control layer)."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from epick.framework import InferenceRequest
from epick.tokenization import Tokenizer

BYTES_PER_TOKEN = 4


def _int_list(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def given_tokens(request: InferenceRequest) -> tuple[tuple[int, ...], ...] | None:
    """Token ids the client sent (a generate call, a completion or embedding of token ids)."""
    body = request.body
    if body.token_ids is not None:
        return (body.token_ids,)
    raw = body.raw
    if raw is None:
        return None
    value = (
        raw.get("prompt")
        if body.kind == "completion"
        else raw.get("input")
        if body.kind == "embeddings"
        else None
    )
    if isinstance(value, list) and _int_list(value):
        return (tuple(value),)
    if isinstance(value, list) and value and all(_int_list(v) for v in value):
        return tuple(tuple(v) for v in value)
    return None


def _text_of(content: Any) -> str:
    """The text of a message's content: a string, or the text blocks of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, Mapping) and p.get("type") in ("text", "input_text")
        )
    return ""


def anthropic_as_chat(raw: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An Anthropic Messages body as OpenAI chat messages (vLLM's /v1/messages renders it so)."""
    messages: list[dict[str, Any]] = []
    system = raw.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for m in raw.get("messages") or []:
        if isinstance(m, Mapping):
            messages.append({"role": str(m.get("role", "user")), "content": _text_of(m.get("content"))})
    return messages


class LocalBackend:
    """The model's own tokenizer: completions encoded with the special tokens (vLLM's default for
    them), chats rendered with the chat template and encoded without (the template writes them)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def tokenize(self, request: InferenceRequest) -> tuple[tuple[int, ...], ...]:
        tok = self.tokenizer
        body = request.body
        raw = body.raw or {}
        if body.kind in ("chat", "messages"):
            messages = raw.get("messages") if body.kind == "chat" else anthropic_as_chat(raw)
            if not isinstance(messages, list):
                messages = [m.to_json() for m in body.messages]
            ids = tok.encode_chat(
                messages,
                add_generation_prompt=bool(raw.get("add_generation_prompt", True)),
                continue_final_message=bool(raw.get("continue_final_message", False)),
                add_special_tokens=bool(raw.get("add_special_tokens", False)),
                tools=raw.get("tools") if isinstance(raw.get("tools"), list) else None,
                chat_template_kwargs=raw.get("chat_template_kwargs")
                if isinstance(raw.get("chat_template_kwargs"), Mapping)
                else None,
            )
            return (tuple(ids),)
        special = bool(raw.get("add_special_tokens", True))
        prompt = raw.get("prompt") if body.kind == "completion" else None
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return tuple(tuple(tok.encode(p, add_special_tokens=special)) for p in prompt)
        text = prompt if isinstance(prompt, str) else body.prefix_text
        return (tuple(tok.encode(text, add_special_tokens=special)),)


def pack_bytes(raw: bytes) -> tuple[int, ...]:
    """Upstream's estimate tokens: the bytes, zero-padded to a multiple of 4, read as little-endian
    uint32s."""
    if not raw:
        return ()
    pad = -len(raw) % BYTES_PER_TOKEN
    raw += b"\0" * pad
    return struct.unpack(f"<{len(raw) // BYTES_PER_TOKEN}I", raw)


class EstimateBackend:
    """llm-d's `estimate` backend (no tokenizer): a chat's tools as JSON, then each message's role and
    text; a completion's prompt; else the request's prefix text, packed four bytes to a token. These
    ids match no engine's: they serve token counts and the approximate index, not the precise one."""

    def tokenize(self, request: InferenceRequest) -> tuple[tuple[int, ...], ...]:
        body = request.body
        raw = body.raw or {}
        if body.kind in ("chat", "messages"):
            out = bytearray()
            tools = raw.get("tools")
            if tools:
                out += json.dumps(tools, separators=(",", ":")).encode()
            messages: Sequence[Any] = raw.get("messages") or [m.to_json() for m in body.messages]
            for m in messages:
                if isinstance(m, Mapping):
                    out += str(m.get("role") or "").encode() + _text_of(m.get("content")).encode()
            return (pack_bytes(bytes(out)),)
        prompt = raw.get("prompt") if body.kind == "completion" else None
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            return tuple(pack_bytes(p.encode()) for p in prompt)
        return (pack_bytes(body.prefix_text.encode()),)


def tokenize_payloads(request: InferenceRequest, model: str) -> tuple[Mapping[str, Any], ...]:
    """vLLM /tokenize bodies for this request: one per prompt of a completion, one for a chat."""
    body = request.body
    raw = body.raw or {}
    if body.kind in ("chat", "messages"):
        messages = raw.get("messages") if body.kind == "chat" else anthropic_as_chat(raw)
        chat: dict[str, Any] = {
            "model": model,
            "messages": messages if isinstance(messages, list) else [m.to_json() for m in body.messages],
            "add_generation_prompt": bool(raw.get("add_generation_prompt", True)),
            "add_special_tokens": bool(raw.get("add_special_tokens", False)),
        }
        for key in ("continue_final_message", "tools", "chat_template_kwargs"):
            if raw.get(key) is not None:
                chat[key] = raw[key]
        if chat.get("continue_final_message"):
            chat["add_generation_prompt"] = False
        return (chat,)
    special = bool(raw.get("add_special_tokens", True))
    prompt = raw.get("prompt") if body.kind == "completion" else None
    prompts = (
        prompt if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt) else None
    )
    texts = prompts if prompts is not None else [prompt if isinstance(prompt, str) else body.prefix_text]
    return tuple({"model": model, "prompt": t, "add_special_tokens": special} for t in texts)


def tokens_of_answer(answer: Mapping[str, Any] | list[Any]) -> tuple[int, ...]:
    """The token ids of a vLLM answer: `/tokenize`'s `tokens`, `/v1/chat/completions/render`'s
    `token_ids`, or the one element of `/v1/completions/render`'s list; ValueError naming what is
    wrong otherwise."""
    if isinstance(answer, list):
        if len(answer) != 1:
            raise ValueError(f"the render answer has {len(answer)} prompts, not one")
        answer = answer[0]
    tokens = None
    if isinstance(answer, Mapping):
        tokens = answer.get("token_ids", answer.get("tokens"))
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise ValueError("the answer has no 'tokens' or 'token_ids' list of non-negative integers")
    return tuple(tokens)
