"""The `multi-turn` workload: chat sessions whose every turn resends the whole conversation, and
`assistant_tokens`, the answers the engine must emit so the next turn's prompt holds them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from epick.simulate import vocab
from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads.base import Workload, _check_float, _check_int
from epick.simulate.workloads.sampling import (
    _TOKENS,
    _distinct_tokens,
    _join,
    _random_tokens,
    _sub_rng,
    _think_time,
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

    @property
    def size_parameters(self) -> dict[str, int]:
        return {"sessions": self.sessions, "turns": self.turns}

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
