"""`epick serve --workers N`: up to N processes serve the proxy, every one deciding on the same state.

One Python process decides and relays on one core. With up to N workers:
- `--min-workers` of them (default 1) always run; the supervisor starts another while the running
  ones are busy and retires the last one added when the others could carry the load
  (`epick.service.workers.scaling`). A worker that retires hands its socket to a serving one,
  drains, and leaves its last /metrics page to the supervisor, which keeps adding its counts.
- The supervisor (the process `epick serve` starts) binds one listening socket per worker on the
  proxy's port (SO_REUSEPORT: the kernel spreads new connections over them evenly) and starts N
  worker processes, each accepting on its own. It holds a lock file for the port, so a second epick
  on the same port fails to start, naming the port (as does anything else binding it). It keeps the
  sockets open and gives every worker all of them: while a worker is down (or not started, or
  retired), the hub has a serving worker accept on its socket too, until it serves again.
- Each worker is a whole service (`epick.service.Service`): its own data layer (discovery, scrapes, KV
  events) and its own copy of the config. Scheduling state lives in plugins; those that record what
  decisions did implement `epick.framework.replication.Replicated`: the prefix index (`prefix-cache-scorer`,
  `approx-prefix-cache-producer`), the requests and tokens in flight (`inflight-load-producer`, which
  `active-request-scorer`, `token-load-scorer`, `concurrency-detector` and the affinity and utilization
  filters read), `no-hit-lru-scorer`'s order, and the endpoints' scraped metrics (`epick.datalayer.shared`:
  the freshest scrape of any worker). What one worker records, it publishes to the supervisor's hub, which
  forwards it to every other worker (msgpack frames over a Unix socket), so each worker decides on every
  worker's decisions, the few hundred microseconds an update travels aside. Other stateful plugins keep
  their state per worker (`worker_state`; a warning names them); flow control, whose queues cannot be split,
  is refused with `--workers` above 1. Where either would split the service, the default count
  (`default_workers`) is one.
- A worker that dies is started again (after 0.5 s, doubling to 8 s while it keeps dying; a worker that
  ran 30 s or more before it died starts again after 0.5 s). The hub
  forwards what it had published, then tells the others it left (its requests in flight ended with
  its connections, which are reset: their clients see the error). The new one loads a snapshot of a
  running worker's replicated state, so no decision recorded before is lost.
- Every worker serves ext_proc too, on the same ports (SO_REUSEPORT; the supervisor holds each port
  with a lock and a bound, non-listening socket, so nothing else binds it). The supervisor serves
  `/metrics`, the workers' series merged: counters and histograms summed, gauges the largest.
- SIGHUP is passed on to every worker (each reloads its config); SIGTERM and SIGINT stop them all.
"""

from epick.service.workers.count import cores_available, default_workers, unshared_plugins
from epick.service.workers.link import WorkerLink
from epick.service.workers.supervisor import Supervisor

__all__ = ["Supervisor", "WorkerLink", "cores_available", "default_workers", "unshared_plugins"]
