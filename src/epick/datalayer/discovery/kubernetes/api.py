"""The Kubernetes API server's answers as discovery reads them: JSON objects and their metadata, and
its errors (`_ApiError` with a Status object's reason and message, `_GoneError` for 410 Gone).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

Json = dict[str, Any]


class _ApiError(Exception):
    """An answer other than success: its HTTP status, the Status object's reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class _GoneError(_ApiError):
    """The resourceVersion a watch asked for is older than the server keeps: list again."""


async def _check(resp: Any, ok: tuple[int, ...] = (200,)) -> None:
    """Raise `_ApiError` (`_GoneError` for 410) with the Status object's reason and message, unless the
    status is one of `ok`."""
    if resp.status in ok:
        return
    body = await resp.read()
    reason, message = str(resp.reason or ""), ""
    with contextlib.suppress(ValueError):
        status = json.loads(body)
        if isinstance(status, dict):
            reason = str(status.get("reason") or reason)
            message = str(status.get("message") or "")
    cls = _GoneError if resp.status == 410 else _ApiError
    raise cls(resp.status, reason, message)


def _metadata(obj: Json) -> Json:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, _ApiError):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


async def call_json(call: Any, *args: Any, timeout: Any = None, **kwargs: Any) -> Json:
    """Call a kubernetes-asyncio API method and return the answer's JSON object; raise `_ApiError` for
    any status but 200 and 201 (the API server's reason and message), `ValueError` for a body that is not
    a JSON object."""
    resp = await call(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
    try:
        await _check(resp, ok=(200, 201))
        body = await resp.read()
    finally:
        resp.release()
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    return doc
