"""A pool's custom resources from the cluster (InferenceModelRewrites, InferenceObjectives): listed and
watched in every API group that serves them (GIE's `inference.networking.x-k8s.io/v1alpha2`, llm-d's
`llm-d.ai/v1alpha2`), kept to those whose poolRef names the followed pool, and handed on whole after
every change.

A group whose CRD is not installed (404) is skipped with a note; one the service account may not read
(403) with a warning: these resources are optional, endpoints are not. A resource that does not
validate is logged and its last valid version (if any) stays in force, as a bad config keeps the old
one running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from epick.datalayer.discovery.kubernetes.api import Json, _ApiError, _metadata
from epick.datalayer.discovery.kubernetes.reflector import Reflector, _Collection

log = logging.getLogger(__name__)

API_GROUPS: tuple[tuple[str, str], ...] = (
    ("inference.networking.x-k8s.io", "v1alpha2"),
    ("llm-d.ai", "v1alpha2"),
)


class PoolScoped(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def pool(self) -> str: ...

    @property
    def created(self) -> str: ...


R = TypeVar("R", bound=PoolScoped)


class PoolResourceWatch(Generic[R]):
    """Follows one kind of a pool's resources in one namespace; `on_change` gets the full set (oldest
    first) after every change."""

    def __init__(
        self,
        reflector: Reflector,
        api_client: Any,
        namespace: str,
        pool: str,
        *,
        kind: str,
        plural: str,
        parse: Callable[[Mapping[str, Any], str], R],
        error: type[ValueError],
        on_change: Callable[[list[R]], None],
    ) -> None:
        self._reflector = reflector
        self._api_client = api_client
        self._namespace = namespace
        self._pool = pool
        self._kind = kind
        self._plural = plural
        self._parse_fn = parse
        self._error = error
        self._on_change = on_change
        self._found: dict[tuple[str, str], R] = {}  # (group, resource name) -> its last valid version
        self._tasks: list[asyncio.Task[None]] = []
        self.groups: list[str] = []  # the API groups being watched, after `start()`

    async def start(self) -> None:
        """List each group once (the resources are in force when this returns), then watch in the
        background. Raises the API server's error (`_ApiError`) for anything but 403 and 404."""
        listed: list[tuple[_Collection, str]] = []
        for group, version in API_GROUPS:
            coll = self._collection(group, version)
            try:
                items, rv = await self._reflector.list_items(coll)
            except _ApiError as e:
                if e.status == 404:
                    log.info("%s: not served (CRD not installed); not watched", coll.what)
                    continue
                if e.status == 403:
                    log.warning("%s: forbidden (%s); %ss from this group are off", coll.what, e, self._kind)
                    continue
                raise
            self._replace(group, items)
            listed.append((coll, rv))
        self._publish()
        for coll, rv in listed:
            group = coll.args[0]
            self.groups.append(group)
            self._tasks.append(
                asyncio.create_task(
                    self._reflector.reflect(coll, rv, self._lister(group), self._watcher(group))
                )
            )

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _collection(self, group: str, version: str) -> _Collection:
        from kubernetes_asyncio import client

        return _Collection(
            f"{self._kind}s in {self._namespace} ({group}/{version})",
            client.CustomObjectsApi(self._api_client).list_namespaced_custom_object,
            (group, version, self._namespace, self._plural),
            {},
        )

    def _lister(self, group: str) -> Callable[[list[Json]], Any]:
        async def listed(items: list[Json]) -> None:
            self._replace(group, items)
            self._publish()

        return listed

    def _watcher(self, group: str) -> Callable[[str, Json], Any]:
        async def event(kind: str, obj: Json) -> None:
            name = _metadata(obj).get("name")
            if not isinstance(name, str) or not name:
                return
            if kind == "DELETED":
                if self._found.pop((group, name), None) is not None:
                    log.info("%s %s/%s deleted", self._kind, group, name)
                    self._publish()
                return
            resource = self._parse(group, obj)
            if resource is None:
                return
            old = self._found.get((group, name))
            if resource.pool != self._pool:
                if old is not None:  # its poolRef moved to another pool
                    del self._found[(group, name)]
                    self._publish()
                return
            if old != resource:
                self._found[(group, name)] = resource
                log.info("%s %s/%s %s", self._kind, group, name, "changed" if old else "added")
                self._publish()

        return event

    def _replace(self, group: str, items: list[Json]) -> None:
        fresh: dict[tuple[str, str], R] = {}
        for obj in items:
            name = _metadata(obj).get("name")
            resource = self._parse(group, obj)
            if resource is None:  # invalid: keep its last valid version, if there is one
                old = self._found.get((group, str(name)))
                if old is not None:
                    fresh[(group, old.name)] = old
            elif resource.pool == self._pool:
                fresh[(group, resource.name)] = resource
        for key in [k for k in self._found if k[0] == group]:
            del self._found[key]
        self._found.update(fresh)

    def _parse(self, group: str, obj: Json) -> R | None:
        name = _metadata(obj).get("name")
        try:
            return self._parse_fn(obj, f"{self._namespace}/{name} ({group})")
        except self._error as e:
            kept = " (its last valid version stays in force)" if (group, name) in self._found else ""
            log.error("%s; ignored%s", e, kept)
            return None

    def _publish(self) -> None:
        self._on_change(sorted(self._found.values(), key=lambda r: (r.created, r.name)))
