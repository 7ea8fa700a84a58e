"""Workloads by name: `WORKLOADS`, and `build_workload` / `workload_parameters`, which build one from
command-line style parameters and list its parameters with their defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_type_hints

from epick.simulate.workloads.base import Workload, WorkloadError, _is_int, _param
from epick.simulate.workloads.long_doc_qa import LongDocQA
from epick.simulate.workloads.lora_mix import LoraMix
from epick.simulate.workloads.multi_turn import MultiTurn
from epick.simulate.workloads.shared_prefix import SharedPrefix
from epick.simulate.workloads.sharegpt_like import ShareGPTLike
from epick.simulate.workloads.tenancy import TENANCY_PARAMS, Tenancy, TenantWorkload
from epick.simulate.workloads.trace import Trace

WORKLOADS: dict[str, type[Workload]] = {
    cls.kind: cls for cls in (SharedPrefix, MultiTurn, ShareGPTLike, LoraMix, LongDocQA, Trace)
}

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def _workload_class(kind: str) -> type[Workload]:
    cls = WORKLOADS.get(kind)
    if cls is None:
        raise WorkloadError(f"unknown workload {kind!r}; valid: {', '.join(WORKLOADS)}")
    return cls


def workload_parameters(kind: str) -> dict[str, object]:
    """A workload's parameters, kebab-case, with their defaults (`None`: required), in field order."""
    cls = _workload_class(kind)
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        out[_param(f.name)] = None if f.default is dataclasses.MISSING else f.default
    return out


def _convert(kind: str, name: str, value: str | int | float, target: Any) -> object:
    def bad(expected: str) -> WorkloadError:
        return WorkloadError(f"{kind}: parameter {name} must be {expected}, got {value!r}")

    text = value.strip() if isinstance(value, str) else None
    if target is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        if _is_int(value) and value in (0, 1):
            return bool(value)
        raise bad("true or false")
    if target is int:
        if _is_int(value):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if text is not None:
            try:
                return int(text)
            except ValueError:
                pass
        raise bad("an integer")
    if target is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if text is not None:
            try:
                return float(text)
            except ValueError:
                pass
        raise bad("a number")
    if target is Path:
        if text:
            return Path(text)
        raise bad("a file path")
    return value


def build_workload(kind: str, params: Mapping[str, str | int | float]) -> Workload:
    """The workload `kind` with `params` (kebab-case names, e.g. `prompts-per-group`; values as given on
    a command line, strings converted to the field's type). Unknown kinds or parameters, bad values and
    missing required parameters raise `WorkloadError` listing the valid ones. Any workload also takes
    `tenants`, `tenant-weights` and `priorities` (workloads/tenancy.py)."""
    params = {_param(k.strip()): v for k, v in params.items()}
    tenancy = Tenancy.parse(params)
    cls = _workload_class(kind)
    fields = {_param(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    kwargs: dict[str, object] = {}
    for raw_name, value in params.items():
        name = _param(raw_name.strip())
        field = fields.get(name)
        if field is None:
            valid = ", ".join([*fields, *TENANCY_PARAMS])
            raise WorkloadError(f"unknown parameter {raw_name!r} for workload {kind}; valid: {valid}")
        kwargs[field.name] = _convert(kind, name, value, hints[field.name])
    missing = [
        name
        for name, f in fields.items()
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise WorkloadError(f"workload {kind} needs parameter {', '.join(missing)}")
    workload: Workload = cls(**kwargs)
    if tenancy is not None:
        return TenantWorkload(workload, tenancy)
    return workload
