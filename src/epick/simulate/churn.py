"""Servers restarting during a run (`Churn`): the next server in turn loses its requests and its
KV cache, and leaves the pool for the downtime (the policy told when it leaves and returns) or
restarts in place, unnoticed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epick.simulate.events import PREFILL_SUFFIX, RESTART, RETURN
from epick.simulate.prompts import cached_tokens_fn

if TYPE_CHECKING:
    from epick.simulate.fleet import Fleet


def noticed_restarts(fleet: Fleet) -> bool:
    """Whether a restart takes a server out of the pool for a while (the policy hears it)."""
    return fleet.churn is not None and fleet.churn.downtime > 0


def restart(fleet: Fleet, server: int, now: float) -> None:
    """Server `server` restarts: its requests fail, a new engine with an empty cache replaces
    its own, and it leaves the pool for the downtime (or stays, unnoticed)."""
    assert fleet.churn is not None
    if not fleet.pending():
        return  # the run is over
    name = fleet.views[server].name
    for spec in list(fleet._in_flight.values()):
        record = fleet._records[spec.request_id]
        prefilling = fleet._prefilling.get(spec.request_id + PREFILL_SUFFIX) is not None
        if record.server != server and not (prefilling and record.prefill_server == server):
            continue
        if prefilling:
            # Its prefill on another server runs on, unheard of when it ends (`_engine_due`).
            del fleet._prefilling[spec.request_id + PREFILL_SUFFIX]
            if record.server != server:
                fleet.views[record.server].in_flight -= 1
        del fleet._in_flight[spec.request_id]
        record.failed = f"server {name} restarted"
        record.finish = now
        fleet.policy.finished(spec, record.server, now)
        fleet.done(spec, now)
    old = fleet.engines[server]
    fleet._earlier_busy[server] += old.busy_time
    fleet._earlier_prefix[0] += old.scheduler.prefix_queries
    fleet._earlier_prefix[1] += old.scheduler.prefix_hits
    new = fleet._engine_kind(old.config)
    new.track_loras = old.track_loras
    new.first_tokens = [] if old.first_tokens is not None else None
    fleet.engines[server] = new
    fleet._version[server] += 1  # the old engine's next event goes stale
    fleet._generation[server] += 1
    view = fleet.views[server]
    view.in_flight = 0
    view.cached_tokens = cached_tokens_fn(fleet, server)
    fleet._scraped_epoch = -1  # its metrics start over
    fleet._restarts += 1
    if fleet.churn.downtime > 0:
        fleet._up = [v for v in fleet._up if v.index != server]
        if fleet._membership is not None:
            fleet._membership.server_left(server, now)
        fleet.push(now + fleet.churn.downtime, RETURN, server)
    else:
        fleet._restarted_unnoticed.add(server)
    if fleet.pending():
        fleet.push(now + fleet.churn.interval, RESTART, fleet._restarts)


def rejoin(fleet: Fleet, server: int, now: float) -> None:
    """Server `server` is back in the pool after its downtime, its cache empty."""
    up = {v.index for v in fleet._up} | {server}
    fleet._up = [v for v in fleet.views if v.index in up]
    if fleet._membership is not None:
        fleet._membership.server_joined(server, now)
    if fleet._held:
        fleet.dispatch(now)
