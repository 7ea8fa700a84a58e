"""Endpoints from the file a `file-discovery` plugin names (`dataLayer.discovery`), watched if asked.

Upstream's rules (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/discovery/file): the
first load must be clean (any bad entry fails startup, naming it); a reload applies the valid
entries, drops endpoints no longer listed, and logs the bad ones. Upstream watches with fsnotify;
epick checks the file's modification time and size every `poll_interval` seconds (no dependency for
one file; a ConfigMap's symlink swap is seen the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.discovery.static import DiscoveryError
from epick.framework.datalayer import EndpointsFileDiscovery

log = logging.getLogger(__name__)


def _stamp(path: str) -> tuple[float, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime, st.st_size


class FileDiscoveryRunner:
    def __init__(
        self, datastore: Datastore, plugin: EndpointsFileDiscovery, *, poll_interval: float = 1.0
    ) -> None:
        self.datastore = datastore
        self.plugin = plugin
        self.path = plugin.path
        self.poll_interval = poll_interval
        self.source = f"file {self.path}" + (" (watched)" if plugin.watch_file else "")
        self.loads = 0
        self._stamp: tuple[float, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def load(self, *, initial: bool) -> None:
        """Read the file and make the datastore hold exactly its valid endpoints. Raises
        `DiscoveryError` on the first load when anything is wrong; later, logs and keeps going."""
        self._stamp = _stamp(self.path)
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            found, errors = self.plugin.parse(data)
        except (OSError, ValueError, TypeError, RecursionError) as e:  # ValueError: a file not a list
            message = f"{self.plugin.typed_name.type}: {self.path}: {e}"
            if initial:
                raise DiscoveryError(message) from None
            log.error("%s; keeping the endpoints from the last load", message)
            return
        specs = [EndpointSpec(ep.name, ep.address, ep.port, dict(ep.labels), ep.name) for ep in found]
        self.datastore.replace_all(specs)
        self.loads += 1
        if errors:
            message = f"{self.plugin.typed_name.type}: {self.path}: " + "; ".join(errors)
            if initial:
                raise DiscoveryError(f"{message} (initial load failed)")
            log.error("%s (skipped)", message)

    async def start(self, *, initial: bool = True) -> None:
        """Load the file (the first load must be clean; a later runner's, after a reload, keeps the
        endpoints when the file is bad) and watch it if asked."""
        self.load(initial=initial)
        if self.plugin.watch_file:
            self._task = asyncio.create_task(self._watch(), name=f"watch {self.path}")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            stamp = _stamp(self.path)
            if stamp is None or stamp == self._stamp:
                continue
            if stamp[1] == 0:
                continue  # truncated by a writer mid-replace: wait for the content
            log.info("file-discovery: %s changed; reloading", self.path)
            try:
                self.load(initial=False)
            except Exception:  # the watch must outlive any file
                log.exception("file-discovery: %s: reload failed; keeping the endpoints", self.path)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
