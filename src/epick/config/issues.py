"""Config issues from pydantic validation errors: each names its path in the file and a fix (the
closest allowed field for a misspelt one, the fields a plugin's parameters take)."""

from __future__ import annotations

import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from epick.config.errors import ConfigIssue
from epick.config.suggest import did_you_mean

# The error type of a check in `epick.config.schema` that words its own issue: `ctx` holds
# `message` and `fix`.
CONFIG_ISSUE = "config_issue"


def _render_loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that validates the mapping at `loc` (field names by alias), for listing its fields."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = next((f for n, f in model.model_fields.items() if part in (f.alias or n, n)), None)
        model = _nested_model(field.annotation) if field is not None else None
    return model


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _issue_from_pydantic(err: Any, root: type[BaseModel], prefix: str = "") -> ConfigIssue:
    loc = list(err.get("loc", ()))
    path = _render_loc(loc)
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
        allowed = _field_names(model) if model else []
        close = did_you_mean(str(loc[-1]), allowed)
        fix = f"did you mean '{close}'?" if close else "remove it"
        if allowed:
            fix += f" (allowed here: {', '.join(allowed)})"
        return ConfigIssue(path, f"unknown field '{loc[-1]}'", fix)
    if kind == CONFIG_ISSUE:
        ctx = err.get("ctx", {})
        return ConfigIssue(path, str(ctx.get("message", err.get("msg", ""))), str(ctx.get("fix", "")))
    if kind == "missing":
        return ConfigIssue(path, f"required field '{loc[-1]}' is missing", f"add '{loc[-1]}'")
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return ConfigIssue(path, f"{err.get('input')!r} is not allowed here", f"use {expected}")
    msg = err.get("msg", "invalid value")
    return ConfigIssue(path, f"{msg} (got {err.get('input')!r})", "correct the value")


def _params_hint(model: type[BaseModel]) -> str:
    names = _field_names(model)
    return f"; parameters of this type: {', '.join(names)}" if names else "; this type takes no parameters"
