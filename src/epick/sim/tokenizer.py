"""A deterministic built-in tokenizer: no vocabulary files, no downloads.

Text is split the way byte-level BPE pre-tokenizers split it: an optional leading space plus a run
of letters, a run of up to three digits, one other symbol, or whitespace. Letter runs longer than
eight characters are cut every eight, approximating how BPE splits rare long words. Each piece's
id is xxhash32 of its UTF-8 bytes modulo the vocabulary (32,000, Llama-2 sized). English prose
comes out at about 4 characters per token, close to Llama's and GPT's tokenizers.

Generated text is drawn from a fixed list of common words whose ids live in their own range, so
`decode` can turn any output back into text.

Chat requests are rendered to one prompt string with a simple template
(`<|role|>\\ncontent\\n` per message, then `<|assistant|>\\n`), then tokenized.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import xxhash

VOCAB_SIZE = 32_000
_PIECE = re.compile(r" ?[^\W\d_]{1,8}| ?\d{1,3}| ?[^\s\w]|\s+(?!\S)|\s+|_")

# Output words, ids VOCAB_SIZE .. VOCAB_SIZE + len - 1 (an extended range no prompt piece maps to).
_OUTPUT_TEXT = (
    "the of and to in is that for it as with was on be by this are or from at an which but not have "
    "has had were their they can more one all will also other these its been into only most some "
    "time such than when then would about there them many first may new over used after between "
    "each two where both very through during model token cache request server batch prefix decode "
    "prefill memory block queue route endpoint latency throughput system data result value"
)
OUTPUT_WORDS = tuple(_OUTPUT_TEXT.split())


def tokenize(text: str) -> list[int]:
    h = xxhash.xxh32_intdigest
    return [h(piece.encode()) % VOCAB_SIZE for piece in _PIECE.findall(text)]


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def render_chat(messages: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(
                str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
            )
        parts.append(f"<|{m.get('role', 'user')}|>\n{content or ''}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def output_plan(seed: str, n: int) -> list[int]:
    """n output token ids, deterministic for a seed."""
    start = xxhash.xxh32_intdigest(seed.encode())
    k = len(OUTPUT_WORDS)
    return [VOCAB_SIZE + (start + i * 7919) % k for i in range(max(n, 1))]


def decode(token_ids: Iterable[int]) -> str:
    k = len(OUTPUT_WORDS)
    return "".join(" " + OUTPUT_WORDS[(t - VOCAB_SIZE) % k] for t in token_ids)
