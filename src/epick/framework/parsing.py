"""Request parsers: the extension point that turns a request's path and body into what the scheduler
reads, and a response's body into its token usage.

A parser claims path suffixes (`paths`); a `ParserSet` resolves a request path to the parser whose
claimed suffix is the longest match, as upstream does (llm-d/llm-d-router,
pkg/epp/handlers/parsers.go): suffixes are compared as plain string endings (not path segments) after
trimming one trailing "/" from the path and every "/" from the ends of the suffix; a tie goes to the
parser listed first. A parser claiming no paths is the fallback for paths nobody claims; parsers listed
after it are left out, and so is a second parser of a type already listed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from epick.framework.plugin import Plugin
from epick.framework.request import RequestBody
from epick.framework.response import Usage

PARSER = "Parser"


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What a parser makes of one request."""

    body: RequestBody
    model: str = ""  # the model the body names ("" when it names none, or the body is not read)
    # The decoded JSON object, which a model rewrite may change before the body is forwarded; None for
    # a body forwarded as it came (never rewritten, and no model is required).
    payload: dict[str, Any] | None = field(default=None, repr=False)
    skip_response: bool = False  # the response is not read (no usage): e.g. Anthropic's count_tokens


@runtime_checkable
class Parser(Plugin, Protocol):
    """Reads requests on the paths it claims and the usage in their responses."""

    @property
    def paths(self) -> tuple[str, ...]:
        """Claimed path suffixes without leading or trailing "/" ("chat/completions"); none: a fallback."""
        ...

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        """Parse a request body received on `path` (query removed); raise `BadRequestError` naming
        what is wrong."""
        ...

    def parse_response(self, data: bytes, streaming: bool) -> Usage | None:
        """The usage in a response: `data` is the whole body, or for an event stream (`streaming`) one or
        more whole lines of it. None when it holds no usage. Never raises for a body it cannot read.

        A parser may also declare `usage_markers: tuple[bytes, ...]`: whole lines of an event stream
        that contain none of them hold no usage, and are not handed to `parse_response`."""
        ...


HTTP = "http"  # InferencePool appProtocol: HTTP/1.1
H2C = "kubernetes.io/h2c"  # InferencePool appProtocol: HTTP/2 without TLS


def protocol_mismatch(parsers: Iterable[object], app_protocol: str) -> str | None:
    """Why the parsers cannot serve a pool of `app_protocol`, or None (upstream's readiness check,
    cmd/epp/runner/health.go): a parser that names the protocols it serves (`protocols`) must name the
    pool's. A pool that names none constrains nothing; a parser that names none takes any."""
    if not app_protocol:
        return None
    for parser in parsers:
        claims: tuple[str, ...] = getattr(parser, "protocols", ())
        if claims and app_protocol not in claims:
            name = getattr(parser, "typed_name", parser)
            return (
                f"parser {name} serves appProtocol {' or '.join(claims)}, "
                f"not the InferencePool's {app_protocol!r}"
            )
    return None


def normalize_suffix(suffix: str) -> str:
    return suffix.strip().strip("/")


def matches_suffix(path: str, suffix: str) -> bool:
    """Upstream's MatchPathSuffix: a plain ending, after one trailing "/" is trimmed from the path."""
    path = path.strip()
    if path.endswith("/"):
        path = path[:-1]
    return path.endswith(normalize_suffix(suffix))


RESOLVED_PATHS = 1024  # distinct request paths whose parser is remembered


class ParserSet:
    """The configured parsers, in order, resolving request paths (see the module docstring)."""

    def __init__(self, parsers: Sequence[Parser]) -> None:
        self.parsers: list[Parser] = []
        self.skipped: list[tuple[Parser, str]] = []  # left out, and why (for the loader's warnings)
        self.fallback: Parser | None = None
        types: set[str] = set()
        for parser in parsers:
            if self.fallback is not None:
                self.skipped.append(
                    (parser, f"listed after the fallback parser {self.fallback.typed_name.name!r}")
                )
                continue
            if parser.typed_name.type in types:
                self.skipped.append(
                    (parser, f"a parser of type {parser.typed_name.type!r} is listed before it")
                )
                continue
            types.add(parser.typed_name.type)
            self.parsers.append(parser)
            if not parser.paths:
                self.fallback = parser
        self._claims = [
            (normalize_suffix(suffix), parser) for parser in self.parsers for suffix in parser.paths
        ]
        # Paths resolved before: clients use a handful. Bounded, since a client may send any path.
        self._resolved: dict[str, Parser | None] = {}

    def resolve(self, path: str) -> Parser | None:
        """The parser for a request path (query removed), or None when no parser accepts it."""
        try:
            return self._resolved[path]
        except KeyError:
            pass
        parser = self._resolve(path)
        if len(self._resolved) < RESOLVED_PATHS:
            self._resolved[path] = parser
        return parser

    def _resolve(self, path: str) -> Parser | None:
        best: Parser | None = None
        best_len = -1
        for suffix, parser in self._claims:
            if len(suffix) > best_len and matches_suffix(path, suffix):
                best, best_len = parser, len(suffix)
        return best if best is not None else self.fallback

    @property
    def accepted(self) -> list[str]:
        """The claimed suffixes as paths ("/chat/completions"), for an error naming what is served."""
        return sorted({f"/{suffix}" for suffix, _ in self._claims})


def merge_usage(into: Usage | None, new: Usage | None) -> Usage | None:
    """Usage from one more piece of a response, merged as upstream's handler merges it: a non-zero count
    replaces the one held (Anthropic sends input tokens first and output tokens last)."""
    if new is None:
        return into
    if into is None:
        return Usage(new.prompt_tokens, new.completion_tokens, new.cached_tokens)
    if new.prompt_tokens:
        into.prompt_tokens = new.prompt_tokens
    if new.completion_tokens:
        into.completion_tokens = new.completion_tokens
    if new.cached_tokens:
        into.cached_tokens = new.cached_tokens
    return into
