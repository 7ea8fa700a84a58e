"""A loaded config: the scheduler, the plugins by name, their request-control hooks and the
saturation detector, as `epick.config.loader` builds them from an `EndpointPickerConfig`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epick.config.datalayer import DataLayerPlan
from epick.flowcontrol import FlowControlSettings
from epick.framework import (
    Admitter,
    BatchingProducer,
    Clock,
    DataProducer,
    ParserSet,
    Plugin,
    PreRequest,
    RemoteTokenizer,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseReceived,
    ResponseStreaming,
    SaturationDetector,
    Scheduler,
    Screener,
)


@dataclass(slots=True)
class RequestHooks:
    """The request-control hooks a config's plugins implement, in the order they were defined."""

    header_processors: list[RequestHeaderProcessor] = field(default_factory=list)
    screeners: list[Screener] = field(default_factory=list)
    producers: list[DataProducer] = field(default_factory=list)
    remote_tokenizers: list[RemoteTokenizer] = field(default_factory=list)
    batching: list[BatchingProducer] = field(default_factory=list)
    admitters: list[Admitter] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_received: list[ResponseReceived] = field(default_factory=list)
    response_streaming: list[ResponseStreaming] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)

    @classmethod
    def from_plugins(cls, plugins: Sequence[Plugin]) -> RequestHooks:
        hooks = cls()
        for p in plugins:
            if isinstance(p, RequestHeaderProcessor):
                hooks.header_processors.append(p)
            if isinstance(p, Screener):
                hooks.screeners.append(p)
            if isinstance(p, DataProducer):
                hooks.producers.append(p)
            if isinstance(p, RemoteTokenizer) and p.remote:
                hooks.remote_tokenizers.append(p)
            if isinstance(p, BatchingProducer):
                hooks.batching.append(p)
            if isinstance(p, Admitter):
                hooks.admitters.append(p)
            if isinstance(p, PreRequest):
                hooks.pre_request.append(p)
            if isinstance(p, ResponseReceived):
                hooks.response_received.append(p)
            if isinstance(p, ResponseStreaming):
                hooks.response_streaming.append(p)
            if isinstance(p, ResponseComplete):
                hooks.response_complete.append(p)
        return hooks


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What the service gives a config's plugins beyond the file: the clock their factories get
    (`Handle.clock`), how many worker processes decide with copies of the config (`Handle.workers`),
    and parameters, by plugin type, that replace the file's (command-line settings)."""

    clock: Clock | None = None  # None: a clock of the config's own, on the process's time
    workers: int = 1
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # False: refuse plugins upstream registers as Alpha (`epp` without --allow-experimental-plugins).
    allow_experimental: bool = True
    # `--feature-gates` entries ("name", "name=false"), after the file's: the last word on a gate wins.
    feature_gates: tuple[str, ...] = ()
    # `--plugin-state-staleness-threshold` (seconds; `Handle.plugin_state_staleness`)
    plugin_state_staleness: float = 300.0  # upstream's default


@dataclass(slots=True)
class LoadedConfig:
    source: str
    scheduler: Scheduler
    plugins: dict[str, Plugin]
    hooks: RequestHooks
    saturation_detector: SaturationDetector
    parsers: ParserSet
    warnings: list[str]
    data_layer: DataLayerPlan = field(default_factory=DataLayerPlan)
    flow_control: FlowControlSettings | None = None  # None: the flowControl gate is off
    # Per plugin: its type and parameters as built, and the plugins its factory used (for a reload
    # that keeps the instances whose configuration did not change: `load_config(previous=)`).
    fingerprints: dict[str, str] = field(default_factory=dict)
    uses: dict[str, frozenset[str]] = field(default_factory=dict)
    # What the plugins' factories were given: the config's clock (the simulator points it at
    # virtual time) and how many worker processes decide with copies of this config.
    clock: Clock = field(default_factory=Clock)
    workers: int = 1
    # Per plugin: what it keeps per worker, as its spec declares (absent: not declared).
    worker_states: dict[str, str] = field(default_factory=dict)

    def summary(self) -> list[str]:
        """One line per profile, then the handler: what `epick check-config` prints."""
        lines = []
        for profile in self.scheduler.profiles.values():
            filters = ", ".join(str(f.typed_name) for f in profile.filters) or "none"
            scorers = ", ".join(f"{s.scorer.typed_name}×{s.weight:g}" for s in profile.scorers) or "none"
            picker = profile.picker.typed_name
            lines.append(f"profile {profile.name}: filters [{filters}]; scorers [{scorers}]; picker {picker}")
        lines.append(f"profile handler: {self.scheduler.handler.typed_name}")
        served = ", ".join(str(p.typed_name) for p in self.parsers.parsers) or "none"
        lines.append(f"parsers: {served}")
        plan = self.data_layer
        polled = "; ".join(
            f"{p.source.typed_name} -> {', '.join(str(e.typed_name) for e in p.extractors) or 'nothing'}"
            for p in plan.polled
        )
        lines.append(f"data sources: {polled or 'none'}")
        if plan.endpoint_extractors:
            lines.append(
                "endpoint extractors: " + ", ".join(str(e.typed_name) for e in plan.endpoint_extractors)
            )
        if plan.discovery is not None:
            lines.append(f"discovery: {plan.discovery.typed_name} ({plan.discovery.path})")
        return lines
