"""docs/deploy.md's flag table is `epp`'s: every flag, its default and what epick does with it."""

from __future__ import annotations

from pathlib import Path

from epick.cli.epp_flags import FLAGS, HOW, flags_table

DOC = Path(__file__).parents[2] / "docs" / "deploy.md"


def test_every_flag_says_what_epick_does_with_it() -> None:
    assert {spec.name for spec in FLAGS} == set(HOW)


def test_the_doc_table_is_the_generated_one() -> None:
    assert flags_table() in DOC.read_text(encoding="utf-8"), (
        "regenerate docs/deploy.md's flag table with epick.cli.epp_flags.flags_table()"
    )
