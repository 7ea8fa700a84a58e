"""Kubernetes discovery: the Ready pods an InferencePool (or a label selector) selects, kept live by watches.

One endpoint per pod and target port: named `<pod>` when there is one port, `<pod>-rank-<i>` for port i
when there are several (as the Go EPP names them); address the pod IP; labels the pod's labels. A pod
counts while it is Ready (condition Ready=True), has a pod IP and is not being deleted.

An InferencePool is read from `inference.networking.k8s.io/v1` (`spec.selector.matchLabels`,
`spec.targetPorts[].number`), or, where that has no such pool, from the older
`inference.networking.x-k8s.io/v1alpha2` (`spec.selector` a flat map, `spec.targetPortNumber`). The pool is
watched too: a new selector or new ports re-list the pods; a deleted pool empties the datastore until it
comes back.

Each collection is listed once, then watched from the list's resourceVersion. A watch that ends
(timeoutSeconds, a dropped connection) resumes from the last resourceVersion seen; one whose version has
expired (410 Gone) re-lists and replaces the endpoints. Errors are retried with a backoff (logged once a
streak, and once on recovery); the background tasks end only with `stop()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.discovery.static import DiscoveryError

log = logging.getLogger(__name__)

POOL_PLURAL = "inferencepools"
POOL_API_VERSIONS = (("inference.networking.k8s.io", "v1"), ("inference.networking.x-k8s.io", "v1alpha2"))
DEFAULT_TARGET_PORTS = (8000,)
SHORT_WATCH_S = 1.0  # a watch that ends sooner than this without an event counts as a failure (client-go)

Json = dict[str, Any]
EventHandler = Callable[[str, Json], Awaitable[None]]
ListHandler = Callable[[list[Json]], Awaitable[None]]


class _ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message


class _GoneError(_ApiError):
    """The resourceVersion a watch asked for is older than the server keeps: list again."""


@dataclass(frozen=True, slots=True)
class _Target:
    """What the pods are chosen by: a label selector (API syntax) and the ports to serve on."""

    selector: str
    ports: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Collection:
    """One listable, watchable collection: the API call and its fixed arguments."""

    what: str  # for logs: "pods in default (app=vllm)"
    call: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


class KubernetesDiscovery:
    """Keeps a `Datastore` in step with the Ready pods of an InferencePool, or of a label selector.

    Give exactly one of `pool` (an InferencePool's name; its selector and target ports are used) or
    `selector` (a label selector string such as "app=vllm,tier in (a,b)", or a mapping of matchLabels,
    served on `target_ports`, default [8000]). Without `api_client`, the configuration is loaded at
    `start()`: from `kubeconfig` when given, else in-cluster when KUBERNETES_SERVICE_HOST is set, else the
    default kubeconfig; a client made here is closed by `stop()`, one passed in is left open.
    """

    def __init__(
        self,
        datastore: Datastore,
        namespace: str,
        *,
        pool: str | None = None,
        selector: str | Mapping[str, str] | None = None,
        target_ports: Sequence[int] | None = None,
        api_client: Any = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        backoff_s: tuple[float, float] = (0.5, 30.0),
    ) -> None:
        if not namespace:
            raise DiscoveryError("Kubernetes discovery: a namespace is required")
        if (pool is None) == (selector is None):
            raise DiscoveryError(
                "Kubernetes discovery: give either an InferencePool name or a label selector"
            )
        if api_client is not None and kubeconfig is not None:
            raise DiscoveryError("Kubernetes discovery: give an API client or a kubeconfig, not both")
        self._datastore = datastore
        self._namespace = namespace
        self._pool = pool
        self._target: _Target | None = None
        if pool is not None:
            if not pool:
                raise DiscoveryError("Kubernetes discovery: the InferencePool name is empty")
            if target_ports is not None:
                raise DiscoveryError(
                    f"Kubernetes discovery: InferencePool {pool!r} sets the target ports; do not give them"
                )
        else:
            assert selector is not None
            where = "Kubernetes discovery: the label selector"
            text = _selector_string(selector, where) if isinstance(selector, Mapping) else selector.strip()
            if not text:
                raise DiscoveryError(f"{where} is empty (it would select every pod in {namespace!r})")
            ports = DEFAULT_TARGET_PORTS if target_ports is None else tuple(target_ports)
            self._target = _Target(text, _check_ports(ports, "Kubernetes discovery: target ports"))
        self._api_client = api_client
        self._own_client = False
        self._kubeconfig = None if kubeconfig is None else os.fspath(kubeconfig)
        self._watch_timeout_s = max(1, int(watch_timeout_s))
        self._list_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._watch_http_timeout = aiohttp.ClientTimeout(
            connect=request_timeout_s,
            sock_connect=request_timeout_s,
            sock_read=self._watch_timeout_s + request_timeout_s,
        )
        self._backoff = backoff_s
        self._pool_api: tuple[str, str] | None = None  # (group, version) the pool was found in
        self._pool_present = False
        self._pods: dict[str, tuple[EndpointSpec, ...]] = {}  # the endpoints of each Ready pod
        self._pod_task: asyncio.Task[None] | None = None
        self._pool_task: asyncio.Task[None] | None = None
        self._started = False

    # public

    @property
    def source(self) -> str:
        """What is being followed, for logs: "InferencePool default/pool" or "pods in default (app=vllm)"."""
        if self._pool is not None:
            return f"InferencePool {self._namespace}/{self._pool}"
        assert self._target is not None
        return f"pods in {self._namespace} ({self._target.selector})"

    @property
    def target_ports(self) -> tuple[int, ...]:
        return () if self._target is None else self._target.ports

    async def start(self) -> None:
        """List once (the datastore is filled when this returns), then keep watching in the background.

        Raises `DiscoveryError` when the configuration cannot be loaded, the API server cannot be reached,
        the pool does not exist (or is invalid), or the API server refuses the list (its message quoted).
        """
        if self._started:
            raise RuntimeError("KubernetesDiscovery.start() called twice")
        self._started = True
        if self._api_client is None:
            self._api_client = await self._load_client()
            self._own_client = True
        try:
            pool_rv = await self._initial_pool() if self._pool is not None else None
            pod_rv = await self._initial_pods()
        except DiscoveryError:
            await self._close_client()
            raise
        except _ApiError as e:
            await self._close_client()
            raise DiscoveryError(
                f"{self.source}: the Kubernetes API server at {self._host} said {e}"
            ) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            await self._close_client()
            raise DiscoveryError(
                f"{self.source}: cannot reach the Kubernetes API server at {self._host}: {_describe(e)}"
            ) from None
        except ValueError as e:
            await self._close_client()
            raise DiscoveryError(
                f"{self.source}: {self._host} does not answer as a Kubernetes API server: {_describe(e)}"
            ) from None
        except BaseException:  # cancelled, or a bug: still close a client made here
            await self._close_client()
            raise
        self._pod_task = asyncio.create_task(
            self._reflect(self._pods_collection(), pod_rv, self._pods_listed, self._pod_event)
        )
        if self._pool is not None:
            self._pool_task = asyncio.create_task(
                self._reflect(self._pool_collection(), pool_rv, self._pool_listed, self._pool_event)
            )

    async def stop(self) -> None:
        """Stop watching (the datastore keeps what it has) and close a client made by `start()`."""
        pool_task, self._pool_task = self._pool_task, None
        await _cancel(pool_task)
        await self._stop_pods()
        await self._close_client()

    # set-up

    @property
    def _host(self) -> str:
        return str(getattr(getattr(self._api_client, "configuration", None), "host", "?"))

    async def _load_client(self) -> Any:
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        try:
            if self._kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                source = "in-cluster configuration"
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            else:
                source = f"kubeconfig {self._kubeconfig or '(default location)'}"
                await config.load_kube_config(
                    config_file=self._kubeconfig, client_configuration=configuration
                )
        except Exception as e:
            raise DiscoveryError(f"Kubernetes discovery: cannot load the {source}: {_describe(e)}") from None
        return client.ApiClient(configuration)

    async def _close_client(self) -> None:
        if self._own_client and self._api_client is not None:
            self._own_client = False
            await self._api_client.close()

    async def _initial_pool(self) -> str:
        from kubernetes_asyncio import client

        api = client.CustomObjectsApi(self._api_client)
        for group, version in POOL_API_VERSIONS:
            try:
                pool = await self._get(
                    api.get_namespaced_custom_object, group, version, self._namespace, POOL_PLURAL, self._pool
                )
            except _ApiError as e:
                if e.status == 404:
                    continue
                raise
            self._pool_api = (group, version)
            self._target = _parse_pool(pool, f"{self.source} ({group}/{version})")
            self._pool_present = True
            log.info("%s (%s/%s): %s", self.source, group, version, _describe_target(self._target))
            return str(_metadata(pool).get("resourceVersion") or "")
        tried = " and ".join(f"{g}/{v}" for g, v in POOL_API_VERSIONS)
        raise DiscoveryError(
            f"InferencePool {self._pool!r} not found in namespace {self._namespace!r} "
            f"(looked in {tried} at {self._host})"
        )

    async def _initial_pods(self) -> str:
        items, rv = await self._list(self._pods_collection())
        await self._pods_listed(items)
        return rv

    # the two collections

    def _pods_collection(self) -> _Collection:
        from kubernetes_asyncio import client

        assert self._target is not None
        return _Collection(
            f"pods in {self._namespace} ({self._target.selector})",
            client.CoreV1Api(self._api_client).list_namespaced_pod,
            (self._namespace,),
            {"label_selector": self._target.selector},
        )

    def _pool_collection(self) -> _Collection:
        from kubernetes_asyncio import client

        assert self._pool_api is not None
        group, version = self._pool_api
        return _Collection(
            self.source,
            client.CustomObjectsApi(self._api_client).list_namespaced_custom_object,
            (group, version, self._namespace, POOL_PLURAL),
            {"field_selector": f"metadata.name={self._pool}"},
        )

    # pods

    async def _pods_listed(self, items: list[Json]) -> None:
        pods: dict[str, tuple[EndpointSpec, ...]] = {}
        for obj in items:
            name, specs, _ = self._endpoints_of(obj)
            if specs:
                pods[name] = specs
        for name in sorted(pods.keys() - self._pods.keys()):
            log.info("%s: pod %s added: %s", self.source, name, _where(pods[name]))
        for name in sorted(self._pods.keys() - pods.keys()):
            log.info("%s: pod %s removed (gone from the list)", self.source, name)
        for name in sorted(pods.keys() & self._pods.keys()):
            if pods[name] != self._pods[name]:
                log.info("%s: pod %s changed: %s", self.source, name, _where(pods[name]))
        self._pods = pods
        self._datastore.replace_all(spec for specs in pods.values() for spec in specs)

    async def _pod_event(self, kind: str, obj: Json) -> None:
        name, specs, why_not = self._endpoints_of(obj)
        if not name:
            return
        if kind == "DELETED":
            specs, why_not = (), "deleted"
        old = self._pods.get(name)
        if not specs:
            if old is not None:
                del self._pods[name]
                for spec in old:
                    self._datastore.remove(spec.name)
                log.info("%s: pod %s removed (%s)", self.source, name, why_not)
            return
        if old == specs:
            return
        self._pods[name] = specs
        for spec in old or ():
            if spec.name not in {s.name for s in specs}:
                self._datastore.remove(spec.name)
        for spec in specs:
            self._datastore.upsert(spec)
        log.info("%s: pod %s %s: %s", self.source, name, "changed" if old else "added", _where(specs))

    def _endpoints_of(self, pod: Json) -> tuple[str, tuple[EndpointSpec, ...], str]:
        """(pod name, its endpoints, why it has none)."""
        meta = _metadata(pod)
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            return "", (), "no name"
        status = pod.get("status")
        status = status if isinstance(status, dict) else {}
        if meta.get("deletionTimestamp"):
            return name, (), "being deleted"
        ip = status.get("podIP")
        if not isinstance(ip, str) or not ip:
            return name, (), "no pod IP"
        if not _is_ready(status):
            return name, (), "not Ready"
        if self._target is None:
            return name, (), "no pool"
        raw_labels = meta.get("labels")
        labels = {str(k): str(v) for k, v in raw_labels.items()} if isinstance(raw_labels, dict) else {}
        ports = self._target.ports
        if len(ports) == 1:
            return name, (EndpointSpec(name, ip, ports[0], labels),), ""
        return name, tuple(EndpointSpec(f"{name}-rank-{i}", ip, p, labels) for i, p in enumerate(ports)), ""

    async def _stop_pods(self) -> None:
        task, self._pod_task = self._pod_task, None
        await _cancel(task)

    # the pool

    async def _pool_listed(self, items: list[Json]) -> None:
        mine = [p for p in items if _metadata(p).get("name") == self._pool]
        await self._apply_pool(mine[0] if mine else None)

    async def _pool_event(self, kind: str, obj: Json) -> None:
        if _metadata(obj).get("name") != self._pool:
            return
        await self._apply_pool(None if kind == "DELETED" else obj)

    async def _apply_pool(self, pool: Json | None) -> None:
        if pool is None:
            if self._pool_present:
                self._pool_present = False
                await self._stop_pods()
                log.warning(
                    "%s was deleted: removing its %d endpoints until it is created again",
                    self.source,
                    sum(len(s) for s in self._pods.values()),
                )
                self._pods = {}
                self._datastore.replace_all(())
            return
        try:
            target = _parse_pool(pool, self.source)
        except DiscoveryError as e:
            log.error("%s; keeping the current endpoints", e)
            return
        if self._pool_present and target == self._target:
            return
        log.info(
            "%s %s: %s",
            self.source,
            "changed" if self._pool_present else "appeared",
            _describe_target(target),
        )
        await self._stop_pods()
        self._pool_present = True
        self._target = target
        self._pod_task = asyncio.create_task(
            self._reflect(self._pods_collection(), None, self._pods_listed, self._pod_event)
        )

    # list and watch

    async def _reflect(
        self, coll: _Collection, rv: str | None, on_list: ListHandler, on_event: EventHandler
    ) -> None:
        """List (when there is no version to watch from) then watch, forever."""
        retry = _Retry(coll.what, self._backoff)
        while True:
            try:
                if rv is None:
                    items, rv = await self._list(coll)
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

    async def _list(self, coll: _Collection) -> tuple[list[Json], str]:
        doc = await self._get(coll.call, *coll.args, **coll.kwargs)
        items = doc.get("items")
        if not isinstance(items, list):
            raise ValueError(f"listing {coll.what}: the answer has no items")
        rv = _metadata(doc).get("resourceVersion")
        return [i for i in items if isinstance(i, dict)], str(rv or "0")

    async def _get(self, call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Json:
        resp = await call(*args, _preload_content=False, _request_timeout=self._list_timeout, **kwargs)
        try:
            await _check(resp)
            body = await resp.read()
        finally:
            resp.release()
        doc = json.loads(body)
        if not isinstance(doc, dict):
            raise ValueError("the answer is not a JSON object")
        return doc

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


# helpers


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


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel a task and wait for it to end; a cancellation of the caller itself still propagates."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        log.error("Kubernetes discovery task failed", exc_info=task.exception())


def _metadata(obj: Json) -> Json:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _is_ready(status: Json) -> bool:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def _check_ports(ports: Sequence[Any], where: str) -> tuple[int, ...]:
    if not ports:
        raise DiscoveryError(f"{where}: give at least one port")
    for p in ports:
        if not isinstance(p, int) or isinstance(p, bool) or not 0 < p < 65536:
            raise DiscoveryError(f"{where}: {p!r} is not a port in 1..65535")
    if len(set(ports)) != len(ports):
        raise DiscoveryError(f"{where}: {list(ports)} repeats a port")
    return tuple(ports)


def _selector_string(match_labels: Mapping[Any, Any], where: str) -> str:
    for k, v in match_labels.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
            raise DiscoveryError(f"{where}: matchLabels must map label names to strings, got {k!r}: {v!r}")
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def _expression(expr: Any, where: str) -> str:
    if not isinstance(expr, dict) or not isinstance(expr.get("key"), str):
        raise DiscoveryError(f"{where}: a matchExpressions entry needs a key")
    key: str = expr["key"]
    op, values = expr.get("operator"), expr.get("values") or []
    if op in ("In", "NotIn"):
        if not values or not all(isinstance(v, str) for v in values):
            raise DiscoveryError(f"{where}: matchExpressions {key!r} {op} needs values")
        return f"{key} {op.lower()} ({','.join(values)})"
    if op == "Exists":
        return key
    if op == "DoesNotExist":
        return f"!{key}"
    raise DiscoveryError(f"{where}: matchExpressions {key!r} has an unknown operator {op!r}")


def _parse_pool(pool: Json, where: str) -> _Target:
    """The selector and ports of an InferencePool, v1 or v1alpha2 shape."""
    spec = pool.get("spec")
    if not isinstance(spec, dict):
        raise DiscoveryError(f"{where}: the InferencePool has no spec")
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        raise DiscoveryError(f"{where}: spec.selector is missing")
    if isinstance(selector.get("matchLabels"), dict) or "matchExpressions" in selector:  # v1
        parts = [_selector_string(selector.get("matchLabels") or {}, f"{where}: spec.selector")]
        parts += [_expression(e, f"{where}: spec.selector") for e in selector.get("matchExpressions") or []]
        text = ",".join(p for p in parts if p)
    else:  # v1alpha2: a flat map
        text = _selector_string(selector, f"{where}: spec.selector")
    if not text:
        raise DiscoveryError(f"{where}: spec.selector is empty (it would select every pod in the namespace)")
    if "targetPorts" in spec:
        raw = spec.get("targetPorts")
        entries = raw if isinstance(raw, list) else [raw]
        ports = [e.get("number") if isinstance(e, dict) else e for e in entries]
        checked = _check_ports(ports, f"{where}: spec.targetPorts")
    elif "targetPortNumber" in spec:
        checked = _check_ports([spec.get("targetPortNumber")], f"{where}: spec.targetPortNumber")
    else:
        raise DiscoveryError(f"{where}: no spec.targetPorts (v1) or spec.targetPortNumber (v1alpha2)")
    return _Target(text, checked)


def _describe_target(target: _Target) -> str:
    return f"selector {target.selector}, target ports {list(target.ports)}"


def _where(specs: Sequence[EndpointSpec]) -> str:
    return ", ".join(f"{s.name}={s.host_port}" for s in specs)


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, _ApiError):
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
