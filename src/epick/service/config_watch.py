"""`--watch-config-file`: the config file reloaded when its content changes, as a ConfigMap update
changes it (the kubelet swaps the mounted directory's `..data` link), and the reloads counted
(llm-d/llm-d-router, pkg/epp/config/file_watcher.go and pkg/epp/metrics/config_reload.go, read
after ebab687).

The file is looked at every second (`CHECK_INTERVAL_S`; upstream uses fsnotify and a 30 s poll):
its identity (device, inode, size, modification time, following links) first, its SHA-256 only when
that moved, so an unchanged file costs one `stat`. Content equal to the last seen is not reloaded.
A reload that fails keeps the running config (the service logs why); the next change is tried
afresh.

Upstream reloads only `schedulingProfiles` and refuses any other change as unsupported; epick
reloads the whole file, each plugin whose name, type and parameters did not change keeping its
instance and state (`load_config(previous=)`), so it never answers `unsupported`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["RESULTS", "ConfigFileWatch", "ConfigReloads"]

log = logging.getLogger(__name__)

# upstream's `result` label values; epick has no change it cannot apply, so never "unsupported"
RESULTS = ("success", "invalid", "unsupported", "read_error", "watch_error")
CHECK_INTERVAL_S = 1.0


class ConfigReloads(Collector):
    """llm_d_epp_config_reload_total{result}, llm_d_epp_config_active_generation and
    llm_d_epp_config_last_reload_success_timestamp_seconds."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.counts = dict.fromkeys(RESULTS, 0)
        self.generation = 1
        self.last_success = 0.0

    def record(self, result: str) -> None:
        self.counts[result] += 1
        if result == "success":
            self.generation += 1
            self.last_success = self.clock()

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily(
            "llm_d_epp_config_reload",
            "[ALPHA] Configuration reloads, by result.",
            labels=["result"],
        )
        for result, count in self.counts.items():
            total.add_metric([result], count)
        yield total
        yield GaugeMetricFamily(
            "llm_d_epp_config_active_generation",
            "[ALPHA] The generation of the configuration in use: 1 at start, one more each reload.",
            value=self.generation,
        )
        yield GaugeMetricFamily(
            "llm_d_epp_config_last_reload_success_timestamp_seconds",
            "[ALPHA] When the configuration was last reloaded, in seconds since the epoch (0: never).",
            value=self.last_success,
        )


def _identity(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _digest(path: str) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


class ConfigFileWatch:
    """The config file's content as the service loaded it (taken when made: make it right after the
    load), and `run`, which reloads whenever the content changes from it."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._seen: tuple[int, int, int, int] | None = _identity(path)
            self._content = _digest(path)
        except OSError as e:
            log.error("--watch-config-file: cannot read %s: %s; watching for it", path, e)
            self._seen, self._content = None, b""

    async def run(self, reload: Callable[[], bool], reloads: ConfigReloads) -> None:
        """Until cancelled: call `reload` whenever the content changes (a file that cannot be read
        counts in `reloads` as a read_error, once until it can be again)."""
        failing = False
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                now = _identity(self.path)
                if now == self._seen:
                    continue
                fresh = _digest(self.path)
            except OSError as e:
                if not failing:
                    log.error(
                        "--watch-config-file: cannot read %s: %s; keeping the running config", self.path, e
                    )
                    reloads.record("read_error")
                failing = True
                continue
            failing = False
            self._seen = now
            if fresh == self._content:
                continue
            self._content = fresh
            log.info("--watch-config-file: %s changed; reloading", self.path)
            reload()  # counted by the service, as a SIGHUP's
