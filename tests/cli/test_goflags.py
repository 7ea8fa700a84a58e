"""The Go EPP's command-line syntax (pflag's, and Go flag's single-dash names), as its charts write it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from epick.cli.goflags import (
    FlagError,
    FlagSpec,
    HelpRequested,
    parse_go_duration,
    parse_go_flags,
)

SPECS = [
    FlagSpec("pool-name", "string", ""),
    FlagSpec("v", "int", 0, shorthand="v"),
    FlagSpec("ports", "intSlice", ()),
    FlagSpec("suites", "stringSlice", ()),
    FlagSpec("tracing", "bool", True),
    FlagSpec("secure-serving", "bool", True),
    FlagSpec("refresh-metrics-interval", "duration", 0.05),
    FlagSpec("ratio", "float", 0.5),
]


def parse(*argv: str):
    return parse_go_flags(list(argv), SPECS)


def test_one_or_two_dashes_with_or_without_equals() -> None:
    for argv in (["--v=2"], ["-v=2"], ["--v", "2"], ["-v", "2"]):
        assert parse(*argv).integer("v") == 2
    assert parse("--pool-name=my-pool").text("pool-name") == "my-pool"


def test_defaults_hold_for_flags_not_given() -> None:
    flags = parse("--v=1")
    assert flags.boolean("tracing") is True
    assert flags.number("refresh-metrics-interval") == 0.05
    assert flags.given == ["v"]
    assert flags.was_given("v") and not flags.was_given("tracing")


def test_bool_alone_is_true_and_takes_a_value_only_after_equals() -> None:
    assert parse("--tracing=false").boolean("tracing") is False
    assert parse("--secure-serving=0", "--tracing=F").values["secure-serving"] is False
    flags = parse("--tracing", "false", "--v=3")
    # as pflag: "false" is a stray argument, the flag is true, and parsing goes on
    assert flags.boolean("tracing") is True
    assert flags.rest == ["false"]
    assert flags.integer("v") == 3


def test_stray_arguments_do_not_end_the_flags() -> None:
    flags = parse("--v=2", "stray", "--pool-name=x", "-")
    assert flags.rest == ["stray", "-"]
    assert flags.text("pool-name") == "x"


def test_double_dash_ends_the_flags() -> None:
    flags = parse("--v=2", "--", "--tracing=false")
    assert flags.rest == ["--tracing=false"]
    assert flags.boolean("tracing") is True


def test_shorthand_forms() -> None:
    for argv in (["-v", "4"], ["-v=4"], ["-v4"]):
        assert parse(*argv).integer("v") == 4


def test_the_last_value_wins_and_slices_append() -> None:
    flags = parse("--v=1", "--v=3", "--ports=8000,8001", "--ports", "8002", "--suites=A,B")
    assert flags.integer("v") == 3
    assert flags.values["ports"] == (8000, 8001, 8002)
    assert flags.values["suites"] == ("A", "B")
    assert flags.given == ["v", "ports", "suites"]


def test_go_test_flags_are_skipped() -> None:
    assert parse("-test.v", "--v=1").given == ["v"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope=1"], "unknown flag: --nope"),
        (["-nope"], "unknown flag: -nope"),
        (["--v"], "flag needs an argument: --v"),
        (["--v=two"], "invalid argument 'two' for --v"),
        (["--tracing=yes"], "invalid argument 'yes' for --tracing"),
        (["--refresh-metrics-interval=5"], "invalid argument '5' for --refresh-metrics-interval"),
        (["--ports=1, 2"], "invalid argument '1, 2' for --ports"),
        (["---v=1"], "bad flag syntax: ---v=1"),
        (["-=1"], "bad flag syntax: -=1"),
    ],
)
def test_refused_as_go_refuses(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message):
        parse(*argv)


def test_help_when_no_flag_is_named_so() -> None:
    with pytest.raises(HelpRequested):
        parse("-h")
    with pytest.raises(HelpRequested):
        parse("--help")


def test_integers_take_go_base_prefixes() -> None:
    assert parse("--v=0x10").integer("v") == 16


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("300ms", 0.3), ("1m30s", 90.0), ("1.5h", 5400.0), ("-2s", -2.0), ("10us", 1e-5)],
)
def test_durations_as_time_parse_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "1x", "s", "1s2"])
def test_not_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_go_duration(text)


@given(st.lists(st.text(min_size=0, max_size=12), max_size=8))
def test_any_command_line_parses_or_names_what_is_wrong(argv: list[str]) -> None:
    try:
        flags = parse(*argv)
    except (FlagError, HelpRequested):
        return
    assert set(flags.values) == {spec.name for spec in SPECS}
    assert all(arg in argv for arg in flags.rest)
