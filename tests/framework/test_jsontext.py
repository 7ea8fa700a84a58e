"""The request path's JSON: msgspec's speed, Python's json semantics, for any input."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epick.framework import jsontext

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal, NaN included, and of the same types (1 is not 1.0 here)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@given(values)
def test_what_json_writes_reads_back_as_json_reads_it(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        assert same(jsontext.loads(text.encode()), json.loads(text.encode()))


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": NaN, "b": Infinity, "c": -Infinity}',  # json reads these; msgspec does not
        b'{"n": 123456789012345678901234567890}',  # beyond 64 bits: still an int
        b'{"s": "\\ud800"}',  # an escaped lone surrogate
        b'\xef\xbb\xbf{"bom": 1}',  # a UTF-8 byte-order mark
        '{"utf16": "é"}'.encode("utf-16"),
        b'{"k": 1, "k": 2}',  # a repeated key: the last wins
        b"[" * 1500 + b"]" * 1500,  # past the nesting limits
        b'{"x": 1e400}',
        b'{"f": 1.5, "i": 1, "e": 1e16, "neg0": -0.0}',
    ],
)
def test_inputs_orjson_refuses_read_as_json_reads_them(data: bytes) -> None:
    try:
        expected = json.loads(data)
    except (ValueError, RecursionError) as e:
        with pytest.raises(type(e)):
            jsontext.loads(data)
        return
    assert same(jsontext.loads(data), expected)


@pytest.mark.parametrize("data", [b"", b"{", b'{"a": }', b"\xff\xfe\xfa", b"[1,]", b'"unterminated'])
def test_bad_json_raises_what_json_raises(data: bytes) -> None:
    with pytest.raises(ValueError) as ours:
        jsontext.loads(data)
    with pytest.raises(ValueError) as theirs:
        json.loads(data)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


texts = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(texts)
def test_compact_text_is_jsons_compact_text_without_floats(value: Any) -> None:
    assert jsontext.compact(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def test_compact_text_of_numbers_and_keys() -> None:
    assert jsontext.compact({"n": 2**70}) == '{"n":1180591620717411303424}'
    assert jsontext.compact({1: "int key"}) == '{"1":"int key"}'
    assert jsontext.compact([1e16, 1e-7, 0.5, float("nan")]) == "[1e16,1e-7,0.5,null]"
    assert jsontext.compact({"unserializable": {1, 2}}).startswith('{"unserializable":')
