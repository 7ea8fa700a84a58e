"""Running a sweep's cells: one after another in this process (`jobs` 1, the reference), or on a pool
of worker processes. Results come back in the cells' order, whatever order they finish in.

Workers are forked from a server process that has imported the simulator once (`forkserver`; `spawn`
where there is none), so a worker starts in milliseconds and shares nothing with this process but
what a cell carries. A worker runs cells one after another; its memory is its largest cell's
(docs/simulator.md).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from epick.simulate.sweep.cell import Cell, CellOutcome, run_cell

OnDone = Callable[[int, CellOutcome], None]


class WorkerDiedError(Exception):
    """A worker process ended while running a cell (killed, or out of memory)."""


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_local(cells: Sequence[Cell], jobs: int, on_done: OnDone | None = None) -> list[CellOutcome]:
    """Every cell's outcome, in order: in this process with `jobs` 1 (or a single cell), else on
    min(`jobs`, cells) worker processes. The first cell that raises stops the sweep with its error."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    if jobs == 1 or len(cells) <= 1:
        return _serial(cells, on_done)
    return _pool(cells, min(jobs, len(cells)), on_done)


def _serial(cells: Sequence[Cell], on_done: OnDone | None) -> list[CellOutcome]:
    out = []
    for i, cell in enumerate(cells):
        outcome = run_cell(cell)
        out.append(outcome)
        if on_done is not None:
            on_done(i, outcome)
    return out


def _context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["epick.simulate.sweep.cell"])
        return context
    return multiprocessing.get_context("spawn")


def _ignore_interrupts() -> None:
    """A worker leaves Ctrl-C to the parent, which stops the sweep."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pool(cells: Sequence[Cell], workers: int, on_done: OnDone | None) -> list[CellOutcome]:
    results: list[CellOutcome | None] = [None] * len(cells)
    pool = ProcessPoolExecutor(workers, mp_context=_context(), initializer=_ignore_interrupts)
    try:
        index: dict[Future[CellOutcome], int] = {pool.submit(run_cell, c): i for i, c in enumerate(cells)}
        pending: set[Future[CellOutcome]] = set(index)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in sorted(done, key=index.__getitem__):
                i = index[future]
                try:
                    outcome = future.result()
                except BrokenProcessPool:
                    raise WorkerDiedError(
                        f"a worker process died while running cell {i + 1} of {len(cells)} "
                        f"({cells[i].policy.name}, seed {cells[i].seed}): killed, or out of memory?"
                    ) from None
                results[i] = outcome
                if on_done is not None:
                    on_done(i, outcome)
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the sweep now: pending cells cancelled, running ones ended with their workers."""
    processes = list((pool._processes or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join()
