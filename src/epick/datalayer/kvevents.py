"""The engines' KV-cache events, received over ZMQ and applied to the config's precise prefix indexes
(every plugin that is a `KVEventSink`), as llm-d-kv-cache's event pool does (pkg/kvevents).

Sockets, per sink's `kvEventsConfig`:
- `zmqEndpoint` set: one SUB socket bound there, which every engine publishes to (vLLM's publisher
  connects when its endpoint names a host); the endpoint is the topic's `kv@<address:port>@<model>`.
- `discoverPods`: a SUB socket connected to each endpoint's publisher, tcp://<address>:<socketPort +
  rank> (the rank: the endpoint's place among its pod's ports, 0 outside Kubernetes), opened and
  closed as endpoints come and go; the endpoint is its own "address:port", whatever the topic says.
  An endpoint that leaves leaves the index.

Messages are [topic, sequence (8 bytes, big-endian), payload]; only topics starting with
`topicFilter` are received. Per endpoint, sequence numbers must follow each other: after a gap
epick asks the engine's replay socket (`podDiscoveryConfig.replaySocketPort`, vLLM's
`replay_endpoint`) for what it missed, and without one, or when the replay fails, the endpoint's
blocks are dropped from the index (unknown until new events arrive). A sequence that goes back (the
engine restarted) drops them too. A malformed message is logged and skipped; the index keeps
serving. Deviation, on purpose: events are applied on the event loop as they arrive, in order per
endpoint; `concurrency` (upstream's worker shards) is accepted and not needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.kvcache import (
    BadEventError,
    KVEventSink,
    decode_batch,
    decode_sequence,
    parse_topic,
)

log = logging.getLogger(__name__)
END_OF_REPLAY = b"\xff" * 8  # vLLM's replay end marker: sequence -1
REPLAY_TIMEOUT = 2.0  # seconds without a frame before a replay is given up


@dataclass(slots=True)
class SubscriberStats:
    messages: int = 0
    bad: int = 0
    gaps: int = 0
    replays: int = 0
    resets: int = 0  # endpoints dropped from the index after a gap or a restart
    # Per endpoint ("central" for a bound socket's messages that name none).
    received: dict[str, int] = field(default_factory=dict)
    bad_by: dict[str, int] = field(default_factory=dict)
    gaps_by: dict[str, int] = field(default_factory=dict)


def _count(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


@dataclass(slots=True)
class _Source:
    """One endpoint's stream: the last sequence number applied."""

    last: int | None = None


@dataclass(slots=True)
class _Subscription:
    sink: KVEventSink
    socket: zmq.asyncio.Socket
    task: asyncio.Task[None]
    pod: str | None  # the endpoint, for a per-endpoint socket; None: from each message's topic
    address: str = ""
    sources: dict[str, _Source] = field(default_factory=dict)


class KVEventSubscribers:
    def __init__(self, datastore: Datastore, context: zmq.asyncio.Context | None = None) -> None:
        self.datastore = datastore
        self.context = context or zmq.asyncio.Context.instance()
        self.sinks: list[KVEventSink] = []
        self.stats = SubscriberStats()
        self._central: list[_Subscription] = []
        self._per_endpoint: dict[tuple[int, str], _Subscription] = {}  # (sink id, endpoint name)
        self._started = False
        self._subscribed = False
        self._where: dict[str, str] = {}  # endpoint name -> "address:port"

    # Lifecycle.
    async def start(self, sinks: Iterable[KVEventSink]) -> None:
        self._started = True
        if not self._subscribed:
            self.datastore.subscribe(self._endpoint_changed)
            self._subscribed = True
        await self.set_sinks(sinks)

    async def set_sinks(self, sinks: Iterable[KVEventSink]) -> None:
        """The running config's sinks: sockets of sinks no longer configured close, new ones open."""
        wanted = list(sinks)
        if [id(s) for s in wanted] == [id(s) for s in self.sinks] and self._central_matches(wanted):
            return
        await self._close_all()
        self.sinks = wanted
        if not self._started:
            return
        for sink in wanted:
            settings = sink.kv_events
            if settings.zmq_endpoint:
                self._central.append(self._subscribe(sink, settings.zmq_endpoint, bind=True, pod=None))
            if settings.discover_pods:
                for spec in self.datastore.specs():
                    self._open_endpoint(sink, spec)
        self._where = {spec.name: spec.host_port for spec in self.datastore.specs()}

    @property
    def active(self) -> int:
        """Sockets open."""
        return len(self._central) + len(self._per_endpoint)

    def _central_matches(self, sinks: list[KVEventSink]) -> bool:
        return len(self._central) == sum(1 for s in sinks if s.kv_events.zmq_endpoint)

    async def stop(self) -> None:
        self._started = False
        await self._close_all()

    async def _close_all(self) -> None:
        subs = [*self._central, *self._per_endpoint.values()]
        self._central.clear()
        self._per_endpoint.clear()
        for sub in subs:
            sub.task.cancel()
        for sub in subs:
            with contextlib.suppress(asyncio.CancelledError):
                await sub.task
            sub.socket.close(linger=0)

    # Endpoints.
    def _rank(self, spec: EndpointSpec) -> int:
        if not spec.pod_name:
            return 0
        ports = sorted(
            s.port
            for s in self.datastore.specs()
            if s.pod_name == spec.pod_name and s.address == spec.address
        )
        return ports.index(spec.port) if spec.port in ports else 0

    def _open_endpoint(self, sink: KVEventSink, spec: EndpointSpec) -> None:
        port = sink.kv_events.socket_port + self._rank(spec)
        url = f"tcp://{_host(spec.address)}:{port}"
        sub = self._subscribe(sink, url, bind=False, pod=spec.host_port)
        sub.address = spec.address
        self._per_endpoint[(id(sink), spec.name)] = sub

    def _endpoint_changed(self, name: str, spec: EndpointSpec | None) -> None:
        """An endpoint appeared, changed or left: its socket follows, and an endpoint that left (or
        moved) leaves every index."""
        if not self._started:
            return
        gone = self._where.pop(name, None)
        if spec is not None:
            self._where[name] = spec.host_port
        for sink in self.sinks:
            old = self._per_endpoint.pop((id(sink), name), None)
            if old is not None:
                old.task.cancel()
                old.socket.close(linger=0)
            if gone is not None and (spec is None or spec.host_port != gone):
                sink.endpoint_left(gone)
            if spec is not None and sink.kv_events.discover_pods:
                self._open_endpoint(sink, spec)

    # Receiving.
    def _subscribe(self, sink: KVEventSink, url: str, *, bind: bool, pod: str | None) -> _Subscription:
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, sink.kv_events.topic_filter.encode())
        if bind:
            socket.bind(url)
        else:
            socket.connect(url)
        task = asyncio.get_running_loop().create_task(
            self._receive(socket, sink, pod), name=f"kv events {url}"
        )
        return _Subscription(sink, socket, task, pod)

    async def _receive(self, socket: zmq.asyncio.Socket, sink: KVEventSink, pod: str | None) -> None:
        sources: dict[str, _Source] = {}
        while True:
            frames = await socket.recv_multipart()
            self.stats.messages += 1
            _count(self.stats.received, pod or "central")
            replay: tuple[str, str, int] | None = None
            try:
                replay = self._handle(frames, sink, pod, sources)
            except BadEventError as e:
                self.stats.bad += 1
                _count(self.stats.bad_by, pod or "central")
                log.error("KV events from %s: %s; message skipped", pod or "the central socket", e)
            except Exception:  # an index bug must not stop the stream
                self.stats.bad += 1
                log.exception("KV events from %s: applying a message failed", pod or "the central socket")
            if replay is not None:
                await self._replay(sink, replay, sources)

    def _handle(
        self, frames: list[bytes], sink: KVEventSink, pod: str | None, sources: dict[str, _Source]
    ) -> tuple[str, str, int] | None:
        """Apply one message; (endpoint, model, first sequence missed) when a replay is due."""
        if len(frames) != 3:
            raise BadEventError(f"a message of {len(frames)} frames (3 expected: topic, sequence, payload)")
        topic = frames[0].decode("utf-8", "replace")
        seq = decode_sequence(frames[1])
        batch = decode_batch(frames[2])
        topic_pod, model = parse_topic(topic)
        source = pod or topic_pod
        state = sources.setdefault(source, _Source())
        last = state.last
        if last is not None and seq <= last:
            if seq == last:
                return None  # a duplicate
            self.stats.resets += 1
            log.warning(
                "KV events from %s: sequence went back (%d after %d): the engine restarted", source, seq, last
            )
            sink.endpoint_left(source)
        elif last is not None and seq > last + 1:
            self.stats.gaps += 1
            _count(self.stats.gaps_by, source)
            if sink.kv_events.replay_port > 0:
                log.warning(
                    "KV events from %s: %d missed (%d after %d); asking for a replay",
                    source,
                    seq - last - 1,
                    seq,
                    last,
                )
                return source, model, last + 1  # the replay brings them, and this one again
            self.stats.resets += 1
            log.error(
                "KV events from %s: %d missed (%d after %d) and no replay port: its blocks are dropped "
                "from the index until new events arrive", source, seq - last - 1, seq, last,
            )  # fmt: skip
            sink.endpoint_left(source)
        sink.tracker.apply(source, model, batch)
        state.last = seq
        return None

    async def _replay(
        self,
        sink: KVEventSink,
        due: tuple[str, str, int],
        sources: dict[str, _Source],
    ) -> None:
        """Ask the engine's replay socket for the events from `start` on (vLLM's protocol: DEALER to
        its ROUTER, [b"", start]; answers [b"", topic, seq, payload] or, before vLLM 0.34,
        [b"", seq, payload]; the end marker has sequence -1)."""
        source, model, start = due
        address = source.rsplit(":", 1)[0].strip("[]")
        self.stats.replays += 1
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        state = sources.setdefault(source, _Source())
        try:
            dealer.connect(f"tcp://{_host(address)}:{sink.kv_events.replay_port}")
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), REPLAY_TIMEOUT)
                parts = frames[1:] if frames and frames[0] == b"" else frames
                if len(parts) == 3:
                    topic, seq_frame, payload = parts
                elif len(parts) == 2:
                    topic, (seq_frame, payload) = b"", parts
                else:
                    raise BadEventError(f"a replay message of {len(frames)} frames")
                if seq_frame == END_OF_REPLAY:
                    return
                seq = decode_sequence(seq_frame)
                if state.last is not None and seq <= state.last:
                    continue
                _, topic_model = parse_topic(topic.decode("utf-8", "replace")) if topic else ("", model)
                sink.tracker.apply(source, topic_model or model, decode_batch(payload))
                state.last = seq
        except (TimeoutError, BadEventError, zmq.ZMQError) as e:
            self.stats.resets += 1
            log.error(
                "KV events from %s: the replay failed (%s): its blocks are dropped from the index",
                source,
                e or "no answer",
            )
            sink.endpoint_left(source)
            state.last = None
        finally:
            dealer.close(linger=0)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def sinks_of(plugins: Iterable[Any]) -> list[KVEventSink]:
    """The plugins that keep a KV-block index fed by events."""
    return [p for p in plugins if isinstance(p, KVEventSink)]


class KVEventsCollector(Collector):
    """llm-d-router's KV-event metrics (pkg/kvcache/metrics), from the subscribers' and trackers'
    counts at scrape time; `epick_kv_cache_events_sequence_gaps_total` is epick's own."""

    def __init__(self, subscribers: KVEventSubscribers) -> None:
        self.subscribers = subscribers

    def collect(self) -> Iterator[Metric]:
        subs = self.subscribers
        if not subs.sinks:
            return
        stats = subs.stats
        prefix = "llm_d_epp_kv_cache_events"
        active = GaugeMetricFamily(f"{prefix}_active_subscribers", "ZMQ subscribers open.")
        active.add_metric([], float(subs.active))
        yield active
        received = CounterMetricFamily(
            f"{prefix}_messages_received", "KV-event messages received.", labels=["pod_identifier"]
        )
        for pod, n in stats.received.items():
            received.add_metric([pod], float(n))
        yield received
        errors = CounterMetricFamily(
            f"{prefix}_zmq_errors", "Messages that could not be read.", labels=["pod_identifier", "operation"]
        )
        for pod, n in stats.bad_by.items():
            errors.add_metric([pod, "decode"], float(n))
        yield errors
        gaps = CounterMetricFamily(
            "epick_kv_cache_events_sequence_gaps",
            "Sequence-number gaps (missed messages).",
            labels=["pod_identifier"],
        )
        for pod, n in stats.gaps_by.items():
            gaps.add_metric([pod], float(n))
        yield gaps
        skipped = CounterMetricFamily(
            f"{prefix}_stores_skipped", "BlockStored events not indexed.", labels=["cache_kind", "reason"]
        )
        parent = sum(s.tracker.stats.skipped_unknown_parent for s in subs.sinks)
        partial = sum(s.tracker.stats.skipped_partial for s in subs.sinks)
        skipped.add_metric(["", "unknown_parent"], float(parent))
        skipped.add_metric(["", "partial_block"], float(partial))
        yield skipped
