"""Token ids asked of a model server: the calls `RemoteTokenizer` producers describe (vLLM's
`/tokenize`), made before the data producers run, so the producers find the tokens on the request.

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


class RemoteTokenization:
    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self.failures = 0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def tokenize(self, request: InferenceRequest, tokenizers: Sequence[RemoteTokenizer]) -> None:
        for tokenizer in tokenizers:
            call = tokenizer.tokenize_call(request)
            if call is None:
                continue
            try:
                async with asyncio.timeout(call.timeout):
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
                raise ValueError(f"status {r.status}: {text}")
            try:
                return await r.json(content_type=None)
            except ValueError as e:
                raise ValueError(f"an answer that is not JSON: {e}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
