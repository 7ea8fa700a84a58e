"""Reading the few metrics the scheduler needs out of a Prometheus text page.

A scraper parses every endpoint's page every 50 ms, so this reads only the wanted families: each
wanted name is located with `str.find`, only those lines are split, and labels are parsed only for
the info metrics.
benchmarks/bench_parse.py measures it against prometheus_client's full parser on vLLM-sized pages
(docs/performance.md has the figures).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from epick.datalayer.engines import EngineMetricNames
from epick.framework import Metrics

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsParseError(ValueError):
    """The page is not what a model server exposes; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class _Sample:
    labels: dict[str, str]
    value: float


_ESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    """Label-value escapes of the text format (\\\\, \\", \\n), in one pass."""
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], value)


def _scan(text: str, name: str) -> list[_Sample]:
    """The samples of one family. Its first sample line is found with str.find (C speed); the text
    format keeps a family's samples together, so the rest follow line by line. A vLLM page has
    hundreds of lines and we need half a dozen: no Python loop ever walks the whole page."""
    samples: list[_Sample] = []
    size = len(text)
    start = 0
    while (i := text.find(name, start)) != -1:
        j = i + len(name)
        start = j
        if (i > 0 and text[i - 1] != "\n") or (j < size and text[j] not in "{ \n"):
            continue  # inside a comment, or a longer name sharing this prefix
        while True:
            end = text.find("\n", j)
            line = text[i : end if end != -1 else size]
            try:
                samples.append(_sample(name, line))
            except MetricsParseError as e:
                raise MetricsParseError(f"line {text.count(chr(10), 0, i) + 1}: {e}") from None
            i = end + 1
            j = i + len(name)
            if end == -1 or not text.startswith(name, i) or (j < size and text[j] not in "{ \n"):
                return samples
    return samples


def _sample(name: str, line: str) -> _Sample:
    rest_at = len(name)
    labels: dict[str, str] = {}
    if line[rest_at : rest_at + 1] == "{":
        close = line.rfind("}")
        if close < rest_at:
            raise MetricsParseError(f"unterminated label set in {line[:80]!r}")
        labels = {k: _unescape(v) for k, v in _LABEL.findall(line[rest_at + 1 : close])}
        rest_at = close + 1
    rest = line[rest_at:].split()
    if not rest:
        raise MetricsParseError(f"{name} has no value")
    try:
        return _Sample(labels, float(rest[0]))
    except ValueError:
        raise MetricsParseError(f"{name} has value {rest[0]!r}, not a number") from None


def parse_metrics(text: str, names: EngineMetricNames, *, update_time: float | None = None) -> Metrics:
    """The scheduler's view of one endpoint from its /metrics page. Raises `MetricsParseError`."""
    found = {name: samples for name in (names.waiting, names.running) if (samples := _scan(text, name))}
    missing = [n for n in (names.waiting, names.running) if n not in found]
    kv_name = None
    for candidate in names.kv_usage:  # the first name present wins: the newer one is tried first
        if samples := _scan(text, candidate):
            found[kv_name := candidate] = samples
            break
    if kv_name is None:
        missing.append(" or ".join(names.kv_usage))
    if missing or kv_name is None:
        raise MetricsParseError(f"missing metrics: {', '.join(missing)}")
    for optional in (names.lora_info, names.cache_info):
        if optional and (samples := _scan(text, optional)):
            found[optional] = samples
    waiting = _sum(found[names.waiting], names.waiting)
    running = _sum(found[names.running], names.running)
    kv = max(_values(found[kv_name], kv_name))
    if kv > 1.0:  # some servers report percent
        kv = kv / 100.0 if kv <= 100.0 else 1.0
    active: frozenset[str] = frozenset()
    waiting_models: frozenset[str] = frozenset()
    max_models = 0
    if names.lora_info and names.lora_info in found:
        latest = max(found[names.lora_info], key=lambda s: s.value)
        active = _adapters(latest.labels.get("running_lora_adapters", ""))
        waiting_models = _adapters(latest.labels.get("waiting_lora_adapters", ""))
        max_models = _int_label(latest.labels, "max_lora", names.lora_info)
    block_size = num_blocks = 0
    if names.cache_info and names.cache_info in found:
        info = found[names.cache_info][0].labels
        block_size = _int_label(info, "block_size", names.cache_info)
        num_blocks = _int_label(info, "num_gpu_blocks", names.cache_info)
    return Metrics(
        waiting_queue_size=int(waiting),
        running_requests_size=int(running),
        kv_cache_usage_percent=kv,
        active_models=active,
        waiting_models=waiting_models,
        max_active_models=max_models,
        cache_block_size=block_size,
        cache_num_blocks=num_blocks,
        update_time=update_time,
    )


def _values(samples: list[_Sample], name: str) -> list[float]:
    for s in samples:
        if math.isnan(s.value) or s.value < 0 or math.isinf(s.value):
            raise MetricsParseError(f"{name} is {s.value}, not a count or share")
    return [s.value for s in samples]


def _sum(samples: list[_Sample], name: str) -> float:
    return sum(_values(samples, name))


def _adapters(value: str) -> frozenset[str]:
    return frozenset(a.strip() for a in value.split(",") if a.strip())


def _int_label(labels: dict[str, str], key: str, metric: str) -> int:
    raw = labels.get(key, "")
    if not raw or raw == "None":
        return 0
    try:
        return int(float(raw))
    except (ValueError, OverflowError):
        raise MetricsParseError(f"{metric}: label {key}={raw!r} is not a number") from None
