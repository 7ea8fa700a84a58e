"""How many workers to run: the cores available, and what would be lost by splitting the service."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

from epick.config import LoadedConfig
from epick.framework.replication import unshared_state

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cores_available(cgroup: Path = CGROUP_ROOT) -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup CPU quota (a
    container's CPU limit, rounded up), cgroup v2's `cpu.max` or v1's `cpu.cfs_quota_us`."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota: float | None = None
    with contextlib.suppress(OSError, ValueError):
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]
        if limit != "max":
            quota = int(limit) / int(period)
    if quota is None:
        with contextlib.suppress(OSError, ValueError):
            limit_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
            period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
            if limit_us > 0 and period_us > 0:
                quota = limit_us / period_us
    if quota is not None and quota > 0:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def default_workers(cores: int, config: LoadedConfig, *, grpc_ports_fixed: bool) -> tuple[int, str]:
    """How many workers `epick serve` runs when `--workers` is not given, and why: one per core,
    unless something would be lost by splitting the service (then one, saying what)."""
    if cores <= 1:
        return 1, "one core is available"
    if config.flow_control is not None:
        return 1, "flow control's queues are one process's"
    if not grpc_ports_fixed:
        return 1, "ext_proc's gRPC ports are chosen by the kernel (0), and workers share fixed ones"
    unshared = unshared_plugins(config)
    if unshared:
        return 1, "these plugins would keep their state per worker: " + "; ".join(unshared)
    return cores, f"{cores} cores are available"


def unshared_plugins(config: LoadedConfig) -> list[str]:
    """The plugins whose state from earlier requests stays per worker, each as "name (type): what"."""
    found = []
    for name, plugin in config.plugins.items():
        state = unshared_state(plugin, config.worker_states.get(name))
        if state:
            found.append(f"{name} ({plugin.typed_name.type}): {state}")
    return found
