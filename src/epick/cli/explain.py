"""`epick explain`: show every step of one scheduling decision."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from epick.config import LoadedConfig
from epick.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileRunResult,
    Response,
    ScheduleTrace,
    SchedulingError,
    SchedulingResult,
)
from epick.framework.trace import ProfileTrace
from epick.plugins.latency.producer import PredictedLatencyProducer
from epick.requestcontrol.path import RequestPath


@dataclass(slots=True)
class Explanation:
    trace: ScheduleTrace
    result: SchedulingResult | None
    # Per predicted-latency producer (by its typed name), what it predicted for each candidate.
    predictions: dict[str, dict[str, dict[str, float | bool | int]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "primary_profile": self.trace.primary_profile,
            "targets": list(self.trace.targets),
            "profiles": {p.name: _profile_json(p) for p in self.trace.profiles},
            "error": self.trace.error,
        }
        if self.predictions:
            out["predictions"] = self.predictions
        return out


def _predictions(
    config: LoadedConfig, cycle_state: CycleState
) -> dict[str, dict[str, dict[str, float | bool | int]]]:
    found: dict[str, dict[str, dict[str, float | bool | int]]] = {}
    for plugin in config.plugins.values():
        if not isinstance(plugin, PredictedLatencyProducer):
            continue
        predictions = plugin.predictions(cycle_state)
        if predictions is None:
            continue
        found[str(plugin.typed_name)] = {
            name: {
                "ttft_ms": round(p.ttft, 3),
                "tpot_ms": round(p.tpot, 3),
                "ttft_headroom_ms": round(p.ttft_headroom, 3),
                "tpot_headroom_ms": round(p.tpot_headroom, 3),
                "valid": p.valid,
                "dispatched": p.dispatched,
            }
            for name, p in predictions.items()
        }
    return found


def _profile_json(p: ProfileTrace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "filters": [{"plugin": f.plugin, "kept": f.kept} for f in p.filters],
        "scorers": [{"plugin": s.plugin, "weight": s.weight, "scores": s.scores} for s in p.scorers],
        "totals": p.totals,
        "targets": p.targets,
    }
    if p.error is not None:
        out["error"] = p.error
    return out


def replay_history(config: LoadedConfig, history: list[tuple[InferenceRequest, Endpoint]]) -> None:
    """Run each past request through the hooks as if it had been sent to its endpoint and finished."""
    profile = next(iter(config.scheduler.profiles))
    hooks = config.hooks
    for request, endpoint in history:
        result = SchedulingResult({profile: ProfileRunResult((endpoint,))}, profile)
        _, cycle_state = prepare(config, request, [endpoint])
        for pre in hooks.pre_request:
            pre.pre_request(request, result, cycle_state)
        response = Response(request.request_id, end_of_stream=True)
        for received in hooks.response_received:
            received.response_received(request, response, endpoint)
        for complete in hooks.response_complete:
            complete.response_complete(request, response, endpoint)


def prepare(
    config: LoadedConfig, request: InferenceRequest, endpoints: list[Endpoint]
) -> tuple[list[Endpoint], CycleState]:
    """What the request path does before scheduling, without admission: the request-header
    processors, the screeners (the candidates every one keeps) and the data producers."""
    path = RequestPath(config)
    cycle_state = path.read_headers(request)
    kept = list(path.screen(request, cycle_state, endpoints))
    path.produce(request, cycle_state, kept)
    return kept, cycle_state


def explain(config: LoadedConfig, request: InferenceRequest, endpoints: list[Endpoint]) -> Explanation:
    trace = ScheduleTrace()
    endpoints, cycle_state = prepare(config, request, endpoints)
    try:
        result: SchedulingResult | None = config.scheduler.schedule(
            request, endpoints, trace=trace, cycle_state=cycle_state
        )
    except SchedulingError:
        result = None  # the trace holds the error
    return Explanation(trace, result, _predictions(config, cycle_state))


def render(explanation: Explanation, console: Console) -> None:
    trace = explanation.trace
    for plugin, by_endpoint in explanation.predictions.items():
        table = Table(title=f"predicted by {_short(plugin)} (ms)", show_edge=False)
        for column in ("endpoint", "TTFT", "TPOT", "TTFT headroom", "TPOT headroom", "valid", "running"):
            table.add_column(column, justify="left" if column == "endpoint" else "right")
        for name, pred in by_endpoint.items():
            table.add_row(
                name,
                f"{pred['ttft_ms']:.1f}",
                f"{pred['tpot_ms']:.2f}",
                f"{pred['ttft_headroom_ms']:.1f}",
                f"{pred['tpot_headroom_ms']:.2f}",
                "yes" if pred["valid"] else "no",
                str(pred["dispatched"]),
            )
        console.print(table)
    for p in trace.profiles:
        console.rule(f"profile [bold]{p.name}[/bold]")
        console.print(f"candidates: {', '.join(p.candidates)}")
        for f in p.filters:
            console.print(f"filter {f.plugin}: kept {', '.join(f.kept) or 'none'}")
        names = list(p.totals) or (p.filters[-1].kept if p.filters else p.candidates)
        if p.scorers or p.totals:
            table = Table(show_edge=False)
            table.add_column("endpoint")
            for s in p.scorers:
                table.add_column(f"{_short(s.plugin)}\n×{s.weight:g}", justify="right")
            table.add_column("total", justify="right", style="bold")
            for name in names:
                mark = " ◀" if name in p.targets else ""
                row = [name + mark, *(f"{s.scores.get(name, 0.0):.3f}" for s in p.scorers)]
                row.append(f"{p.totals.get(name, 0.0):.3f}")
                table.add_row(*row)
            console.print(table)
        if p.picker:
            console.print(f"picker {p.picker}: {', '.join(p.targets) or 'none'}")
        if p.error:
            console.print(f"[red]error: {p.error}[/red]")
    if trace.error is not None:
        console.print(f"[bold red]scheduling failed:[/bold red] {trace.error}")
        return
    targets = ", ".join(trace.targets)
    console.print(f"[bold]primary profile:[/bold] {trace.primary_profile}   [bold]targets:[/bold] {targets}")
    result = explanation.result
    if result is not None:
        for name, r in result.profile_results.items():
            if name != result.primary_profile and r is not None:
                console.print(f"also {name}: {', '.join(ep.name for ep in r.targets)}")
        for name, r in result.shadow_results.items():
            shown = ", ".join(ep.name for ep in r.targets) if r is not None else "failed"
            console.print(f"shadow {name} (reported only): {shown}")


def _short(typed_name: str) -> str:
    """`name/type` shown as `name` when the two are equal."""
    name, _, type_ = typed_name.partition("/")
    return name if name == type_ else typed_name


def dumps(explanation: Explanation) -> str:
    return json.dumps(explanation.to_json(), indent=2, sort_keys=False)
