"""Recorded KV events for `epick explain --kv-events FILE`, and `epick kv-events` that records them.

The file is JSON Lines, one message per line, in either form:
- as received: {"topic": "kv@<address:port>@<model>", "seq": N, "payload": "<base64 msgpack>"}
  (what `epick kv-events` writes; the endpoint and model come from the topic);
- as written by hand: {"endpoint": "<address:port>", "model": "<model>", "events": [event, ...]},
  each event as vLLM encodes it, in JSON: a map with "type" (vLLM 0.34) or a tagged array.

Every line is applied in order to each plugin of the config that keeps a KV-block index.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack

from epick.kvcache import BadEventError, EventBatch, KVEventSink, decode_batch, parse_topic


class KVEventsFileError(ValueError):
    """A line of a KV-events file that cannot be replayed: the message names the line."""


def read_kv_events(path: str | Path) -> list[tuple[str, str, EventBatch]]:
    """(endpoint, model, batch) per line of the file."""
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise KVEventsFileError(f"{path}: cannot read it: {e.strerror or e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise KVEventsFileError(f"{where}: not JSON: {e.msg}") from None
        if not isinstance(doc, dict):
            raise KVEventsFileError(f"{where}: a line must be a JSON object")
        try:
            out.append(_message(doc))
        except (BadEventError, KVEventsFileError) as e:
            raise KVEventsFileError(f"{where}: {e}") from None
    return out


def _message(doc: dict[str, Any]) -> tuple[str, str, EventBatch]:
    if "payload" in doc:
        topic = doc.get("topic")
        if not isinstance(topic, str):
            raise KVEventsFileError("'topic' must be a string")
        try:
            payload = base64.b64decode(str(doc["payload"]), validate=True)
        except (binascii.Error, ValueError):
            raise KVEventsFileError("'payload' must be base64") from None
        endpoint, model = parse_topic(topic)
        return endpoint, model, decode_batch(payload)
    named, model, events = doc.get("endpoint"), doc.get("model", ""), doc.get("events")
    if not isinstance(named, str) or not named:
        raise KVEventsFileError("needs 'endpoint' (address:port) and 'events', or 'topic' and 'payload'")
    if not isinstance(model, str) or not isinstance(events, list):
        raise KVEventsFileError("'model' must be a string and 'events' a list")
    ts = doc.get("ts", 0.0)
    return named, model, decode_batch(msgpack.packb([ts, events, None]))


def replay(sinks: Iterable[KVEventSink], messages: Iterable[tuple[str, str, EventBatch]]) -> int:
    """Apply the messages to every sink; how many were applied."""
    targets = list(sinks)
    n = 0
    for endpoint, model, batch in messages:
        for sink in targets:
            sink.tracker.apply(endpoint, model, batch)
        n += 1
    return n


async def record(
    endpoint: str, out: Path, *, count: int | None, seconds: float | None, topic: str = "kv@"
) -> int:
    """Subscribe to a publisher (tcp://host:port) and write what it sends to `out`, as JSON Lines."""
    import zmq
    import zmq.asyncio

    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
    socket.connect(endpoint)
    written = 0
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        with out.open("w", encoding="utf-8") as f:
            while count is None or written < count:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    frames = await asyncio.wait_for(socket.recv_multipart(), timeout)
                except TimeoutError:
                    break
                if len(frames) != 3:
                    continue
                line = {
                    "topic": frames[0].decode("utf-8", "replace"),
                    "seq": int.from_bytes(frames[1], "big") if len(frames[1]) == 8 else None,
                    "payload": base64.b64encode(frames[2]).decode(),
                }
                f.write(json.dumps(line) + "\n")
                f.flush()
                written += 1
    finally:
        socket.close(linger=0)
        context.term()
    return written
