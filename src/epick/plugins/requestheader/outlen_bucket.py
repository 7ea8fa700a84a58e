"""`outlen-bucket`: a guess, before any token is generated, of how long the response will be.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/requestheader/outlenbucket,
outlenbucket.go and README.md at acc2ee54; Alpha): a request-header processor with no parameters that
reads the parsed body and publishes a `Bucket`, UNKNOWN (0), SHORT (1, under ~500 output tokens) or
LONG (2, ~2000 and more), under the producer-less key "outlen-bucket/" (upstream's
`NewDataKey("outlen-bucket", "")`). UNKNOWN is published too, so a missing value and UNKNOWN read
alike (`read_bucket`).

The signals:
- chat completions only: `chat_template_kwargs.enable_thinking` (a boolean, one of Go's
  `strconv.ParseBool` spellings, or a number: non-zero is true), else DeepSeek's
  `chat_template_kwargs.thinking.type` "enabled" / "disabled"; the budget
  `chat_template_kwargs.thinking_budget`, else Nemotron's `reasoning_budget` (a whole number, or a
  string of one); a non-empty `tools` list; `continue_final_message: true`;
- the Responses API: a non-empty `tools` list;
- any JSON body: `tool_choice` (a string as given; any object is a named tool) and, when
  enable_thinking is unset, `reasoning.effort` ("none": thinking off; any other non-empty string:
  on);
- the request's output cap (epick's `RequestBody.max_tokens`: upstream's normalised
  `MaxOutputTokens`, e.g. chat's `max_completion_tokens` then `max_tokens`).

First match wins: thinking on → LONG; thinking unset and budget > 4000 → LONG; tool_choice
`required` or named → SHORT; tools, thinking not on and tool_choice not `none` → SHORT;
continue_final_message → SHORT; 0 < cap < 500 → SHORT; else UNKNOWN. Last, a LONG with a cap
0 < cap < 500 becomes SHORT and one with 500 <= cap < 2000 UNKNOWN.

As upstream's code (not its README), `tool_choice` is read from any JSON body, so an Anthropic
messages body's `tool_choice` object (`{"type": "auto"}`) reads as a named tool: SHORT.

Upstream's consumer is `inflight-load-producer` with `addEstimatedOutputTokens`: it adds a flat
output estimate by bucket (LONG 4096, SHORT 100, UNKNOWN 1000) capped by the client's positive cap and
`maxEstimatedOutputTokens` (`estimated_output_tokens` here). Deviation until that producer reads the
bucket: epick's `inflight-load-producer` still estimates round(prompt × outputRatio), so nothing in
epick consumes the bucket yet.

Where the bucket lives: upstream puts it in the request's attribute store; epick's requests are
immutable, so it goes to the request's cycle state (written before admission, read by the producers,
the scheduler and the PreRequest hooks of that request), as `agent-identity` does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

from epick.framework import CycleState, InferenceRequest, NamedPlugin, Reads, RequestBody
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, NoParameters, PluginSpec

TYPE = "outlen-bucket"
OUTLEN_BUCKET_KEY = data_key("outlen-bucket", "")  # upstream's AttributeKey: no producer name

LONG_BUDGET_TOKENS = 4000  # a thinking budget above this is LONG (when enable_thinking is unset)
SHORT_MAX_OUTPUT_TOKENS = 500  # a cap below this is SHORT
LONG_FLOOR_TOKENS = 2000  # a LONG under a cap below this cannot be long: downgraded
TOOL_CHOICE_NAMED = "named"

# The flat output estimates upstream's in-flight producer adds by bucket (inflightload's
# SimpleTokenEstimator): SHORT < UNKNOWN < LONG.
LONG_OUTPUT_TOKENS = 4096
UNKNOWN_OUTPUT_TOKENS = 1000
SHORT_OUTPUT_TOKENS = 100

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # strconv.ParseBool's spellings
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_GO_INT = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64)'s syntax
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class Bucket(IntEnum):
    """The predicted output length (upstream's `Bucket`, an int8; UNKNOWN is the zero value)."""

    UNKNOWN = 0
    SHORT = 1
    LONG = 2


def _as_bool(value: object) -> bool | None:
    """A JSON value as a boolean (upstream's boolPtrFromAny), None when it is not one."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        if value in _GO_TRUE:
            return True
        if value in _GO_FALSE:
            return False
        return None
    if isinstance(value, int | float):
        return value != 0
    return None


def _as_int64(value: object) -> int | None:
    """A JSON value as a 64-bit integer (upstream's int64PtrFromAny): a whole number, or a string
    of decimal digits with an optional sign; None otherwise (a fraction, out of range, another type)."""
    if isinstance(value, bool):
        return None
    number: int | None = None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            number = int(value)
    elif isinstance(value, str) and _GO_INT.fullmatch(value):
        number = int(value)
    if number is None or not _INT64_MIN <= number <= _INT64_MAX:
        return None
    return number


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""


def tool_choice_kind(value: object) -> str:
    """`tool_choice` normalised: a string as given, "named" for an object, else "" (unset)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return TOOL_CHOICE_NAMED
    return ""


def _effort_thinking(reasoning: object) -> bool | None:
    """`reasoning.effort` as enable_thinking: "none" is off, any other non-empty value on."""
    if not isinstance(reasoning, Mapping):
        return None
    effort = _string(reasoning.get("effort"))
    if not effort:
        return None
    return effort != "none"


@dataclass(frozen=True, slots=True)
class Signals:
    """What the classifier reads of a request (None: unset)."""

    enable_thinking: bool | None = None
    thinking_budget: int | None = None
    has_tools: bool = False
    continue_final_message: bool = False
    tool_choice: str = ""
    max_output_tokens: int | None = None


def classify(signals: Signals) -> Bucket:
    """The cascade, first match wins, then the cap's ceiling on LONG (see the module's docstring)."""
    bucket = _cascade(signals)
    cap = signals.max_output_tokens
    if bucket is Bucket.LONG and cap is not None and cap > 0:
        if cap < SHORT_MAX_OUTPUT_TOKENS:
            return Bucket.SHORT
        if cap < LONG_FLOOR_TOKENS:
            return Bucket.UNKNOWN
    return bucket


def _cascade(s: Signals) -> Bucket:
    if s.enable_thinking is True:
        return Bucket.LONG
    if s.enable_thinking is None and s.thinking_budget is not None and s.thinking_budget > LONG_BUDGET_TOKENS:
        return Bucket.LONG
    if s.tool_choice in ("required", TOOL_CHOICE_NAMED):
        return Bucket.SHORT
    if s.has_tools and s.tool_choice != "none":  # thinking is not on here
        return Bucket.SHORT
    if s.continue_final_message:
        return Bucket.SHORT
    if s.max_output_tokens is not None and 0 < s.max_output_tokens < SHORT_MAX_OUTPUT_TOKENS:
        return Bucket.SHORT
    return Bucket.UNKNOWN


def signals_of(body: RequestBody) -> Signals:
    """What the classifier reads of a parsed request body."""
    raw = body.raw if isinstance(body.raw, Mapping) else None
    enable_thinking: bool | None = None
    budget: int | None = None
    has_tools = False
    continue_final = False
    if raw is not None and body.kind == "chat":
        tools = raw.get("tools")
        has_tools = isinstance(tools, list) and len(tools) > 0
        continue_final = raw.get("continue_final_message") is True
        kwargs = raw.get("chat_template_kwargs")
        if not isinstance(kwargs, Mapping):
            kwargs = {}
        enable_thinking = _as_bool(kwargs.get("enable_thinking"))
        if enable_thinking is None:
            thinking = kwargs.get("thinking")
            if isinstance(thinking, Mapping):
                kind = _string(thinking.get("type"))
                if kind == "enabled":
                    enable_thinking = True
                elif kind == "disabled":
                    enable_thinking = False
        budget = _as_int64(kwargs.get("thinking_budget"))
        if budget is None:
            budget = _as_int64(kwargs.get("reasoning_budget"))
    elif raw is not None and body.kind == "responses":
        tools = raw.get("tools")
        has_tools = isinstance(tools, list) and len(tools) > 0
    tool_choice = ""
    if raw is not None:
        tool_choice = tool_choice_kind(raw.get("tool_choice"))
        if enable_thinking is None:
            enable_thinking = _effort_thinking(raw.get("reasoning"))
    return Signals(enable_thinking, budget, has_tools, continue_final, tool_choice, body.max_tokens)


def estimate_outlen(body: RequestBody) -> Bucket:
    """The bucket of a parsed request body (upstream's `EstimateOutlen`)."""
    return classify(signals_of(body))


def read_bucket(cycle_state: CycleState) -> Bucket:
    """The bucket published for this request; UNKNOWN when none was (the plugin is not configured)."""
    found = cycle_state.read(OUTLEN_BUCKET_KEY, Bucket)
    return found if found is not None else Bucket.UNKNOWN


def estimated_output_tokens(bucket: Bucket, client_cap: int | None, operator_cap: int | None = None) -> int:
    """Upstream's flat output estimate for a bucket (LONG 4096, SHORT 100, UNKNOWN 1000), capped by
    the client's cap when it is > 0 and by the operator's (`maxEstimatedOutputTokens`) when >= 0."""
    estimate = {Bucket.LONG: LONG_OUTPUT_TOKENS, Bucket.SHORT: SHORT_OUTPUT_TOKENS}.get(
        bucket, UNKNOWN_OUTPUT_TOKENS
    )
    if client_cap is not None and 0 < client_cap < estimate:
        estimate = client_cap
    if operator_cap is not None and 0 <= operator_cap < estimate:
        estimate = operator_cap
    return estimate


class OutlenBucket(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.BODY  # the body's fields and output cap; no prompt, no state

    def process_request_headers(self, request: InferenceRequest, cycle_state: CycleState) -> None:
        cycle_state.write(OUTLEN_BUCKET_KEY, estimate_outlen(request.body))


def _factory(name: str, params: NoParameters, handle: Handle) -> OutlenBucket:
    return OutlenBucket(name)


SPEC = PluginSpec(
    TYPE,
    _factory,
    NoParameters,
    "a guess of the response's length (SHORT, LONG, UNKNOWN) from the request's fields",
    worker_state="",
)
