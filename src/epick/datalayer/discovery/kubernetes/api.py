"""The Kubernetes API server's answers as discovery reads them: JSON objects and their metadata, and
its errors (`_ApiError` with a Status object's reason and message, `_GoneError` for 410 Gone).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

Json = dict[str, Any]


class _ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class _GoneError(_ApiError):
    """The resourceVersion a watch asked for is older than the server keeps: list again."""


async def _check(resp: Any) -> None:
    """Raise `_ApiError` (`_GoneError` for 410) with the Status object's reason and message, unless 200."""
    if resp.status == 200:
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
