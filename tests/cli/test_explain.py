"""`epick explain` (JSON and human-readable) and `epick demo`, run in-process."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epick.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "config"
EXAMPLES = ROOT / "examples" / "explain"
HEADER = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

# Three endpoints. Under the default config (queue ×2, kv ×2, prefix ×3):
#   queue 0, 2, 4   -> (4 - q) / (4 - 0) = 1, 0.5, 0
#   kv 0.1, 0.5, 0.9 -> 1 - kv           = 0.9, 0.5, 0.1
ENDPOINTS = [
    {
        "name": "a",
        "address": "10.0.0.1",
        "port": 8000,
        "metrics": {"waiting_queue_size": 0, "kv_cache_usage_percent": 0.1},
    },
    {
        "name": "b",
        "address": "10.0.0.2",
        "port": 8000,
        "metrics": {"waiting_queue_size": 2, "kv_cache_usage_percent": 0.5},
    },
    {
        "name": "c",
        "address": "10.0.0.3",
        "port": 8000,
        "metrics": {"waiting_queue_size": 4, "kv_cache_usage_percent": 0.9},
    },
]
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4  # 180 characters: 3 blocks of 64
REQUEST = {"model": "m", "prompt": PROMPT}


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def write_config(tmp_path: Path, body: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + body, encoding="utf-8")
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "endpoints": write_json(tmp_path / "endpoints.json", ENDPOINTS),
        "request": write_json(tmp_path / "request.json", REQUEST),
    }


def run(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["explain", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, dict[str, Any]]:
    code, out, _ = run(capsys, *args, "--json")
    # Exactly one JSON object on stdout, nothing before or after it.
    obj, end = json.JSONDecoder().raw_decode(out)
    assert out[end:].strip() == ""
    assert isinstance(obj, dict)
    return code, obj


def history(tmp_path: Path, *items: tuple[dict[str, Any], str]) -> Path:
    return write_json(tmp_path / "history.json", [{"request": r, "endpoint": e} for r, e in items])


def assert_totals_are_weighted_sums(result: dict[str, Any]) -> None:
    for profile in result["profiles"].values():
        for name, total in profile["totals"].items():
            expected = sum(s["weight"] * s["scores"][name] for s in profile["scorers"])
            assert total == pytest.approx(expected)


# --- JSON output -------------------------------------------------------------------------------


def test_json_has_the_documented_shape(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    code, result = run_json(capsys, "--endpoints", files["endpoints"], "--request", files["request"])
    assert code == 0
    assert list(result) == ["primary_profile", "targets", "profiles", "error"]
    assert result["error"] is None
    assert result["primary_profile"] == "default"
    assert list(result["profiles"]) == ["default"]
    profile = result["profiles"]["default"]
    assert list(profile) == ["filters", "scorers", "totals", "targets"]
    assert profile["filters"] == []
    assert [list(s) for s in profile["scorers"]] == [["plugin", "weight", "scores"]] * 3
    assert [(s["plugin"], s["weight"]) for s in profile["scorers"]] == [
        ("queue-scorer/queue-scorer", 2.0),
        ("kv-cache-utilization-scorer/kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer/prefix-cache-scorer", 3.0),
    ]


def test_totals_without_history(capsys: pytest.CaptureFixture[str], files: dict[str, Path]) -> None:
    code, result = run_json(capsys, "--endpoints", files["endpoints"], "--request", files["request"])
    assert code == 0
    queue, kv, prefix = result["profiles"]["default"]["scorers"]
    assert queue["scores"] == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert kv["scores"] == pytest.approx({"a": 0.9, "b": 0.5, "c": 0.1})
    assert prefix["scores"] == {"a": 0.0, "b": 0.0, "c": 0.0}  # nothing learned yet
    # a = 2*1   + 2*0.9 + 3*0 = 3.8
    # b = 2*0.5 + 2*0.5 + 3*0 = 2.0
    # c = 2*0   + 2*0.1 + 3*0 = 0.2
    assert result["profiles"]["default"]["totals"] == pytest.approx({"a": 3.8, "b": 2.0, "c": 0.2})
    assert result["profiles"]["default"]["targets"] == ["a"]
    assert result["targets"] == ["a"]


def test_history_warms_the_prefix_index(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    # b served the identical request before: all 3 of its blocks match there.
    hist = history(tmp_path, (REQUEST, "b"), ({"model": "m", "prompt": "something else entirely"}, "c"))
    code, result = run_json(
        capsys, "--endpoints", files["endpoints"], "--request", files["request"], "--history", hist
    )
    assert code == 0
    profile = result["profiles"]["default"]
    assert profile["scorers"][2]["scores"] == {"a": 0.0, "b": 1.0, "c": 0.0}
    # a = 2*1   + 2*0.9 + 3*0 = 3.8
    # b = 2*0.5 + 2*0.5 + 3*1 = 5.0   <- wins
    # c = 2*0   + 2*0.1 + 3*0 = 0.2
    assert profile["totals"] == pytest.approx({"a": 3.8, "b": 5.0, "c": 0.2})
    assert result["targets"] == ["b"]


def test_partial_prefix_match(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    # blockSizeTokens 16 -> blocks of 64 characters. Past prompt and this one share the first 64
    # characters only: 1 of this prompt's 2 blocks matches on b -> 0.5.
    past = {"model": "m", "prompt": "A" * 64 + "B" * 64}
    request = write_json(tmp_path / "req2.json", {"model": "m", "prompt": "A" * 64 + "C" * 64})
    code, result = run_json(
        capsys,
        "--endpoints",
        files["endpoints"],
        "--request",
        request,
        "--history",
        history(tmp_path, (past, "b")),
    )
    assert code == 0
    profile = result["profiles"]["default"]
    assert profile["scorers"][2]["scores"] == {"a": 0.0, "b": 0.5, "c": 0.0}
    # b = 2*0.5 + 2*0.5 + 3*0.5 = 3.5 < a = 3.8 -> a still wins
    assert profile["totals"] == pytest.approx({"a": 3.8, "b": 3.5, "c": 0.2})
    assert result["targets"] == ["a"]


def test_prefix_is_per_model(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    # The same prompt for another model hashes differently (the chain is seeded with the model name).
    hist = history(tmp_path, ({"model": "other", "prompt": PROMPT}, "b"))
    _, result = run_json(
        capsys, "--endpoints", files["endpoints"], "--request", files["request"], "--history", hist
    )
    assert result["profiles"]["default"]["scorers"][2]["scores"] == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert result["targets"] == ["a"]


# A body carrying both a prompt and messages: --path decides which one is the request.
CHAT_PAST = [{"role": "user", "content": "first conversation, about the weather " * 4}]
CHAT_NOW = [{"role": "user", "content": "second conversation, about the markets " * 4}]


@pytest.mark.parametrize(
    "case",
    [
        # completion: the prompts are identical -> b holds every block -> b = 5.0 beats a = 3.8
        ("/v1/completions", 1.0, "b"),
        # chat: the messages differ from the first block on -> no match -> a = 3.8 wins
        ("/v1/chat/completions", 0.0, "a"),
        (None, 0.0, "a"),  # no --path: a body with messages is chat
    ],
    ids=["completion", "chat", "no-path"],
)
def test_path_selects_chat_or_completion(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    tmp_path: Path,
    case: tuple[str | None, float, str],
) -> None:
    path, prefix_b, target = case
    past = {"model": "m", "prompt": PROMPT, "messages": CHAT_PAST}
    request = write_json(tmp_path / "both.json", {"model": "m", "prompt": PROMPT, "messages": CHAT_NOW})
    args: list[str | Path] = ["--endpoints", files["endpoints"], "--request", request]
    args += ["--history", history(tmp_path, (past, "b"))]
    if path is not None:
        args += ["--path", path]
    code, result = run_json(capsys, *args)
    assert code == 0
    assert result["profiles"]["default"]["scorers"][2]["scores"]["b"] == prefix_b
    assert result["targets"] == [target]


def test_completion_path_on_a_chat_only_body_is_bad_input(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    request = write_json(tmp_path / "chat.json", {"model": "m", "messages": CHAT_NOW})
    code, out, err = run(
        capsys, "--endpoints", files["endpoints"], "--request", request, "--path", "/v1/completions"
    )
    assert code == 2
    assert out == ""
    assert f"error: {request}: completion request needs 'prompt'" in err


SESSION_CONFIG = """\
plugins:
- type: session-affinity-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
    weight: 10
  - pluginRef: queue-scorer
"""


def test_header_reaches_the_plugins(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    config = write_config(tmp_path, SESSION_CONFIG)
    base = ["--config", config, "--endpoints", files["endpoints"], "--request", files["request"]]
    # Without a session token: session 0 everywhere; queue 1, 0.5, 0 (weight 1) -> a.
    _, result = run_json(capsys, *base)
    assert result["profiles"]["default"]["totals"] == {"a": 1.0, "b": 0.5, "c": 0.0}
    assert result["targets"] == ["a"]
    # With x-session-token = base64("c"): c = 10*1 + 1*0 = 10; a = 10*0 + 1*1 = 1; b = 0.5 -> c.
    token = base64.b64encode(b"c").decode()
    assert token == "Yw=="
    code, result = run_json(capsys, *base, "--header", f"X-Session-Token: {token}", "--header", "x-other:1")
    assert code == 0
    assert result["profiles"]["default"]["scorers"][0]["scores"] == {"a": 0.0, "b": 0.0, "c": 1.0}
    assert result["profiles"]["default"]["totals"] == {"a": 1.0, "b": 0.5, "c": 10.0}
    assert result["targets"] == ["c"]


def test_fallback_targets_follow_the_primary(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        """\
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
""",
    )
    _, result = run_json(
        capsys, "--config", config, "--endpoints", files["endpoints"], "--request", files["request"]
    )
    # a = 2*1 + 2*0.9 = 3.8; b = 2*0.5 + 2*0.5 = 2.0; c = 0 + 2*0.1 = 0.2 -> top two, best first
    assert result["profiles"]["default"]["totals"] == pytest.approx({"a": 3.8, "b": 2.0, "c": 0.2})
    assert result["targets"] == ["a", "b"]


def test_seed_makes_random_choices_repeatable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    endpoints = write_json(tmp_path / "many.json", [{"name": f"ep{i}"} for i in range(20)])
    request = write_json(tmp_path / "r.json", REQUEST)
    config = write_config(tmp_path, "plugins:\n- type: random-picker\n")
    base = ["--config", config, "--endpoints", endpoints, "--request", request, "--json"]
    outputs = {}
    for seed in ("5", "5", "6"):
        code, out, _ = run(capsys, *base, "--seed", seed)
        assert code == 0
        outputs.setdefault(seed, set()).add(out)
    assert len(outputs["5"]) == 1  # same seed, same output
    # Another seed draws another endpoint here (ep7 vs ep15 today; seeded, so stable run to run).
    assert json.loads(outputs["5"].pop())["targets"] != json.loads(outputs["6"].pop())["targets"]


# --- failures ----------------------------------------------------------------------------------

NOTHING_MATCHES = """\
plugins:
- name: h100-only
  type: label-selector-filter
  parameters: {matchLabels: {gpu: h100}}
- type: queue-scorer
"""


def test_failing_schedule_json(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    config = write_config(tmp_path, NOTHING_MATCHES)
    code, result = run_json(
        capsys, "--config", config, "--endpoints", files["endpoints"], "--request", files["request"]
    )
    assert code == 1
    message = "profile 'default': filter h100-only/label-selector-filter removed all 3 endpoints"
    assert result == {
        "primary_profile": None,
        "targets": [],
        "profiles": {
            "default": {
                "filters": [{"plugin": "h100-only/label-selector-filter", "kept": []}],
                "scorers": [],
                "totals": {},
                "targets": [],
                "error": message,
            }
        },
        "error": message,
    }


def test_failing_schedule_human(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    config = write_config(tmp_path, NOTHING_MATCHES)
    code, out, _ = run(
        capsys, "--config", config, "--endpoints", files["endpoints"], "--request", files["request"]
    )
    assert code == 1
    text = plain(out)
    assert "filter h100-only/label-selector-filter: kept none" in text
    assert (
        "scheduling failed: profile 'default': filter h100-only/label-selector-filter removed all 3 endpoints"
        in text
    )


def test_no_endpoints_is_a_scheduling_failure(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path
) -> None:
    empty = write_json(tmp_path / "none.json", [])
    code, result = run_json(capsys, "--endpoints", empty, "--request", files["request"])
    assert code == 1
    assert result["error"] == "no candidate endpoints to schedule on"
    assert result["profiles"] == {}
    assert result["targets"] == []


@dataclass(frozen=True)
class BadInput:
    id: str
    file: str  # which input is bad: endpoints, request, history, config; "" for a flag
    content: str | None  # its text; None: the file does not exist
    expected: str  # what stderr says after "error: FILE: " (or after "error: " for a flag)
    extra: tuple[str, ...] = ()


BAD_INPUTS = [
    BadInput("missing-endpoints-file", "endpoints", None, "cannot read: No such file or directory"),
    BadInput("endpoints-not-json", "endpoints", "[{name: a}]", "not valid JSON: Expecting property name"),
    BadInput(
        "endpoints-not-a-list", "endpoints", '{"name": "a"}', "expected a JSON list of endpoints, found dict"
    ),
    BadInput("endpoint-without-name", "endpoints", '[{"metrics": {}}]', "[0].name: Field required"),
    BadInput(
        "endpoint-bad-metric",
        "endpoints",
        '[{"name": "a", "metrics": {"kv_cache_usage_percent": 1.5}}]',
        "[0].metrics.kv_cache_usage_percent: Input should be less than or equal to 1",
    ),
    BadInput(
        "duplicate-endpoint",
        "endpoints",
        '[{"name": "a"}, {"name": "a"}]',
        "[1].name: endpoint name 'a' appears twice",
    ),
    BadInput("missing-request-file", "request", None, "cannot read: No such file or directory"),
    BadInput("request-not-json", "request", "model: m", "not valid JSON"),
    BadInput(
        "request-without-model",
        "request",
        '{"prompt": "hi"}',
        "request body has no 'model' (a non-empty string is required)",
    ),
    BadInput("request-not-an-object", "request", '["m"]', "request body must be a JSON object"),
    BadInput("request-without-prompt", "request", '{"model": "m"}', "completion request needs 'prompt'"),
    BadInput(
        "history-unknown-endpoint",
        "history",
        '[{"request": {"model": "m", "prompt": "x"}, "endpoint": "zz"}]',
        "[0].endpoint: no endpoint named 'zz' in the state (known: a, b, c)",
    ),
    BadInput(
        "history-not-a-list",
        "history",
        '{"request": {}, "endpoint": "a"}',
        "expected a JSON list of {'request': ..., 'endpoint': ...}",
    ),
    BadInput(
        "history-item-without-endpoint",
        "history",
        '[{"request": {"model": "m", "prompt": "x"}}]',
        "[0]: expected an object with 'request' and 'endpoint'",
    ),
    BadInput(
        "history-request-without-model",
        "history",
        '[{"request": {"prompt": "x"}, "endpoint": "a"}]',
        "[0].request: request body has no 'model'",
    ),
    BadInput(
        "history-bad-headers",
        "history",
        '[{"request": {"model": "m", "prompt": "x"}, "endpoint": "a", "headers": ["x"]}]',
        "[0].headers: expected an object",
    ),
    BadInput("missing-history-file", "history", None, "cannot read: No such file or directory"),
    BadInput(
        "config-unknown-type",
        "config",
        HEADER + "plugins:\n- type: queue-scorrer\n",
        "plugins[0].type: unknown plugin type 'queue-scorrer' (fix: did you mean 'queue-scorer'?",
    ),
    BadInput("missing-config-file", "config", None, "cannot read the file: No such file or directory"),
    BadInput(
        "header-without-colon", "", "", "--header 'nocolon': expected NAME:VALUE", ("--header", "nocolon")
    ),
    BadInput("header-empty-name", "", "", "--header ':v': expected NAME:VALUE", ("--header", ":v")),
    BadInput(  # the path chooses the parser and what it requires: an embeddings body needs 'input'
        "body-not-what-the-path-says",
        "request",
        '{"model": "m", "prompt": "x"}',
        "embeddings request needs 'input'",
        ("--path", "/v1/embeddings"),
    ),
]

SUFFIX = {"endpoints": ".json", "request": ".json", "history": ".json", "config": ".yaml"}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c.id for c in BAD_INPUTS])
def test_bad_input_exits_2_naming_the_file(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], tmp_path: Path, case: BadInput
) -> None:
    paths: dict[str, Path] = dict(files)
    args: list[str | Path] = []
    if case.file:
        bad = tmp_path / f"bad-{case.file}{SUFFIX[case.file]}"
        if case.content is not None:
            bad.write_text(case.content, encoding="utf-8")
        paths[case.file] = bad
    for flag in ("config", "endpoints", "request", "history"):
        if flag in paths:
            args += [f"--{flag}", paths[flag]]
    code, out, err = run(capsys, *args, *case.extra, "--json")
    assert code == 2
    assert out == ""  # nothing half-done on stdout
    if case.file == "config":
        assert err.startswith(f"{paths['config']}: {case.expected}")  # the config loader's own format
    elif case.file:
        assert err.startswith(f"error: {paths[case.file]}: {case.expected}")
    else:
        assert err.startswith(f"error: {case.expected}")


# --- human-readable output ---------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def plain(text: str) -> str:
    """Without terminal styling, and with line wrapping undone (one space per run of whitespace)."""
    return " ".join(ANSI.sub("", text).split())


def test_human_readable_output(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    hist = history(tmp_path, (REQUEST, "b"))
    code, out, err = run(
        capsys, "--endpoints", files["endpoints"], "--request", files["request"], "--history", hist
    )
    assert code == 0
    assert err == ""
    text = plain(out)
    assert "profile default" in text
    assert "candidates: a, b, c" in text
    assert "picker max-score-picker/max-score-picker: b" in text
    assert "primary profile: default targets: b" in text
    # The table: b marked as chosen, with total 5.000 (see test_history_warms_the_prefix_index).
    assert re.search(r"b ◀ │ 0\.500 │ 0\.500 │ 1\.000 │ 5\.000", text), text
    assert re.search(r"a │ 1\.000 │ 0\.900 │ 0\.000 │ 3\.800", text), text
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_human_readable_pd_shows_both_profiles(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(
        capsys,
        "--config", CONFIGS / "pd.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / "request-pd.json",
        "--history", EXAMPLES / "history.json",
    )  # fmt: skip
    assert code == 0
    text = plain(out)
    assert "profile decode" in text
    assert "profile prefill" in text
    assert "filter decode-filter/decode-filter: kept pod-a, pod-b, pod-d" in text
    assert "primary profile: decode targets: pod-a" in text
    assert "also prefill: pod-c" in text


# --- the shipped examples ----------------------------------------------------------------------


def test_pd_example_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, result = run_json(
        capsys,
        "--config", CONFIGS / "pd.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / "request-pd.json",
        "--history", EXAMPLES / "history.json",
    )  # fmt: skip
    assert code == 0
    assert result["primary_profile"] == "decode"
    assert result["targets"] == ["pod-a"]
    assert list(result["profiles"]) == ["decode", "prefill"]
    decode, prefill = result["profiles"]["decode"], result["profiles"]["prefill"]
    assert decode["filters"] == [
        {"plugin": "decode-filter/decode-filter", "kept": ["pod-a", "pod-b", "pod-d"]}
    ]
    assert prefill["filters"] == [{"plugin": "prefill-filter/prefill-filter", "kept": ["pod-c"]}]
    assert prefill["targets"] == ["pod-c"]
    # decode queue 2, 0, 6 -> (6-q)/6 = 2/3, 1, 0; kv 0.35, 0.7, 0.9 -> 0.65, 0.3, 0.1.
    # b = 3*0 + 2*1 + 2*0.3 = 2.6; d = 0 + 0 + 2*0.1 = 0.2; a = 3*p + 2*(2/3) + 2*0.65 with p the
    # share of the request's blocks that pod-a served before (the history's SQL system prompt).
    p = decode["scorers"][0]["scores"]["pod-a"]
    assert 0 < p < 1
    assert decode["totals"] == pytest.approx({"pod-a": 3 * p + 4 / 3 + 1.3, "pod-b": 2.6, "pod-d": 0.2})
    assert_totals_are_weighted_sums(result)


@pytest.mark.parametrize("name", ["default", "lora", "shadow"])
def test_other_examples_json(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, result = run_json(
        capsys,
        "--config", CONFIGS / f"{name}.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / f"request-{name}.json",
        "--history", EXAMPLES / "history.json",
    )  # fmt: skip
    assert code == 0
    assert result["error"] is None
    assert result["primary_profile"] == "default"
    # pod-a served this system prompt (for this model) in the history, and wins in every config.
    assert result["targets"] == ["pod-a"]
    expected_profiles = ["default", "candidate"] if name == "shadow" else ["default"]
    assert list(result["profiles"]) == expected_profiles
    assert_totals_are_weighted_sums(result)


def test_lora_example_filters_the_saturated_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    _, result = run_json(
        capsys,
        "--config", CONFIGS / "lora.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / "request-lora.json",
    )  # fmt: skip
    profile = result["profiles"]["default"]
    # pod-d: 6 waiting >= 5 and kv 0.9 >= 0.8 -> dropped by the utilization detector.
    assert profile["filters"] == [
        {"plugin": "utilization-detector/utilization-detector", "kept": ["pod-a", "pod-b", "pod-c"]}
    ]
    # lora-affinity for sql-lora: pod-a has it active (1); pod-b is full (2 of 2 active: 0);
    # pod-c has room to load it (0.8).
    assert profile["scorers"][0]["scores"] == {"pod-a": 1.0, "pod-b": 0.0, "pod-c": 0.8}


def test_examples_exits_0(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["examples"]) == 0
    text = plain(capsys.readouterr().out)
    for name in ("default", "lora", "pd", "shadow", "precise-prefix", "predicted-latency"):
        assert f"config/{name}.yaml" in text
    assert "shadow candidate (reported only):" in text
    assert "scheduling failed" not in text


def test_precise_example_replays_recorded_kv_events(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = (
        "--config", CONFIGS / "precise-prefix.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / "request-precise-prefix.json",
    )  # fmt: skip
    code, result = run_json(capsys, *args, "--kv-events", EXAMPLES / "kv-events.jsonl")
    assert code == 0 and result["targets"] == ["pod-b"]
    # 160 prompt tokens: 2 blocks of 64; pod-b's engine reported both, pod-c's the first.
    prefix = result["profiles"]["default"]["scorers"][0]
    assert prefix["plugin"] == "prefix-cache-scorer/prefix-cache-scorer"
    assert prefix["scores"] == {"pod-a": 0.0, "pod-b": 1.0, "pod-c": 0.5, "pod-d": 0.0}
    # Without the events the precise index knows nothing.
    _, cold = run_json(capsys, *args)
    assert set(cold["profiles"]["default"]["scorers"][0]["scores"].values()) == {0.0}
    # A line that is not an event batch is refused, naming the line.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"endpoint": "10.0.0.2:8000", "model": "m", "events": [{"type": "Teleported"}]}\n')
    assert main(["explain", *map(str, args), "--kv-events", str(bad)]) == 2
    assert f"{bad}:1: events[0]: unknown event type 'Teleported'" in capsys.readouterr().err


def test_predicted_latency_example_keeps_the_prefix_holder(capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        "--config", CONFIGS / "predicted-latency.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / "request-predicted-latency.json",
        "--history", EXAMPLES / "history.json",
    )  # fmt: skip
    code, result = run_json(capsys, *args)
    assert code == 0
    profile = result["profiles"]["default"]
    # The history sent this system prompt to pod-a: the affinity filter keeps it alone.
    assert profile["filters"][0]["kept"] == ["pod-a"] and result["targets"] == ["pod-a"]
    assert profile["scorers"][0]["plugin"] == "latency-cost-scorer/latency-cost-scorer"


def test_explain_shows_what_the_latency_producer_predicted(capsys: pytest.CaptureFixture[str]) -> None:
    args = (
        "--config", CONFIGS / "predicted-latency.yaml",
        "--endpoints", EXAMPLES / "endpoints.json",
        "--request", EXAMPLES / "request-predicted-latency.json",
        "--history", EXAMPLES / "history.json",
    )  # fmt: skip
    _, result = run_json(capsys, *args)
    predicted = result["predictions"]["predicted-latency-producer/predicted-latency-producer"]
    assert set(predicted) == {"pod-a", "pod-b", "pod-c", "pod-d"}
    # pod-a holds the prompt's prefix: it computes less of it, so its predicted TTFT is the lowest.
    assert min(predicted, key=lambda name: predicted[name]["ttft_ms"]) == "pod-a"
    # No objective in the request: nothing is valid and the TTFT headroom is minus the prediction.
    assert all(not p["valid"] and p["ttft_headroom_ms"] == -p["ttft_ms"] for p in predicted.values())
    assert main(["explain", *map(str, args)]) == 0
    assert "predicted by predicted-latency-producer" in plain(capsys.readouterr().out)
