"""Token ids asked of a model server: the calls `RemoteTokenizer` producers describe (vLLM's render
endpoints, or `/tokenize`), made before the data producers run, so the producers find the tokens on
the request. An endpoint that answers 404 is not asked again: its call's fallback is made instead.

A call that fails (unreachable server, an error status, a timeout, an answer without token ids) is
logged with its reason and leaves the request without tokens; its producer then fails, and the
request is scheduled without them, as upstream schedules it.

gRPC calls (llm-d's tokenizer sidecar, on a Unix socket) go over one grpc.aio channel per target.
A tokenizer that must be initialized first (`InitializedTokenizer`) is asked by `prepare`, again
after 1, 2, 3, 4, then every 5 seconds, until it answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp
import grpc

from epick.framework import InferenceRequest, InitializedTokenizer, RemoteTokenizer, TokenizeCall

log = logging.getLogger(__name__)

RETRY_AFTER = (1.0, 2.0, 3.0, 4.0, 5.0)  # seconds between initialization attempts, the last repeated
MAX_MESSAGE = 100 * 1024 * 1024  # bytes: upstream's client's send and receive limits


class _NotFoundError(ValueError):
    """The endpoint answered 404: the server does not have it."""


class RemoteTokenization:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.failures = 0
        self.missing: set[str] = set()  # endpoints that answered 404: their fallback is asked instead

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def tokenize(self, request: InferenceRequest, tokenizers: Sequence[RemoteTokenizer]) -> None:
        for tokenizer in tokenizers:
            call = tokenizer.tokenize_call(request)
            if call is None:
                continue
            if call.fallback is not None and call.url in self.missing:
                call = call.fallback
            try:
                async with asyncio.timeout(call.timeout):
                    try:
                        answers = await self._ask(call)
                    except _NotFoundError:
                        if call.fallback is None:
                            raise
                        self.missing.add(call.url)
                        log.info(
                            "%s: %s answers 404; asking %s instead",
                            tokenizer.typed_name,
                            call.url,
                            call.fallback.url,
                        )
                        call = call.fallback
                        answers = await self._ask(call)
                tokenizer.tokenized(request, answers)
            except (aiohttp.ClientError, grpc.aio.AioRpcError, TimeoutError, ValueError, OSError) as e:
                self.failures += 1
                reason = _said(e, call.timeout)
                log.warning(
                    "%s: tokenizing request %s at %s failed: %s",
                    tokenizer.typed_name, request.request_id, call.url, reason,
                )  # fmt: skip

    async def prepare(self, tokenizers: Iterable[object]) -> None:
        """Initialize every tokenizer that asks for it, retrying the ones that fail until each has
        answered (run in the background: readiness waits on them, not the caller)."""
        waiting = [t for t in tokenizers if isinstance(t, InitializedTokenizer)]
        attempt = 0
        while waiting:
            for tokenizer in list(waiting):
                call = tokenizer.initialize_call()
                if call is None:
                    waiting.remove(tokenizer)
                    continue
                try:
                    async with asyncio.timeout(call.timeout):
                        answers = await self._ask(call)
                    tokenizer.initialized(answers, None)
                except (aiohttp.ClientError, grpc.aio.AioRpcError, TimeoutError, ValueError, OSError) as e:
                    reason = _said(e, call.timeout)
                    tokenizer.initialized(None, reason)
                    if attempt == 0:
                        log.warning(
                            "%s: initializing at %s failed: %s", tokenizer.typed_name, call.url, reason
                        )
            waiting = [t for t in waiting if t.initialize_call() is not None]
            if waiting:
                await asyncio.sleep(RETRY_AFTER[min(attempt, len(RETRY_AFTER) - 1)])
                attempt += 1

    async def _ask(self, call: TokenizeCall) -> list[Any]:
        """Each payload's answer, in order."""
        if not call.method:
            return [await self._post(call.url, payload) for payload in call.payloads]
        assert call.reply is not None
        answers = []
        for payload in call.payloads:
            assert isinstance(payload, bytes)
            answers.append(call.reply(await self._unary(call.url, call.method, payload)))
        return answers

    async def _unary(self, target: str, method: str, payload: bytes) -> bytes:
        channel = self._channels.get(target)
        if channel is None:
            options = [
                ("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
            ]
            channel = self._channels[target] = grpc.aio.insecure_channel(target, options=options)
        try:
            answer: bytes = await channel.unary_unary(method)(payload)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise _NotFoundError(f"{method} is not implemented there") from None
            raise ValueError(_said(e)) from None
        return answer

    async def _post(self, url: str, payload: Any) -> Any:
        async with self._client().post(url, json=payload) as r:
            if r.status != 200:
                text = (await r.text())[:200]
                raise (_NotFoundError if r.status == 404 else ValueError)(f"status {r.status}: {text}")
            try:
                return await r.json(content_type=None)
            except ValueError as e:
                raise ValueError(f"an answer that is not JSON: {e}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()


def _said(error: BaseException, timeout: float = 0.0) -> str:
    """A failure in words: a gRPC status with its details, a timeout, else the error."""
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g}s"
    if isinstance(error, grpc.aio.AioRpcError):
        return f"gRPC {error.code().name}: {error.details()}"
    return str(error)
