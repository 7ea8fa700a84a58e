"""Workload generators for `epick simulate`: the request streams a fleet simulation routes.

A workload is a small frozen dataclass of parameters. `requests(rng)` draws one seed from `rng` at
once and returns a lazy iterator of `SimRequestSpec`s, so a seeded `Random` always gives the same
stream (whatever else the caller later draws from it) and a million requests never sit in memory
together. Generated prompts use `epick.simulate.vocab`: one word is one token and `text` is
`vocab.text(tokens)`, so equal text prefixes are equal token prefixes. A shared prefix (system
prompt, document) is generated once as a tuple and reused by every request that shares it; token
ids are drawn from one pool of int objects, so a request's tuple holds pointers, not new ints.

Every workload can also say which tokens the engine should emit for a request (`output_plan`, empty
for "any"; only `MultiTurn` needs it, since its later prompts contain the earlier answers) and which
LoRA adapters its requests name (`adapter_names`, empty unless `LoraMix`).

Workloads: `SharedPrefix`, `MultiTurn`, `ShareGPTLike`, `LoraMix`, `LongDocQA`, `Trace`; build one
by name with `build_workload("shared-prefix", {"groups": 150})`. See docs/workloads.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Protocol, get_type_hints

import xxhash

from epick.simulate import vocab
from epick.simulate.types import BASE_MODEL, SimRequestSpec

__all__ = [
    "BASE_MODEL",
    "TRACE_BLOCK_TOKENS",
    "WORKLOADS",
    "LongDocQA",
    "LoraMix",
    "MultiTurn",
    "ShareGPTLike",
    "SharedPrefix",
    "Trace",
    "Workload",
    "WorkloadError",
    "assistant_tokens",
    "build_workload",
    "trace_block_tokens",
    "word_token",
    "workload_parameters",
]

TRACE_BLOCK_TOKENS = 16  # tokens per `prompt_block_ids` entry of a trace

# Every token id as one shared int object: prompts are tuples of references into this pool.
_TOKENS: tuple[int, ...] = tuple(range(vocab.VOCAB_SIZE))


class WorkloadError(ValueError):
    """Invalid workload parameters, or an invalid trace file (the message names file, line and field)."""


class Workload(Protocol):
    """A stream of requests for a fleet simulation."""

    kind: ClassVar[str]  # the name `build_workload` knows it by

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        """The requests, lazily, in order; the same for the same seeded `rng`."""
        ...

    def output_plan(self, request: SimRequestSpec) -> tuple[int, ...]:
        """The token ids the engine should emit for `request`, in order; empty when any will do."""
        return ()

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The LoRA adapters this workload's requests name as `model`, when known in advance."""
        return ()

    @property
    def size(self) -> int | None:
        """How many requests it makes, when known in advance (a trace's is not)."""
        return None

    @property
    def reuses_outputs(self) -> bool:
        """Whether a later prompt may contain an earlier request's output (a conversation's history):
        only then must engines offer output blocks to the prefix cache."""
        return False


# Small helpers


def _param(field: str) -> str:
    return field.replace("_", "-")


def _check_int(kind: str, field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{kind}: {_param(field)} must be an integer, got {value!r}")
    if value < minimum:
        raise WorkloadError(f"{kind}: {_param(field)} must be at least {minimum}, got {value}")


def _check_float(
    kind: str, field: str, value: object, minimum: float, *, maximum: float = math.inf, positive: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{kind}: {_param(field)} must be a finite number, got {value!r}")
    if value < minimum or value > maximum or (positive and value <= 0):
        bound = f"greater than {minimum}" if positive else f"at least {minimum}"
        if maximum < math.inf:
            bound = f"between {minimum} and {maximum}"
        raise WorkloadError(f"{kind}: {_param(field)} must be {bound}, got {value}")


def _sub_rng(rng: random.Random) -> random.Random:
    """A private generator seeded from `rng` now, so later draws from `rng` do not change the stream."""
    return random.Random(rng.getrandbits(64))


def _random_tokens(rng: random.Random, n: int, first: int | None = None) -> array[int]:
    """`n` uniformly random token ids (the first one given, if `first` is set), compact: two bytes a
    token and no int object each (VOCAB_SIZE is 2**16: any 16 bits are a token)."""
    if n <= 0:
        return array("H")
    if first is None:
        return array("H", rng.randbytes(2 * n))
    tokens = array("H", (first,))
    tokens.frombytes(rng.randbytes(2 * (n - 1)))
    return tokens


def _distinct_tokens(rng: random.Random, count: int) -> list[int]:
    """`count` token ids, pairwise distinct while `count` ≤ VOCAB_SIZE (first tokens of sibling prompts)."""
    if count <= vocab.VOCAB_SIZE:
        return rng.sample(_TOKENS, count)
    return rng.choices(_TOKENS, k=count)


def _coprime_stride(rng: random.Random) -> int:
    while True:
        stride = rng.randrange(1, vocab.VOCAB_SIZE)
        if math.gcd(stride, vocab.VOCAB_SIZE) == 1:
            return stride


def _join(a: str, b: str) -> str:
    return f"{a} {b}" if a and b else a or b


def _think_time(rng: random.Random, mean: float) -> float:
    return rng.expovariate(1.0 / mean) if mean > 0 else 0.0


def _lognormal_length(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


def _grouped(
    rng: random.Random,
    id_format: str,
    *,
    groups: int,
    per_group: int,
    prefix_tokens: int,
    suffix_tokens: int,
    output_tokens: int,
    shuffle: bool,
) -> Iterator[SimRequestSpec]:
    """`groups` random prefixes × `per_group` random suffixes; request = prefix + suffix.

    Prefixes of different groups start with different tokens, and so do the suffixes within a group
    (up to VOCAB_SIZE of each), so requests of one group share exactly the prefix.
    """
    prefixes = [_random_tokens(rng, prefix_tokens, first) for first in _distinct_tokens(rng, groups)]
    prefix_texts = [vocab.text(p) for p in prefixes]
    # Suffix p of group g starts with token (offset + p × stride) mod VOCAB_SIZE: a random walk over
    # the vocabulary that repeats no token before VOCAB_SIZE steps (stride coprime with it).
    offsets = array("q", (rng.randrange(vocab.VOCAB_SIZE) for _ in range(groups)))
    strides = array("q", (_coprime_stride(rng) for _ in range(groups)))
    order = array("q", range(groups * per_group))
    if shuffle:
        rng.shuffle(order)
    for i in order:
        g, p = divmod(i, per_group)
        first = (offsets[g] + p * strides[g]) % vocab.VOCAB_SIZE
        suffix = _random_tokens(rng, suffix_tokens, first)
        yield SimRequestSpec(
            request_id=id_format.format(g, p),
            text=None,  # the prefix's text and the suffix's, joined if a policy reads it
            tokens=prefixes[g] + suffix,
            output_tokens=output_tokens,
            known_text=prefix_texts[g],
            known_text_tokens=prefix_tokens,
        )


# Generated workloads


@dataclass(frozen=True)
class SharedPrefix(Workload):
    """Groups of prompts sharing a system prompt: SGLang's `generated-shared-prefix`, inference-perf's
    `shared_prefix`, the llm-d prefix-routing benchmarks.

    Each of `groups` groups has its own random system prompt of `system_tokens` tokens; each of its
    `prompts_per_group` requests is that system prompt followed by its own random question of
    `question_tokens` tokens, and asks for `output_tokens` tokens. With `shuffle` the requests of all
    groups are interleaved in random order; without, they come group by group. Requests of one group
    share exactly the system prompt (their questions start with different tokens). Request ids are
    `sp-g<group>-p<prompt>`.

    Defaults are SGLang's (64 groups × 16 prompts, 2,048 / 128 / 256 tokens); llm-d's 73-capacity run
    is groups=150, prompts_per_group=5, system_tokens=6000, question_tokens=1200, output_tokens=1000.
    """

    kind: ClassVar[str] = "shared-prefix"

    groups: int = 64
    prompts_per_group: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256
    shuffle: bool = True

    @property
    def size(self) -> int | None:
        return self.groups * self.prompts_per_group

    def __post_init__(self) -> None:
        _check_int(self.kind, "groups", self.groups, 1)
        _check_int(self.kind, "prompts_per_group", self.prompts_per_group, 1)
        _check_int(self.kind, "system_tokens", self.system_tokens, 0)
        _check_int(self.kind, "question_tokens", self.question_tokens, 1)
        _check_int(self.kind, "output_tokens", self.output_tokens, 1)
        if not isinstance(self.shuffle, bool):
            raise WorkloadError(f"{self.kind}: shuffle must be true or false, got {self.shuffle!r}")

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return _grouped(
            _sub_rng(rng),
            "sp-g{}-p{}",
            groups=self.groups,
            per_group=self.prompts_per_group,
            prefix_tokens=self.system_tokens,
            suffix_tokens=self.question_tokens,
            output_tokens=self.output_tokens,
            shuffle=self.shuffle,
        )


@dataclass(frozen=True)
class LongDocQA(Workload):
    """A few long documents, many questions about each (LMCache's long-document QA shape).

    Each of `documents` documents is `document_tokens` random tokens; each of its
    `questions_per_document` requests is the document followed by its own random question of
    `question_tokens` tokens, asking for `output_tokens` tokens. The requests of all documents are
    interleaved in random order. Requests about one document share exactly the document. Request ids
    are `doc-d<document>-q<question>`.

    Defaults: 8 documents × 20 questions, 10,000-token documents, 64-token questions, 128 output tokens
    (an 80k-token working set: a few documents fit one server's cache, all of them only the fleet's).
    """

    kind: ClassVar[str] = "long-doc-qa"

    documents: int = 8
    questions_per_document: int = 20
    document_tokens: int = 10_000
    question_tokens: int = 64
    output_tokens: int = 128

    @property
    def size(self) -> int | None:
        return self.documents * self.questions_per_document

    def __post_init__(self) -> None:
        _check_int(self.kind, "documents", self.documents, 1)
        _check_int(self.kind, "questions_per_document", self.questions_per_document, 1)
        _check_int(self.kind, "document_tokens", self.document_tokens, 1)
        _check_int(self.kind, "question_tokens", self.question_tokens, 1)
        _check_int(self.kind, "output_tokens", self.output_tokens, 1)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return _grouped(
            _sub_rng(rng),
            "doc-d{}-q{}",
            groups=self.documents,
            per_group=self.questions_per_document,
            prefix_tokens=self.document_tokens,
            suffix_tokens=self.question_tokens,
            output_tokens=self.output_tokens,
            shuffle=True,
        )


def assistant_tokens(session: int, turn: int, n: int) -> tuple[int, ...]:
    """The `n` token ids the assistant answers in turn `turn` (0-based) of `MultiTurn` session `session`.

    A pure function of its arguments (not of the workload's seed), so the fleet can make the engine
    emit exactly the tokens the next turn's prompt will contain. Prefix-stable: the first m tokens
    for n > m are the tokens for m.
    """
    r = random.Random(f"epick.simulate.multi-turn/{session}/{turn}")
    return tuple(r.choices(_TOKENS, k=n))


_MULTI_TURN_ID = re.compile(r"mt-s(\d+)-t(\d+)")


@dataclass(frozen=True)
class MultiTurn(Workload):
    """Chat sessions whose every turn resends the whole conversation (closed loop per session).

    Each of `sessions` sessions has its own random system prompt of `system_tokens` tokens and
    `turns` turns. Turn k's prompt (k = 0, 1, …) is the history: system prompt, user message 0,
    assistant answer 0, …, user message k, where each user message is `user_tokens` random tokens
    and each assistant answer is `assistant_tokens(session, turn, output_tokens)`; every turn asks
    for `output_tokens` tokens, and `output_plan` gives the engine those answer tokens, so the next
    prompt holds exactly what the server generated. Turn 0 has `after=None` (the arrival process
    starts it); turn k > 0 has `after` = turn k−1's request id and a `think_time` drawn from an
    exponential distribution of mean `think_time_s` (0: none). Request ids are `mt-s<session>-t<turn>`,
    `session` is `session-<session>`. Requests come session by session, turn by turn, so a request
    always follows the one it waits for.

    Defaults: 64 sessions × 6 turns, 1,024-token system prompt, 128-token user messages, 256-token
    answers, 4 s mean think time (the last turn's prompt is 1,024 + 6 × 128 + 5 × 256 = 3,072 tokens).
    """

    kind: ClassVar[str] = "multi-turn"

    sessions: int = 64
    turns: int = 6
    system_tokens: int = 1024
    user_tokens: int = 128
    output_tokens: int = 256
    think_time_s: float = 4.0

    @property
    def size(self) -> int | None:
        return self.sessions * self.turns

    def __post_init__(self) -> None:
        _check_int(self.kind, "sessions", self.sessions, 1)
        _check_int(self.kind, "turns", self.turns, 1)
        _check_int(self.kind, "system_tokens", self.system_tokens, 0)
        _check_int(self.kind, "user_tokens", self.user_tokens, 1)
        _check_int(self.kind, "output_tokens", self.output_tokens, 1)
        _check_float(self.kind, "think_time_s", self.think_time_s, 0.0)

    @staticmethod
    def assistant_tokens(session: int, turn: int, n: int) -> tuple[int, ...]:
        """The module's `assistant_tokens`: the answer tokens of turn `turn` of session `session`."""
        return assistant_tokens(session, turn, n)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return self._requests(_sub_rng(rng))

    def _requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        system_firsts = _distinct_tokens(rng, self.sessions)
        for s in range(self.sessions):
            # Tuples: a conversation grows by the assistant's answers, which are tuples.
            history = tuple(_random_tokens(rng, self.system_tokens, system_firsts[s]))
            history_text = vocab.text(history)
            previous: str | None = None
            for t in range(self.turns):
                user = tuple(_random_tokens(rng, self.user_tokens))
                tokens = history + user
                text = _join(history_text, vocab.text(user))
                request_id = f"mt-s{s}-t{t}"
                yield SimRequestSpec(
                    request_id=request_id,
                    text=text,
                    tokens=tokens,
                    output_tokens=self.output_tokens,
                    session=f"session-{s}",
                    after=previous,
                    think_time=0.0 if previous is None else _think_time(rng, self.think_time_s),
                )
                answer = assistant_tokens(s, t, self.output_tokens)
                history = tokens + answer
                history_text = _join(text, vocab.text(answer))
                previous = request_id

    @property
    def reuses_outputs(self) -> bool:
        return True  # each turn's prompt holds the earlier answers

    def output_plan(self, request: SimRequestSpec) -> tuple[int, ...]:
        match = _MULTI_TURN_ID.fullmatch(request.request_id)
        if match is None:
            return ()
        return assistant_tokens(int(match[1]), int(match[2]), request.output_tokens)


@dataclass(frozen=True)
class ShareGPTLike(Workload):
    """Independent chat requests with ShareGPT-like lengths (no shared prefixes).

    `n` requests, each a random prompt (unique with overwhelming probability) whose length is drawn
    from a lognormal distribution of median `input_median` and shape `input_sigma`, rounded and
    clamped to [1, `input_max`], asking for a lognormal(`output_median`, `output_sigma`) number of
    tokens clamped to [1, `output_max`]. Request ids are `sg-<i>`.

    An approximation, not a fit to the dataset: the defaults (inputs median 100, sigma 1.0, cap 4,096;
    outputs median 250, sigma 0.8, cap 2,048) give means of about 165 and 345 tokens, close to the
    means the vLLM paper (Kwon et al., SOSP 2023, fig. 11) reports for its ShareGPT sample (161 input,
    338 output tokens), with the long right tail real chat traffic has.
    """

    kind: ClassVar[str] = "sharegpt-like"

    n: int = 1000
    input_median: float = 100.0
    input_sigma: float = 1.0
    input_max: int = 4096
    output_median: float = 250.0
    output_sigma: float = 0.8
    output_max: int = 2048

    @property
    def size(self) -> int | None:
        return self.n

    def __post_init__(self) -> None:
        _check_int(self.kind, "n", self.n, 1)
        _check_float(self.kind, "input_median", self.input_median, 0.0, positive=True)
        _check_float(self.kind, "input_sigma", self.input_sigma, 0.0)
        _check_int(self.kind, "input_max", self.input_max, 1)
        _check_float(self.kind, "output_median", self.output_median, 0.0, positive=True)
        _check_float(self.kind, "output_sigma", self.output_sigma, 0.0)
        _check_int(self.kind, "output_max", self.output_max, 1)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return self._requests(_sub_rng(rng))

    def _requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        for i in range(self.n):
            input_tokens = _lognormal_length(rng, self.input_median, self.input_sigma, self.input_max)
            output_tokens = _lognormal_length(rng, self.output_median, self.output_sigma, self.output_max)
            tokens = _random_tokens(rng, input_tokens)
            yield SimRequestSpec(request_id=f"sg-{i}", text=None, tokens=tokens, output_tokens=output_tokens)


@dataclass(frozen=True)
class LoraMix(Workload):
    """Requests spread over LoRA adapters with Zipf popularity, plus some for the base model.

    `n` requests of random prompts of `prompt_tokens` tokens asking for `output_tokens` tokens. Each
    goes to the base model (`model` = "sim-model") with probability `base_model_share`; otherwise to
    adapter `lora-<k>`, k = 0 … `adapters`−1, with probability ∝ 1 / (k + 1)^`zipf_s` (lora-0 the most
    popular; zipf_s = 0 is uniform). Request ids are `lora-mix-<i>`.

    Defaults: 1,000 requests, 8 adapters, zipf_s 1.0, base share 0.2, 512-token prompts, 128 output
    tokens.
    """

    kind: ClassVar[str] = "lora-mix"

    n: int = 1000
    adapters: int = 8
    zipf_s: float = 1.0
    base_model_share: float = 0.2
    prompt_tokens: int = 512
    output_tokens: int = 128

    @property
    def size(self) -> int | None:
        return self.n

    def __post_init__(self) -> None:
        _check_int(self.kind, "n", self.n, 1)
        _check_int(self.kind, "adapters", self.adapters, 1)
        _check_float(self.kind, "zipf_s", self.zipf_s, 0.0)
        _check_float(self.kind, "base_model_share", self.base_model_share, 0.0, maximum=1.0)
        _check_int(self.kind, "prompt_tokens", self.prompt_tokens, 1)
        _check_int(self.kind, "output_tokens", self.output_tokens, 1)

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The adapters, most popular first."""
        return tuple(f"lora-{k}" for k in range(self.adapters))

    def adapter_weights(self) -> tuple[float, ...]:
        """Each adapter's probability among the non-base requests, in `adapter_names` order."""
        weights = [1.0 / (k + 1) ** self.zipf_s for k in range(self.adapters)]
        total = sum(weights)
        return tuple(w / total for w in weights)

    def requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        return self._requests(_sub_rng(rng))

    def _requests(self, rng: random.Random) -> Iterator[SimRequestSpec]:
        names = self.adapter_names
        cum_weights = list(itertools.accumulate(self.adapter_weights()))
        for i in range(self.n):
            if rng.random() < self.base_model_share:
                model = BASE_MODEL
            else:
                model = rng.choices(names, cum_weights=cum_weights)[0]
            tokens = _random_tokens(rng, self.prompt_tokens)
            yield SimRequestSpec(
                request_id=f"lora-mix-{i}",
                text=None,
                tokens=tokens,
                output_tokens=self.output_tokens,
                model=model,
            )


# Trace replay


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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


# By name

WORKLOADS: dict[str, type[Workload]] = {
    cls.kind: cls for cls in (SharedPrefix, MultiTurn, ShareGPTLike, LoraMix, LongDocQA, Trace)
}

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


def _workload_class(kind: str) -> type[Workload]:
    cls = WORKLOADS.get(kind)
    if cls is None:
        raise WorkloadError(f"unknown workload {kind!r}; valid: {', '.join(WORKLOADS)}")
    return cls


def workload_parameters(kind: str) -> dict[str, object]:
    """A workload's parameters, kebab-case, with their defaults (`None`: required), in field order."""
    cls = _workload_class(kind)
    out: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        out[_param(f.name)] = None if f.default is dataclasses.MISSING else f.default
    return out


def _convert(kind: str, name: str, value: str | int | float, target: Any) -> object:
    def bad(expected: str) -> WorkloadError:
        return WorkloadError(f"{kind}: parameter {name} must be {expected}, got {value!r}")

    text = value.strip() if isinstance(value, str) else None
    if target is bool:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        if _is_int(value) and value in (0, 1):
            return bool(value)
        raise bad("true or false")
    if target is int:
        if _is_int(value):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if text is not None:
            try:
                return int(text)
            except ValueError:
                pass
        raise bad("an integer")
    if target is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if text is not None:
            try:
                return float(text)
            except ValueError:
                pass
        raise bad("a number")
    if target is Path:
        if text:
            return Path(text)
        raise bad("a file path")
    return value


def build_workload(kind: str, params: Mapping[str, str | int | float]) -> Workload:
    """The workload `kind` with `params` (kebab-case names, e.g. `prompts-per-group`; values as given on
    a command line, strings converted to the field's type). Unknown kinds or parameters, bad values and
    missing required parameters raise `WorkloadError` listing the valid ones."""
    cls = _workload_class(kind)
    fields = {_param(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = get_type_hints(cls)
    kwargs: dict[str, object] = {}
    for raw_name, value in params.items():
        name = _param(raw_name.strip())
        field = fields.get(name)
        if field is None:
            raise WorkloadError(
                f"unknown parameter {raw_name!r} for workload {kind}; valid: {', '.join(fields)}"
            )
        kwargs[field.name] = _convert(kind, name, value, hints[field.name])
    missing = [
        name
        for name, f in fields.items()
        if f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise WorkloadError(f"workload {kind} needs parameter {', '.join(missing)}")
    workload: Workload = cls(**kwargs)
    return workload
