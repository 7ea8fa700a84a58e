"""The sim server's tokenizer: the built-in one (`epick.sim.tokenizer`, the default) or a model's own
(`--tokenizer PATH`, `epick.tokenization`), behind one interface.

With a model's tokenizer, prompts are encoded as vLLM encodes them: a completion prompt with the
special tokens its post-processor adds (unless `add_special_tokens` is false), a chat with its chat
template, then without special tokens (unless asked). Generated text is still the built-in output
words: each output token is an id of the tokenizer's encoding of one of those words (" the",
" model", ...), drawn deterministically per request, so outputs are valid ids that decode to text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import xxhash

from epick.sim import errors, tokenizer
from epick.tokenization import ChatTemplateError, Tokenizer, TokenizerNotFoundError
from epick.tokenization import load as load_tokenizer

Messages = Sequence[Mapping[str, Any]]


class SimTokenizer:
    """What the server asks of a tokenizer. This base is the built-in tokenizer."""

    name = "built-in"

    @property
    def vocab_size(self) -> int:
        return tokenizer.VOCAB_SIZE

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return tokenizer.tokenize(text)

    def encode_chat(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """The built-in chat rendering (`epick.sim.tokenizer.render_chat`), whatever the options."""
        return tokenizer.tokenize(tokenizer.render_chat(messages))

    def check_ids(self, ids: Sequence[int], param: str) -> None:
        """Refuse (400) ids outside the vocabulary; the built-in tokenizer decodes any id."""

    def prompt_ids(self, ids: Sequence[int], param: str = "prompt") -> list[int]:
        """A prompt given as token ids (the built-in vocabulary takes any id, modulo its size)."""
        return [t % tokenizer.VOCAB_SIZE for t in ids]

    def output_plan(self, seed: str, n: int) -> list[int]:
        return tokenizer.output_plan(seed, n)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return tokenizer.decode(ids)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return [tokenizer.decode([t]) for t in ids]


class ModelTokenizer(SimTokenizer):
    """A model's tokenizer files (`epick.tokenization.Tokenizer`)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.name = tok.name
        words = [tok.encode(" " + w, add_special_tokens=False) for w in tokenizer.OUTPUT_WORDS]
        self._words = [w for w in words if w] or [[0]]

    @property
    def vocab_size(self) -> int:
        return self.tok.vocab_size

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        try:
            return self.tok.encode_chat(
                messages,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                add_special_tokens=add_special_tokens,
                tools=tools,
                chat_template_kwargs=chat_template_kwargs,
            )
        except ChatTemplateError as e:
            raise errors.bad_request(str(e), "messages") from None

    def check_ids(self, ids: Sequence[int], param: str) -> None:
        size = self.vocab_size
        for t in ids:
            if not 0 <= t < size:
                raise errors.bad_request(f"Token id {t} is out of vocabulary", param)

    def prompt_ids(self, ids: Sequence[int], param: str = "prompt") -> list[int]:
        self.check_ids(ids, param)
        return list(ids)

    def output_plan(self, seed: str, n: int) -> list[int]:
        start = xxhash.xxh32_intdigest(seed.encode())
        words, k = self._words, len(self._words)
        n = max(n, 1)
        out: list[int] = []
        i = 0
        while len(out) < n:
            out.extend(words[(start + i * 7919) % k])
            i += 1
        return out[:n]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        return self.tok.token_strings(ids)


BUILTIN = SimTokenizer()


@lru_cache(maxsize=8)
def load(source: str | None) -> SimTokenizer:
    """The built-in tokenizer (None) or the one in `source` (a directory holding tokenizer.json, or
    the file); a ValueError says why it cannot be loaded."""
    if source is None:
        return BUILTIN
    try:
        return ModelTokenizer(load_tokenizer(source))
    except (TokenizerNotFoundError, OSError, ValueError) as e:
        raise ValueError(f"--tokenizer {source!r}: {e}") from None
