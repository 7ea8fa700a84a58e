"""What a plugin that keeps a KV-block index asks of the data layer: which ZMQ publishers to
subscribe to (llm-d's `kvEventsConfig`), the tracker that applies their events, and a call when an
endpoint leaves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from epick.kvcache.tracker import EventTracker

DEFAULT_SOCKET_PORT = 5557  # vLLM's default KV-events endpoint, tcp://*:5557
DEFAULT_TOPIC_FILTER = "kv@"


@dataclass(frozen=True, slots=True)
class KVEventsSettings:
    """llm-d-kv-cache's `kvEventsConfig` (pkg/kvevents/pool.go, `Config`)."""

    zmq_endpoint: str = ""  # set: one SUB socket bound here, every engine publishing to it
    topic_filter: str = DEFAULT_TOPIC_FILTER
    concurrency: int = 4
    engine_type: str = "vllm"
    discover_pods: bool = True  # a SUB socket connected to each endpoint's publisher
    socket_port: int = DEFAULT_SOCKET_PORT  # the publisher's port on each endpoint (+ its rank)
    replay_port: int = 0  # > 0: each endpoint's replay (ROUTER) port, asked after a sequence gap


@runtime_checkable
class KVEventSink(Protocol):
    @property
    def kv_events(self) -> KVEventsSettings: ...

    @property
    def tracker(self) -> EventTracker: ...

    def endpoint_left(self, pod: str) -> None:
        """The endpoint `pod` ("address:port") left: its blocks leave the index."""
        ...
