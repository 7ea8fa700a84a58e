"""Go's `flag` package syntax, for command lines written for a Go binary (the EPP's Helm charts).

What Go accepts, this accepts, and the same way:

- one or two dashes alike: `-v=2`, `--v=2`, `-v 2`, `--v 2`;
- a boolean flag alone is true (`--tracing`); its value only after `=` (`--tracing=false`), with
  the spellings of Go's `strconv.ParseBool` (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False);
- parsing stops at the first argument that is not a flag, or after `--`. Go's binary ignores that
  argument and every one after it (`flag.Args()`, which the EPP never reads); here they are returned,
  so that the caller can warn about them.

An unknown flag, a missing value or a value of the wrong type is a `FlagError` naming the flag, as Go's
"flag provided but not defined: -x" is. Durations take Go's `time.ParseDuration` syntax.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "FlagError",
    "FlagSpec",
    "GoFlags",
    "HelpRequested",
    "parse_go_bool",
    "parse_go_duration",
    "parse_go_flags",
]

Kind = Literal["bool", "string", "int", "float", "duration"]
Value = bool | str | int | float

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class FlagError(ValueError):
    """A command line Go's flag package would refuse; the message names the flag."""


class HelpRequested(Exception):  # noqa: N818 - not an error: the caller prints the usage
    """`-h` or `-help` (when no flag has that name): Go prints the usage and exits 0."""


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One flag: its name (no dashes), kind, default (as a Python value) and usage text."""

    name: str
    kind: Kind
    default: Value
    usage: str = ""


@dataclass(slots=True)
class GoFlags:
    """A parsed command line: every flag's value (its default unless given), which were given, in
    the order first given, and the arguments left over (not parsed, as Go leaves them)."""

    values: dict[str, Value]
    given: list[str] = field(default_factory=list)
    rest: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    def was_given(self, name: str) -> bool:
        return name in self.given

    def boolean(self, name: str) -> bool:
        value = self.values[name]
        assert isinstance(value, bool), name
        return value

    def text(self, name: str) -> str:
        value = self.values[name]
        assert isinstance(value, str), name
        return value

    def integer(self, name: str) -> int:
        value = self.values[name]
        assert isinstance(value, int) and not isinstance(value, bool), name
        return value

    def number(self, name: str) -> float:
        value = self.values[name]
        assert isinstance(value, int | float) and not isinstance(value, bool), name
        return float(value)


def parse_go_bool(text: str) -> bool:
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean (true or false)")


def parse_go_duration(text: str) -> float:
    """Seconds from a Go duration ("1m30s", "-2h", "300ms", "0"), as `time.ParseDuration` reads it."""
    s = text
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    pos, seconds = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        seconds += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise ValueError(f"{text!r} is not a duration (write it like 300ms, 10s or 1m30s)")
    return sign * seconds


def _convert(spec: FlagSpec, text: str) -> Value:
    if spec.kind == "bool":
        return parse_go_bool(text)
    if spec.kind == "string":
        return text
    if spec.kind == "duration":
        return parse_go_duration(text)
    if spec.kind == "int":
        # Go's flag.Int takes base prefixes too (strconv.ParseInt(s, 0, 64)): 0x10, 0o17, 0b1.
        try:
            return int(text, 0)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if math.isnan(number) and text.strip().lower() != "nan":
        raise ValueError(f"{text!r} is not a number")
    return number


def parse_go_flags(
    argv: Sequence[str], specs: Iterable[FlagSpec], *, aliases: Mapping[str, str] | None = None
) -> GoFlags:
    """Parse `argv` (without the program name) as Go's `flag.FlagSet.Parse` does."""
    table = {spec.name: spec for spec in specs}
    aliases = aliases or {}
    parsed = GoFlags(values={name: spec.default for name, spec in table.items()})
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if len(arg) < 2 or arg[0] != "-":
            break  # the first argument that is not a flag ends the flags, as in Go
        dashes = 2 if arg[1] == "-" else 1
        if dashes == 2 and len(arg) == 2:
            i += 1  # "--" ends the flags and is itself dropped
            break
        body = arg[dashes:]
        if not body or body[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        name, has_value, text = body.partition("=")
        spec = table.get(aliases.get(name, name))
        if spec is None and name in ("h", "help"):
            raise HelpRequested
        if spec is None:
            raise FlagError(f"flag provided but not defined: -{name}")
        i += 1
        if spec.kind == "bool" and not has_value:
            text = "true"
        elif not has_value:
            if i >= len(args):
                raise FlagError(f"flag needs an argument: -{name}")
            text = args[i]
            i += 1
        try:
            value = _convert(spec, text)
        except ValueError as e:
            raise FlagError(f"invalid value {text!r} for flag -{name}: {e}") from None
        parsed.values[spec.name] = value
        if spec.name not in parsed.given:
            parsed.given.append(spec.name)
    parsed.rest = args[i:]
    return parsed
