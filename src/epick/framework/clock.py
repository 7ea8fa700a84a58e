"""The time plugins keep, handed to their factories by the config (`Handle.clock`).

A `Clock` reads the process's monotonic clock until something points it elsewhere: the fleet
simulator makes a config's clock follow virtual time (`follow`), so every plugin built with it keeps
the simulation's time without being patched one by one.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Clock:
    __slots__ = ("_source",)

    def __init__(self, source: Callable[[], float] = time.monotonic) -> None:
        self._source = source

    def __call__(self) -> float:
        return self._source()

    def follow(self, source: Callable[[], float]) -> None:
        """Read `source` from now on (the simulator's virtual time)."""
        self._source = source
