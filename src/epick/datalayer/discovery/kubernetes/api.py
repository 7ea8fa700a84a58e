"""The Kubernetes API server's answers as discovery reads them: JSON objects and their metadata, and
its errors (`_ApiError` with a Status object's reason and message, `_GoneError` for 410 Gone).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

Json = dict[str, Any]


class _ApiError(Exception):
    """An answer other than success: its HTTP status, the Status object's reason and message, and what
    was asked (`action`, as RBAC names it: "list pods in namespace default")."""

    def __init__(self, status: int, reason: str, message: str, action: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message
        self.action = action


def rbac_action(method: str, path: str, query: Mapping[str, str]) -> str:
    """A request as RBAC sees it: the verb, the resource (with its API group) and where, e.g.
    "watch pods in namespace default" or "create tokenreviews.authentication.k8s.io"."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return f"{method} {path}"
    namespace = ""
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return f"{method} {path}"
    resource, name = rest[0], rest[1] if len(rest) > 1 else ""
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    watching = query.get("watch", "").lower() in ("true", "1")
    verb = {
        "GET": "get" if name else ("watch" if watching else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }.get(method.upper(), method.lower())
    what = f"{resource}.{group}" if group else resource
    if name:
        what += f" {name!r}"
    return f"{verb} {what} in namespace {namespace}" if namespace else f"{verb} {what}"


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
    action = rbac_action(str(resp.method), resp.url.path, resp.url.query) if hasattr(resp, "url") else ""
    raise cls(resp.status, reason, message, action)


def _metadata(obj: Json) -> Json:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, _ApiError):
        if error.status == 403 and error.action:
            return (
                f"{text} (RBAC: this pod's service account may not {error.action}; deploy/rbac.yaml "
                "has the rules epick needs)"
            )
        if error.status == 401:
            return f"{text} (the API server refused the service account's token{_asking(error)})"
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _asking(error: _ApiError) -> str:
    return f", asked to {error.action}" if error.action else ""


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
