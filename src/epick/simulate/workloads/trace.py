"""The `trace` workload: replay of a JSONL trace file, and the fixed tokens its string prompts and
`prompt_block_ids` stand for (`word_token`, `trace_block_tokens`).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

import xxhash

from epick.simulate import vocab
from epick.simulate.types import BASE_MODEL, SimRequestSpec
from epick.simulate.workloads.base import Workload, WorkloadError, _is_int
from epick.simulate.workloads.sampling import _TOKENS

TRACE_BLOCK_TOKENS = 16  # tokens per `prompt_block_ids` entry of a trace


def word_token(word: str) -> int:
    """The token id of a word of a trace's string prompt (stable: xxhash64 of its UTF-8, mod VOCAB_SIZE)."""
    return _TOKENS[xxhash.xxh64_intdigest(word.encode("utf-8", "surrogatepass")) % vocab.VOCAB_SIZE]


@lru_cache(maxsize=65_536)
def _block(block_id: int) -> tuple[tuple[int, ...], str]:
    tokens = tuple(
        _TOKENS[xxhash.xxh64_intdigest(f"epick.simulate.block/{block_id}/{j}".encode()) % vocab.VOCAB_SIZE]
        for j in range(TRACE_BLOCK_TOKENS)
    )
    return tokens, vocab.text(tokens)


def trace_block_tokens(block_id: int) -> tuple[int, ...]:
    """The fixed `TRACE_BLOCK_TOKENS` token ids a trace's `prompt_block_ids` entry expands to."""
    return _block(block_id)[0]


def _parse_trace_object(where: str, obj: object, default_id: str) -> SimRequestSpec:
    """One trace line's object as a request; `where` is `file:line` for errors."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")

    def bad(field: str, problem: str) -> WorkloadError:
        return WorkloadError(f"{where}: field '{field}': {problem}")

    arrival = obj.get("arrival")
    if arrival is None:
        raise bad("arrival", "missing (seconds, required)")
    if isinstance(arrival, bool) or not isinstance(arrival, int | float) or not math.isfinite(arrival):
        raise bad("arrival", f"must be a number of seconds, got {arrival!r}")
    if arrival < 0:
        raise bad("arrival", f"must not be negative, got {arrival}")

    output_tokens = obj.get("output_tokens")
    if output_tokens is None:
        raise bad("output_tokens", "missing (required)")
    if not _is_int(output_tokens) or output_tokens < 1:
        raise bad("output_tokens", f"must be a positive integer, got {output_tokens!r}")

    prompt, block_ids = obj.get("prompt"), obj.get("prompt_block_ids")
    if prompt is not None and block_ids is not None:
        raise bad("prompt", "give 'prompt' or 'prompt_block_ids', not both")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise bad("prompt", f"must be a string, got {type(prompt).__name__}")
        words = prompt.split()
        if not words:
            raise bad("prompt", "has no words")
        tokens = tuple(word_token(w) for w in words)
        text = prompt
    elif block_ids is not None:
        if not isinstance(block_ids, list) or not block_ids:
            raise bad("prompt_block_ids", "must be a non-empty list of integers")
        for b in block_ids:
            if not _is_int(b):
                raise bad("prompt_block_ids", f"must hold integers only, got {b!r}")
        blocks = [_block(b) for b in block_ids]
        tokens = tuple(itertools.chain.from_iterable(tokens for tokens, _ in blocks))
        text = " ".join(block_text for _, block_text in blocks)
    else:
        raise bad("prompt", "missing: give 'prompt' (a string) or 'prompt_block_ids' (a list of integers)")

    strings: dict[str, str | None] = {}
    for field in ("model", "session", "request_id"):
        value = obj.get(field)
        if value is not None and (not isinstance(value, str) or not value):
            raise bad(field, f"must be a non-empty string, got {value!r}")
        strings[field] = value
    return SimRequestSpec(
        request_id=strings["request_id"] or default_id,
        text=text,
        tokens=tokens,
        output_tokens=output_tokens,
        model=strings["model"] or BASE_MODEL,
        session=strings["session"],
        arrival=float(arrival),
    )


@dataclass(frozen=True)
class Trace(Workload):
    """Replay of a JSONL trace: one JSON object per line, in order of arrival (blank lines skipped).

    Fields: `arrival` (seconds from the start, required, non-decreasing down the file);
    `output_tokens` (int ≥ 1, required); the prompt as either `prompt` (a string: each
    whitespace-separated word is one token, `word_token(word)`, and the text is the string itself)
    or `prompt_block_ids` (a list of ints: each expands to the same `TRACE_BLOCK_TOKENS` (16) tokens,
    `trace_block_tokens(id)`, so traces can share prefixes without text); optional `model` (default
    "sim-model"), `session`, `request_id` (default `trace-<line number>`; must be unique). Other
    fields are ignored. Errors raise `WorkloadError` naming the file, the line and the field. The
    seed plays no part.
    """

    kind: ClassVar[str] = "trace"

    @property
    def reuses_outputs(self) -> bool:
        return True  # a trace's prompts may repeat anything, outputs included

    path: Path

    def __post_init__(self) -> None:
        if not isinstance(self.path, Path):
            if not isinstance(self.path, str) or not self.path:
                raise WorkloadError(f"{self.kind}: path must be a file path, got {self.path!r}")
            object.__setattr__(self, "path", Path(self.path))
        if self.path.is_dir():
            raise WorkloadError(f"{self.kind}: {self.path} is a directory; give a JSONL file")
        if not self.path.is_file():
            raise WorkloadError(f"{self.kind}: no such file: {self.path}")

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return self._requests()

    def _requests(self) -> Iterator[SimRequestSpec]:
        path = self.path
        last_arrival = 0.0
        seen: set[str] = set()
        try:
            with path.open(encoding="utf-8") as lines:
                for lineno, line in enumerate(lines, 1):
                    if not line.strip():
                        continue
                    where = f"{path}:{lineno}"
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise WorkloadError(f"{where}: not valid JSON: {e.msg} (column {e.colno})") from None
                    spec = _parse_trace_object(where, obj, f"trace-{lineno}")
                    assert spec.arrival is not None
                    if spec.arrival < last_arrival:
                        raise WorkloadError(
                            f"{where}: field 'arrival': {spec.arrival} is before the previous request's "
                            f"{last_arrival}; sort the trace by arrival"
                        )
                    if spec.request_id in seen:
                        raise WorkloadError(f"{where}: field 'request_id': duplicate id {spec.request_id!r}")
                    seen.add(spec.request_id)
                    last_arrival = spec.arrival
                    yield spec
        except UnicodeDecodeError as e:
            raise WorkloadError(f"{path}: not UTF-8 text ({e.reason})") from None
        except OSError as e:
            raise WorkloadError(f"{path}: cannot read: {e.strerror or e}") from None
