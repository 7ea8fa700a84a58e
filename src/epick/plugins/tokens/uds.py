"""A token producer's calls to llm-d's tokenizer sidecar (`udsTokenizerConfig`): the gRPC service
`tokenization.TokenizationService` on a Unix socket (llm-d/llm-d-kv-cache, api/tokenizerpb; the
sidecar renders with vLLM's own code, so its ids are the engine's).

As llm-d-kv-cache's Go client (pkg/tokenization/uds_tokenizer.go) asks it:
- once, `InitializeTokenizer {model_name, enable_thinking: false, add_generation_prompt: true}`;
- a chat (or an Anthropic Messages body, as a chat): `RenderChatCompletion` with each message's role,
  its content as text or as parts (text and image_url parts; others dropped), its tool calls as JSON,
  the tools as JSON, the template, its kwargs as JSON and `continue_final_message`, within 5 s (30 s
  when a message's content is a list of parts);
- a completion: `RenderCompletion {model_name, prompt}` per prompt, within 5 s; a sidecar older than
  llm-d-kv-cache v0.7 answers UNIMPLEMENTED, and `Tokenize {input, model_name, add_special_tokens}`
  is asked instead from then on (epick's; upstream's client fails there).

Deviations, on purpose: `add_generation_prompt` is sent only when the client set it, so the sidecar
takes vLLM's default (true), as the engine renders the request; upstream's client always sends it,
false when the client left it out. A completion of several prompts is rendered prompt by prompt,
where upstream's adapter refuses a prompt that is not one string.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from epick.framework import InferenceRequest, TokenizeCall
from epick.plugins.registry import Parameters
from epick.plugins.tokens.backends import anthropic_as_chat
from epick.tokenization.uds_messages import (
    INITIALIZE,
    RENDER_CHAT,
    RENDER_COMPLETION,
    TOKENIZE,
    message,
)


class UDSParameters(Parameters):
    """`udsTokenizerConfig` (and `tokenizersPoolConfig.uds`), llm-d-kv-cache's UdsTokenizerConfig."""

    socket_file: str = ""  # the socket; host:port with `useTCP`
    use_tcp: bool = Field(default=False, alias="useTCP")  # upstream's, for tests
    model_tokenizer_map: dict[str, str] = Field(default_factory=dict)


TEXT_TIMEOUT = 5.0  # seconds: upstream's client's deadline for a text prompt
MEDIA_TIMEOUT = 30.0  # and for a chat with structured content (images take longer)

_ChatMessage = message("ChatMessage")
_RenderChat = message("RenderChatCompletionRequest")
_RenderChatReply = message("RenderChatCompletionResponse")
_RenderCompletion = message("RenderCompletionRequest")
_RenderCompletionReply = message("RenderCompletionResponse")
_Tokenize = message("TokenizeRequest")
_TokenizeReply = message("TokenizeResponse")
_Initialize = message("InitializeTokenizerRequest")
_InitializeReply = message("InitializeTokenizerResponse")


def target(socket_file: str, use_tcp: bool = False) -> str:
    """The gRPC target of `udsTokenizerConfig`: the socket, or host:port with `useTCP` (testing)."""
    return socket_file if use_tcp else "unix://" + os.path.abspath(socket_file)


def tokenizer_name(model: str, tokenizer_map: Mapping[str, str]) -> str:
    """The name the sidecar knows the model's tokenizer by: `modelTokenizerMap`'s entry for it (a
    path to a tokenizer.json stands for its directory), else the model. KeyError when the map is
    given and has no entry for the model, as upstream's client refuses it."""
    if not tokenizer_map:
        return model
    path = tokenizer_map[model]
    return os.path.dirname(path) if os.path.basename(path) == "tokenizer.json" else path


def _failed(reply: Any, what: str) -> None:
    if not reply.success:
        raise ValueError(f"{what} failed: {reply.error_message or 'the sidecar gave no reason'}")


def _chat_reply(raw: bytes) -> Mapping[str, Any]:
    reply = _RenderChatReply.FromString(raw)
    _failed(reply, "RenderChatCompletion")
    return {"token_ids": list(reply.token_ids)}


def _completion_reply(raw: bytes) -> Mapping[str, Any]:
    reply = _RenderCompletionReply.FromString(raw)
    _failed(reply, "RenderCompletion")
    return {"token_ids": list(reply.token_ids)}


def _tokenize_reply(raw: bytes) -> Mapping[str, Any]:
    reply = _TokenizeReply.FromString(raw)
    _failed(reply, "Tokenize")
    return {"tokens": list(reply.input_ids)}


def _initialize_reply(raw: bytes) -> Mapping[str, Any]:
    reply = _InitializeReply.FromString(raw)
    _failed(reply, "InitializeTokenizer")
    return {"success": True}


def _chat_message(raw: Mapping[str, Any]) -> Any:
    out = _ChatMessage(role=str(raw.get("role") or ""))
    calls = raw.get("tool_calls")
    if calls:
        out.tool_calls_json = json.dumps(calls, separators=(",", ":"))
    content = raw.get("content")
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, Mapping):
                continue
            kind = part.get("type")
            if kind == "text":
                out.content_parts.add(type="text", text=str(part.get("text", "")))
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, Mapping) else image
                added = out.content_parts.add(type="image_url")
                added.image_url.url = str(url or "")
    else:
        out.content = content if isinstance(content, str) else ""
    return out


def chat_call(request: InferenceRequest, model: str, where: str) -> TokenizeCall:
    """RenderChatCompletion for a chat or an Anthropic Messages body."""
    body = request.body
    raw = body.raw or {}
    given = raw.get("messages") if body.kind == "chat" else anthropic_as_chat(raw)
    messages: Sequence[Any] = given if isinstance(given, list) else [m.to_json() for m in body.messages]
    call = _RenderChat(model_name=model)
    structured = False
    for m in messages:
        if isinstance(m, Mapping):
            call.messages.append(_chat_message(m))
            structured = structured or isinstance(m.get("content"), list)
    tools = raw.get("tools")
    if tools:
        call.tools_json = json.dumps(tools, separators=(",", ":"))
    template = raw.get("chat_template")
    if isinstance(template, str):
        call.chat_template = template
    if isinstance(raw.get("add_generation_prompt"), bool):
        call.add_generation_prompt = raw["add_generation_prompt"]
    call.continue_final_message = bool(raw.get("continue_final_message", False))
    kwargs = raw.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping) and kwargs:
        call.chat_template_kwargs = json.dumps(kwargs, separators=(",", ":"))
    return TokenizeCall(
        where,
        (call.SerializeToString(),),
        MEDIA_TIMEOUT if structured else TEXT_TIMEOUT,
        method=RENDER_CHAT,
        reply=_chat_reply,
    )


def completion_call(request: InferenceRequest, model: str, where: str) -> TokenizeCall:
    """RenderCompletion per prompt (a completion's, else the request's prefix text), with Tokenize as
    the fallback for a sidecar that does not render."""
    body = request.body
    raw = body.raw or {}
    prompt = raw.get("prompt") if body.kind == "completion" else None
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        texts: list[str] = prompt
    else:
        texts = [prompt if isinstance(prompt, str) else body.prefix_text]
    special = bool(raw.get("add_special_tokens", True))
    tokenize = TokenizeCall(
        where,
        tuple(
            _Tokenize(input=t, model_name=model, add_special_tokens=special).SerializeToString()
            for t in texts
        ),
        TEXT_TIMEOUT,
        method=TOKENIZE,
        reply=_tokenize_reply,
    )
    return TokenizeCall(
        where,
        tuple(_RenderCompletion(model_name=model, prompt=t).SerializeToString() for t in texts),
        TEXT_TIMEOUT,
        fallback=tokenize,
        method=RENDER_COMPLETION,
        reply=_completion_reply,
    )


def initialize_call(model: str, where: str) -> TokenizeCall:
    """InitializeTokenizer, as upstream's client sends it at start."""
    call = _Initialize(model_name=model, enable_thinking=False, add_generation_prompt=True)
    return TokenizeCall(
        where, (call.SerializeToString(),), MEDIA_TIMEOUT, method=INITIALIZE, reply=_initialize_reply
    )
