"""A grid file (`epick simulate --grid grid.yaml`): the axes of a sweep and the settings every cell
shares, validated field by field, and the cells it makes.

    policies: [default, round-robin]         # named policies, as --policy
    configs: [../config/load-only.yaml]      # config files, as --config (relative to the grid file)
    workloads:
      - kind: shared-prefix
        params: {groups: 16, system-tokens: [500, 4000]}   # a list is an axis: one value per point
    loads: {qps: [5, 10, 20]}                # or {concurrency: [...]}
    servers: [4, 8]
    engine_profiles: [llama-3.1-8b-h100, qwen3-32b-tp2-h100]
    seeds: 3                                 # seeds seed, seed+1, …
    metric: ttft_p90                         # what "best" means in the summary

Cells come in the order workloads × servers × engine profiles × loads × policies × seeds.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from epick.sim.engine.profiles import DEFAULT_PROFILE, PROFILES
from epick.simulate.fleet import Arrivals, ClosedLoop, Poisson
from epick.simulate.sweep.cell import Cell, FleetSpec, PolicySpec, WorkloadSpec
from epick.simulate.sweep.figures import DEFAULT_METRIC, FIGURES

Scalar = str | int | float | bool
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class GridError(Exception):
    """A grid file that cannot be read or is invalid: the message names the file and every bad field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkloadAxis(_Strict):
    kind: str = "shared-prefix"
    name: str | None = None  # what the results call it (default: the kind and the values that vary)
    params: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)

    @field_validator("params")
    @classmethod
    def _lists_not_empty(cls, params: dict[str, Scalar | list[Scalar]]) -> dict[str, Scalar | list[Scalar]]:
        for key, value in params.items():
            if isinstance(value, list) and not value:
                raise ValueError(f"parameter {key}: an empty list gives no point")
        return params

    def points(self) -> list[WorkloadSpec]:
        """One workload per combination of the listed parameters' values."""
        axes = {k: v for k, v in self.params.items() if isinstance(v, list)}
        out = []
        for values in itertools.product(*axes.values()):
            chosen: dict[str, Scalar] = dict(zip(axes, values, strict=True))
            params = tuple((k, _param_value(chosen.get(k, v))) for k, v in self.params.items())  # type: ignore[arg-type]
            label = " ".join([self.name or self.kind, *(f"{k}={_param_value(v)}" for k, v in chosen.items())])
            out.append(WorkloadSpec(self.kind, params, label))
        return out


def _param_value(value: Scalar) -> str | int | float:
    """As a command line would give it: a boolean as its word."""
    return str(value).lower() if isinstance(value, bool) else value


class Loads(_Strict):
    qps: list[PositiveFloat] | None = None
    concurrency: list[PositiveInt] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Loads:
        if (self.qps is None) == (self.concurrency is None):
            raise ValueError("give one of qps (Poisson arrivals per second) or concurrency (closed loop)")
        values: Sequence[float] = self.qps if self.qps is not None else self.concurrency or []
        if not values:
            raise ValueError("an empty list gives no point")
        return self

    def arrivals(self) -> list[Arrivals]:
        if self.concurrency is not None:
            return [ClosedLoop(n) for n in self.concurrency]
        return [Poisson(x) for x in self.qps or []]


class Grid(_Strict):
    policies: list[str] = Field(default_factory=list)
    configs: list[str] = Field(default_factory=list)
    workloads: list[WorkloadAxis] = Field(default_factory=lambda: [WorkloadAxis()], min_length=1)
    loads: Loads = Field(default_factory=lambda: Loads(qps=[10.0]))
    servers: list[PositiveInt] = Field(default_factory=lambda: [8], min_length=1)
    prefill_servers: Annotated[int, Field(ge=0, strict=True)] = 0
    engine_profiles: list[str] = Field(default_factory=lambda: [DEFAULT_PROFILE], min_length=1)
    seeds: PositiveInt = 1
    seed: Annotated[int, Field(strict=True)] = 0
    requests: PositiveInt | None = None
    metric: str = DEFAULT_METRIC
    # Settings every cell shares, as the command line's flags of the same names.
    scrape_interval: float | str = "50ms"
    idle_scrape_interval: float | str = 0.0
    num_gpu_blocks: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_loras: PositiveInt | None = None
    slo_ttft: PositiveFloat = 2.0
    slo_tpot: PositiveFloat = 0.1
    kv_event_delay: NonNegativeFloat = 0.0
    restart_every: PositiveFloat | None = None
    restart_downtime: NonNegativeFloat = 0.0

    @field_validator("engine_profiles")
    @classmethod
    def _known_profiles(cls, profiles: list[str]) -> list[str]:
        for name in profiles:
            if name not in PROFILES:
                raise ValueError(f"unknown engine profile {name!r}; known: {', '.join(PROFILES)}")
        return profiles

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in FIGURES:
            raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(FIGURES)}")
        return metric

    @model_validator(mode="after")
    def _consistent(self) -> Grid:
        if not self.policies and not self.configs:
            raise ValueError("give at least one entry under policies or configs")
        for n in self.servers:
            if not self.prefill_servers < n:
                raise ValueError(
                    f"prefill_servers ({self.prefill_servers}) must be less than every fleet size "
                    f"(servers: {n})"
                )
        if self.restart_downtime and self.restart_every is None:
            raise ValueError("restart_downtime needs restart_every (how often a server restarts)")
        if "loads" in self.model_fields_set and self.loads.qps is not None:
            traces = [w.name or w.kind for w in self.workloads if w.kind == "trace"]
            if traces:
                raise ValueError(
                    f"loads.qps does not apply to a trace ({', '.join(traces)}): its lines carry their "
                    "arrival times (loads.concurrency may cap the requests in flight)"
                )
        labels = [spec.name for w in self.workloads for spec in w.points()]
        twice = sorted({label for label in labels if labels.count(label) > 1})
        if twice:
            raise ValueError(f"two workloads are named {twice[0]!r}: give each a different name")
        return self

    def relative_to(self, base: Path) -> Grid:
        """This grid with its config files and trace paths taken relative to `base` (the grid file's
        directory) unless absolute."""

        def resolve(p: str) -> str:
            return p if Path(p).is_absolute() else str(base / p)

        workloads = [
            w.model_copy(update={"params": {**w.params, "path": resolve(str(w.params["path"]))}})
            if w.kind == "trace" and isinstance(w.params.get("path"), str)
            else w
            for w in self.workloads
        ]
        return self.model_copy(update={"configs": [resolve(c) for c in self.configs], "workloads": workloads})

    def workload_points(self) -> list[WorkloadSpec]:
        return [spec for w in self.workloads for spec in w.points()]

    def cells(self, policies: Sequence[PolicySpec], fleet: FleetSpec) -> list[Cell]:
        """Every cell: `policies` (this grid's, resolved) on `fleet` (the shared settings) with each
        fleet size, engine profile, workload, load and seed."""
        out = []
        for workload in self.workload_points():
            for servers, profile in itertools.product(self.servers, self.engine_profiles):
                setup = dataclasses.replace(
                    fleet, servers=servers, engine_profile=profile, prefill_servers=self.prefill_servers
                )
                for arrivals in self.loads.arrivals():
                    for policy in policies:
                        for seed in range(self.seed, self.seed + self.seeds):
                            out.append(Cell(policy, workload, arrivals, seed, setup, self.requests))
        return out


def load_grid(path: str | Path) -> Grid:
    """The grid in the YAML file at `path`, as written (`Grid.relative_to` resolves its paths)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise GridError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    except yaml.YAMLError as e:
        raise GridError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise GridError(
            f"{path}: expected a mapping of settings (policies:, loads:, …), got {type(data).__name__}"
        )
    try:
        return Grid.model_validate(data)
    except ValidationError as e:
        lines = [f"{path}: {e.error_count()} invalid field{'s' if e.error_count() > 1 else ''}:"]
        for error in e.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(top level)"
            lines.append(f"  {where}: {error['msg'].removeprefix('Value error, ')}")
        raise GridError("\n".join(lines)) from None
