"""`max-saturation-detector`: several saturation detectors as one, the pool as saturated as the most
saturated of them (upstream's flowcontrol/saturationdetector/composite, llm-d-router #2827, Beta).

Parameters, as upstream's: `detectors`, the names of other saturation-detector plugins of the config
(at least one, each once, not itself), and `stages`, optionally, per detector the stages it is asked
for ("prefill", "decode"; a detector not listed is asked for every stage). For a stage, the answer is
the highest of the detectors asked, 0 when none is. Each detector's last answer is served as
llm_d_epp_flow_control_detector_saturation{detector, stage} ("" for a pool without roles).

Deviation: upstream forwards dispatch reservations to the detectors that track them; epick's
detectors keep none (the concurrency detector reads the in-flight producer), so there is nothing to
forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

from pydantic import Field

from epick.framework import Endpoint, NamedPlugin, Reads, SaturationDetector, StagedSaturationDetector
from epick.framework.metrics import LLMD_SUBSYSTEM, MetricSample
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "max-saturation-detector"
Stage = Literal["prefill", "decode"]


class MaxSaturationParameters(Parameters):
    detectors: list[str] = Field(min_length=1)
    stages: dict[str, list[Stage]] = Field(default_factory=dict)


class MaxSaturationDetector(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.HISTORY  # whatever its detectors read

    def __init__(
        self,
        name: str | None,
        detectors: Sequence[tuple[str, SaturationDetector]],
        stages: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        super().__init__(name)
        self.detectors = tuple(detectors)
        self.stages = {k: frozenset(v) for k, v in (stages or {}).items()}
        self.last: dict[tuple[str, str], float] = {}  # (detector, stage) -> its last answer

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.stage_saturation("", endpoints)

    def stage_saturation(self, stage: str, endpoints: Sequence[Endpoint]) -> float:
        highest = 0.0
        for name, detector in self.detectors:
            only = self.stages.get(name)
            if stage and only is not None and stage not in only:
                continue
            if isinstance(detector, StagedSaturationDetector):
                value = detector.stage_saturation(stage, endpoints)
            else:
                value = detector.pool_saturation(endpoints)
            self.last[(name, stage)] = value
            highest = max(highest, value)
        return highest

    # ExportsMetrics
    def metric_samples(self) -> Iterator[MetricSample]:
        for (detector, stage), value in sorted(self.last.items()):
            yield MetricSample(
                f"{LLMD_SUBSYSTEM}_flow_control_detector_saturation",
                "[ALPHA] The last saturation each detector of a max-saturation-detector reported, by stage.",
                "gauge",
                value,
                labels=(("detector", detector), ("stage", stage)),
                plugin_labels=False,
            )


def _factory(name: str, params: MaxSaturationParameters, handle: Handle) -> MaxSaturationDetector:
    found: list[tuple[str, SaturationDetector]] = []
    for i, ref in enumerate(params.detectors):
        where = f"detectors[{i}]"
        if ref == name:
            raise ParameterError(where, "a max-saturation-detector cannot name itself")
        if any(ref == seen for seen, _ in found):
            raise ParameterError(where, f"detector {ref!r} is listed twice", "list each detector once")
        try:
            plugin = handle.plugin(ref)
        except LookupError as e:
            hint = e.args[1] if len(e.args) > 1 else ""
            raise ParameterError(where, f"no plugin named {ref!r} in this config", str(hint)) from None
        if not isinstance(plugin, SaturationDetector):
            raise ParameterError(
                where,
                f"plugin {ref!r} ({plugin.typed_name.type}) is not a saturation detector",
                "name utilization-detector or concurrency-detector plugins",
            )
        found.append((ref, plugin))
    for key, listed in params.stages.items():
        if key not in params.detectors:
            raise ParameterError(
                f"stages.{key}", f"{key!r} is not one of the detectors", "key stages by detector"
            )
        if not listed:
            raise ParameterError(f"stages.{key}", "an empty stage list", "list prefill, decode or both")
    return MaxSaturationDetector(name, found, params.stages)


SPEC = PluginSpec(
    TYPE,
    _factory,
    MaxSaturationParameters,
    "flow-control saturation: the highest of several detectors'",
    worker_state="",
)
