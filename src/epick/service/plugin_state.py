"""What the running config's plugins say about themselves: whether they are ready (readiness) and
their state (`GET /debug/plugins/state` on the metrics port), as upstream's EPP serves them
(llm-d/llm-d-router cmd/epp/runner/health.go `checkPluginReadiness`, pkg/epp/server/
plugin_state_debug.go)."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from epick.framework import Plugin, ReadinessChecker, StateDumper

__all__ = ["PATH", "not_ready", "state_handler", "states"]

log = logging.getLogger(__name__)

PATH = "/debug/plugins/state"
UNSUPPORTED = "plugin does not support state collection"  # upstream's words


def not_ready(plugins: Mapping[str, Plugin]) -> str | None:
    """Why the first plugin that is not ready is not (None when all are), as upstream words it."""
    for plugin in plugins.values():
        if not isinstance(plugin, ReadinessChecker):
            continue
        try:
            reason = plugin.check_ready()
        except Exception as e:  # a broken check is a plugin not ready, not a broken probe
            reason = f"its readiness check failed: {type(e).__name__}: {e}"
        if reason is not None:
            return f"plugin {plugin.typed_name} is not ready: {reason}"
    return None


def states(plugins: Mapping[str, Plugin], now: datetime.datetime | None = None) -> dict[str, object]:
    """The page: `{"timestamp": RFC 3339 UTC, "plugins": {name: {"name", "type", "state"|"message"}}}`.
    A plugin without state, one whose dump fails and one whose dump is not JSON-able get a message."""
    when = now or datetime.datetime.now(datetime.UTC)
    page: dict[str, object] = {}
    for name, plugin in plugins.items():
        entry: dict[str, object] = {"name": name, "type": plugin.typed_name.type}
        if not isinstance(plugin, StateDumper):
            entry["message"] = UNSUPPORTED
        else:
            try:
                state = plugin.dump_state()
                json.dumps(state, allow_nan=False)
            except (TypeError, ValueError) as e:
                entry["message"] = f"plugin returned state that is not JSON: {e}"
            except Exception as e:
                entry["message"] = f"failed to dump plugin state: {type(e).__name__}: {e}"
            else:
                entry["state"] = state
        page[name] = entry
    return {"timestamp": when.isoformat().replace("+00:00", "Z"), "plugins": page}


def state_handler(
    plugins: Callable[[], Mapping[str, Plugin]],
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of `PATH`, over the plugins `plugins()` gives at each request."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.json_response(states(plugins()))

    return handle
