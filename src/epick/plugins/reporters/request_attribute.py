"""`request-attribute-reporter` (Beta in llm-d and GIE v1.5.0): a number computed from the response's
token usage with a CEL expression, reported back to the gateway as dynamic metadata.

Upstream: llm-d/llm-d-router at ebab687 (GIE v1.5.0 has the same logic),
pkg/epp/framework/plugins/requestcontrol/requestattributereporter/plugin.go.

Parameters, as upstream's (exactly one attribute):

    attributes:
    - key:
        namespace: envoy.lb                      # optional; empty or absent means envoy.lb
        name: x-gateway-inference-request-cost   # required
      expression: "usage.prompt_tokens + usage.completion_tokens"   # required: CEL, a number
      condition: "has(usage.completion_tokens)"                     # optional: CEL, a bool

Both are compiled when the config loads; a syntax error or an undeclared name is a config error at
`attributes[0].expression` (or `.condition`). Unlike upstream, whose factory crashes on a plugin
entry without `parameters`, epick reports that as "attributes must contain exactly one entry".

The CEL environment has one variable, `usage`, a map built from the response's usage as upstream
builds a `google.protobuf.Struct` from its JSON: `prompt_tokens`, `completion_tokens` and
`total_tokens` are always there (0 when the response reported none), and
`prompt_tokens_details.cached_tokens` is there when the server reported cached tokens. Every number
is a double, so `has(usage.prompt_tokens)` is always true and an unknown field read without `has()`
is an evaluation error.

When the response is complete (upstream: the end-of-stream ResponseBody call), and only when it
did not fail:
- a condition that fails to evaluate, or is anything but `true`: nothing is written;
- the expression must give a double or an int (anything else is logged and nothing is written); it
  is truncated to an integer, and 0 and -1 are not written (-1 is upstream's "not a number",
  which a real -1 cannot be told apart from);
- otherwise `response.dynamic_metadata[namespace][name]` is set to the value (a float), next to what
  other plugins wrote there.

Where the value goes:
- ext_proc: dynamic metadata on the last response-body ProcessingResponse (on the response-trailers
  answer when trailers end the response), e.g. `envoy.lb: {x-gateway-inference-request-cost: 42}`.
- The standalone proxy: a response header named by `key.name`, the value as an integer, on a
  response it reads whole before answering (a request that did not ask for a stream). A streamed
  response's headers are sent before its usage is known, and the proxy sends no HTTP trailers,
  so for a stream the value is only logged (at debug level).

Where epick differs from upstream, which uses cel-go (epick uses cel-python, a pure-Python CEL):
- Arithmetic and comparisons follow cel-go's runtime: `+ - * / %` take operands of one type
  (`usage.prompt_tokens + 1` is an error: a double and an int; write `1.0`), while comparisons and
  equality compare numbers across types (`usage.completion_tokens > 0`).
- At load, epick checks the syntax and that every variable, function and method is declared, as
  cel-go's checker does; a type mismatch cel-go's checker would also refuse (`1 + "a"`) is found
  only when the expression is evaluated (logged; nothing is written).
- epick's usage has no separate total: `total_tokens` is prompt plus completion tokens (what
  OpenAI-compatible servers report), and `prompt_tokens_details` is absent when the server reported
  no cached tokens, also when it reported 0. GIE v1.5.0 spells that field `prompt_token_details`;
  epick uses llm-d's `prompt_tokens_details`.
- A value that is not finite, or beyond a 64-bit integer, is not written (Go's conversion is
  undefined there).
- cel-python evaluates by recursion, within Python's recursion limit: an expression nested too
  deeply for it (about 15 levels of parentheses or conditionals) is refused at load.
- Evaluating costs about half a millisecond per expression per response (cel-python interprets
  its parse tree), on the thread that completes the response.
"""

from __future__ import annotations

import logging
import math
import operator
import sys
from collections.abc import Callable, Iterator
from typing import Any

import celpy
import celpy.celtypes as ct
import lark
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, base_functions
from lark.exceptions import UnexpectedCharacters, UnexpectedToken
from pydantic import Field

from epick.framework import Endpoint, InferenceRequest, NamedPlugin, Reads, Response
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

log = logging.getLogger(__name__)

TYPE = "request-attribute-reporter"
DEFAULT_NAMESPACE = "envoy.lb"
VARIABLE = "usage"

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_FAILED = object()  # an evaluation that failed (already logged)


class AttributeKey(Parameters):
    """Where in the dynamic metadata the value goes."""

    namespace: str = DEFAULT_NAMESPACE
    name: str = ""


class Attribute(Parameters):
    key: AttributeKey = Field(default_factory=AttributeKey)
    expression: str = ""  # CEL; must give a number
    condition: str = ""  # CEL; optional, must give a bool


class RequestAttributeReporterParameters(Parameters):
    attributes: list[Attribute] = Field(default_factory=list)


# --- CEL: compiling, with the checks cel-go's checker makes on names -------------------------------

# Names an expression may use as values: the variable, and type names (`type(x) == int`).
_TYPE_NAMES = frozenset(
    {"bool", "bytes", "double", "dyn", "int", "list", "map", "null_type", "string", "type", "uint"}
)
_GLOBAL_NAMES = _TYPE_NAMES | {VARIABLE, "google"}  # google.protobuf.* wrapper types
# Functions and methods: cel-python's standard library (its operators are named `_+_` and so on).
_FUNCTIONS = frozenset(name for name in base_functions if name.isidentifier()) | {"has", "dyn"}
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})


class _CompileError(Exception):
    pass


class _UndeclaredError(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _environment() -> celpy.Environment:
    # cel-python raises the process's recursion limit whenever an environment is made; epick's
    # limit stays as it was (its expressions are short).
    limit = sys.getrecursionlimit()
    try:
        return celpy.Environment(annotations={VARIABLE: ct.MapType})
    finally:
        sys.setrecursionlimit(limit)


def _children(tree: lark.Tree[Any]) -> Iterator[lark.Tree[Any]]:
    return (c for c in tree.children if isinstance(c, lark.Tree))


def _plain_ident(tree: lark.Tree[Any]) -> str | None:
    """The identifier an expression is made of alone (a macro's variable), or None."""
    node = tree
    while node.data != "ident":
        kids = list(node.children)
        if len(kids) != 1 or not isinstance(kids[0], lark.Tree):
            return None
        node = kids[0]
    return str(node.children[0])


def _check_names(tree: lark.Tree[Any], bound: frozenset[str] = frozenset()) -> None:
    """Raise `_UndeclaredError` for the first variable, function or method CEL would not know."""
    kind = tree.data
    if kind == "ident":
        name = str(tree.children[0])
        if name not in bound and name not in _GLOBAL_NAMES:
            raise _UndeclaredError(name)
        return
    if kind == "dot_ident":  # `.usage`: a name from the root scope
        name = str(tree.children[0])
        if name not in _GLOBAL_NAMES:
            raise _UndeclaredError(name)
        return
    if kind == "ident_arg":  # f(args)
        name = str(tree.children[0])
        if name not in _FUNCTIONS:
            raise _UndeclaredError(name)
    elif kind == "dot_ident_arg":
        raise _UndeclaredError(str(tree.children[0]))
    elif kind == "member_dot_arg":  # target.method(args)
        target, method = tree.children[0], str(tree.children[1])
        args = [list(_children(c)) for c in tree.children[2:] if isinstance(c, lark.Tree)]
        exprs = args[0] if args else []
        if method in _MACROS and exprs:
            var = _plain_ident(exprs[0])
            if var is None:
                raise _CompileError(f"the first argument of {method}() must be a variable name")
            assert isinstance(target, lark.Tree)
            _check_names(target, bound)
            for expr in exprs[1:]:
                _check_names(expr, bound | {var})
            return
        if method not in _FUNCTIONS:
            raise _UndeclaredError(method)
    for child in _children(tree):
        _check_names(child, bound)


def _describe_syntax_error(text: str, error: CELParseError) -> str:
    cause = error.__context__
    where = f"line {error.line}, column {error.column}" if error.line else "somewhere"
    if isinstance(cause, UnexpectedToken):
        token = cause.token
        found = "end of the expression" if token.type == "$END" else repr(str(token))
        return f"syntax error at {where}: unexpected {found}"
    if isinstance(cause, UnexpectedCharacters):
        return f"syntax error at {where}: unexpected character {cause.char!r}"
    return f"syntax error at {where}" if text.strip() else "the expression is empty"


def _compile(env: celpy.Environment, text: str) -> celpy.Runner:
    """The program for `text`; `_CompileError` says why there is none."""
    try:
        ast = env.compile(text)
    except CELParseError as e:
        raise _CompileError(_describe_syntax_error(text, e)) from None
    except RecursionError:
        raise _CompileError("the expression is nested too deeply") from None
    try:
        _check_names(ast)
    except _UndeclaredError as e:
        raise _CompileError(f"undeclared reference to {e.name!r}") from None
    except RecursionError:
        raise _CompileError("the expression is nested too deeply") from None
    return env.program(ast, functions=_STRICT_FUNCTIONS)


_HEADROOM = 200  # stack frames a hook's caller may use (a server's handler, the director)
_SAMPLE_USAGE = {
    "prompt_tokens": 1.0,
    "completion_tokens": 1.0,
    "total_tokens": 2.0,
    "prompt_tokens_details": {"cached_tokens": 1.0},
}


def _trial(program: celpy.Runner) -> None:
    """Evaluate once, as deep in the stack as a response hook may run: cel-python evaluates by
    recursion, and an expression too deep for the interpreter's recursion limit is refused at load
    rather than failing on every response. Other errors depend on the data and are left for then."""

    def descend(depth: int) -> None:
        if depth:
            descend(depth - 1)
            return
        try:
            program.evaluate({VARIABLE: json_to_cel(_SAMPLE_USAGE)})
        except RecursionError:
            raise
        except Exception as e:
            if isinstance(e.__cause__, RecursionError) or (e.args and e.args[1:2] == (RecursionError,)):
                raise RecursionError from None

    try:
        descend(_HEADROOM)
    except RecursionError:
        raise _CompileError("the expression is nested too deeply for epick's CEL evaluator") from None


# --- CEL: the operators as cel-go runs them ----------------------------------------------------------


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, ct.BoolType | bool)


def _plain(value: Any) -> int | float:
    """A CEL number as a Python one (cel-python's own refuse to compare across types)."""
    return float(value) if isinstance(value, float) else int(value)


def _kind(value: object) -> type:
    if isinstance(value, ct.UintType):
        return ct.UintType
    if isinstance(value, int):
        return ct.IntType
    return ct.DoubleType


def _arithmetic(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """cel-go adds, multiplies ... numbers of one type only (no int + double)."""

    def apply(a: Any, b: Any) -> Any:
        if isinstance(a, ct.BoolType | bool) or isinstance(b, ct.BoolType | bool):
            raise TypeError("no such overload")
        if _numeric(a) and _numeric(b):
            if _kind(a) is not _kind(b):
                raise TypeError("no such overload")
            if isinstance(a, float):  # cel-python leaves some double results as plain floats
                if op is operator.mod:
                    raise TypeError("no such overload")  # CEL has no double remainder
                if op is operator.truediv:
                    return ct.DoubleType(_div(float(a), float(b)))
                return ct.DoubleType(op(float(a), float(b)))
        return op(a, b)

    apply.__name__ = getattr(op, "__name__", "op")
    return apply


def _div(a: float, b: float) -> float:
    if b == 0:  # IEEE: cel-go's double division by zero is an infinity (or NaN), not an error
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
    return a / b


def _comparison(op: Callable[[Any, Any], Any], base: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """cel-go orders numbers across types (double < int) and refuses to order NaN."""

    def apply(a: Any, b: Any) -> Any:
        if _numeric(a) and _numeric(b):
            if (isinstance(a, float) and math.isnan(a)) or (isinstance(b, float) and math.isnan(b)):
                raise TypeError("NaN values cannot be ordered")
            return ct.BoolType(op(_plain(a), _plain(b)))
        return base(a, b)

    apply.__name__ = getattr(base, "__name__", "op")
    return apply


def _equality(equal: bool) -> Callable[[Any, Any], Any]:
    """cel-go's heterogeneous equality: numbers equal across types; other values of two types
    are simply unequal."""
    base = base_functions["_==_"]

    def apply(a: Any, b: Any) -> Any:
        if _numeric(a) and _numeric(b):
            same = _plain(a) == _plain(b)  # Python compares int and float exactly; NaN is unequal to all
        else:
            try:
                same = bool(base(a, b))
            except TypeError:
                same = False
        return ct.BoolType(same if equal else not same)

    apply.__name__ = "bool_eq" if equal else "bool_ne"
    return apply


_STRICT_FUNCTIONS: dict[str, Any] = {
    "_+_": _arithmetic(operator.add),
    "_-_": _arithmetic(operator.sub),
    "_*_": _arithmetic(operator.mul),
    "_/_": _arithmetic(operator.truediv),
    "_%_": _arithmetic(operator.mod),
    "_<_": _comparison(operator.lt, base_functions["_<_"]),
    "_<=_": _comparison(operator.le, base_functions["_<=_"]),
    "_>_": _comparison(operator.gt, base_functions["_>_"]),
    "_>=_": _comparison(operator.ge, base_functions["_>=_"]),
    "_==_": _equality(True),
    "_!=_": _equality(False),
}


# --- The plugin ---------------------------------------------------------------------------------------


def usage_variable(response: Response) -> dict[str, Any]:
    """The `usage` map CEL sees, as upstream's JSON of the response's usage (numbers as doubles)."""
    usage = response.usage
    prompt = usage.prompt_tokens if usage is not None else 0
    completion = usage.completion_tokens if usage is not None else 0
    data: dict[str, Any] = {
        "prompt_tokens": float(prompt),
        "completion_tokens": float(completion),
        "total_tokens": float(prompt + completion),
    }
    if usage is not None and usage.cached_tokens:
        data["prompt_tokens_details"] = {"cached_tokens": float(usage.cached_tokens)}
    return data


class RequestAttributeReporter(NamedPlugin):
    """A ResponseComplete hook: writes the attribute's value into `response.dynamic_metadata`."""

    plugin_type = TYPE
    reads = Reads.NOTHING  # the response only

    def __init__(
        self,
        name: str | None = None,
        *,
        key_name: str,
        expression: str,
        condition: str = "",
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        """Raises `ParameterError` for parameters upstream's `New` refuses."""
        super().__init__(name)
        if not key_name:
            raise ParameterError(
                "attributes[0].key.name", "attributeKey.name cannot be empty", "name the metadata key"
            )
        if not expression:
            raise ParameterError(
                "attributes[0].expression",
                "attributes[0].expression cannot be empty",
                "give a CEL expression over `usage`, e.g. usage.prompt_tokens + usage.completion_tokens",
            )
        self.namespace = namespace or DEFAULT_NAMESPACE
        self.key_name = key_name
        self.expression = expression
        self.condition = condition
        env = _environment()
        self._expression = self._compiled(env, "expression", expression)
        self._condition = self._compiled(env, "condition", condition) if condition else None
        self._complained = False

    @staticmethod
    def _compiled(env: celpy.Environment, what: str, text: str) -> celpy.Runner:
        try:
            program = _compile(env, text)
            _trial(program)
        except _CompileError as e:
            raise ParameterError(
                f"attributes[0].{what}",
                f"failed to compile {what}: {e}",
                f"correct the CEL {what}; its one variable is `usage` (prompt_tokens, completion_tokens, "
                "total_tokens, prompt_tokens_details.cached_tokens)",
            ) from None
        return program

    def value(self, response: Response) -> int | None:
        """The value to report for `response`, or None when nothing is to be written."""
        activation = {VARIABLE: json_to_cel(usage_variable(response))}
        if self._condition is not None:
            met = self._evaluate(self._condition, activation, "condition", self.condition)
            if met is _FAILED:
                return None
            if not isinstance(met, ct.BoolType | bool) or not met:
                log.debug("%s: condition not met: %s", self.typed_name, self.condition)
                return None
        result = self._evaluate(self._expression, activation, "expression", self.expression)
        if result is _FAILED:
            return None
        if isinstance(result, ct.BoolType | bool | ct.UintType) or not isinstance(result, int | float):
            self._complain(
                "expression %r gave a %s, not a double or an int", self.expression, type(result).__name__
            )
            return None
        if isinstance(result, float) and not math.isfinite(result):
            self._complain("expression %r gave %s, not a finite number", self.expression, result)
            return None
        number = int(result)  # truncated toward zero, as Go's int64(float64)
        if not _INT64_MIN <= number <= _INT64_MAX:
            self._complain("expression %r gave %s, beyond a 64-bit integer", self.expression, result)
            return None
        if number in (0, -1):  # zero is not reported; -1 is upstream's "not a number"
            return None
        return number

    def response_complete(self, request: InferenceRequest, response: Response, endpoint: Endpoint) -> None:
        if response.error is not None:
            return
        number = self.value(response)
        if number is None:
            return
        response.dynamic_metadata.setdefault(self.namespace, {})[self.key_name] = float(number)
        log.debug("%s: reported %s/%s = %d", self.typed_name, self.namespace, self.key_name, number)

    def _evaluate(self, program: celpy.Runner, activation: dict[str, Any], what: str, text: str) -> object:
        try:
            return program.evaluate(activation)
        except CELEvalError as e:
            self._complain("%s %r failed: %s", what, text, e.args[0] if e.args else e)
        except Exception as e:  # cel-python's own failures must not fail the response
            self._complain("%s %r failed: %s: %s", what, text, type(e).__name__, e)
        return _FAILED

    def _complain(self, message: str, *args: object) -> None:
        """The first evaluation problem is a warning, later ones debug (one per response otherwise)."""
        level = logging.DEBUG if self._complained else logging.WARNING
        self._complained = True
        log.log(level, "%s: " + message, self.typed_name, *args)


def _factory(
    name: str, params: RequestAttributeReporterParameters, handle: Handle
) -> RequestAttributeReporter:
    if len(params.attributes) != 1:
        raise ParameterError(
            "attributes",
            f"attributes must contain exactly one entry (found {len(params.attributes)})",
            "give one entry with key.name and expression",
        )
    attribute = params.attributes[0]
    return RequestAttributeReporter(
        name,
        key_name=attribute.key.name,
        expression=attribute.expression,
        condition=attribute.condition,
        namespace=attribute.key.namespace,
    )


SPEC = PluginSpec(
    TYPE,
    _factory,
    RequestAttributeReporterParameters,
    "reports a CEL expression over the response's token usage as dynamic metadata (envoy.lb)",
)
