"""Every EndpointPickerConfig document upstream publishes, loaded unchanged and asked to schedule.

tests/config/upstream/ holds the configs of GIE v1.5.0 (docs, Helm chart, integration and loader
testdata), llm-d-router and llm-d-inference-scheduler (deploy configs, docs, e2e tests) and the llm-d
guides (those extracted from values files at llm-d 7edda66; the standalone ones at 48fa8c0), each
with a `# Source:` line naming its repository, revision and path. The guides' values files
themselves, with the configs they embed, are read by test_upstream_values.py. A file whose types
epick has must load (`epick check-config`) and schedule a request (`epick explain`) on a pool of
decode, prefill and encode endpoints. A file that needs a type epick does not implement yet is listed
in PENDING with exactly the types it lacks, and the loader must say so of each, naming its upstream
origin: when a type lands, its files leave the list.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from epick.cli.explain import explain
from epick.cli.main import main
from epick.config import ConfigError, load_config_file
from epick.framework import ChatMessage, Endpoint, InferenceRequest, Metrics, RequestBody
from tests.builders import make_endpoint

CORPUS = Path(__file__).parent / "upstream"
FILES = sorted(CORPUS.glob("*/*.yaml"))

# Files that name types epick does not implement yet, with exactly those types (none today).
PENDING: dict[str, set[str]] = {}


def _missing(path: Path) -> set[str]:
    try:
        load_config_file(path, seed=0)
    except ConfigError as e:
        found = set()
        for issue in e.issues:
            if issue.message.startswith("depends on plugin"):
                continue  # a consequence of a missing type, reported at that type
            m = re.search(
                r"reads ([a-z-]+), an upstream type epick does not implement yet", issue.message
            ) or re.search(
                r"plugin type '([^']+)' is an upstream EPP .* that epick does not implement yet",
                issue.message,
            )
            assert m is not None, f"{path.name}: {issue.render(e.source)}"
            found.add(m.group(1))
        return found
    return set()


def _pool() -> list[Endpoint]:
    def ep(name: str, role: str | None, queue: int, address: str, **labels: str) -> Endpoint:
        if role is not None:
            labels["role"] = role  # the label key upstream's docs select on
        if role in ("decode", "prefill"):  # one DisaggregatedSet revision (the rollout screener's labels)
            labels["disaggregatedset.x-k8s.io/name"] = "my-set"
            labels["disaggregatedset.x-k8s.io/revision"] = "r1"
            labels["disaggregatedset.x-k8s.io/role"] = role
        base = make_endpoint(name, role=role, queue=queue, address=address, labels=labels)
        return base.with_metrics(
            Metrics(waiting_queue_size=queue, kv_cache_usage_percent=0.2, update_time=None)
        )

    return [
        ep("decode-0", "decode", 0, "10.0.0.1", **{"kubernetes.io/hostname": "n1"}),
        ep("decode-1", "decode", 2, "10.0.0.2", **{"kubernetes.io/hostname": "n2"}),
        ep("prefill-0", "prefill", 1, "10.0.0.3", **{"kubernetes.io/hostname": "n1"}),
        ep("encode-0", "encode", 0, "10.0.0.4"),
        ep("plain-0", None, 1, "10.0.0.5"),
    ]


def _request() -> InferenceRequest:
    content = [{"type": "text", "text": "describe " * 40}, {"type": "image_url", "image_url": {"url": "u"}}]
    return InferenceRequest(
        target_model="meta-llama/Llama-3.1-8B-Instruct",
        body=RequestBody.chat([ChatMessage("user", content)]),
        request_id="corpus",
        headers={"x-session-token": ""},
    )


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_upstream_config_loads_and_schedules_or_names_what_epick_lacks(path: Path) -> None:
    assert path.read_text(encoding="utf-8").startswith("# Source: "), "each corpus file names its source"
    missing = _missing(path)
    assert missing == PENDING.get(f"{path.parent.name}/{path.name}", set())
    if missing:
        return
    config = load_config_file(path, seed=0)
    explanation = explain(config, _request(), _pool())
    assert explanation.result is not None, f"{path.name}: {explanation.trace.error}"
    assert explanation.result.targets


def test_pending_lists_only_corpus_files() -> None:
    names = {f"{p.parent.name}/{p.name}" for p in FILES}
    assert set(PENDING) <= names
    assert len(FILES) >= 100


LOADABLE = [p for p in FILES if f"{p.parent.name}/{p.name}" not in PENDING]
POOL = Path(__file__).parent / "corpus"


@pytest.mark.parametrize("path", LOADABLE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_epick_check_config_and_explain_accept_the_upstream_config(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok")
    args = ["explain", "--config", str(path), "--endpoints", str(POOL / "endpoints.json"), "--json"]
    parsers = load_config_file(path, seed=0).parsers
    if parsers.resolve("/v1/chat/completions") is not None:
        args += ["--request", str(POOL / "request.json")]
    elif parsers.resolve("/inference/v1/generate") is not None:
        args += ["--request", str(POOL / "generate.json"), "--path", "/inference/v1/generate"]  # vLLM's
    else:
        # Only gRPC bodies (vertexai-parser): `explain` reads JSON; the first test schedules these.
        return
    assert main(args) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["targets"] and decision["error"] is None
