"""How many workers run: between `--min-workers` and `--workers`, following the CPU they use.

One process relays hundreds of streamed requests a second on one core, and every worker beyond the
first costs CPU (its own timers, the other workers' updates) and routing quality (its view of the
shared state lags theirs by the time an update travels). So the supervisor starts `--min-workers`
(default 1) and adds one while the running workers are busy, up to `--workers`; it retires the last
one added while the others could carry the load. Busy is CPU: the supervisor reads each running
worker's CPU time from /proc every `sample_s` (no system call in the workers, no wake-up of theirs).

- Up: the running workers averaged at least `up_cpu` of a core over `up_samples` samples in a row.
- Down: over `down_samples` samples in a row, the running workers' CPU would have kept one worker
  fewer at no more than `down_cpu` of a core each. With `down_cpu` below `up_cpu`, the workers left
  after a retirement are not busy at once.
- After a change nothing moves for `settle_s`, counted again from when a started worker serves: a
  new worker starts (imports, config, snapshot) on CPU of its own, and the load takes a moment to
  spread over it (the others close their clients' kept-alive connections after the next response,
  and the kernel spreads the new ones over every worker's socket).
- Only serving workers are sampled: while one starts, samples in a row count again from its start.

The busiest worker is not a trigger of its own: a gateway that keeps one connection to the EPP sends
it all to one worker, however many run.
"""

from __future__ import annotations

import os
from pathlib import Path

from epick.service.settings import WorkerScaling

PROC = Path("/proc")


class ScalingDecision:
    """The count to run from CPU samples: `sample` takes the serving workers' CPU seconds over the
    last `elapsed` seconds and answers +1, -1 or 0."""

    def __init__(self, policy: WorkerScaling, least: int, most: int) -> None:
        self.policy = policy
        self.least, self.most = least, most
        self._busy = 0  # samples in a row over the up threshold
        self._spare = 0  # samples in a row that one worker fewer could have carried
        self._settled_at = -float("inf")

    def sample(self, running: int, cpu_s: float, elapsed: float, now: float, *, room: bool = True) -> int:
        """`room`: whether a worker could start now (the last one retired may still be draining)."""
        policy = self.policy
        if running < 1 or elapsed <= 0:
            return 0
        cores = cpu_s / elapsed
        can_add = room and running < self.most
        self._busy = self._busy + 1 if can_add and cores / running >= policy.up_cpu else 0
        fewer = running - 1
        self._spare = self._spare + 1 if running > self.least and cores <= policy.down_cpu * fewer else 0
        if now - self._settled_at < policy.settle_s:
            return 0
        if self._busy >= policy.up_samples:
            self.settle(now)
            return +1
        if self._spare >= policy.down_samples:
            self.settle(now)
            return -1
        return 0

    def restart(self) -> None:
        """Samples in a row count again from the next (one was skipped: a worker is starting)."""
        self._busy = self._spare = 0

    def settle(self, now: float) -> None:
        """A change took effect at `now` (decided, or a started worker began serving): nothing moves
        for `settle_s`, and samples in a row count again."""
        self.restart()
        self._settled_at = now


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """The user and system CPU time process `pid` has used, from /proc/PID/stat; None where there is
    no such file (another system, or the process is gone)."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15
    except (IndexError, ValueError):
        return None


def measurable(proc: Path = PROC) -> bool:
    """Whether this system shows processes' CPU time where `cpu_seconds` reads it."""
    return cpu_seconds(os.getpid(), proc) is not None
