"""What a workload is: the `Workload` protocol every generator follows, the `WorkloadError` it raises,
and the checks generators and `build_workload` run on their parameters.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import ClassVar, Protocol

from epick.simulate.types import SimRequestSpec


class WorkloadError(ValueError):
    """Invalid workload parameters, or an invalid trace file (the message names file, line and field)."""


class Workload(Protocol):
    """A stream of requests for a fleet simulation."""

    kind: ClassVar[str]  # the name `build_workload` knows it by

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        """The requests, lazily, in order; the same for the same seeded `rng`."""
        ...

    def output_plan(self, request: SimRequestSpec) -> tuple[int, ...]:
        """The token ids the engine should emit for `request`, in order; empty when any will do."""
        return ()

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The LoRA adapters this workload's requests name as `model`, when known in advance."""
        return ()

    @property
    def size(self) -> int | None:
        """How many requests it makes, when known in advance (a trace's is not)."""
        return None

    @property
    def size_parameters(self) -> dict[str, int]:
        """The parameters (kebab-case, as `build_workload` takes them) whose product is `size`, with their
        values; empty when the size is not known in advance."""
        return {}

    @property
    def reuses_outputs(self) -> bool:
        """Whether a later prompt may contain an earlier request's output (a conversation's history):
        only then must engines offer output blocks to the prefix cache."""
        return False


# Parameter checks


def _param(field: str) -> str:
    return field.replace("_", "-")


def _check_int(kind: str, field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{kind}: {_param(field)} must be an integer, got {value!r}")
    if value < minimum:
        raise WorkloadError(f"{kind}: {_param(field)} must be at least {minimum}, got {value}")


def _check_float(
    kind: str, field: str, value: object, minimum: float, *, maximum: float = math.inf, positive: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{kind}: {_param(field)} must be a finite number, got {value!r}")
    if value < minimum or value > maximum or (positive and value <= 0):
        bound = f"greater than {minimum}" if positive else f"at least {minimum}"
        if maximum < math.inf:
            bound = f"between {minimum} and {maximum}"
        raise WorkloadError(f"{kind}: {_param(field)} must be {bound}, got {value}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
