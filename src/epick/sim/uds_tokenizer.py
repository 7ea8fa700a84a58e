"""A stand-in for llm-d's tokenizer sidecar: `tokenization.TokenizationService` (llm-d/llm-d-kv-cache,
services/uds_tokenizer) on a Unix socket, tokenizing with the sim server's tokenizer (built-in, or a
model's files with `--tokenizer`), so that an EPP configured with `udsTokenizerConfig` gets the same
ids the simulated engines compute their block hashes from.

As the sidecar answers: `InitializeTokenizer` succeeds (the tokenizer is already loaded); the render
calls default `add_generation_prompt` to true when it is absent; a chat's content parts are read as
vLLM reads them (text parts; an image part counts for nothing, the sim having no vision encoder); any
failure is the status INTERNAL with the reason, as the sidecar aborts. `Tokenize` answers no offsets:
nothing in the router reads them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from epick.sim.tokenizing import SimTokenizer
from epick.tokenization.uds_messages import INITIALIZE, RENDER_CHAT, RENDER_COMPLETION, TOKENIZE, message

__all__ = ["TokenizerSidecar"]

log = logging.getLogger(__name__)

_Initialize, _InitializeReply = message("InitializeTokenizerRequest"), message("InitializeTokenizerResponse")
_RenderChat, _RenderChatReply = (
    message("RenderChatCompletionRequest"),
    message("RenderChatCompletionResponse"),
)
_RenderCompletion = message("RenderCompletionRequest")
_RenderCompletionReply = message("RenderCompletionResponse")
_Tokenize, _TokenizeReply = message("TokenizeRequest"), message("TokenizeResponse")


class TokenizerSidecar:
    """The service on `socket_path` (a path; `host:port` with `tcp`), until `stop`."""

    def __init__(
        self,
        tokenizer: SimTokenizer,
        socket_path: str,
        *,
        tcp: bool = False,
        models: Sequence[str] = (),
        without: Sequence[str] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.models = tuple(models)  # the models it has a tokenizer for (empty: any)
        self.socket_path = socket_path
        self.tcp = tcp
        self.without = tuple(without)  # method paths it lacks (a sidecar older than the renders)
        self.initialized: list[str] = []  # the models InitializeTokenizer was asked for
        self.calls: dict[str, int] = {}  # method path -> calls answered
        self._server: grpc.aio.Server | None = None
        self._requests = 0

    async def start(self) -> None:
        if not self.tcp:
            os.makedirs(os.path.dirname(os.path.abspath(self.socket_path)), mode=0o700, exist_ok=True)
            if os.path.exists(self.socket_path):
                os.unlink(self.socket_path)  # a stale socket, as the sidecar removes it
        server = grpc.aio.server()
        handlers = {
            INITIALIZE: (_Initialize, self._initialize),
            RENDER_CHAT: (_RenderChat, self._render_chat),
            RENDER_COMPLETION: (_RenderCompletion, self._render_completion),
            TOKENIZE: (_Tokenize, self._tokenize),
        }
        methods = {
            path.rsplit("/", 1)[1]: grpc.unary_unary_rpc_method_handler(
                self._answer(path, handle),
                request_deserializer=kind.FromString,
                response_serializer=lambda reply: reply.SerializeToString(),
            )
            for path, (kind, handle) in handlers.items()
            if path not in self.without
        }
        service = INITIALIZE.split("/")[1]
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
        server.add_insecure_port(
            self.socket_path if self.tcp else "unix://" + os.path.abspath(self.socket_path)
        )
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=None)
            self._server = None

    def _answer(
        self, path: str, handle: Callable[[Any], Any]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Any]:
        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self.calls[path] = self.calls.get(path, 0) + 1
            try:
                return handle(request)
            except (ValueError, TypeError, KeyError) as e:
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

        return answer

    def _request_id(self) -> str:
        self._requests += 1
        return f"sidecar-{self._requests}"

    def _check_model(self, model: str) -> None:
        if self.models and model not in self.models:
            raise ValueError(f"Render failed: no tokenizer for model {model!r}")

    def _initialize(self, request: Any) -> Any:
        if self.models and request.model_name not in self.models:
            return _InitializeReply(
                success=False, error_message=f"Failed to initialize renderer for model: {request.model_name}"
            )
        self.initialized.append(request.model_name)
        return _InitializeReply(success=True)

    def _render_chat(self, request: Any) -> Any:
        self._check_model(request.model_name)
        messages: list[dict[str, Any]] = []
        for m in request.messages:
            entry: dict[str, Any] = {"role": m.role}
            if m.content_parts:
                entry["content"] = [
                    {"type": "text", "text": p.text} if p.type == "text" else {"type": p.type}
                    for p in m.content_parts
                ]
            else:
                entry["content"] = m.content
            if m.HasField("tool_calls_json"):
                entry["tool_calls"] = json.loads(m.tool_calls_json)
            messages.append(entry)
        ids = self.tokenizer.encode_chat(
            messages,
            add_generation_prompt=request.add_generation_prompt
            if request.HasField("add_generation_prompt")
            else True,
            continue_final_message=request.continue_final_message,
            tools=json.loads(request.tools_json) if request.HasField("tools_json") else None,
            chat_template_kwargs=json.loads(request.chat_template_kwargs)
            if request.HasField("chat_template_kwargs")
            else None,
        )
        return _RenderChatReply(request_id=self._request_id(), token_ids=ids, success=True)

    def _render_completion(self, request: Any) -> Any:
        self._check_model(request.model_name)
        ids = self.tokenizer.encode(request.prompt)
        return _RenderCompletionReply(request_id=self._request_id(), token_ids=ids, success=True)

    def _tokenize(self, request: Any) -> Any:
        self._check_model(request.model_name)
        ids = self.tokenizer.encode(request.input, add_special_tokens=request.add_special_tokens)
        return _TokenizeReply(input_ids=ids, success=True)
