"""Logging as the Go EPP logs: zap's JSON lines with its keys, and `--v` / `--zap-log-level` mapped onto
Python's levels.

One JSON object per line on stderr, with zap's production keys: `level`, `ts` (seconds since the epoch,
a float, zap's default "epoch" time encoding), `logger`, `caller` (`package/file.py:line`), `msg`, and
on an exception `error` and `stacktrace`. (python-json-logger could write the object, but not zap's key
names and level names without as much code as this formatter.)

Verbosity: the Go EPP logs with logr's `V(n)`, shown when `n <= --v` (zap level `-v`); its levels are
DEFAULT 2, VERBOSE 3, DEBUG 4, TRACE 5. epick's messages are Python levels, so `--v` 4 or more shows
DEBUG, anything from 0 shows INFO, and a negative `--v` (zap level above info) WARNING.
`--zap-log-level` wins over `--v`, as upstream: debug, info, error, panic, or a number N (as `--v N`).
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

__all__ = ["ZapJsonFormatter", "configure_logging", "python_level"]

DEBUG_VERBOSITY = 4  # the Go EPP's logutil.DEBUG
_LEVEL_NAMES = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warn",
    logging.ERROR: "error",
    logging.CRITICAL: "fatal",
}
_ZAP_LEVELS = {"debug": logging.INFO, "info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}
_PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def python_level(verbosity: int, zap_log_level: str = "") -> int:
    """The Python level for the Go EPP's `--v` and `--zap-log-level` (which wins when given)."""
    if zap_log_level:
        named = _ZAP_LEVELS.get(zap_log_level.lower())
        if named is not None:
            return named
        verbosity = int(zap_log_level)
    if verbosity >= DEBUG_VERBOSITY:
        return logging.DEBUG
    return logging.INFO if verbosity >= 0 else logging.WARNING


def check_zap_log_level(text: str) -> str:
    """Refuse what controller-runtime's flag refuses: a level name but debug/info/error/panic, or a
    number that is not above 0. Empty: not given."""
    if not text or text.lower() in _ZAP_LEVELS:
        return text
    if text.isdigit() and int(text) > 0:
        return text
    raise ValueError(f"invalid log level {text!r}: one of debug, info, error, panic, or an integer above 0")


class ZapJsonFormatter(logging.Formatter):
    """A log record as one line of zap's JSON (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "level": _LEVEL_NAMES.get(record.levelno, record.levelname.lower()),
            "ts": record.created,
            "logger": record.name,
            "caller": _caller(record.pathname, record.lineno),
            "msg": record.getMessage(),
        }
        if record.exc_info and record.exc_info[1] is not None:
            line["error"] = str(record.exc_info[1]) or type(record.exc_info[1]).__name__
            line["stacktrace"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return json.dumps(line, ensure_ascii=False, default=str, separators=(",", ":"))


def _caller(pathname: str, lineno: int) -> str:
    """zap's short caller: the file's parent directory and name, and the line."""
    path = Path(pathname)
    return f"{path.parent.name}/{path.name}:{lineno}"


def configure_logging(level: int, *, json_lines: bool = True) -> None:
    """Send every log record at `level` or above to stderr, as zap JSON or as text."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(ZapJsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
