"""InferenceModelRewrite resources from the cluster: listed and watched in every API group that serves
them (GIE's `inference.networking.x-k8s.io/v1alpha2`, llm-d's `llm-d.ai/v1alpha2`), kept to those whose
poolRef names the followed pool, and handed on whole after every change.

A group whose CRD is not installed (404) is skipped with a note; one the service account may not read
(403) with a warning: rewrites are optional, endpoints are not. A resource that does not validate is
logged and its last valid version (if any) stays in force, as a bad config keeps the old one running.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from epick.datalayer.discovery.kubernetes.api import Json, _ApiError, _metadata
from epick.datalayer.discovery.kubernetes.reflector import Reflector, _Collection
from epick.datalayer.rewrites import KIND, Rewrite, RewriteError, parse_rewrite

log = logging.getLogger(__name__)

REWRITE_API_VERSIONS: tuple[tuple[str, str], ...] = (
    ("inference.networking.x-k8s.io", "v1alpha2"),
    ("llm-d.ai", "v1alpha2"),
)
REWRITE_PLURAL = "inferencemodelrewrites"

RewritesHandler = Callable[[list[Rewrite]], None]


class RewriteWatch:
    """Follows the InferenceModelRewrites of one pool in one namespace; `on_change` gets the full set."""

    def __init__(
        self,
        reflector: Reflector,
        api_client: Any,
        namespace: str,
        pool: str,
        on_change: RewritesHandler,
    ) -> None:
        self._reflector = reflector
        self._api_client = api_client
        self._namespace = namespace
        self._pool = pool
        self._on_change = on_change
        self._found: dict[tuple[str, str], Rewrite] = {}  # (group, resource name) -> its last valid version
        self._tasks: list[asyncio.Task[None]] = []
        self.groups: list[str] = []  # the API groups being watched, after `start()`

    async def start(self) -> None:
        """List each group once (the rewrites are in force when this returns), then watch in the
        background. Raises the API server's error (`_ApiError`) for anything but 403 and 404."""
        listed: list[tuple[_Collection, str]] = []
        for group, version in REWRITE_API_VERSIONS:
            coll = self._collection(group, version)
            try:
                items, rv = await self._reflector.list_items(coll)
            except _ApiError as e:
                if e.status == 404:
                    log.info("%s: not served (CRD not installed); not watched", coll.what)
                    continue
                if e.status == 403:
                    log.warning("%s: forbidden (%s); model rewrites from this group are off", coll.what, e)
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
            f"{KIND}s in {self._namespace} ({group}/{version})",
            client.CustomObjectsApi(self._api_client).list_namespaced_custom_object,
            (group, version, self._namespace, REWRITE_PLURAL),
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
                    log.info("%s %s/%s deleted", KIND, group, name)
                    self._publish()
                return
            rewrite = self._parse(group, obj)
            if rewrite is None:
                return
            old = self._found.get((group, name))
            if rewrite.pool != self._pool:
                if old is not None:  # its poolRef moved to another pool
                    del self._found[(group, name)]
                    self._publish()
                return
            if old != rewrite:
                self._found[(group, name)] = rewrite
                log.info("%s %s/%s %s", KIND, group, name, "changed" if old else "added")
                self._publish()

        return event

    def _replace(self, group: str, items: list[Json]) -> None:
        fresh: dict[tuple[str, str], Rewrite] = {}
        for obj in items:
            name = _metadata(obj).get("name")
            rewrite = self._parse(group, obj)
            if rewrite is None:  # invalid: keep its last valid version, if there is one
                old = self._found.get((group, str(name)))
                if old is not None:
                    fresh[(group, old.name)] = old
            elif rewrite.pool == self._pool:
                fresh[(group, rewrite.name)] = rewrite
        for key in [k for k in self._found if k[0] == group]:
            del self._found[key]
        self._found.update(fresh)

    def _parse(self, group: str, obj: Json) -> Rewrite | None:
        name = _metadata(obj).get("name")
        try:
            return parse_rewrite(obj, f"{self._namespace}/{name} ({group})")
        except RewriteError as e:
            kept = " (its last valid version stays in force)" if (group, name) in self._found else ""
            log.error("%s; ignored%s", e, kept)
            return None

    def _publish(self) -> None:
        self._on_change(sorted(self._found.values(), key=lambda r: (r.created, r.name)))
