"""The request's media items (images, audio, video), each with the hash that names it in an encoder
cache, as upstream's token producer finds them (llm-d/llm-d-router,
pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/estimate.go and tokenizer.go).

- A chat content part `image_url` or `video_url`: its `url`, hashed whole (an http URL and a `data:`
  URI alike, nothing decoded).
- `input_audio` or `audio_url`: the part's `input_audio.data` followed by its `input_audio.format`.
  An `audio_url` part has no `input_audio`, so it hashes the empty string: upstream's quirk, kept.
- An Anthropic `image` block (also inside a `tool_result`): `source.url` when set, else `source.data`.
- A generate body's `features`: the hashes vLLM computed, `mm_hashes[modality][i]` paired with
  `mm_placeholders[modality][i]`, in placeholder offset order.

A hash is XXH64 (seed 0) of the string's UTF-8 bytes, written in lowercase hex without padding, as
upstream writes it. Items repeat once per hash (the last modality seen wins) and each counts 1.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import xxhash

from epick.framework import InferenceRequest

IMAGE, AUDIO, VIDEO = "image", "audio", "video"


@dataclass(frozen=True, slots=True)
class MediaItem:
    hash: str
    modality: str
    size: int = 1  # upstream counts every item as 1, whatever its token length


def media_hash(text: str) -> str:
    return format(xxhash.xxh64_intdigest(text.encode()), "x")


def media_items(request: InferenceRequest) -> tuple[MediaItem, ...]:
    """The request's distinct media items, in the order first seen."""
    found: dict[str, str] = {}
    for digest, modality in _features(request.body.raw) if request.body.kind == "generate" else ():
        found[digest] = modality
    for message in request.body.messages:
        for text, modality in _parts(message.content):
            found[media_hash(text)] = modality
    return tuple(MediaItem(digest, modality) for digest, modality in found.items())


def _parts(content: object) -> Iterator[tuple[str, str]]:
    """(string to hash, modality) for each media part of one message's content."""
    if not isinstance(content, list):
        return
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = part.get("type")
        if kind in ("image_url", "video_url"):
            url = _field(part.get(kind), "url")
            yield url, IMAGE if kind == "image_url" else VIDEO
        elif kind in ("input_audio", "audio_url"):
            audio = part.get("input_audio")
            yield _field(audio, "data") + _field(audio, "format"), AUDIO
        elif kind == "image":
            source = part.get("source")
            yield _field(source, "url") or _field(source, "data"), IMAGE
        elif kind == "tool_result":
            yield from _parts(part.get("content"))


def _field(value: object, name: str) -> str:
    if isinstance(value, Mapping):
        found = value.get(name)
        return found if isinstance(found, str) else ""
    return ""


def _features(raw: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """vLLM's own hashes from a generate body's `features`, by placeholder offset."""
    features = raw.get("features") if raw is not None else None
    if not isinstance(features, Mapping):
        return []
    hashes, places = features.get("mm_hashes"), features.get("mm_placeholders")
    if not isinstance(hashes, Mapping) or not isinstance(places, Mapping):
        return []
    found: list[tuple[int, str, str]] = []
    for modality, digests in hashes.items():
        ranges = places.get(modality)
        if not isinstance(digests, list) or not isinstance(ranges, list):
            continue
        for digest, span in zip(digests, ranges, strict=False):
            offset = span.get("offset") if isinstance(span, Mapping) else None
            if isinstance(digest, str) and digest and isinstance(offset, int):
                found.append((offset, digest, str(modality)))
    found.sort(key=lambda item: item[0])
    return [(digest, modality) for _, digest, modality in found]
