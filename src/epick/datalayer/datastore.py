"""The current endpoints and their latest metrics: what every scheduling call snapshots."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from epick.framework import Endpoint, Metrics, Snapshot


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """A discovered endpoint, before any metrics: name, where it is, its labels."""

    name: str
    address: str
    port: int
    labels: Mapping[str, str]
    pod_name: str = ""  # the Kubernetes pod ("" outside Kubernetes)
    node_address: str = ""  # the pod's node IP (hostIP)

    @property
    def host_port(self) -> str:
        return f"{self.address}:{self.port}"


Listener = Callable[[str, EndpointSpec | None], None]


class Datastore:
    """Endpoints by name. Endpoints are immutable: an update replaces one, so a list taken by
    `snapshot()` never changes under the scheduler. Only the event loop's thread writes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock  # for ejections (`eject`)
        self._ejected: dict[str, float] = {}  # name -> until (clock time)
        self._next_release = math.inf
        self._endpoints: dict[str, Endpoint] = {}
        self._specs: dict[str, EndpointSpec] = {}
        self._snapshot: Snapshot | None = None
        self._version = 0  # of the last snapshot built
        self._listeners: list[Listener] = []
        self._unhealthy: set[str] = set()
        # Each unhealthy endpoint's mark (`health_marks` when it was set): evidence gathered before
        # it (a scrape that began earlier) does not bring the endpoint back.
        self._marked: dict[str, int] = {}
        self.health_marks = 0  # endpoints marked unhealthy so far
        # The `update_time` of each endpoint's last scraped metrics, this process's or another
        # worker's: `refresh_metrics` moves the metrics' own stamp, never this one.
        self._scraped_at: dict[str, float] = {}
        # Told of every scrape's metrics as they land (`epick serve --workers` shares them).
        self.on_metrics: Callable[[str, Metrics], None] | None = None

    def subscribe(self, listener: Listener) -> None:
        """Called with (name, spec) when an endpoint appears or changes, (name, None) when it goes."""
        self._listeners.append(listener)

    def upsert(self, spec: EndpointSpec) -> None:
        old = self._specs.get(spec.name)
        if old == spec:
            return
        old_endpoint = self._endpoints.get(spec.name)
        metrics = old_endpoint.metrics if old_endpoint is not None else Metrics()
        attributes = old_endpoint.attributes if old_endpoint is not None else {}
        self._specs[spec.name] = spec
        self._endpoints[spec.name] = Endpoint(
            spec.name,
            spec.address,
            spec.port,
            dict(spec.labels),
            metrics,
            attributes,
            spec.pod_name,
            spec.node_address,
        )
        self._snapshot = None
        for listener in self._listeners:
            listener(spec.name, spec)

    def remove(self, name: str) -> None:
        if self._specs.pop(name, None) is None:
            return
        del self._endpoints[name]
        self._scraped_at.pop(name, None)
        self._unhealthy.discard(name)
        self._marked.pop(name, None)
        self._ejected.pop(name, None)
        self._snapshot = None
        for listener in self._listeners:
            listener(name, None)

    def replace_all(self, specs: Iterable[EndpointSpec]) -> None:
        wanted = {s.name: s for s in specs}
        for name in list(self._specs):
            if name not in wanted:
                self.remove(name)
        for spec in wanted.values():
            self.upsert(spec)

    def update_metrics(self, name: str, metrics: Metrics) -> None:
        current = self._endpoints.get(name)
        if current is None:
            return  # removed while its scrape was in flight
        self._endpoints[name] = current.with_metrics(metrics)
        if metrics.update_time is not None:
            self._scraped_at[name] = metrics.update_time
        self._snapshot = None
        if self.on_metrics is not None:
            self.on_metrics(name, metrics)

    def offer_metrics(self, name: str, metrics: Metrics) -> bool:
        """Metrics scraped elsewhere (another worker): taken when scraped after the endpoint's own
        (`update_time`, as scraped: a `refresh_metrics` does not count), else dropped. Whether they
        were taken."""
        current = self._endpoints.get(name)
        if current is None or metrics.update_time is None:
            return False
        own = self._scraped_at.get(name)
        if own is not None and own >= metrics.update_time:
            return False
        self._endpoints[name] = current.with_metrics(metrics)
        self._scraped_at[name] = metrics.update_time
        self._snapshot = None
        return True

    def refresh_metrics(self, name: str, at: float) -> None:
        """The endpoint's metrics, unchanged, count as read at `at` (quiet scraping): they do not go
        stale, but a scrape made before `at` elsewhere still replaces them (`offer_metrics`)."""
        current = self._endpoints.get(name)
        if current is None or current.metrics.update_time is None:
            return
        self._endpoints[name] = current.with_metrics(current.metrics._replace(update_time=at))
        self._snapshot = None

    def scraped_at(self, name: str) -> float | None:
        """When the endpoint's last scraped metrics were read (`time.time()`), here or elsewhere."""
        return self._scraped_at.get(name)

    def update_attributes(self, name: str, attributes: Mapping[str, object]) -> None:
        """Merge `attributes` (data key -> value; None removes the key) into the endpoint's."""
        current = self._endpoints.get(name)
        if current is None:
            return
        merged = dict(current.attributes)
        for key, value in attributes.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        if merged == current.attributes:
            return
        self._endpoints[name] = current.with_attributes(merged)
        self._snapshot = None

    def clear_attributes(self, name: str) -> None:
        """Drop every attribute of the endpoint (a new data-layer plan fills them again)."""
        current = self._endpoints.get(name)
        if current is None or not current.attributes:
            return
        self._endpoints[name] = current.with_attributes({})
        self._snapshot = None

    def set_healthy(self, name: str, healthy: bool, *, seen_after: int | None = None) -> None:
        """An unhealthy endpoint (unreachable, failing scrapes) is left out of snapshots until it
        recovers. `seen_after`: `health_marks` when the evidence of health was gathered (a scrape's
        start); an endpoint marked unhealthy since stays so (the scrape read it before it failed)."""
        if name not in self._endpoints or healthy == (name not in self._unhealthy):
            return
        if healthy:
            if seen_after is not None and self._marked.get(name, 0) > seen_after:
                return
            self._unhealthy.discard(name)
            self._marked.pop(name, None)
        else:
            self.health_marks += 1
            self._marked[name] = self.health_marks
            self._unhealthy.add(name)
        self._snapshot = None

    def eject(self, name: str, until: float) -> None:
        """Leave `name` out of snapshots until the clock reaches `until` (outlier detection)."""
        if name not in self._endpoints:
            return
        self._ejected[name] = until
        self._next_release = min(self._next_release, until)
        self._snapshot = None

    def ejected_count(self) -> int:
        self._release_expired()
        return len(self._ejected)

    def is_ejected(self, name: str) -> bool:
        self._release_expired()
        return name in self._ejected

    def _release_expired(self) -> None:
        if not self._ejected or self.clock() < self._next_release:
            return
        now = self.clock()
        self._ejected = {n: until for n, until in self._ejected.items() if until > now}
        self._next_release = min(self._ejected.values(), default=math.inf)
        self._snapshot = None

    def is_healthy(self, name: str) -> bool:
        return name in self._endpoints and name not in self._unhealthy

    def get(self, name: str) -> Endpoint | None:
        return self._endpoints.get(name)

    def spec(self, name: str) -> EndpointSpec | None:
        return self._specs.get(name)

    def specs(self) -> list[EndpointSpec]:
        return list(self._specs.values())

    def snapshot(self) -> Snapshot:
        """The current healthy, not ejected endpoints: the same object, with the same version, until
        something changes (so the scheduler reuses scores that depend on metrics alone)."""
        if self._ejected:
            self._release_expired()
        if self._snapshot is None:
            unhealthy, ejected = self._unhealthy, self._ejected
            self._version += 1
            self._snapshot = Snapshot(
                tuple(
                    ep
                    for name, ep in self._endpoints.items()
                    if name not in unhealthy and name not in ejected
                ),
                self._version,
            )
        return self._snapshot

    def all_endpoints(self) -> list[Endpoint]:
        """Every known endpoint, healthy or not."""
        return list(self._endpoints.values())

    def __len__(self) -> int:
        return len(self._endpoints)
