"""`--shared-state redis://…`: the state `--workers` keeps equal within a host, kept equal across
replicas on other hosts too, through Redis or Valkey.

The plugins that share are those of `epick.framework.replication.Replicated` (the approximate prefix
index, the requests and tokens in flight, `no-hit-lru-scorer`'s order). Two kinds of updates:

- **Events** (a prefix index's blocks recorded, an endpoint touched): idempotent, global, and they
  outlive the replica that recorded them. Published on the channel `<scope>:updates`, batched per turn
  of the event loop; every replica applies the others'. Each replica also writes a snapshot of these
  plugins every `snapshot_interval` to the hash `<scope>:snapshots` (a field per replica, with its wall
  time); a replica that starts, or that finds Redis back after an outage, restores every snapshot
  younger than `SNAPSHOT_MAX_AGE` before it applies what it missed, so it serves on the current state
  and what it missed while away is not kept wrong.
- **State** (`replicates_state` on the plugin: the requests and tokens in flight): each update is
  the replica's own absolute value for one key (an endpoint). Each replica writes all of its own
  every `interval` (200 ms, upstream's `crossReplicaSyncInterval`) to the hash `<scope>:states`, with
  a counter; every replica reads the hash as often and replaces each other replica's values with what
  it wrote. A write lost to a blip is repaired by the next one. A replica whose counter has not moved
  for `ttl` is gone: its values are dropped (`worker_left`).

Replicas are named `<replica id>/<worker>`: the id is the process group's (`Settings.replica_id`, one
per pod under `--workers`), and updates from one's own group are skipped (the workers' hub carries
them). Deciding never waits on Redis: it reads the local state. While Redis does not answer, the
replica decides on what it had and what it records itself (one warning; `epick_shared_state_up` 0);
after `ttl` the other replicas' in-flight values are dropped rather than kept stale; once Redis is
back, the snapshots are restored again.

Redis layout, epick's own (llm-d has no cross-replica store for this state): msgpack values; `<scope>`
is `epick:<namespace>/<pool>` (`epick:static` without a pool). Nothing expires by TTL: stale fields
are skipped and deleted by the readers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from epick.config import LoadedConfig
from epick.framework.metrics import EPICK_PREFIX, MetricSample
from epick.framework.plugin import TypedName
from epick.framework.replication import Replicated
from epick.plugins.prefix.redis_index import redacted

log = logging.getLogger(__name__)

SNAPSHOT_MAX_AGE = 300.0  # seconds: an older snapshot (a replica gone long ago) is not restored
EXCHANGE_AFTER = (0.0, 0.5, 1.5, 3.0)  # seconds between the snapshot exchanges after an outage
REMOTE_BASE = 1_000_000  # the worker numbers other replicas get here (local workers are 0 .. N-1)
STOP_TIMEOUT = 2.0  # seconds each step of `stop` may take


@dataclass(slots=True)
class SharedStateStats:
    sent: int = 0  # updates published
    received: int = 0  # updates applied from other replicas
    restored: int = 0  # snapshots restored
    outages: int = 0


@dataclass(slots=True)
class _Remote:
    worker: int  # the number it is known by here
    counter: int = -1
    seen: float = 0.0  # when its counter last moved (this replica's clock)
    state: dict[str, list[Any]] = field(default_factory=dict)


def scope_of(namespace: str, pool: str | None) -> str:
    return f"epick:{namespace}/{pool}" if pool else "epick:static"


class SharedState:
    """Keeps the running config's replicated plugins in step with the other replicas'."""

    typed_name = TypedName("shared-state", "shared-state")

    def __init__(
        self,
        url: str,
        scope: str,
        identity: str,
        config: Callable[[], LoadedConfig],
        *,
        local_worker: int = 0,
        interval: float = 0.2,
        ttl: float = 2.0,
        snapshot_interval: float = 10.0,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.scope = scope
        self.identity = identity
        self.group = identity.split("/", 1)[0]
        self.config = config
        self.local_worker = local_worker
        self.interval, self.ttl, self.snapshot_interval = interval, ttl, snapshot_interval
        self.clock = clock
        self.stats = SharedStateStats()
        self.up = False
        self._client = client if client is not None else _client(url)
        self._events: dict[str, Replicated] = {}
        self._states: dict[str, Replicated] = {}
        self._own: dict[str, dict[Any, list[Any]]] = {}  # state plugins' own values, by key
        self._outbox: list[list[Any]] = []
        self._flush_pending = False
        self._remotes: dict[str, _Remote] = {}
        self._numbers = itertools.count(REMOTE_BASE)
        self._counter = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._last_ok = 0.0
        self._stopping = False

    # wiring

    def attach(self, *, replicate: bool) -> None:
        """(Again, after a reload) find the replicated plugins; with `replicate`, hand them this
        object's publisher (without `--workers`: with them, the workers' link does, and tees here)."""
        self._events, self._states = {}, {}
        for name, plugin in self.config().plugins.items():
            if not isinstance(plugin, Replicated):
                continue
            (self._states if getattr(plugin, "replicates_state", False) else self._events)[name] = plugin
            if replicate:
                plugin.replicate(self._publisher(name), self.local_worker)
        self._own = {name: self._own.get(name, {}) for name in self._states}

    def _publisher(self, name: str) -> Callable[[object], None]:
        def publish(update: object) -> None:
            self.published(name, update)

        return publish

    def published(self, name: str, update: object) -> None:
        """What a local plugin recorded: an event goes out this turn; a state value with the next
        write of the states."""
        if name in self._states:
            if isinstance(update, list | tuple) and update:
                self._own.setdefault(name, {})[update[0]] = list(update)
            return
        if name not in self._events or not self.up:
            return  # the snapshots restored when Redis is back carry it
        self._outbox.append([name, update])
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        batch, self._outbox = self._outbox, []
        if batch:
            self._in_task(self._publish(batch))

    async def _publish(self, batch: list[list[Any]]) -> None:
        if await self._send("u", batch):
            self.stats.sent += len(batch)

    async def _send(self, kind: str, payload: object) -> bool:
        """One message on the channel: "u" updates, "s" a snapshot, "r" a request for snapshots."""
        try:
            await self._client.publish(f"{self.scope}:updates", msgpack.packb([kind, self.identity, payload]))
        except Exception as e:
            self._failed(e)
            return False
        return True

    def _snapshot(self) -> dict[str, object]:
        return {name: plugin.snapshot() for name, plugin in self._events.items()}

    # lifecycle

    async def start(self, *, replicate: bool, timeout: float = 5.0) -> None:
        """Attach, subscribe, and restore the others' snapshots and states before returning (the
        service serves after), within `timeout`; an unreachable Redis is a warning, not an error."""
        self.attach(replicate=replicate)
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            await asyncio.wait_for(self._join(pubsub), timeout)
        except Exception as e:
            self._failed(e)
        self._tasks.append(asyncio.create_task(self._listen(pubsub)))
        self._tasks.append(asyncio.create_task(self._sync_loop()))
        self._tasks.append(asyncio.create_task(self._snapshot_loop()))

    async def _join(self, pubsub: Any) -> None:
        """Subscribe, restore the snapshots the others wrote (at most `snapshot_interval` old), ask
        them for fresh ones (applied as they come), and read their in-flight values."""
        await pubsub.subscribe(f"{self.scope}:updates")
        await self._restore_snapshots()
        await self._send("r", None)
        await self._sync_states()
        self._back()

    async def stop(self) -> None:
        """Stop the loops, say goodbye (the others drop this replica's in-flight values at once rather
        than after `ttl`) and close; each step bounded, so a Redis that hangs cannot hold the stop."""
        self._stopping = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._client.hdel(f"{self.scope}:states", self.identity), STOP_TIMEOUT)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._client.aclose(), STOP_TIMEOUT)

    def _in_task(self, coroutine: Any) -> None:
        if self._stopping:
            coroutine.close()
            return
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(task)

    # events: the channel, and snapshots

    async def _listen(self, pubsub: Any) -> None:
        """Apply the others' messages (subscribed again after a failure)."""
        delay = self.interval
        while True:
            try:
                if not pubsub.subscribed:
                    await pubsub.subscribe(f"{self.scope}:updates")
                message = await pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    self._received(message["data"])
                delay = self.interval
            except asyncio.CancelledError:
                raise  # its connection closes with the client's pool (`stop`)
            except Exception as e:
                self._failed(e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                with contextlib.suppress(Exception):
                    await pubsub.reset()

    def _received(self, data: bytes) -> None:
        try:
            kind, sender, payload = msgpack.unpackb(data, strict_map_key=False)
        except Exception:
            log.warning(
                "shared state: a message that is not epick's (%d bytes) on %s:updates", len(data), self.scope
            )
            return
        if str(sender).split("/", 1)[0] == self.group:
            return  # this pod's own workers: the hub carried it
        if kind == "r":  # a replica back from an outage asks for everyone's state
            self._in_task(self._send("s", self._snapshot()))
        elif kind == "s":
            self._restore(payload)
        else:
            worker = self._remote(str(sender)).worker
            for name, update in payload:
                plugin = self._events.get(name)
                if plugin is not None:
                    plugin.apply_update(update, worker)
                    self.stats.received += 1

    def _restore(self, snapshot: dict[str, object]) -> None:
        for name, state in snapshot.items():
            plugin = self._events.get(name)
            if plugin is not None:
                plugin.restore(state)
        self.stats.restored += 1

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(self.snapshot_interval)
            if not self.up:
                continue
            snapshot = self._snapshot()
            try:
                value = msgpack.packb([time.time(), snapshot])
                await self._client.hset(f"{self.scope}:snapshots", self.identity, value)
            except Exception as e:
                self._failed(e)

    async def _restore_snapshots(self) -> None:
        found = await self._client.hgetall(f"{self.scope}:snapshots")
        now = time.time()
        for field_name, value in found.items():
            sender = field_name.decode() if isinstance(field_name, bytes) else str(field_name)
            if sender.split("/", 1)[0] == self.group:
                continue
            try:
                written, snapshot = msgpack.unpackb(value, strict_map_key=False)
            except Exception:
                continue
            if now - float(written) > SNAPSHOT_MAX_AGE:
                with contextlib.suppress(Exception):
                    await self._client.hdel(f"{self.scope}:snapshots", sender)
                continue
            self._restore(snapshot)

    # state: written and read every interval

    async def _sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if not self.up:
                    await self._client.ping()
                    await self._restore_snapshots()
                await self._sync_states()
                if not self.up:
                    self._back()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed(e)
            if not self.up and self.clock() - self._last_ok > self.ttl:
                self._forget_remotes()

    async def _sync_states(self) -> None:
        self._counter += 1
        own = {name: list(values.values()) for name, values in self._own.items()}
        pipe = self._client.pipeline(transaction=False)
        pipe.hset(f"{self.scope}:states", self.identity, msgpack.packb([self._counter, own]))
        pipe.hgetall(f"{self.scope}:states")
        _, found = await pipe.execute()
        self._last_ok = now = self.clock()
        alive: set[str] = set()
        for field_name, value in found.items():
            sender = field_name.decode() if isinstance(field_name, bytes) else str(field_name)
            if sender.split("/", 1)[0] == self.group:
                continue
            try:
                counter, state = msgpack.unpackb(value, strict_map_key=False)
            except Exception:
                continue
            remote = self._remote(sender)
            if counter != remote.counter:
                remote.counter, remote.seen = counter, now
                if state != remote.state:
                    remote.state = state
                    self._apply_state(remote)
            if now - remote.seen <= self.ttl:
                alive.add(sender)
        for sender in [s for s in self._remotes if s not in alive]:
            self._gone(sender)
            with contextlib.suppress(Exception):
                await self._client.hdel(f"{self.scope}:states", sender)

    def _apply_state(self, remote: _Remote) -> None:
        """Replace what this replica holds of `remote`'s values with what it wrote."""
        for name, plugin in self._states.items():
            plugin.worker_left(remote.worker)
            for update in remote.state.get(name, ()):
                plugin.apply_update(update, remote.worker)
                self.stats.received += 1

    def _remote(self, sender: str) -> _Remote:
        remote = self._remotes.get(sender)
        if remote is None:
            remote = self._remotes[sender] = _Remote(next(self._numbers), seen=self.clock())
        return remote

    def _gone(self, sender: str) -> None:
        remote = self._remotes.pop(sender, None)
        if remote is not None:
            for plugin in self._states.values():
                plugin.worker_left(remote.worker)

    def _forget_remotes(self) -> None:
        """Redis has been away longer than `ttl`: the others' in-flight values are stale now."""
        for sender in list(self._remotes):
            self._gone(sender)

    # faults

    def _failed(self, error: BaseException) -> None:
        if not self.up and self.stats.outages:
            return
        self.up = False
        self.stats.outages += 1
        log.warning(
            "shared state at %s does not answer (%s: %s); deciding on this replica's own state until it is "
            "back",
            redacted(self.url),
            type(error).__name__,
            error,
        )

    def _back(self) -> None:
        """Redis answers (again). After an outage, what this replica recorded meanwhile goes out as a
        snapshot and the others are asked for theirs, a few times over the next seconds: the other
        replicas' subscriptions come back on their own schedule (redis-py resubscribes by itself), and
        a message sent before one is back does not reach it. Restoring is merging: twice is harmless."""
        if self.stats.outages and not self.up:
            log.info("shared state at %s answers again", redacted(self.url))
            self._in_task(self._exchange())
        self.up = True

    async def _exchange(self) -> None:
        for delay in EXCHANGE_AFTER:
            await asyncio.sleep(delay)
            if self.up:
                await self._send("s", self._snapshot())
                await self._send("r", None)

    # ExportsMetrics

    def metric_samples(self) -> Iterator[MetricSample]:
        prefix = f"{EPICK_PREFIX}_shared_state"
        yield MetricSample(
            f"{prefix}_up", "Whether the shared state's Redis answers (1) or not (0).", "gauge",
            1.0 if self.up else 0.0, plugin_labels=False,
        )  # fmt: skip
        yield MetricSample(
            f"{prefix}_replicas", "Other replicas whose state this one holds.", "gauge",
            float(len(self._remotes)), plugin_labels=False,
        )  # fmt: skip
        for name, doc, value in (
            ("updates_sent", "Updates published to the other replicas.", self.stats.sent),
            ("updates_received", "Updates applied from the other replicas.", self.stats.received),
            ("outages", "Times the shared state's Redis stopped answering.", self.stats.outages),
        ):
            yield MetricSample(f"{prefix}_{name}", doc, "counter", float(value), plugin_labels=False)


def _client(url: str) -> Any:
    import redis.asyncio

    return redis.asyncio.Redis.from_url(
        url, socket_connect_timeout=2.0, socket_timeout=5.0, health_check_interval=30
    )
