"""A request's token ids, computed once and read by every plugin that needs them (upstream's
`request.Body.TokenizedRequest`, llm-d/llm-d-router pkg/epp/framework/interface/requesthandling).

A token producer sets them on the request body; the precise prefix-cache producer, the P/D decider
and token-counting scorers read them. A producer that asks a model server for them (`RemoteTokenizer`)
says what to ask; the request-control layer makes the call, so plugins stay free of I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from epick.framework.plugin import Plugin

if TYPE_CHECKING:
    from epick.framework.request import InferenceRequest


@dataclass(frozen=True, slots=True)
class TokenizedPrompt:
    """One token-id sequence per prompt (a completion may carry several), and the request's cache
    salt (it enters the first block's key, as vLLM puts it in the first block's hash)."""

    prompts: tuple[tuple[int, ...], ...]
    cache_salt: str = ""

    @property
    def token_count(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass(frozen=True, slots=True)
class TokenizeCall:
    """What to ask a model server: POST each payload to `url`, within `timeout` seconds in all; where
    `url` answers 404 (a server without that endpoint), the `fallback` call instead, from then on.

    With `method` (a gRPC method path, "/package.Service/Method"), a unary gRPC call instead: `url`
    is the target (unix:///path, or host:port), each payload the serialized request message, and
    `reply` turns each serialized answer into the mapping a JSON answer would have been (raising
    ValueError when the answer says it failed); UNIMPLEMENTED counts as 404."""

    url: str
    payloads: tuple[Mapping[str, Any], ...] | tuple[bytes, ...]
    timeout: float
    fallback: TokenizeCall | None = None
    method: str = ""
    reply: Callable[[bytes], Mapping[str, Any]] | None = None


@runtime_checkable
class RemoteTokenizer(Plugin, Protocol):
    """A token producer whose tokens may come from a model server's tokenize endpoint."""

    @property
    def remote(self) -> bool:
        """Whether it asks a server (the front ends then call it before the producers run)."""
        ...

    def tokenize_call(self, request: InferenceRequest) -> TokenizeCall | None:
        """The call to make for this request; None when there is nothing to ask."""
        ...

    def tokenized(self, request: InferenceRequest, answers: Sequence[Mapping[str, Any]]) -> None:
        """The server's answers, one per payload, in order: set the request's tokens (or raise
        ValueError naming what is wrong with them)."""
        ...


@runtime_checkable
class InitializedTokenizer(Plugin, Protocol):
    """A remote tokenizer that asks its server to get ready before it is asked for tokens (llm-d's
    tokenizer sidecar loads the model's tokenizer on `InitializeTokenizer`). The request-control
    layer makes the call, again after a while when it fails, until it succeeds."""

    def initialize_call(self) -> TokenizeCall | None:
        """The call to make; None when there is nothing (more) to initialize."""
        ...

    def initialized(self, answers: Sequence[Mapping[str, Any]] | None, error: str | None) -> None:
        """The call's answers (or why it failed): raise ValueError when the answers say it failed."""
        ...
