"""The command-line syntax of the Go EPP: spf13/pflag's, as `cmd/epp` parses it (what its Helm charts
write), and Go's `flag` package's single-dash long names besides.

- `--name=value` and `--name value`; `-name=value` and `-name value` too (Go's `flag`; pflag reads a
  single dash as shorthand letters and would refuse them);
- a shorthand letter: `-v 3`, `-v=3`, `-v3`;
- a boolean flag alone is true (`--tracing`); its value only after `=` (`--tracing=false`), in the
  spellings of Go's `strconv.ParseBool` (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False);
  `--tracing false` is true and a stray `false`;
- arguments that are not flags do not end the flags (pflag's interspersed mode): they are collected in
  `GoFlags.rest`, which the Go EPP never reads, so the caller warns and ignores them; `--` ends the
  flags and everything after it is such an argument;
- a repeated flag's last value wins, except the slice kinds, which append (`--endpoint-target-ports`);
- arguments starting with `-test.` are skipped, as pflag skips `go test`'s flags.

An unknown flag, a missing value or a value of the wrong kind is a `FlagError` worded as pflag's
("unknown flag: --x", "flag needs an argument: --x", "invalid argument ..."). Integers take Go's base
prefixes (0x, 0o, 0b); durations Go's `time.ParseDuration` syntax (a unit is required: "30s", not "30").
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Sequence
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

Kind = Literal["bool", "string", "int", "float", "duration", "intSlice", "stringSlice"]
Value = bool | str | int | float | tuple[int, ...] | tuple[str, ...]

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DECIMAL = re.compile(r"[+-]?[0-9]+")
_DURATION_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


class FlagError(ValueError):
    """A command line Go's flag package would refuse; the message names the flag."""


class HelpRequested(Exception):  # noqa: N818 - not an error: the caller prints the usage
    """`-h`, `--help` or `-help` (no flag has those names): pflag prints the usage and exits 0."""


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One flag: its name (no dashes), kind, default (as a Python value), usage text, and a one-letter
    shorthand if it has one."""

    name: str
    kind: Kind
    default: Value
    usage: str = ""
    shorthand: str = ""


@dataclass(slots=True)
class GoFlags:
    """A parsed command line: every flag's value (its default unless given), which were given, in
    the order first given, and the arguments that were not flags (which the Go EPP ignores)."""

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

    def integers(self, name: str) -> tuple[int, ...]:
        value = self.values[name]
        assert isinstance(value, tuple), name
        return tuple(int(v) for v in value)

    def strings(self, name: str) -> tuple[str, ...]:
        value = self.values[name]
        assert isinstance(value, tuple), name
        return tuple(str(v) for v in value)

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


def _convert(spec: FlagSpec, text: str, previous: Value, repeated: bool) -> Value:
    if spec.kind == "intSlice":
        # pflag: comma-separated, no spaces (strconv.Atoi on each part); a repeat appends
        parts = text.split(",") if text else []
        if not all(_DECIMAL.fullmatch(part) for part in parts):
            raise ValueError(f"{text!r} is not a comma-separated list of integers")
        items = tuple(int(part) for part in parts)
        return (*previous, *items) if repeated and isinstance(previous, tuple) else items
    if spec.kind == "stringSlice":
        items_s = tuple(next(csv.reader([text]))) if text else ()
        return (*previous, *items_s) if repeated and isinstance(previous, tuple) else items_s
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


def parse_go_flags(argv: Sequence[str], specs: Iterable[FlagSpec]) -> GoFlags:
    """Parse `argv` (without the program name) as the Go EPP's `pflag.Parse()` does (module docstring)."""
    table = {spec.name: spec for spec in specs}
    shorthands = {spec.shorthand: spec for spec in table.values() if spec.shorthand}
    parsed = GoFlags(values={name: spec.default for name, spec in table.items()})
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if len(arg) < 2 or arg[0] != "-":
            parsed.rest.append(arg)  # not a flag: pflag keeps parsing after it
            continue
        if arg == "--":
            parsed.rest.extend(args[i:])
            break
        if arg.startswith("-test."):
            continue
        dash = "--" if arg[1] == "-" else "-"
        body = arg[len(dash) :]
        if not body or body[0] in "-=":
            raise FlagError(f"bad flag syntax: {arg}")
        name, equals, text = body.partition("=")
        has_value = bool(equals)
        spec = table.get(name)
        if spec is None and dash == "-" and body[0] in shorthands:
            # a shorthand: -v 3, -v=3, -v3
            spec = shorthands[body[0]]
            name, has_value, text = spec.shorthand, bool(body[1:]), body[1:].removeprefix("=")
        if spec is None and name in ("h", "help"):
            raise HelpRequested
        if spec is None:
            raise FlagError(f"unknown flag: {dash}{name}")
        if spec.kind == "bool" and not has_value:
            text = "true"
        elif not has_value:
            if i >= len(args):
                raise FlagError(f"flag needs an argument: {dash}{name}")
            text = args[i]
            i += 1
        repeated = spec.name in parsed.given
        try:
            value = _convert(spec, text, parsed.values[spec.name], repeated)
        except ValueError as e:
            raise FlagError(f"invalid argument {text!r} for {dash}{name}: {e}") from None
        parsed.values[spec.name] = value
        if not repeated:
            parsed.given.append(spec.name)
    return parsed
