"""llm-d's request keys (epick.kvcache.upstream_keys) against vectors computed by Go with the libraries
llm-d-router uses: hash/fnv, fxamacker/cbor's canonical mode and cespare/xxhash
(tests/data/kvkeys/golden.go wrote tests/data/kvkeys/upstream_keys.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epick.kvcache.upstream_keys import UpstreamTokenProcessor, cbor_payload, fnv1a_64

VECTORS = json.loads((Path(__file__).parents[1] / "data" / "kvkeys" / "upstream_keys.json").read_text())


@pytest.mark.parametrize("case", VECTORS, ids=lambda c: f"{c['algorithm']}-{c['seed']}-{c['model']}")
def test_keys_are_the_go_epps(case: dict[str, object]) -> None:
    processor = UpstreamTokenProcessor(int(case["block_size"]), str(case["seed"]), str(case["algorithm"]))  # type: ignore[call-overload]
    keys = processor.keys(case["tokens"], str(case["model"]), extra=case["extra"])  # type: ignore[arg-type]
    assert [str(k) for k in keys] == case["keys"]


def test_a_chain_continues_from_a_parent() -> None:
    processor = UpstreamTokenProcessor(4, "s")
    tokens = list(range(12))
    whole = processor.keys(tokens, "m")
    assert processor.keys(tokens[4:], "m", parent=whole[0]) == whole[1:]
    assert processor.keys(tokens[:3], "m") == []  # no partial block


def test_fnv1a_64_reference_values() -> None:
    # the FNV reference test vectors (draft-eastlake-fnv): "" and "a", "foobar"
    assert fnv1a_64(b"") == 0xCBF29CE484222325
    assert fnv1a_64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a_64(b"foobar") == 0x85944171F73967E8


def test_the_cbor_payload_is_canonical() -> None:
    # [24, [1, 255, 65536], null]: an array of 3; 24 takes a byte; 255 a byte; 65536 four bytes
    assert cbor_payload(24, [1, 255, 65536], None) == bytes.fromhex("83 1818 83 01 18ff 1a00010000 f6")
    assert cbor_payload(0, None, "m") == bytes.fromhex("83 00 f6 616d")
    assert cbor_payload(2**64 - 1, [], [{"Hash": "x"}]) == bytes.fromhex(
        "83 1bffffffffffffffff 80 81 a1 6448617368 6178"
    )


def test_an_unknown_algorithm_is_refused() -> None:
    with pytest.raises(ValueError, match="accepted values are cbor-fnv and xxh64"):
        UpstreamTokenProcessor(16, "", "sha256")
