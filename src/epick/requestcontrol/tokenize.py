"""Token ids asked of a model server: the calls `RemoteTokenizer` producers describe (vLLM's render
endpoints, or `/tokenize`), made before the data producers run, so the producers find the tokens on
the request. An endpoint that answers 404 is not asked again: its call's fallback is made instead.

A call that fails (unreachable server, an error status, a timeout, an answer without token ids) is
logged with its reason and leaves the request without tokens; its producer then fails, and the
request is scheduled without them, as upstream schedules it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import aiohttp

from epick.framework import InferenceRequest, RemoteTokenizer

log = logging.getLogger(__name__)


class _NotFoundError(ValueError):
    """The endpoint answered 404: the server does not have it."""


class RemoteTokenization:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
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
                        answers = [await self._post(call.url, payload) for payload in call.payloads]
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
                        answers = [await self._post(call.url, payload) for payload in call.payloads]
                tokenizer.tokenized(request, answers)
            except (aiohttp.ClientError, TimeoutError, ValueError, OSError) as e:
                self.failures += 1
                reason = f"no answer within {call.timeout:g}s" if isinstance(e, TimeoutError) else str(e)
                log.warning(
                    "%s: tokenizing request %s at %s failed: %s",
                    tokenizer.typed_name, request.request_id, call.url, reason,
                )  # fmt: skip

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
