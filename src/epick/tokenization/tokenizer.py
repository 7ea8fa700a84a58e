"""A model's own tokenizer, from its files: `tokenizer.json` (Hugging Face `tokenizers`) and, beside
it, `tokenizer_config.json` (the chat template and the special tokens).

Encoding follows vLLM: a completion prompt is encoded with the special tokens the tokenizer's
post-processor adds (a BOS token, for most models), a chat prompt is rendered with the chat template
and encoded without them (the template writes its own).

Files are found, never downloaded: `locate` takes a directory, a `tokenizer.json` path, or a
Hugging Face model name already in the local Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _Backend

from epick.tokenization.chat import ChatTemplate, ChatTemplateError, compile_template

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TokenizerNotFoundError(LookupError):
    """No tokenizer files for a model: the message says where epick looked."""


def _from_hf_cache(model: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - tokenizers depends on it
        return None
    try:
        found = try_to_load_from_cache(repo_id=model, filename=TOKENIZER_FILE)
    except ValueError:  # not a valid repository id
        return None
    return Path(found) if isinstance(found, str) else None


def locate(source: str, *, search: Sequence[str | Path] = ()) -> Path:
    """The `tokenizer.json` for `source`: a file, a directory holding one, a model name under one of
    the `search` directories (`<dir>/<model>/tokenizer.json`), or a model in the Hugging Face cache."""
    looked: list[str] = []
    path = Path(source).expanduser()
    candidates = [path] if path.name == TOKENIZER_FILE else [path / TOKENIZER_FILE]
    candidates += [Path(d).expanduser() / source / TOKENIZER_FILE for d in search]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
        looked.append(str(candidate))
    cached = _from_hf_cache(source)
    if cached is not None:
        return cached
    looked.append(f"the Hugging Face cache (model {source!r})")
    raise TokenizerNotFoundError(
        f"no tokenizer for {source!r}: looked at {', '.join(looked)} (nothing is downloaded)"
    )


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class Tokenizer:
    """One model's tokenizer. `encode` and `encode_chat` give token ids as vLLM would."""

    def __init__(self, backend: _Backend, config: Mapping[str, Any] | None = None, *, name: str = "") -> None:
        self.backend = backend
        self.config = dict(config or {})
        self.name = name
        self.special_tokens = {
            key: text for key in _SPECIAL_NAMES if (text := _token_text(self.config.get(key))) is not None
        }
        self._template_source = self._default_template(self.config.get("chat_template"))
        self._template: ChatTemplate | None = None

    @classmethod
    def from_file(cls, tokenizer_json: str | Path, *, name: str = "") -> Tokenizer:
        path = Path(tokenizer_json)
        try:
            backend = _Backend.from_file(str(path))
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise ValueError(f"{path}: not a tokenizers file: {e}") from e
        config: dict[str, Any] = {}
        config_path = path.parent / CONFIG_FILE
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ValueError(f"{config_path}: {e}") from e
            if not isinstance(config, dict):
                raise ValueError(f"{config_path}: not a JSON object")
        template_path = path.parent / "chat_template.jinja"  # newer transformers keep it apart
        if "chat_template" not in config and template_path.is_file():
            config["chat_template"] = template_path.read_text()
        return cls(backend, config, name=name or str(path.parent))

    @staticmethod
    def _default_template(value: Any) -> str | None:
        if isinstance(value, str):
            return value
        if isinstance(value, list):  # named templates: the default one
            for entry in value:
                if isinstance(entry, Mapping) and entry.get("name") == "default":
                    return str(entry.get("template", ""))
        return None

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def max_model_len(self) -> int | None:
        value = self.config.get("model_max_length")
        return int(value) if isinstance(value, (int, float)) and value < 10**9 else None

    @property
    def chat_template(self) -> ChatTemplate:
        if self._template is None:
            if self._template_source is None:
                raise ChatTemplateError(f"tokenizer {self.name}: no chat template in its {CONFIG_FILE}")
            self._template = compile_template(self._template_source)
        return self._template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        template = compile_template(chat_template) if chat_template else self.chat_template
        return template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            special_tokens=self.special_tokens,
            tools=tools,
            kwargs=chat_template_kwargs,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        text = self.render_chat(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs,
        )
        return self.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [self.backend.id_to_token(i) or "" for i in ids]


@lru_cache(maxsize=16)
def load(source: str, search: tuple[str, ...] = ()) -> Tokenizer:
    """The tokenizer for `source` (see `locate`), loaded once per process."""
    return Tokenizer.from_file(locate(source, search=search), name=source)
