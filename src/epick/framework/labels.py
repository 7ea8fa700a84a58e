"""Kubernetes label selectors: requirements on a pod's labels, all of which must hold.

Two forms, as Kubernetes has them: the string form (`k8s.io/apimachinery/pkg/labels.Parse`: `k=v`,
`k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, `k>1`, `k<2`, comma-joined), parsed by
`parse_label_selector`, and the structured form of a `metav1.LabelSelector` (`matchLabels` and
`matchExpressions` with In, NotIn, Exists and DoesNotExist), read by `from_structured`. Both give a
`LabelSelector`, which matches a label map and renders back to the string form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["LabelSelector", "Requirement", "SelectorError", "from_structured", "parse_label_selector"]


class SelectorError(ValueError):
    """A label selector that does not parse."""


_Op = Literal["in", "notin", "exists", "notexists", "gt", "lt"]


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: _Op
    values: frozenset[str] = frozenset()

    def render(self) -> str:
        """The requirement in the string form (what the API server's labelSelector takes)."""
        op, key, values = self.operator, self.key, sorted(self.values)
        if op == "in":
            return f"{key}={values[0]}" if len(values) == 1 else f"{key} in ({','.join(values)})"
        if op == "notin":
            return f"{key} notin ({','.join(values)})"
        if op == "exists":
            return key
        if op == "notexists":
            return f"!{key}"
        return f"{key}{'>' if op == 'gt' else '<'}{values[0]}"

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        op = self.operator
        if op == "in":
            return present and labels[self.key] in self.values
        if op == "notin":
            return not present or labels[self.key] not in self.values
        if op == "exists":
            return present
        if op == "notexists":
            return not present
        if not present or not _INT.fullmatch(labels[self.key]):
            return False
        have, limit = int(labels[self.key]), int(next(iter(self.values)))
        return have > limit if op == "gt" else have < limit


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """Requirements, all of which a pod's labels must meet; none selects everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def render(self) -> str:
        """The selector in the string form, requirements in order ("" selects everything)."""
        return ",".join(r.render() for r in self.requirements)


_WHITESPACE = " \t\r\n"
_SYMBOLS = "!=(),<>"
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INT = re.compile(r"[+-]?[0-9]+")


def _tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text): kind "id" for identifiers, else the symbol itself ("!=", "==", "(", ...)."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif c in _SYMBOLS:
            two = text[i : i + 2]
            sym = two if two in ("!=", "==") else c
            out.append((sym, sym))
            i += len(sym)
        else:
            j = i
            while j < n and text[j] not in _WHITESPACE and text[j] not in _SYMBOLS:
                j += 1
            out.append(("id", text[i:j]))
            i = j
    return out


def _check_key(key: str) -> None:
    parts = key.split("/")
    if len(parts) > 2:
        raise SelectorError(f"invalid label key {key!r}: at most one '/' is allowed")
    name = parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            raise SelectorError(f"invalid label key {key!r}: the prefix before '/' must not be empty")
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix):
            raise SelectorError(f"invalid label key {key!r}: the prefix must be a DNS subdomain")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        raise SelectorError(
            f"invalid label key {key!r}: the name must be 1-63 alphanumerics, '-', '_' or '.', "
            "starting and ending with an alphanumeric"
        )


def _check_value(key: str, value: str) -> None:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise SelectorError(
            f"invalid value {value!r} for {key!r}: a label value is empty or up to 63 alphanumerics, "
            "'-', '_' or '.', starting and ending with an alphanumeric"
        )


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ("end", "")

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        self.pos += 1
        return tok

    def parse(self) -> LabelSelector:
        if not self.tokens:
            return LabelSelector()
        requirements = [self.requirement()]
        while True:
            kind, lit = self.take()
            if kind == "end":
                return LabelSelector(tuple(requirements))
            if kind != ",":
                raise SelectorError(f"found {lit!r}, expected ',' or the end")
            if self.peek()[0] == "end":
                raise SelectorError("found the end, expected a requirement after ','")
            requirements.append(self.requirement())

    def requirement(self) -> Requirement:
        kind, lit = self.take()
        if kind == "!":
            kind, key = self.take()
            if kind != "id" or key in ("in", "notin"):
                raise SelectorError(f"found {key or 'the end'!r}, expected a label key after '!'")
            _check_key(key)
            return Requirement(key, "notexists")
        if kind != "id" or lit in ("in", "notin"):
            raise SelectorError(f"found {lit or 'the end'!r}, expected a label key")
        key = lit
        _check_key(key)
        kind, lit = self.peek()
        if kind in ("end", ","):
            return Requirement(key, "exists")
        self.take()
        if kind == "id" and lit in ("in", "notin"):
            values = self.value_set()
            for v in values:
                _check_value(key, v)
            return Requirement(key, "in" if lit == "in" else "notin", frozenset(values))
        if kind not in ("=", "==", "!=", "<", ">"):
            raise SelectorError(f"found {lit!r}, expected an operator (=, ==, !=, in, notin, <, >)")
        value = self.exact_value()
        if kind in ("<", ">"):
            if not _INT.fullmatch(value):
                raise SelectorError(f"for '{kind}' the value must be an integer, got {value!r}")
            _check_value(key, value)
            return Requirement(key, "lt" if kind == "<" else "gt", frozenset((value,)))
        _check_value(key, value)
        return Requirement(key, "notin" if kind == "!=" else "in", frozenset((value,)))

    def exact_value(self) -> str:
        kind, lit = self.peek()
        if kind in ("end", ","):
            return ""  # `k=` selects an empty value
        self.take()
        if kind != "id":
            raise SelectorError(f"found {lit!r}, expected a value")
        return lit

    def value_set(self) -> list[str]:
        kind, lit = self.take()
        if kind != "(":
            raise SelectorError(f"found {lit or 'the end'!r}, expected '('")
        values: list[str] = []
        current = ""  # the value being read; commas may leave it empty, as Kubernetes allows
        while True:
            kind, lit = self.take()
            if kind == ")":
                values.append(current)
                return values
            if kind == ",":
                values.append(current)
                current = ""
            elif kind == "id" and not current:
                current = lit
            else:
                raise SelectorError(f"found {lit or 'the end'!r}, expected ',', ')' or a value")


def parse_label_selector(text: str) -> LabelSelector:
    """A Kubernetes label selector in its string form: comma-separated (ANDed) `k`, `!k`, `k=v`,
    `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k>1`, `k<1`. Raises SelectorError."""
    return _Parser(text).parse()


_STRUCTURED_OPS: dict[str, _Op] = {
    "In": "in",
    "NotIn": "notin",
    "Exists": "exists",
    "DoesNotExist": "notexists",
}


def from_structured(match_labels: Mapping[Any, Any], match_expressions: Sequence[Any] = ()) -> LabelSelector:
    """A `metav1.LabelSelector`'s `matchLabels` (sorted by key) and `matchExpressions` (in order);
    raises `SelectorError` naming what is malformed."""
    requirements: list[Requirement] = []
    for key, value in sorted(match_labels.items(), key=lambda kv: str(kv[0])):
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise SelectorError(f"matchLabels must map label names to strings, got {key!r}: {value!r}")
        requirements.append(Requirement(key, "in", frozenset((value,))))
    for expr in match_expressions:
        if not isinstance(expr, Mapping) or not isinstance(expr.get("key"), str) or not expr["key"]:
            raise SelectorError("a matchExpressions entry needs a key")
        key, op, values = expr["key"], expr.get("operator"), expr.get("values") or []
        operator = _STRUCTURED_OPS.get(op) if isinstance(op, str) else None
        if operator is None:
            raise SelectorError(f"matchExpressions {key!r} has an unknown operator {op!r}")
        if operator in ("in", "notin") and (not values or not all(isinstance(v, str) for v in values)):
            raise SelectorError(f"matchExpressions {key!r} {op} needs values")
        kept = frozenset(values) if operator in ("in", "notin") else frozenset()
        requirements.append(Requirement(key, operator, kept))
    return LabelSelector(tuple(requirements))
