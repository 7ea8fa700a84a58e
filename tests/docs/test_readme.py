"""The README's library snippet runs as written, and prints what its comment says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readmes_library_snippet_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    (snippet,) = python_blocks((ROOT / "README.md").read_text())
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "README.md", "exec"), {})
    expected = re.search(r"# (default \[.*\])\n", snippet)
    assert expected is not None, "the snippet's last line says what it prints"
    assert out.getvalue().strip() == expected.group(1)
