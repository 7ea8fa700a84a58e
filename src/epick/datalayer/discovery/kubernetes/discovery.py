"""`KubernetesDiscovery`: ties the client, the pool and the reflector together, following an
InferencePool (or a label selector) and keeping a `Datastore` in step with its Ready pods.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.discovery.kubernetes.api import Json, _ApiError, _describe, _metadata
from epick.datalayer.discovery.kubernetes.client import load_client
from epick.datalayer.discovery.kubernetes.pool import (
    DEFAULT_TARGET_PORTS,
    POOL_API_VERSIONS,
    POOL_PLURAL,
    _check_ports,
    _describe_target,
    _parse_pool,
    _Target,
    _where,
    endpoints_of,
)
from epick.datalayer.discovery.kubernetes.reflector import Reflector, _Collection
from epick.datalayer.discovery.kubernetes.resources import PoolResourceWatch
from epick.datalayer.discovery.kubernetes.rewrites import (
    ObjectivesHandler,
    RewritesHandler,
    objective_watch,
    rewrite_watch,
)
from epick.datalayer.discovery.static import DiscoveryError
from epick.framework.labels import SelectorError, from_structured

log = logging.getLogger(__name__)


class KubernetesDiscovery:
    """Keeps a `Datastore` in step with the Ready pods of an InferencePool, or of a label selector.

    Give exactly one of `pool` (an InferencePool's name; its selector and target ports are used) or
    `selector` (a label selector string such as "app=vllm,tier in (a,b)", or a mapping of matchLabels,
    served on `target_ports`, default [8000]). Without `api_client`, the configuration is loaded at
    `start()`: from `kubeconfig` when given, else in-cluster when KUBERNETES_SERVICE_HOST is set, else the
    default kubeconfig; a client made here is closed by `stop()`, one passed in is left open.

    `on_synced` is told each time `synced` changes: the pods listed (True), the pool deleted or
    changed (False until its pods are listed again).

    With `on_rewrites` (and a pool), the InferenceModelRewrites whose poolRef names the pool are watched
    too, and `on_rewrites` gets the whole set after every change (first before `start()` returns);
    likewise its InferenceObjectives with `on_objectives`.
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
        on_rewrites: RewritesHandler | None = None,
        on_objectives: ObjectivesHandler | None = None,
        on_synced: Callable[[bool], None] | None = None,
        pool_group: str | None = None,
        on_pool: Callable[[], None] | None = None,
    ) -> None:
        if not namespace:
            raise DiscoveryError("Kubernetes discovery: a namespace is required")
        if (pool is None) == (selector is None):
            raise DiscoveryError(
                "Kubernetes discovery: give either an InferencePool name or a label selector"
            )
        if (on_rewrites is not None or on_objectives is not None) and pool is None:
            raise DiscoveryError(
                "Kubernetes discovery: model rewrites and objectives are watched for an InferencePool; "
                "give its name"
            )
        if api_client is not None and kubeconfig is not None:
            raise DiscoveryError("Kubernetes discovery: give an API client or a kubeconfig, not both")
        self._datastore = datastore
        self._namespace = namespace
        self._pool = pool
        self._target = _fixed_target(namespace, pool, selector, target_ports)
        self._api_client = api_client
        self._own_client = False
        self._kubeconfig = None if kubeconfig is None else os.fspath(kubeconfig)
        self._reflector = Reflector(watch_timeout_s, request_timeout_s, backoff_s)
        self._pool_api: tuple[str, str] | None = None  # (group, version) the pool was found in
        self._pool_present = False
        self._pods: dict[str, tuple[EndpointSpec, ...]] = {}  # the endpoints of each Ready pod
        self._pod_task: asyncio.Task[None] | None = None
        self._pool_task: asyncio.Task[None] | None = None
        self._on_rewrites = on_rewrites
        self._on_objectives = on_objectives
        self._watches: list[PoolResourceWatch[Any]] = []
        self._started = False
        self._pool_versions = [(g, v) for g, v in POOL_API_VERSIONS if pool_group in (None, g)]
        if not self._pool_versions:
            groups = ", ".join(g for g, _ in POOL_API_VERSIONS)
            raise DiscoveryError(
                f"Kubernetes discovery: InferencePool group {pool_group!r} is not one of {groups}"
            )
        self._synced = False
        self._starting = False  # inside `_begin`: its lists do not make the discovery synced yet
        self._on_synced = on_synced
        self._on_pool = on_pool  # told when the pool appears, changes or goes (its appProtocol may have)
        self._retry_task: asyncio.Task[None] | None = None

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

    async def start(self, *, wait_for_pool: bool = False) -> None:
        """List once (the datastore is filled when this returns), then keep watching in the background.

        Raises `DiscoveryError` when the configuration cannot be loaded, the API server cannot be reached,
        the pool does not exist (or is invalid), or the API server refuses the list (its message quoted).
        With `wait_for_pool`, only a configuration that cannot be loaded raises: the rest is logged (once
        each time the reason changes) and tried again with backoff until it works, `synced` False until
        then, as the Go EPP stays up and unready.
        """
        if self._started:
            raise RuntimeError("KubernetesDiscovery.start() called twice")
        self._started = True
        if self._api_client is None:
            self._api_client = await load_client(self._kubeconfig)
            self._own_client = True
        if not wait_for_pool:
            try:
                await self._begin()
            except BaseException:  # a client made here is closed, whatever went wrong
                await self._close_client()
                raise
            return
        try:
            await self._begin()
        except DiscoveryError as e:
            log.error("%s; not ready, trying again", e)
            self._retry_task = asyncio.create_task(self._keep_trying(str(e)))
        except BaseException:
            await self._close_client()
            raise

    @property
    def api_client(self) -> Any:
        """The API client (made by `start()` unless one was given)."""
        return self._api_client

    @property
    def app_protocol(self) -> str:
        """The pool's spec.appProtocol ("" without a pool, or when it sets none)."""
        if self._pool is None or not self._pool_present or self._target is None:
            return ""
        return self._target.app_protocol

    @property
    def synced(self) -> bool:
        """Whether the pods are known: the pool exists (with a pool) and its pods have been listed."""
        return self._synced

    async def _keep_trying(self, last: str) -> None:
        retry_s, most_s = self._reflector.backoff
        while True:
            await asyncio.sleep(retry_s)
            retry_s = min(retry_s * 2, most_s)
            try:
                await self._begin()
            except Exception as e:  # any failure: tried again (a bug's, too, with its traceback once)
                if str(e) != last:
                    last = str(e)
                    log.error("%s; not ready, trying again", e, exc_info=not isinstance(e, DiscoveryError))
                continue
            log.info("%s: found; serving its endpoints", self.source)
            return

    async def _begin(self) -> None:
        """The first lists and the watches; on any error, what was started is stopped again. `synced`
        turns true once all of them are done, not on the pods' list alone."""
        self._starting = True
        try:
            pool_rv = await self._initial_pool() if self._pool is not None else None
            pod_rv = await self._initial_pods()
            if self._on_rewrites is not None:
                assert self._pool is not None
                watch: PoolResourceWatch[Any] = rewrite_watch(
                    self._reflector, self._api_client, self._namespace, self._pool, self._on_rewrites
                )
                self._watches.append(watch)
                await watch.start()
            if self._on_objectives is not None:
                assert self._pool is not None
                watch = objective_watch(
                    self._reflector, self._api_client, self._namespace, self._pool, self._on_objectives
                )
                self._watches.append(watch)
                await watch.start()
        except BaseException as e:
            self._starting = False
            watches, self._watches = self._watches, []
            for started in watches:
                await started.stop()
            raise self._explained(e) from None
        self._starting = False
        self._pool_changed()
        self._set_synced(self._pool is None or self._pool_present)
        self._pod_task = asyncio.create_task(
            self._reflector.reflect(self._pods_collection(), pod_rv, self._pods_listed, self._pod_event)
        )
        if self._pool is not None:
            self._pool_task = asyncio.create_task(
                self._reflector.reflect(self._pool_collection(), pool_rv, self._pool_listed, self._pool_event)
            )

    def _explained(self, e: BaseException) -> BaseException:
        """A start-up failure as a `DiscoveryError` naming the source and the API server."""
        if isinstance(e, _ApiError):
            return DiscoveryError(
                f"{self.source}: the Kubernetes API server at {self._host} said {_describe(e)}"
            )
        if isinstance(e, aiohttp.ClientError | OSError | TimeoutError):
            return DiscoveryError(
                f"{self.source}: cannot reach the Kubernetes API server at {self._host}: {_describe(e)}"
            )
        if isinstance(e, ValueError) and not isinstance(e, DiscoveryError):
            return DiscoveryError(
                f"{self.source}: {self._host} does not answer as a Kubernetes API server: {_describe(e)}"
            )
        return e  # a DiscoveryError already, cancelled, or a bug

    def _pool_changed(self) -> None:
        if self._on_pool is not None:
            self._on_pool()

    def _set_synced(self, synced: bool) -> None:
        if synced != self._synced:
            self._synced = synced
            if self._on_synced is not None:
                self._on_synced(synced)

    async def stop(self) -> None:
        """Stop watching (the datastore keeps what it has) and close a client made by `start()`."""
        retry_task, self._retry_task = self._retry_task, None
        await _cancel(retry_task)
        pool_task, self._pool_task = self._pool_task, None
        await _cancel(pool_task)
        watches, self._watches = self._watches, []
        for watch in watches:
            await watch.stop()
        await self._stop_pods()
        await self._close_client()

    # set-up

    @property
    def _host(self) -> str:
        return str(getattr(getattr(self._api_client, "configuration", None), "host", "?"))

    async def _close_client(self) -> None:
        if self._own_client and self._api_client is not None:
            self._own_client = False
            await self._api_client.close()

    async def _initial_pool(self) -> str:
        from kubernetes_asyncio import client

        api = client.CustomObjectsApi(self._api_client)
        for group, version in self._pool_versions:
            try:
                pool = await self._reflector.get(
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
        tried = " and ".join(f"{g}/{v}" for g, v in self._pool_versions)
        raise DiscoveryError(
            f"InferencePool {self._pool!r} not found in namespace {self._namespace!r} "
            f"(looked in {tried} at {self._host})"
        )

    async def _initial_pods(self) -> str:
        items, rv = await self._reflector.list_items(self._pods_collection())
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
            name, specs, _ = endpoints_of(obj, self._target)
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
        if not self._starting:
            self._set_synced(self._pool is None or self._pool_present)

    async def _pod_event(self, kind: str, obj: Json) -> None:
        name, specs, why_not = endpoints_of(obj, self._target)
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
                self._set_synced(False)
                self._pool_changed()
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
        self._pool_changed()
        self._pod_task = asyncio.create_task(
            self._reflector.reflect(self._pods_collection(), None, self._pods_listed, self._pod_event)
        )


async def _cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel a task and wait for it to end; a cancellation of the caller itself still propagates."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        log.error("Kubernetes discovery task failed", exc_info=task.exception())


def _selector_text(selector: Mapping[str, str] | str, where: str) -> str:
    """A selector given as a label map (every label equal) or in the string form, as a string."""
    if not isinstance(selector, Mapping):
        return selector.strip()
    try:
        return from_structured(selector).render()
    except SelectorError as e:
        raise DiscoveryError(f"{where}: {e}") from None


def _fixed_target(
    namespace: str, pool: str | None, selector: str | Mapping[str, str] | None, ports: Sequence[int] | None
) -> _Target | None:
    """The pods to serve when given by a label selector (None for a pool: its spec says)."""
    if pool is not None:
        if not pool:
            raise DiscoveryError("Kubernetes discovery: the InferencePool name is empty")
        if ports is not None:
            raise DiscoveryError(
                f"Kubernetes discovery: InferencePool {pool!r} sets the target ports; do not give them"
            )
        return None
    assert selector is not None
    where = "Kubernetes discovery: the label selector"
    text = _selector_text(selector, where)
    if not text:
        raise DiscoveryError(f"{where} is empty (it would select every pod in {namespace!r})")
    chosen = DEFAULT_TARGET_PORTS if ports is None else tuple(ports)
    return _Target(text, _check_ports(chosen, "Kubernetes discovery: target ports"))
