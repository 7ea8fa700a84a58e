"""Static discovery: `--endpoints host:port,...` and `--endpoints-file` (YAML or JSON)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from epick.datalayer.datastore import EndpointSpec
from epick.datalayer.discovery.static import DiscoveryError, load_endpoints_file, parse_endpoints_flag

# --endpoints


def test_flag_one_and_many() -> None:
    assert parse_endpoints_flag("10.0.0.1:8000") == [EndpointSpec("10.0.0.1:8000", "10.0.0.1", 8000, {})]
    specs = parse_endpoints_flag(" 10.0.0.1:8000 , vllm-1.svc:8001,,localhost:1 ,")
    assert [(s.name, s.address, s.port) for s in specs] == [
        ("10.0.0.1:8000", "10.0.0.1", 8000),
        ("vllm-1.svc:8001", "vllm-1.svc", 8001),
        ("localhost:1", "localhost", 1),
    ]
    assert all(s.labels == {} for s in specs)
    assert specs[1].host_port == "vllm-1.svc:8001"


def test_flag_ipv6_in_brackets() -> None:
    [spec] = parse_endpoints_flag("[::1]:8000")
    assert (spec.address, spec.port) == ("::1", 8000)


def test_flag_highest_port() -> None:
    [spec] = parse_endpoints_flag("h:65535")
    assert spec.port == 65535


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("10.0.0.1", "--endpoints item 1 ('10.0.0.1'): expected host:port with a port in 1..65535"),
        ("a:1,10.0.0.1:", "--endpoints item 2 ('10.0.0.1:'): expected host:port"),
        ("10.0.0.1:0", "--endpoints item 1 ('10.0.0.1:0'): expected host:port with a port in 1..65535"),
        ("10.0.0.1:70000", "--endpoints item 1 ('10.0.0.1:70000')"),
        ("10.0.0.1:65536", "--endpoints item 1 ('10.0.0.1:65536')"),
        ("10.0.0.1:-1", "--endpoints item 1 ('10.0.0.1:-1')"),
        ("10.0.0.1:http", "--endpoints item 1 ('10.0.0.1:http')"),
        (":8000", "--endpoints item 1 (':8000')"),
        ("", "--endpoints: give at least one host:port"),
        (" , ,", "--endpoints: give at least one host:port"),
        ("a:1,b:2,a:1", "--endpoints: endpoint 'a:1' is listed twice"),
    ],
)
def test_flag_errors(value: str, message: str) -> None:
    with pytest.raises(DiscoveryError, match=re.escape(message)):
        parse_endpoints_flag(value)


def test_flag_bad_ipv6_names_the_item() -> None:
    with pytest.raises(DiscoveryError, match=re.escape("--endpoints item 1 ('[nope]:8000')")):
        parse_endpoints_flag("[nope]:8000")


# --endpoints-file


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_yaml_file(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "endpoints.yaml",
        """\
# Two decode servers and a prefill one.
- name: decode-0
  address: 10.0.0.1
  port: 8000
  labels:
    llm-d.ai/role: decode
    inference.networking.k8s.io/engine-type: vllm
- address: 10.0.0.2
  port: 8000
- 10.0.0.3:8001
- name: prefill-0
  address: prefill.svc.cluster.local
  port: 9000
  labels: {llm-d.ai/role: prefill}
""",
    )
    assert load_endpoints_file(path) == [
        EndpointSpec(
            "decode-0",
            "10.0.0.1",
            8000,
            {"llm-d.ai/role": "decode", "inference.networking.k8s.io/engine-type": "vllm"},
        ),
        EndpointSpec("10.0.0.2:8000", "10.0.0.2", 8000, {}),  # name defaults to address:port
        EndpointSpec("10.0.0.3:8001", "10.0.0.3", 8001, {}),
        EndpointSpec("prefill-0", "prefill.svc.cluster.local", 9000, {"llm-d.ai/role": "prefill"}),
    ]


def test_yaml_file_with_endpoints_key(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "e.yaml", "endpoints:\n- {address: a, port: 1}\n- {address: b, port: 2, labels: {}}\n"
    )
    assert [s.name for s in load_endpoints_file(str(path))] == ["a:1", "b:2"]


def test_json_file(tmp_path: Path) -> None:
    data = {
        "endpoints": [
            {"name": "gpu-a", "address": "10.1.0.1", "port": 8000, "labels": {"gpu": "h100"}},
            {"address": "10.1.0.2", "port": 8000, "labels": None},
        ]
    }
    path = _write(tmp_path, "endpoints.json", json.dumps(data, indent=2))
    assert load_endpoints_file(path) == [
        EndpointSpec("gpu-a", "10.1.0.1", 8000, {"gpu": "h100"}),
        EndpointSpec("10.1.0.2:8000", "10.1.0.2", 8000, {}),
    ]
    plain_list = _write(tmp_path, "list.json", json.dumps(["10.1.0.3:80"]))
    assert [s.name for s in load_endpoints_file(plain_list)] == ["10.1.0.3:80"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "expected a non-empty list of endpoints (or {endpoints: [...]})"),
        ("[]", "expected a non-empty list of endpoints"),
        ("endpoints: []", "expected a non-empty list of endpoints"),
        ("{servers: [a:1]}", "expected a non-empty list of endpoints"),
        ("just a string", "expected a non-empty list of endpoints"),
        ("- [oops", "not valid YAML or JSON"),
        ('{"endpoints": [', "not valid YAML or JSON"),
        ("- 10.0.0.1\n", "endpoints[0]: expected host:port with a port in 1..65535"),
        ("- a:1\n- 10.0.0.1:0\n", "endpoints[1]: expected host:port with a port in 1..65535"),
        ("- 42\n", "endpoints[0]: expected host:port or an object with address and port"),
        ("- {address: a, port: 1, weight: 2, zone: x}\n",
         "endpoints[0]: unknown fields ['weight', 'zone'] (allowed: name, address, port, labels)"),
        ("- {address: a, port: 1}\n- {host: b, port: 2}\n", "endpoints[1]: unknown fields ['host']"),
        ("- {port: 1}\n", "endpoints[0].address: required, a host name or IP"),
        ("- {address: '', port: 1}\n", "endpoints[0].address: required"),
        ("- {address: 7, port: 1}\n", "endpoints[0].address: required"),
        ("- {address: a}\n", "endpoints[0].port: required, an integer in 1..65535"),
        ("- {address: a, port: '8000'}\n", "endpoints[0].port: required, an integer in 1..65535"),
        ("- {address: a, port: 0}\n", "endpoints[0].port"),
        ("- {address: a, port: 70000}\n", "endpoints[0].port"),
        ("- {address: a, port: true}\n", "endpoints[0].port"),
        ("- {address: a, port: 80.5}\n", "endpoints[0].port"),
        ("- {address: a, port: 1, labels: {gpu: 80}}\n",
         "endpoints[0].labels: a mapping of strings to strings"),
        ("- {address: a, port: 1, labels: {version: 1.0}}\n", "endpoints[0].labels"),
        ("- {address: a, port: 1, labels: [gpu]}\n", "endpoints[0].labels"),
        ("- {address: a, port: 1, labels: gpu=h100}\n", "endpoints[0].labels"),
        ("- {address: a, port: 1, name: 12}\n", "endpoints[0].name: a string"),
        ("- {name: x, address: a, port: 1}\n- {name: x, address: b, port: 2}\n",
         "endpoint 'x' is listed twice"),
        ("- a:1\n- {address: a, port: 1}\n", "endpoint 'a:1' is listed twice"),
    ],
)  # fmt: skip
def test_file_errors_name_the_file_and_entry(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, "endpoints.yaml", text)
    with pytest.raises(DiscoveryError) as e:
        load_endpoints_file(path)
    assert str(e.value).startswith(f"{path}: "), str(e.value)
    assert message in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(DiscoveryError, match=re.escape(f"{path}: cannot read: No such file or directory")):
        load_endpoints_file(path)


def test_non_utf8_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"- name: caf\xe9\n  address: a\n  port: 1\n")
    with pytest.raises(DiscoveryError, match=re.escape(str(path))):
        load_endpoints_file(path)


@pytest.mark.parametrize("labels", ["[]", "''", "0"])
def test_falsy_non_mapping_labels_are_errors(tmp_path: Path, labels: str) -> None:
    path = _write(tmp_path, "e.yaml", f"- {{address: a, port: 1, labels: {labels}}}\n")
    with pytest.raises(DiscoveryError, match=re.escape("endpoints[0].labels")):
        load_endpoints_file(path)
