"""The metrics port: `/metrics` (and the debug handlers beside it), authenticated and authorized as
controller-runtime's `filters.WithAuthenticationAndAuthorization` does it for the Go EPP
(`--metrics-endpoint-auth`), over TLS with `--metrics-cert-dir` (and client certificates with
`--metrics-client-ca-file`).

Authentication: the request's bearer token goes to the API server in a TokenReview; its answer is
kept a minute per token. Authorization: a SubjectAccessReview for the user it names, the request's
path and its method as the verb (`get /metrics`); an allow is kept five minutes, a deny thirty
seconds. A request without a bearer token gets 401, one whose token the review rejects 500
("Authentication failed", as upstream's filter answers), one the review denies 403, naming the user.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from epick.datalayer.discovery.kubernetes.api import Json, _describe, call_json

__all__ = ["MetricsAuth", "MetricsServer", "metrics_tls"]

log = logging.getLogger(__name__)

TOKEN_TTL_S = 60.0
ALLOW_TTL_S = 300.0
DENY_TTL_S = 30.0
REVIEW_TIMEOUT_S = 10.0
CACHE_ENTRIES = 4096  # per cache: a client sending new tokens cannot grow it past this
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Answers:
    """Review answers by key for a while, at most `CACHE_ENTRIES` (expired ones go first, then the
    oldest), and one review in flight per key however many requests wait for it."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._kept: dict[str, tuple[float, Any]] = {}
        self._asked: dict[str, asyncio.Future[Any]] = {}

    async def get(self, key: str, ask: Callable[[], Awaitable[tuple[Any, float]]]) -> Any:
        """The answer for `key`: kept, being asked, or asked now (`ask` gives it and how long it keeps)."""
        kept = self._kept.get(key)
        if kept is not None and kept[0] > self.clock():
            return kept[1]
        pending = self._asked.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._asked[key] = future
        try:
            answer, ttl = await ask()
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: those waiting get it raised
            raise
        finally:
            self._asked.pop(key, None)
        future.set_result(answer)
        self._keep(key, answer, ttl)
        return answer

    def _keep(self, key: str, answer: Any, ttl: float) -> None:
        now = self.clock()
        kept = self._kept
        kept.pop(key, None)
        if len(kept) >= CACHE_ENTRIES:
            for old in [k for k, (expires, _) in kept.items() if expires <= now]:
                del kept[old]
            while len(kept) >= CACHE_ENTRIES:
                del kept[next(iter(kept))]
        kept[key] = (now + ttl, answer)


@dataclass(frozen=True, slots=True)
class _User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, Any]


def _text(status: int, body: str) -> web.Response:
    """An error as Go's http.Error writes it."""
    return web.Response(
        status=status,
        text=body + "\n",
        content_type="text/plain",
        charset="utf-8",
        headers={"X-Content-Type-Options": "nosniff"},
    )


class MetricsAuth:
    """TokenReview, then SubjectAccessReview, through the API client `api()` returns (the service's
    Kubernetes client; None while there is none: every request is refused with 500)."""

    def __init__(self, api: Callable[[], Any], clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.clock = clock
        self._tokens = _Answers(clock)  # by the token's SHA-256: the tokens are not kept
        self._reviews = _Answers(clock)

    async def check(self, request: web.Request) -> web.Response | None:
        """None when the request may be served; else the answer that refuses it."""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return _text(401, "Unauthorized")
        try:
            user = await self._authenticate(token)
        except Exception as e:  # the API server could not answer
            log.warning("metrics: TokenReview failed: %s", _describe(e))
            return _text(500, "Authentication failed")
        if user is None:
            return _text(500, "Authentication failed")
        try:
            allowed = await self._authorize(user, request.path, request.method.lower())
        except Exception as e:
            log.warning("metrics: SubjectAccessReview for %s failed: %s", user.name, _describe(e))
            return _text(500, f"Authorization for user {user.name} failed")
        if not allowed:
            return _text(403, f"Authorization denied for user {user.name}")
        return None

    async def _authenticate(self, token: str) -> _User | None:
        async def review() -> tuple[_User | None, float]:
            answer = await self._create(
                "authentication.k8s.io",
                "tokenreviews",
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            )
            status = answer.get("status") or {}
            if not status.get("authenticated"):
                return None, TOKEN_TTL_S
            info = status.get("user") or {}
            groups = [str(g) for g in info.get("groups") or []]
            if "system:authenticated" not in groups:
                groups.append("system:authenticated")
            extra = info.get("extra") or {}
            return _User(
                str(info.get("username", "")), str(info.get("uid", "")), tuple(groups), extra
            ), TOKEN_TTL_S

        user: _User | None = await self._tokens.get(hashlib.sha256(token.encode()).hexdigest(), review)
        return user

    async def _authorize(self, user: _User, path: str, verb: str) -> bool:
        spec: Json = {
            "nonResourceAttributes": {"path": path, "verb": verb},
            "user": user.name,
            "groups": list(user.groups),
        }
        if user.uid:
            spec["uid"] = user.uid
        if user.extra:
            spec["extra"] = dict(user.extra)

        async def review() -> tuple[bool, float]:
            answer = await self._create(
                "authorization.k8s.io",
                "subjectaccessreviews",
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
            )
            allowed = bool((answer.get("status") or {}).get("allowed"))
            return allowed, ALLOW_TTL_S if allowed else DENY_TTL_S

        allowed: bool = await self._reviews.get(json.dumps(spec, sort_keys=True), review)
        return allowed

    async def _create(self, group: str, plural: str, body: Json) -> Json:
        from kubernetes_asyncio import client

        api_client = self.api()
        if api_client is None:
            raise RuntimeError("no Kubernetes API client yet")
        api = client.CustomObjectsApi(api_client)
        return await call_json(
            api.create_cluster_custom_object, group, "v1", plural, body, timeout=REVIEW_TIMEOUT_S
        )


def metrics_tls(cert_dir: str | None, client_ca: str | None) -> ssl.SSLContext | None:
    """The metrics port's TLS: the pair in `cert_dir` (tls.crt, tls.key; re-read when they change),
    client certificates required with `client_ca`; None without a directory (plain HTTP)."""
    if cert_dir is None:
        return None
    from epick.extproc.tls import CertificateStore, ServerContexts

    store = CertificateStore(cert_dir, client_ca, reload=True)
    return ServerContexts(store, alpn=("http/1.1",)).context()


class MetricsServer:
    """`/metrics` from `page()` and the extra routes, on `host:port`, behind `auth` when given."""

    def __init__(
        self,
        page: Callable[[], bytes | Awaitable[bytes]],
        content_type: str,
        *,
        auth: MetricsAuth | None = None,
        tls: ssl.SSLContext | None = None,
        routes: Mapping[str, Handler] | None = None,
    ) -> None:
        self.page = page
        self.content_type = content_type
        self.auth = auth
        self.tls = tls
        self.routes = dict(routes or {})
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/metrics", self._metrics)
        for path, handler in self.routes.items():
            app.router.add_get(path, handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host or None, port, ssl_context=self.tls).start()

    @property
    def port(self) -> int:
        if self._runner is None or not self._runner.addresses:
            return 0
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.auth is not None:
            refused = await self.auth.check(request)
            if refused is not None:
                return refused
        return await handler(request)

    async def _metrics(self, request: web.Request) -> web.Response:
        page = self.page()
        body = await page if inspect.isawaitable(page) else page
        return web.Response(body=body, headers={"Content-Type": self.content_type})
