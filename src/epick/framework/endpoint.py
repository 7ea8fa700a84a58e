"""The endpoint view that plugins see: identity, labels and a metrics snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

ROLE_LABEL = "llm-d.ai/role"


class Metrics(NamedTuple):
    """What the data layer last scraped from one model server.

    Values are immutable: the data layer replaces the whole object on each scrape, so a
    reference taken at the start of a scheduling call is a consistent snapshot. A named tuple, not
    a frozen dataclass: scrapes build one per endpoint every interval, and this builds 6x faster.
    """

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0  # 0..1
    active_models: frozenset[str] = frozenset()  # LoRA adapters loaded and running
    waiting_models: frozenset[str] = frozenset()  # LoRA adapters requested but waiting
    max_active_models: int = 0
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    update_time: float | None = None  # seconds (time.time()) of the scrape; None: not tracked


@dataclass(frozen=True, slots=True, eq=False)
class Endpoint:
    """One model-server endpoint as a scheduling cycle sees it.

    Identity-hashed: within one `Scheduler.schedule` call every plugin receives the same objects,
    so they can be used as dict keys. `name` is unique within a pool.
    """

    name: str
    address: str = ""
    port: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    # What data-layer extractors beyond the core metrics attached, by upstream's data key
    # "<dataType>/<producerName>" (e.g. "GPUUtilization/dcgm-extractor"): replaced whole on update.
    attributes: Mapping[str, object] = field(default_factory=dict)
    pod_name: str = ""  # the Kubernetes pod serving it ("" outside Kubernetes); rank endpoints share it
    node_address: str = ""  # its node's IP (the pod's hostIP), where a DaemonSet exporter listens

    @property
    def role(self) -> str | None:
        """The prefill/decode role from label `llm-d.ai/role`, if any."""
        return self.labels.get(ROLE_LABEL)

    @property
    def host_port(self) -> str:
        """`address:port`, the form gateways route on."""
        return f"{self.address}:{self.port}"

    def with_metrics(self, metrics: Metrics) -> Endpoint:
        """A copy of this endpoint carrying new metrics."""
        return Endpoint(
            self.name,
            self.address,
            self.port,
            self.labels,
            metrics,
            self.attributes,
            self.pod_name,
            self.node_address,
        )

    def with_attributes(self, attributes: Mapping[str, object]) -> Endpoint:
        """A copy of this endpoint carrying new attributes."""
        return Endpoint(
            self.name,
            self.address,
            self.port,
            self.labels,
            self.metrics,
            attributes,
            self.pod_name,
            self.node_address,
        )

    def attribute(self, key: str) -> object | None:
        """The attribute under data key `key` ("<dataType>/<producerName>"), if any."""
        return self.attributes.get(key)
