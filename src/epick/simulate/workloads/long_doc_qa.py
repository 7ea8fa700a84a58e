"""The `long-doc-qa` workload: a few long documents, many questions about each."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from epick.simulate.types import SimRequestSpec
from epick.simulate.workloads.base import Workload, _check_int
from epick.simulate.workloads.sampling import _grouped, _sub_rng


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

    @property
    def size_parameters(self) -> dict[str, int]:
        return {"documents": self.documents, "questions-per-document": self.questions_per_document}

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
