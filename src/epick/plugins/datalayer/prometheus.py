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
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from epick.framework import Metrics
from epick.plugins.datalayer.engines import EngineMetricNames, MetricSpec

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsParseError(ValueError):
    """The page is not what a model server exposes; the message says what is wrong."""


class MissingMetricsError(MetricsParseError):
    """The page lacks metrics the engine's names say it has."""


@dataclass(frozen=True, slots=True)
class _Sample:
    labels: Mapping[str, str]
    value: float


_ESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    """Label-value escapes of the text format (\\\\, \\", \\n), in one pass."""
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], value)


_NO_LABELS: Mapping[str, str] = MappingProxyType({})  # samples whose labels are not read: read-only


def _scan(text: str, name: str, *, labels: bool = True) -> list[_Sample]:
    """The samples of one family. Its first sample line is found with str.find (C speed); the text
    format keeps a family's samples together, so the rest follow line by line. A vLLM page has
    hundreds of lines and we need half a dozen: no Python loop ever walks the whole page. Without
    `labels`, label sets are skipped unread (the samples' labels are empty)."""
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
                samples.append(_sample(name, line, labels))
            except MetricsParseError as e:
                raise MetricsParseError(f"line {text.count(chr(10), 0, i) + 1}: {e}") from None
            i = end + 1
            j = i + len(name)
            if end == -1 or not text.startswith(name, i) or (j < size and text[j] not in "{ \n"):
                return samples
    return samples


def _sample(name: str, line: str, read_labels: bool = True) -> _Sample:
    rest_at = len(name)
    labels: Mapping[str, str] = _NO_LABELS
    if line[rest_at : rest_at + 1] == "{":
        close = line.rfind("}")
        if close < rest_at:
            raise MetricsParseError(f"unterminated label set in {line[:80]!r}")
        if read_labels:
            labels = {k: _unescape(v) for k, v in _LABEL.findall(line[rest_at + 1 : close])}
        rest_at = close + 1
    rest = line[rest_at:].split()
    if not rest:
        raise MetricsParseError(f"{name} has no value")
    try:
        return _Sample(labels, float(rest[0]))
    except ValueError:
        raise MetricsParseError(f"{name} has value {rest[0]!r}, not a number") from None


def _find(text: str, spec: MetricSpec, *, info: bool = False) -> list[_Sample]:
    """The samples of `spec`'s family that its label matchers select. Their labels are read only
    for the matchers, or for an `info` metric (whose labels are what it says)."""
    if not spec.labels:
        return _scan(text, spec.name, labels=info)
    return [x for x in _scan(text, spec.name) if spec.matches(x.labels)]


def parse_metrics(text: str, names: EngineMetricNames, *, update_time: float | None = None) -> Metrics:
    """The scheduler's view of one endpoint from its /metrics page. Raises `MetricsParseError`."""
    waiting_samples = _find(text, names.waiting) if names.waiting is not None else []
    running_samples = _find(text, names.running) if names.running is not None else []
    required = ((names.waiting, waiting_samples), (names.running, running_samples))
    missing = [str(spec) for spec, found in required if spec is not None and not found]
    kv_samples: list[_Sample] = []
    kv_spec = None
    for candidate in names.kv_usage:  # the first one present wins: the newer name is tried first
        if samples := _find(text, candidate):
            kv_samples, kv_spec = samples, candidate
            break
    if names.kv_usage and kv_spec is None:
        missing.append(" or ".join(str(k) for k in names.kv_usage))
    if missing:
        raise MissingMetricsError(f"missing metrics: {', '.join(missing)}")
    waiting = _sum(waiting_samples, str(names.waiting))  # a metric the engine config disables: 0
    running = _sum(running_samples, str(names.running))
    kv = max(_values(kv_samples, str(kv_spec))) if kv_spec is not None else 0.0  # no KV metric: 0
    if kv > 1.0:  # some servers report percent
        kv = kv / 100.0 if kv <= 100.0 else 1.0
    active: frozenset[str] = frozenset()
    waiting_models: frozenset[str] = frozenset()
    max_models = 0
    if names.lora_info is not None and (lora := _find(text, names.lora_info, info=True)):
        latest = max(lora, key=lambda s: s.value)
        active = _adapters(latest.labels.get("running_lora_adapters", ""))
        waiting_models = _adapters(latest.labels.get("waiting_lora_adapters", ""))
        max_models = _int_label(latest.labels, "max_lora", names.lora_info.name)
    block_size = num_blocks = 0
    if names.cache_info is not None and (info := _find(text, names.cache_info, info=True)):
        block_size = _int_label(info[0].labels, names.cache_block_size_label, names.cache_info.name)
        num_blocks = _int_label(info[0].labels, names.cache_num_blocks_label, names.cache_info.name)
    if names.cache_block_size is not None and (size := _find(text, names.cache_block_size)):
        block_size = int(_values(size, str(names.cache_block_size))[0])
    if names.cache_num_blocks is not None and (count := _find(text, names.cache_num_blocks)):
        num_blocks = int(_values(count, str(names.cache_num_blocks))[0])
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


def read_scalar(text: str, spec: MetricSpec) -> float:
    """The value of `spec`'s first matching sample, as upstream reads a custom metric (no sum).
    Raises `MetricsParseError` when the page has none."""
    samples = _scan(text, spec.name)
    if not samples:
        raise MetricsParseError(f"metric family {spec.name!r} not found")
    matching = [x for x in samples if spec.matches(x.labels)]
    if not matching:
        raise MetricsParseError(f"no matching metric found for {str(spec)!r}")
    value = matching[0].value
    if math.isnan(value) or math.isinf(value):
        raise MetricsParseError(f"{spec} is {value}, not a number")
    return value


def _values(samples: list[_Sample], name: str) -> list[float]:
    for s in samples:
        if math.isnan(s.value) or s.value < 0 or math.isinf(s.value):
            raise MetricsParseError(f"{name} is {s.value}, not a count or share")
    return [s.value for s in samples]


def _sum(samples: list[_Sample], name: str) -> float:
    return sum(_values(samples, name))


def _adapters(value: str) -> frozenset[str]:
    return frozenset(a.strip() for a in value.split(",") if a.strip())


def _int_label(labels: Mapping[str, str], key: str, metric: str) -> int:
    raw = labels.get(key, "")
    if not raw or raw == "None":
        return 0
    try:
        return int(float(raw))
    except (ValueError, OverflowError):
        raise MetricsParseError(f"{metric}: label {key}={raw!r} is not a number") from None


def samples_of(text: str, name: str) -> list[tuple[Mapping[str, str], float]]:
    """Every sample of family `name`: (labels, value). Raises `MetricsParseError` on a bad line."""
    return [(s.labels, s.value) for s in _scan(text, name)]
