"""How many workers run: between `--min-workers` and `--workers`, following the CPU they use.

One process relays hundreds of streamed requests a second on one core, and every worker beyond the
first costs CPU (its own timers, the other workers' updates) and routing quality (its view of the
shared state lags theirs by the time an update travels). So the supervisor starts `--min-workers`
(default 1) and adds one while the running workers are busy, up to `--workers`; it retires the last
one added while the others could carry the load. Busy is CPU: the supervisor reads each running
worker's CPU time from /proc every `sample_s` (no system call in the workers, no wake-up of theirs).

- Up: the running workers averaged at least `up_cpu` of a core over `up_samples` samples in a row.
- Down: over `down_samples` samples in a row, the running workers' CPU would have kept one worker
  fewer at no more than `down_cpu` of a core each. `down_cpu` below half of `up_cpu` keeps a retirement
  from calling for the worker back at once.
- After a change nothing moves for `settle_s`: a new worker starts (imports, config, snapshot) on CPU
  of its own, and the load takes a moment to spread over it (new connections only: the kernel hands
  each to one worker's socket).
"""

from __future__ import annotations

import os
from pathlib import Path

from epick.service.settings import WorkerScaling

PROC = Path("/proc")


class ScalingDecision:
    """The count to run from CPU samples: `sample` takes the running workers' CPU seconds over the
    last `elapsed` seconds and answers +1, -1 or 0."""

    def __init__(self, policy: WorkerScaling, least: int, most: int) -> None:
        self.policy = policy
        self.least, self.most = least, most
        self._busy = 0  # samples in a row over the up threshold
        self._spare = 0  # samples in a row that one worker fewer could have carried
        self._settled_at = -float("inf")

    def sample(self, running: int, cpu_s: float, elapsed: float, now: float) -> int:
        policy = self.policy
        if running < 1 or elapsed <= 0:
            return 0
        cores = cpu_s / elapsed
        self._busy = self._busy + 1 if running < self.most and cores / running >= policy.up_cpu else 0
        fewer = running - 1
        self._spare = self._spare + 1 if running > self.least and cores <= policy.down_cpu * fewer else 0
        if now - self._settled_at < policy.settle_s:
            return 0
        if self._busy >= policy.up_samples:
            return self._moved(now, +1)
        if self._spare >= policy.down_samples:
            return self._moved(now, -1)
        return 0

    def _moved(self, now: float, step: int) -> int:
        self._busy = self._spare = 0
        self._settled_at = now
        return step


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
