"""`--enable-pprof`: profiling endpoints on the metrics port, the Python counterparts of Go's
`/debug/pprof/*` (behind the same authentication as `/metrics`).

- `/debug/pprof/profile?seconds=N` (default 30, at most 300): a CPU profile of the event loop's thread
  for N seconds, with `cProfile`; text sorted by cumulative time, or `&format=pstats` for a file
  `pstats`/snakeviz read.
- `/debug/pprof/goroutine`: the stack of every asyncio task and every thread, as text.
- `/debug/pprof/heap`: with `?seconds=N`, what was allocated and is still alive after N seconds of
  `tracemalloc` tracing, by line; without, the live objects by type (`gc`) and the process's memory.
- `/debug/pprof/`: this list.

Go's pprof protobuf format is not written: no maintained Python library writes it.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import marshal
import pstats
import sys
import threading
import traceback
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["profiling_routes"]

MAX_SECONDS = 300.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INDEX = """\
/debug/pprof/profile?seconds=30[&format=pstats]  CPU profile of the event loop's thread (cProfile)
/debug/pprof/goroutine                           stacks of every asyncio task and thread
/debug/pprof/heap[?seconds=N]                    live objects by type; with seconds, allocations (tracemalloc)
"""

_busy = asyncio.Lock()  # one profile at a time: cProfile and tracemalloc are process-wide


def _seconds(request: web.Request, default: float) -> float:
    try:
        value = float(request.query.get("seconds", default))
    except ValueError:
        raise web.HTTPBadRequest(text="seconds must be a number\n") from None
    if not 0 < value <= MAX_SECONDS:
        raise web.HTTPBadRequest(text=f"seconds must be in (0, {MAX_SECONDS:g}]\n")
    return value


async def _index(request: web.Request) -> web.Response:
    return web.Response(text=INDEX)


async def _profile(request: web.Request) -> web.Response:
    seconds = _seconds(request, 30.0)
    if _busy.locked():
        return web.Response(status=409, text="a profile is already running\n")
    async with _busy:
        profiler = cProfile.Profile()
        profiler.enable()
        try:
            await asyncio.sleep(seconds)
        finally:
            profiler.disable()
    if request.query.get("format") == "pstats":
        profiler.create_stats()
        data = marshal.dumps(profiler.stats)
        return web.Response(body=data, content_type="application/octet-stream")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(80)
    return web.Response(text=out.getvalue())


async def _goroutine(request: web.Request) -> web.Response:
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    out.write(f"{len(tasks)} asyncio tasks\n\n")
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"task {task.get_name()}:\n")
        task.print_stack(file=out)
        out.write("\n")
    frames = sys._current_frames()
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        out.write(f"thread {thread.name}:\n")
        if frame is not None:
            out.write("".join(traceback.format_stack(frame)))
        out.write("\n")
    return web.Response(text=out.getvalue())


async def _heap(request: web.Request) -> web.Response:
    out = io.StringIO()
    if "seconds" not in request.query:
        counts = Counter(type(o).__qualname__ for o in gc.get_objects())
        out.write(f"{sum(counts.values())} objects tracked by the garbage collector, by type:\n")
        for name, count in counts.most_common(60):
            out.write(f"{count:>10}  {name}\n")
        out.write(_memory())
        return web.Response(text=out.getvalue())
    seconds = _seconds(request, 10.0)
    if _busy.locked() or tracemalloc.is_tracing():
        return web.Response(status=409, text="a profile is already running\n")
    async with _busy:
        tracemalloc.start(16)
        try:
            await asyncio.sleep(seconds)
            snapshot = tracemalloc.take_snapshot()
        finally:
            tracemalloc.stop()
    stats = snapshot.statistics("lineno")
    out.write(f"allocated in {seconds:g}s and still alive, by line ({sum(s.size for s in stats)} bytes):\n")
    for stat in stats[:60]:
        out.write(f"{stat.size:>12} B {stat.count:>8}  {stat.traceback}\n")
    out.write(_memory())
    return web.Response(text=out.getvalue())


def _memory() -> str:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            lines = [line for line in status if line.startswith(("VmRSS", "VmHWM"))]
    except OSError:
        return ""
    return "\n" + "".join(lines)


def profiling_routes() -> dict[str, Handler]:
    """The handlers, by path, for the metrics server."""
    return {
        "/debug/pprof/": _index,
        "/debug/pprof/profile": _profile,
        "/debug/pprof/goroutine": _goroutine,
        "/debug/pprof/heap": _heap,
    }
