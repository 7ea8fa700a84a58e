"""List and watch, the way client-go's reflector does: each collection is listed once, then watched from
the list's resourceVersion; a watch that ends resumes from the last version seen, one whose version has
expired (410 Gone) lists again, and errors are retried with a backoff (logged once a streak, and once on
recovery).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from epick.datalayer.discovery.kubernetes.api import (
    Json,
    _ApiError,
    _check,
    _describe,
    _GoneError,
    _metadata,
    call_json,
)

log = logging.getLogger(__name__)

SHORT_WATCH_S = 1.0  # a watch that ends sooner than this without an event counts as a failure (client-go)

EventHandler = Callable[[str, Json], Awaitable[None]]
ListHandler = Callable[[list[Json]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Collection:
    """One listable, watchable collection: the API call and its fixed arguments."""

    what: str  # for logs: "pods in default (app=vllm)"
    call: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


class Reflector:
    """Lists and watches collections with one set of timeouts and backoff (`KubernetesDiscovery`'s)."""

    def __init__(
        self, watch_timeout_s: int, request_timeout_s: float, backoff_s: tuple[float, float]
    ) -> None:
        self._watch_timeout_s = max(1, int(watch_timeout_s))
        self._list_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._watch_http_timeout = aiohttp.ClientTimeout(
            connect=request_timeout_s,
            sock_connect=request_timeout_s,
            sock_read=self._watch_timeout_s + request_timeout_s,
        )
        self._backoff = backoff_s

    @property
    def backoff(self) -> tuple[float, float]:
        """The first and the longest wait before trying again."""
        return self._backoff

    async def reflect(
        self, coll: _Collection, rv: str | None, on_list: ListHandler, on_event: EventHandler
    ) -> None:
        """List (when there is no version to watch from) then watch, forever."""
        retry = _Retry(coll.what, self._backoff)
        while True:
            try:
                if rv is None:
                    items, rv = await self.list_items(coll)
                    retry.ok()
                    await on_list(items)
                cursor = _Cursor(rv)
                try:
                    await self._watch(coll, cursor, on_event, retry)
                finally:
                    rv = cursor.rv
                if cursor.events == 0 and cursor.elapsed() < SHORT_WATCH_S:
                    raise _ApiError(0, "ShortWatch", "the watch ended at once, without an event")
                retry.ok()
                retry.gone = 0
            except asyncio.CancelledError:
                raise
            except _GoneError as e:
                rv = None
                retry.gone += 1
                log.info("%s: watch expired (%s); listing again", coll.what, e)
                if retry.gone > 1:  # expired again right after a list: do not spin
                    await retry.failed(e)
            except Exception as e:
                await retry.failed(e)

    async def list_items(self, coll: _Collection) -> tuple[list[Json], str]:
        doc = await self.get(coll.call, *coll.args, **coll.kwargs)
        items = doc.get("items")
        if not isinstance(items, list):
            raise ValueError(f"listing {coll.what}: the answer has no items")
        rv = _metadata(doc).get("resourceVersion")
        return [i for i in items if isinstance(i, dict)], str(rv or "0")

    async def get(self, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Json:
        return await call_json(call, *args, timeout=self._list_timeout, **kwargs)

    async def _watch(self, coll: _Collection, cursor: _Cursor, on_event: EventHandler, retry: _Retry) -> None:
        """Follow one watch stream until it ends; events move `cursor` on."""
        resp = await coll.call(
            *coll.args,
            watch=True,
            resource_version=cursor.rv,
            timeout_seconds=self._watch_timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=self._watch_http_timeout,
            **coll.kwargs,
        )
        try:
            await _check(resp)
            buf = bytearray()
            async for chunk in resp.content.iter_any():
                buf += chunk
                start = 0
                while (end := buf.find(b"\n", start)) >= 0:
                    line = bytes(buf[start:end])
                    start = end + 1
                    if line.strip():
                        retry.ok()
                        await self._event(coll, cursor, line, on_event)
                del buf[:start]
            if buf.strip():
                await self._event(coll, cursor, bytes(buf), on_event)
        except BaseException:
            resp.close()
            raise
        resp.release()

    async def _event(self, coll: _Collection, cursor: _Cursor, line: bytes, on_event: EventHandler) -> None:
        event = json.loads(line)
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise ValueError(f"watching {coll.what}: not a watch event: {line[:200]!r}")
        if kind == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 0
            cls = _GoneError if status == 410 else _ApiError
            raise cls(status, str(obj.get("reason") or ""), str(obj.get("message") or ""))
        rv = _metadata(obj).get("resourceVersion")
        cursor.events += 1
        if kind != "BOOKMARK":
            try:
                await on_event(kind, obj)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: cannot apply a %s event; skipping it", coll.what, kind)
        if isinstance(rv, str) and rv:
            cursor.rv = rv


class _Cursor:
    """Where a watch is: the last resourceVersion seen, and how many events it gave."""

    def __init__(self, rv: str) -> None:
        self.rv = rv
        self.events = 0
        self._started = asyncio.get_running_loop().time()

    def elapsed(self) -> float:
        return asyncio.get_running_loop().time() - self._started


class _Retry:
    """Backoff between failed attempts, a warning at the start of a streak, a note when it ends."""

    def __init__(self, what: str, backoff_s: tuple[float, float]) -> None:
        self.what = what
        self.low, self.high = backoff_s
        self.delay = self.low
        self.failures = 0
        self.gone = 0

    def ok(self) -> None:
        if self.failures:
            log.info(
                "%s: the Kubernetes API server answers again (after %d failures)", self.what, self.failures
            )
        self.failures = 0
        self.delay = self.low

    async def failed(self, error: BaseException) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("%s: %s; retrying with backoff", self.what, _describe(error))
        else:
            log.debug("%s: %s (failure %d)", self.what, _describe(error), self.failures)
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.high)
