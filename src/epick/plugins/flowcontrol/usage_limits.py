"""Usage-limit policies: each priority band's ceiling on pool saturation (a band dispatches only while
saturation < its ceiling). `compute_limit` gets the bands' priorities, highest first, and a buffer of
ceilings pre-filled with 1.0 to write into.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol/usagelimits):

- `static-usage-limit-policy` (usagelimitpolicy.go): every ceiling is `threshold` (default 1.0: no
  gating). Upstream's README asks for a threshold in (0, 1] but its code checks nothing; neither does
  epick's.
- `priority-holdback-policy` (priorityholdback/): ceilings from `maxCeiling` (default 1.0, in (0, 1])
  for the highest band down to `minCeiling` (required, in [0, 1), below maxCeiling) for the lowest,
  along `shape` "linear" (the only one). `domain` "rank" (default) spaces them evenly by rank,
  c_i = max - i·(max - min)/(N - 1); "value" in proportion to the priority values,
  c_i = min + (p_i - p_min)/(p_max - p_min)·(max - min), every ceiling max when all values are equal.
  A single band gets maxCeiling.
- `soft-reflective-ceiling-policy` (softreflectiveceiling/, no parameters): the highest band's ceiling
  is 1. Band i of N has the reflective ceiling 1 - i·saturation/(N - 1): below it the band is open
  (1.0); from saturation 1 on it is shut (0.0); in between it alternates, open on one call in
  `period` = max(1, round(saturation/(1 - saturation + 1e-9))), every such band on the same calls. The
  policy's one tick counts the calls made with 1 - saturation <= saturation < 1 (any band alternating
  then); a call is open when the tick, after its increment, is a multiple of the period. `round` is
  Go's math.Round (halves away from zero).

Deviation: upstream's static policy reports the type "<name>-type"; epick's reports its config type.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import model_validator

from epick.framework import NamedPlugin, Reads
from epick.plugins.registry import Handle, NoParameters, Parameters, PluginSpec

STATIC_TYPE = "static-usage-limit-policy"
PRIORITY_HOLDBACK_TYPE = "priority-holdback-policy"
SOFT_REFLECTIVE_CEILING_TYPE = "soft-reflective-ceiling-policy"


# --- static-usage-limit-policy ---------------------------------------------------------------------


class StaticUsageLimitParameters(Parameters):
    threshold: float | None = None  # null, as absent: 1.0

    def value(self) -> float:
        return 1.0 if self.threshold is None else self.threshold


class StaticUsageLimitPolicy(NamedPlugin):
    plugin_type = STATIC_TYPE
    reads = Reads.NOTHING

    def __init__(self, name: str | None = None, threshold: float = 1.0) -> None:
        super().__init__(name)
        self.threshold = threshold

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        for i in range(len(ceilings)):
            ceilings[i] = self.threshold


# --- priority-holdback-policy ----------------------------------------------------------------------

SHAPES = ("linear",)
DOMAINS = ("rank", "value")


class PriorityHoldbackParameters(Parameters):
    # Upstream's fields are pointers: null is as good as absent (minCeiling then is missing).
    shape: str | None = None
    domain: str | None = None
    min_ceiling: float | None = None
    max_ceiling: float | None = None

    @model_validator(mode="after")
    def _check(self) -> PriorityHoldbackParameters:
        if self.min_ceiling is None:
            raise ValueError("minCeiling is required")
        errors = []
        if self.shape is not None and self.shape not in SHAPES:
            errors.append(f'unsupported shape "{self.shape}", must be "linear"')
        if self.domain is not None and self.domain not in DOMAINS:
            errors.append(f'unsupported domain "{self.domain}", must be one of: "rank", "value"')
        lo, hi = self.min_ceiling, self.ceiling_max()
        if not 0.0 <= lo < 1.0:
            errors.append(f"minCeiling must be in [0.0, 1.0), got {lo:f}")
        if not 0.0 < hi <= 1.0:
            errors.append(f"maxCeiling must be in (0.0, 1.0], got {hi:f}")
        if lo >= hi:
            errors.append(f"minCeiling ({lo:f}) must be strictly less than maxCeiling ({hi:f})")
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def ceiling_min(self) -> float:
        assert self.min_ceiling is not None  # the validator saw to it
        return self.min_ceiling

    def ceiling_max(self) -> float:
        return 1.0 if self.max_ceiling is None else self.max_ceiling

    def domain_name(self) -> Literal["rank", "value"]:
        return "value" if self.domain == "value" else "rank"


def rank_ceilings(c_min: float, c_max: float, n: int, ceilings: list[float]) -> None:
    """Equal steps by rank from c_max (index 0) down to c_min (index n - 1); n >= 2."""
    spread = c_max - c_min
    steps = float(n - 1)
    for i in range(n):
        ceilings[i] = c_max - float(i) * spread / steps


def value_ceilings(c_min: float, c_max: float, priorities: Sequence[int], ceilings: list[float]) -> None:
    """In proportion to the priority values (highest first) between c_min and c_max."""
    p_min = float(priorities[-1])
    p_max = float(priorities[0])
    p_range = p_max - p_min
    if p_range == 0:
        for i in range(len(priorities)):
            ceilings[i] = c_max
        return
    spread = c_max - c_min
    for i, p in enumerate(priorities):
        ceilings[i] = c_min + (float(p) - p_min) / p_range * spread


class PriorityHoldbackPolicy(NamedPlugin):
    plugin_type = PRIORITY_HOLDBACK_TYPE
    reads = Reads.NOTHING

    def __init__(
        self,
        name: str | None = None,
        min_ceiling: float = 0.0,
        max_ceiling: float = 1.0,
        domain: Literal["rank", "value"] = "rank",
    ) -> None:
        super().__init__(name)
        self.min_ceiling = min_ceiling
        self.max_ceiling = max_ceiling
        self.domain = domain

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        n = len(priorities)
        if n == 0:
            return
        if n == 1:
            ceilings[0] = self.max_ceiling
            return
        if self.domain == "value":
            value_ceilings(self.min_ceiling, self.max_ceiling, priorities, ceilings)
        else:
            rank_ceilings(self.min_ceiling, self.max_ceiling, n, ceilings)


# --- soft-reflective-ceiling-policy ----------------------------------------------------------------


def go_round(x: float) -> float:
    """Go's math.Round: to the nearest integer, halves away from zero (Python's round goes to even)."""
    if math.isnan(x) or math.isinf(x):
        return x
    t = math.trunc(x)
    if abs(x - t) >= 0.5:  # x - trunc(x) is exact in binary floating point
        t += 1 if x > 0 else -1
    return float(t)


class SoftReflectiveCeilingPolicy(NamedPlugin):
    plugin_type = SOFT_REFLECTIVE_CEILING_TYPE
    reads = Reads.HISTORY

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.tick = 0

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        n = len(priorities)
        if n == 0:
            return
        if n == 1:
            ceilings[0] = 1.0
            return
        # The lowest band's reflective ceiling is 1 - saturation: some band alternates iff it does.
        is_open = False
        if saturation >= 1.0 - saturation and saturation < 1.0:
            period = int(max(1.0, go_round(saturation / (1.0 - saturation + 1e-9))))
            self.tick += 1
            is_open = self.tick % period == 0
        ceilings[0] = 1.0
        for i in range(1, n):
            reflective = 1.0 - float(i) * saturation / float(n - 1)
            if saturation < reflective:
                ceilings[i] = 1.0
            elif saturation >= 1.0:
                ceilings[i] = 0.0
            else:
                ceilings[i] = 1.0 if is_open else 0.0


# --- registration ----------------------------------------------------------------------------------


def _static(name: str, params: StaticUsageLimitParameters, handle: Handle) -> StaticUsageLimitPolicy:
    return StaticUsageLimitPolicy(name, params.value())


def _priority_holdback(
    name: str, params: PriorityHoldbackParameters, handle: Handle
) -> PriorityHoldbackPolicy:
    return PriorityHoldbackPolicy(name, params.ceiling_min(), params.ceiling_max(), params.domain_name())


def _soft_reflective(name: str, params: NoParameters, handle: Handle) -> SoftReflectiveCeilingPolicy:
    return SoftReflectiveCeilingPolicy(name)


STATIC_SPEC = PluginSpec(
    STATIC_TYPE,
    _static,
    StaticUsageLimitParameters,
    "flow-control usage limit: one ceiling for every band",
    worker_state="flow control's usage per flow",
)
PRIORITY_HOLDBACK_SPEC = PluginSpec(
    PRIORITY_HOLDBACK_TYPE,
    _priority_holdback,
    PriorityHoldbackParameters,
    "flow-control usage limit: ceilings from maxCeiling down to minCeiling by priority",
    worker_state="flow control's usage per flow",
)
SOFT_REFLECTIVE_CEILING_SPEC = PluginSpec(
    SOFT_REFLECTIVE_CEILING_TYPE,
    _soft_reflective,
    NoParameters,
    "flow-control usage limit: lower bands open on a share of cycles as saturation rises",
    worker_state="flow control's usage per flow",
)
