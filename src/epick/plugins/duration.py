"""Durations in plugin parameters and flags: Go duration strings ("200ms", "1m30s") or seconds."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: object) -> float:
    """Seconds from a Go duration string ("200ms", "1m30s") or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration is a string like '200ms' or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        pos = 0
        seconds = 0.0
        for m in _DURATION_RE.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if not text or pos != len(text):
            raise ValueError(f"{value!r} is not a duration (write it like '200ms', '2s' or '1m30s')")
    else:
        raise ValueError("a duration is a string like '200ms' or a number of seconds")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


# A duration parameter: accepts Go duration strings or seconds, holds seconds.
Duration = Annotated[float, BeforeValidator(parse_duration)]
