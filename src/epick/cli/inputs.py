"""Reading the JSON files `epick explain` takes: endpoint states, a request, a history."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from epick.config import LoadedConfig
from epick.framework import ROLE_LABEL, BadRequestError, Endpoint, InferenceRequest, Metrics, new_request_id


class InputError(Exception):
    """A bad input file; the message names the file and what is wrong."""


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow")

    def warn_extra(self, source: str, where: str) -> None:
        for key in self.model_extra or {}:
            print(f"warning: {source}: {where}: field {key!r} is not used", file=sys.stderr)


def _model_set(v: Any) -> Any:
    # Adapters may be listed, or given as the Go EPP's map of name -> count.
    if isinstance(v, dict):
        return list(v)
    return v


class MetricsInput(_Lenient):
    waiting_queue_size: int = Field(default=0, ge=0)
    running_requests_size: int = Field(default=0, ge=0)
    kv_cache_usage_percent: float = Field(default=0.0, ge=0.0, le=1.0)
    active_models: list[str] = Field(default_factory=list)
    waiting_models: list[str] = Field(default_factory=list)
    max_active_models: int = Field(default=0, ge=0)
    cache_block_size: int = Field(default=0, ge=0)
    cache_num_blocks: int = Field(default=0, ge=0)
    update_time: float | None = None

    _sets = field_validator("active_models", "waiting_models", mode="before")(_model_set)


class EndpointInput(_Lenient):
    name: str = Field(min_length=1)
    address: str = ""
    port: int = Field(default=0, ge=0, le=65535)
    labels: dict[str, str] = Field(default_factory=dict)
    role: str | None = None
    metrics: MetricsInput = Field(default_factory=MetricsInput)

    def to_endpoint(self) -> Endpoint:
        labels = dict(self.labels)
        if self.role is not None:
            labels.setdefault(ROLE_LABEL, self.role)
        m = self.metrics
        metrics = Metrics(
            waiting_queue_size=m.waiting_queue_size,
            running_requests_size=m.running_requests_size,
            kv_cache_usage_percent=m.kv_cache_usage_percent,
            active_models=frozenset(m.active_models),
            waiting_models=frozenset(m.waiting_models),
            max_active_models=m.max_active_models,
            cache_block_size=m.cache_block_size,
            cache_num_blocks=m.cache_num_blocks,
            update_time=m.update_time,
        )
        return Endpoint(self.name, self.address, self.port, labels, metrics)


def read_json(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path}: not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None


def _validation_message(path: str, where: str, e: ValidationError) -> str:
    problems = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        problems.append(f"{where}{'.' + loc if loc else ''}: {err['msg']}")
    return f"{path}: " + "; ".join(problems)


def read_endpoints(path: str) -> list[Endpoint]:
    raw = read_json(path)
    if not isinstance(raw, list):
        raise InputError(f"{path}: expected a JSON list of endpoints, found {type(raw).__name__}")
    endpoints = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        try:
            parsed = EndpointInput.model_validate(item)
        except ValidationError as e:
            raise InputError(_validation_message(path, f"[{i}]", e)) from None
        if parsed.name in names:
            raise InputError(f"{path}: [{i}].name: endpoint name {parsed.name!r} appears twice")
        names.add(parsed.name)
        parsed.warn_extra(path, f"[{i}]")
        parsed.metrics.warn_extra(path, f"[{i}].metrics")
        endpoints.append(parsed.to_endpoint())
    return endpoints


def request_path(path: str | None, raw: Any) -> str:
    """`--path`, or without it the OpenAI path the body looks like (chat when it has `messages`)."""
    if path is not None:
        return path
    return "/v1/chat/completions" if isinstance(raw, dict) and "messages" in raw else "/v1/completions"


def parse_request(
    config: LoadedConfig,
    raw: Any,
    source: str,
    *,
    path: str | None,
    headers: dict[str, str],
    request_id: str | None = None,
) -> InferenceRequest:
    """The request as the service would parse it: with the config's parser for its path."""
    body = json.dumps(raw).encode()
    where = request_path(path, raw)
    parser = config.parsers.resolve(where)
    if parser is None:
        accepted = ", ".join(config.parsers.accepted) or "none"
        raise InputError(
            f"{source}: no parser of the config accepts the path {where!r} (accepted: {accepted})"
        )
    try:
        parsed = parser.parse_request(where, body, headers)
    except BadRequestError as e:
        raise InputError(f"{source}: {e}") from None
    return InferenceRequest(
        target_model=parsed.model,
        body=parsed.body,
        request_id=request_id or new_request_id(),
        headers=headers,
        objective=headers.get("x-gateway-inference-objective", ""),
        size=len(body),
    )


def read_history(
    config: LoadedConfig, path: str, endpoints: list[Endpoint], request_path: str | None
) -> list[tuple[InferenceRequest, Endpoint]]:
    raw = read_json(path)
    if not isinstance(raw, list):
        raise InputError(f"{path}: expected a JSON list of {{'request': ..., 'endpoint': ...}}")
    by_name = {ep.name: ep for ep in endpoints}
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or "request" not in item or "endpoint" not in item:
            raise InputError(f"{path}: [{i}]: expected an object with 'request' and 'endpoint'")
        name = item["endpoint"]
        if name not in by_name:
            known = ", ".join(by_name) or "none"
            raise InputError(
                f"{path}: [{i}].endpoint: no endpoint named {name!r} in the state (known: {known})"
            )
        headers = item.get("headers") or {}
        if not isinstance(headers, dict):
            raise InputError(f"{path}: [{i}].headers: expected an object")
        request = parse_request(
            config,
            item["request"],
            f"{path}: [{i}].request",
            path=request_path,
            headers=headers,
            request_id=f"history-{i}",
        )
        out.append((request, by_name[name]))
    return out


def parse_headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for v in values:
        key, sep, value = v.partition(":")
        if not sep or not key.strip():
            raise InputError(f"--header {v!r}: expected NAME:VALUE")
        headers[key.strip().lower()] = value.strip()
    return headers
