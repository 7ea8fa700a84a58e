"""Chat templates rendered as Hugging Face transformers renders them, and so as vLLM does.

The template is a Jinja2 string from the model's `tokenizer_config.json` (`chat_template`: one
string, or a list of `{name, template}` of which `default` is used). It runs in a sandboxed
environment with `trim_blocks` and `lstrip_blocks` and the loop-control extension, with
transformers' helpers: the `tojson` filter (no ASCII escaping), `raise_exception(message)` and
`strftime_now(format)`. Its variables: `messages`, `add_generation_prompt`, `tools` and `documents`
when given, the special tokens by name (`bos_token`, `eos_token`, ...), and any
`chat_template_kwargs`.

Message content. vLLM looks at how the template reads `message['content']`: a template that loops
over it takes OpenAI's list of parts (the "openai" format); one that uses it as text (the "string"
format) gets the text parts joined with newlines, as vLLM joins them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """A template that does not compile, or that raised while rendering (its own message kept)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


def _loops_over_content(template: str) -> bool:
    """Whether the template iterates over a message's content (vLLM's test for the "openai" format):
    a `for` whose iterable is `<something>['content']` or `<something>.content`."""
    try:
        ast = _ENV.parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in ast.find_all(nodes.For):
        target: nodes.Node | None = loop.iter
        if isinstance(target, nodes.Filter):  # e.g. `message['content'] | selectattr(...)`
            target = target.node
        if (
            isinstance(target, nodes.Getitem)
            and isinstance(target.arg, nodes.Const)
            and target.arg.value == "content"
        ):
            return True
        if isinstance(target, nodes.Getattr) and target.attr == "content":
            return True
    return False


class ChatTemplate:
    """One compiled chat template."""

    def __init__(self, source: str) -> None:
        try:
            self.template = _ENV.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template does not compile: {e}") from e
        self.source = source
        self.content_format = "openai" if _loops_over_content(source) else "string"
        self.knows_developer = '"developer"' in source or "'developer'" in source

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        special_tokens: Mapping[str, str] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text. With `continue_final_message`, the text ends where the last message's
        content ends (the template's closing of that turn is cut), as transformers does."""
        if add_generation_prompt and continue_final_message:
            raise ChatTemplateError("add_generation_prompt and continue_final_message cannot both be set")
        if not messages:
            raise ChatTemplateError("no messages to render")
        conversation = self._conversation(messages)
        if continue_final_message:  # mark where the final message's text ends, then cut there
            final = conversation[-1]
            content = final.get("content")
            if isinstance(content, list) and content and isinstance(content[-1], dict):
                content[-1] = {**content[-1], "text": str(content[-1].get("text", "")) + _CONTINUE_TAG}
            else:
                final["content"] = str(content or "") + _CONTINUE_TAG
        variables: dict[str, Any] = {**(special_tokens or {}), **(kwargs or {})}
        variables.update(messages=conversation, add_generation_prompt=add_generation_prompt)
        if tools is not None:
            variables["tools"] = list(tools)
        if documents is not None:
            variables["documents"] = list(documents)
        try:
            text = self.template.render(**variables)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template failed: {e}") from e
        if continue_final_message:
            at = text.rfind(_CONTINUE_TAG)
            if at < 0:
                at = text.rfind(_CONTINUE_TAG.rstrip())
                if at < 0:
                    raise ChatTemplateError(
                        "continue_final_message: the template does not render the final message's content"
                    )
            text = text[:at]
        return text

    def _conversation(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The messages as vLLM hands them to the template: None-valued fields dropped, content in
        the template's format, tool-call arguments decoded, and `developer` turned into `system`
        (merged into one first system message) for a template that does not know the role."""
        conversation = [self._message(m) for m in messages]
        if not self.knows_developer and any(m.get("role") == "developer" for m in conversation):
            system = [m for m in conversation if m.get("role") in ("system", "developer")]
            rest = [m for m in conversation if m.get("role") not in ("system", "developer")]
            if all(isinstance(m.get("content"), str) for m in system):
                merged = {"role": "system", "content": "\n\n".join(str(m["content"]) for m in system)}
                conversation = [merged, *rest]
        return conversation

    def _message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in message.items() if v is not None}
        content = message.get("content")
        if self.content_format == "string":
            if isinstance(content, list):
                out["content"] = "\n".join(t for t in (_part_text(p) for p in content) if t is not None)
            else:
                out["content"] = "" if content is None else content
        elif content is None:
            out["content"] = []
        elif isinstance(content, str):
            out["content"] = [{"type": "text", "text": content}]
        else:
            out["content"] = [{"type": "text", "text": p} if isinstance(p, str) else dict(p) for p in content]
        calls = out.get("tool_calls")
        if isinstance(calls, list):
            if not calls:
                del out["tool_calls"]
            else:
                out["tool_calls"] = [_decoded_call(c) for c in calls]
        return out


def _decoded_call(call: Any) -> Any:
    """A tool call with its JSON `arguments` string decoded (vLLM's; bad JSON becomes {})."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            decoded = {}
        function["arguments"] = decoded if isinstance(decoded, dict) else {}
    return {**call, "function": function}


def _part_text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, Mapping) and part.get("type") in ("text", "input_text", None) and "text" in part:
        return str(part["text"])
    return None


@lru_cache(maxsize=32)
def compile_template(source: str) -> ChatTemplate:
    return ChatTemplate(source)
