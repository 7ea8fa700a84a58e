"""Running a sweep's cells on a Ray cluster (`pip install epick[ray]`).

Each cell is one Ray task of one CPU: the cell (plain data, a few kilobytes with its config's text)
goes to the cluster, `run_cell` runs it on some node's worker (every node needs the same epick
installed: Ray pickles the function by name), and the summary comes back as plain data. Results are
placed in the cells' order, whatever order they finish in.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from epick.simulate.sweep.cell import Cell, CellOutcome, run_cell
from epick.simulate.sweep.runner import OnDone


class RayMissingError(Exception):
    """--ray-address without Ray installed."""


class RayUnreachableError(Exception):
    """No Ray cluster answers at the address given."""


def run_on_ray(cells: Sequence[Cell], address: str, on_done: OnDone | None = None) -> list[CellOutcome]:
    """Every cell's outcome, in order, from the Ray cluster at `address` ("auto": the one this machine
    belongs to). When this process is already connected to Ray (`ray.init` called), that connection
    is used and kept open."""
    try:
        import ray
    except ImportError:
        raise RayMissingError(
            "--ray-address needs Ray, which is not installed: pip install 'epick[ray]'"
        ) from None
    connected_here = not ray.is_initialized()
    if connected_here:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        except ConnectionError as e:
            raise RayUnreachableError(f"--ray-address {address}: {e}") from None
    try:
        task = ray.remote(num_cpus=1)(run_cell)
        refs = [task.remote(cell) for cell in cells]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[CellOutcome | None] = [None] * len(cells)
        pending: list[Any] = refs
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            for ref in sorted(done, key=index.__getitem__):
                i = index[ref]
                try:
                    outcome: CellOutcome = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    for rest in pending:
                        ray.cancel(rest)
                    raise e.cause from None
                results[i] = outcome
                if on_done is not None:
                    on_done(i, outcome)
    finally:
        if connected_here:
            ray.shutdown()
    return [r for r in results if r is not None]
