"""The request as the scheduler sees it: structured properties, never HTTP."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from epick.framework import jsontext
from epick.framework.tokens import TokenizedPrompt

# The Go EPP's estimate of characters per token, used wherever a token count is guessed from text.
CHARS_PER_TOKEN = 4

# What a request asks for, by the API it speaks: OpenAI's completions, chat completions, responses,
# conversations, embeddings and image generation; Anthropic's messages; a pre-tokenized generate call
# (vLLM's /inference/v1/generate, SGLang's /generate); or a body forwarded unread ("raw").
RequestKind = Literal[
    "completion", "chat", "responses", "conversations", "embeddings", "images", "messages", "generate", "raw"
]


# Request ids: 128 bits from a generator seeded from the OS, spelt as uuid4().hex is. uuid4 reads
# os.urandom, a getrandom system call per request (4% of the proxy's CPU under load); ids need to be
# unique, not secret (clients may send their own). Reseeded in a forked child, so no two processes
# share the sequence.
_IDS = random.Random()
os.register_at_fork(after_in_child=_IDS.seed)


def new_request_id() -> str:
    """A fresh request id: 32 hex digits."""
    return f"{_IDS.getrandbits(128):032x}"


class BadRequestError(ValueError):
    """The request body cannot be understood (the service answers 400)."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str | list[Any] | None

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True, slots=True)
class RequestBody:
    """The parsed body: a completion prompt, chat messages, or another API's input (see `RequestKind`).

    The text the approximate prefix index hashes (`prefix_text`: the prompt, the chat messages as
    compact JSON, another API's input as its parser spells it; token ids as decimal text) is built on
    first read: most configs never read it. A body may also be made from a
    text's length and a function that spells it (`lazy_completion`, as the fleet simulator does), so
    plugins that read only `prefix_bytes` never pay for the text.
    """

    kind: RequestKind
    messages: tuple[ChatMessage, ...] = ()
    stream: bool = False
    cache_salt: str = ""
    max_tokens: int | None = None
    # The prefix text, or a function that builds it; and its UTF-8 length when known.
    source: str | Callable[[], str] = field(default="", repr=False)
    known_bytes: int | None = field(default=None, repr=False)
    token_ids: tuple[int, ...] | None = field(default=None, repr=False)  # a pre-tokenized prompt
    # The decoded JSON body, for plugins that read more than the fields above (a tokenizer renders
    # the chat template from the messages, tools and template arguments); None when not JSON.
    raw: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    # The prompt's token ids, set once by a token producer (None until then).
    tokenized: TokenizedPrompt | None = field(default=None, repr=False, compare=False)
    # A plugin changed `raw` (upstream's `Body.Mutated`): the front ends forward it re-encoded.
    mutated: bool = field(default=False, repr=False, compare=False)

    @classmethod
    def completion(cls, prompt: str, **kwargs: Any) -> RequestBody:
        return cls(kind="completion", source=prompt, **kwargs)

    @classmethod
    def chat(cls, messages: Sequence[ChatMessage], **kwargs: Any) -> RequestBody:
        msgs = tuple(messages)

        def text() -> str:
            return jsontext.compact([m.to_json() for m in msgs])

        return cls(kind="chat", messages=msgs, source=text, **kwargs)

    @classmethod
    def lazy_completion(cls, prefix_bytes: int, text: Callable[[], str], **kwargs: Any) -> RequestBody:
        """A completion whose prompt is `prefix_bytes` long and spelt by `text()` when first read."""
        return cls(kind="completion", source=text, known_bytes=prefix_bytes, **kwargs)

    @property
    def prefix_text(self) -> str:
        """The text the approximate prefix index hashes: the prompt, or the messages as compact JSON."""
        source = self.source
        if isinstance(source, str):
            return source
        text = source()
        object.__setattr__(self, "source", text)
        return text

    @property
    def prompt(self) -> str:
        """A completion's prompt ("" for chat)."""
        return self.prefix_text if self.kind == "completion" else ""

    @property
    def prefix_bytes(self) -> int:
        """The UTF-8 length of `prefix_text`: the unit of the index's blocks and of token estimates."""
        known = self.known_bytes
        if known is None:
            known = _utf8_len(self.prefix_text)
            object.__setattr__(self, "known_bytes", known)
        return known

    def mark_mutated(self) -> None:
        """Say that `raw` was changed in place (by a PreRequest hook): the request is forwarded with
        the changed body, not the client's bytes."""
        object.__setattr__(self, "mutated", True)

    def set_tokenized(self, tokenized: TokenizedPrompt) -> None:
        """Record the prompt's token ids (the body is otherwise immutable)."""
        object.__setattr__(self, "tokenized", tokenized)

    @property
    def text_built(self) -> bool:
        """Whether the text exists yet (False until a plugin read it, for a lazily spelt body)."""
        return isinstance(self.source, str)


_KEYS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class InferenceRequest:
    """One inference request's properties, passed to every plugin as a structured argument."""

    target_model: str
    body: RequestBody
    request_id: str = field(default_factory=new_request_id)
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    priority: int = 0  # < 0: sheddable
    objective: str = ""  # the InferenceObjective named by x-gateway-inference-objective
    size: int = 0  # body size in bytes
    # Unique in this process (request_id is the client's x-request-id when it sends one): what
    # plugins key a request's own state by.
    key: int = field(default_factory=lambda: next(_KEYS), compare=False)

    @property
    def estimated_prompt_tokens(self) -> int:
        """Prompt length in tokens: UTF-8 bytes / 4, the Go EPP's rule (Go's len counts bytes)."""
        return self.body.prefix_bytes // CHARS_PER_TOKEN

    @classmethod
    def from_openai(
        cls,
        raw: Mapping[str, Any],
        *,
        kind: RequestKind | None = None,
        request_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        priority: int = 0,
        size: int = 0,
    ) -> InferenceRequest:
        """Build a request from an OpenAI completions or chat body.

        `kind` is taken from the path when the caller knows it; otherwise a body with `messages`
        is chat and anything else a completion. Raises `BadRequestError` naming the field at fault.
        """
        if not isinstance(raw, Mapping):
            raise BadRequestError("request body must be a JSON object")
        model = raw.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequestError("request body has no 'model' (a non-empty string is required)")
        body = openai_body(raw, kind)
        hdrs = {k.lower(): v for k, v in (headers or {}).items()}
        return cls(
            target_model=model,
            body=body,
            request_id=request_id or new_request_id(),
            headers=hdrs,
            priority=priority,
            objective=hdrs.get("x-gateway-inference-objective", ""),
            size=size,
        )


def openai_body(raw: Mapping[str, Any], kind: RequestKind | None = None) -> RequestBody:
    """The body of an OpenAI completions or chat request (`kind` None: chat when it has `messages`);
    `BadRequestError` naming the field at fault."""
    if kind is None:
        kind = "chat" if "messages" in raw else "completion"
    common: dict[str, Any] = {
        "stream": _opt_bool(raw, "stream"),
        "cache_salt": _opt_str(raw, "cache_salt"),
        "max_tokens": _opt_int(raw, "max_completion_tokens")
        if raw.get("max_completion_tokens") is not None
        else _opt_int(raw, "max_tokens"),
        "raw": raw,
    }
    if kind == "chat":
        return RequestBody.chat(_parse_messages(raw.get("messages")), **common)
    return RequestBody.completion(_parse_prompt(raw.get("prompt")), **common)


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def _parse_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt)
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            # Token ids: keep them as text so equal token prefixes hash equally.
            return " ".join(str(p) for p in prompt)
    raise BadRequestError(
        "completion request needs 'prompt': a string, a list of strings or a list of token ids"
    )


def _parse_messages(messages: Any) -> list[ChatMessage]:
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("chat request needs 'messages': a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise BadRequestError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise BadRequestError(f"messages[{i}].content must be a string, a list of parts or null")
        out.append(ChatMessage(role=m["role"], content=content))
    return out


def _opt_bool(raw: Mapping[str, Any], key: str) -> bool:
    v = raw.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise BadRequestError(f"'{key}' must be a boolean")
    return v


def _opt_str(raw: Mapping[str, Any], key: str) -> str:
    v = raw.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise BadRequestError(f"'{key}' must be a string")
    return v


def _opt_int(raw: Mapping[str, Any], key: str) -> int | None:
    v = raw.get(key)
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)  # 16.0: JSON has one number type (vLLM and upstream's parser take it)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadRequestError(f"'{key}' must be a non-negative integer")
    return v
