"""`file-discovery`: the pool's endpoints from a YAML/JSON file, read once or watched.

Expected values follow upstream's rules (llm-d/llm-d-router, datalayer/discovery/file, README): entries
`{name, namespace (default "default"), address (IPv4), port (1..65535), labels}`, a file of at most
1 MiB; a bad entry fails the first load and is skipped, with an error logged, on a reload.
"""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest
from aiohttp import web

from epick.cli.main import build_parser
from epick.cli.serve import settings_from
from epick.datalayer.datastore import Datastore, EndpointSpec
from epick.datalayer.discovery.file import FileDiscoveryRunner
from epick.datalayer.discovery.static import DiscoveryError
from epick.plugins.datalayer.file_discovery import (
    MAX_FILE_BYTES,
    EndpointsFileError,
    FileDiscovery,
    FileEndpoint,
    parse_endpoints_file,
)
from epick.service import Service, Settings
from tests.conftest import MakeApp
from tests.datalayer.pages import vllm_page, wait_until

LOGGER = "epick.datalayer.discovery.file"


def parse(text: str) -> tuple[list[FileEndpoint], list[str]]:
    return parse_endpoints_file(textwrap.dedent(text).encode())


def one_error(entry: str) -> str:
    """The one error of a file holding one entry (YAML flow mapping)."""
    found, errors = parse(f"endpoints:\n- {entry}\n")
    assert found == [] and len(errors) == 1, (found, errors)
    return errors[0]


# --- parse_endpoints_file -----------------------------------------------------------------------


def test_entries_with_default_namespace_string_and_int_ports_and_labels() -> None:
    found, errors = parse(
        """\
        endpoints:
        - name: vllm-0
          address: 10.0.0.1
          port: "8000"
        - name: vllm-1
          namespace: ns1
          address: "10.0.0.2"
          port: 8001
          labels:
            llm-d.ai/role: decode
            app: vllm
        """
    )
    assert errors == []
    assert found == [
        FileEndpoint("vllm-0", "10.0.0.1", 8000, "default", {}),
        FileEndpoint("vllm-1", "10.0.0.2", 8001, "ns1", {"llm-d.ai/role": "decode", "app": "vllm"}),
    ]


def test_json_is_read_too() -> None:
    found, errors = parse_endpoints_file(
        b'{"endpoints": [{"name": "a", "namespace": "", "address": "192.168.1.9", "port": "65535"}]}'
    )
    assert (found, errors) == ([FileEndpoint("a", "192.168.1.9", 65535)], [])


@pytest.mark.parametrize("address", ["10.0.0.256", "10.0.0", "vllm-0.example.com", '""', "167772161"])
def test_an_address_that_is_not_ipv4_is_refused(address: str) -> None:
    error = one_error(f"{{name: a, address: {address}, port: '8000'}}")
    assert error.startswith("endpoints[0]: a: invalid IPv4 address ")


@pytest.mark.parametrize("address", ["'::1'", "'fd00::1'", "'::ffff:10.0.0.1'"])
def test_ipv6_is_refused(address: str) -> None:
    assert "invalid IPv4 address" in one_error(f"{{name: a, address: {address}, port: '8000'}}")


def test_a_missing_address_is_refused() -> None:
    assert one_error("{name: a, port: '8000'}") == "endpoints[0]: a: invalid IPv4 address None"


@pytest.mark.parametrize(
    "port", ["'0'", "0", "'65536'", "65536", "'http'", "'80a'", "-1", "true", "8000.5", "null"]
)
def test_a_port_outside_1_to_65535_is_refused(port: str) -> None:
    error = one_error(f"{{name: a, address: 10.0.0.1, port: {port}}}")
    assert error.startswith("endpoints[0]: a: invalid port ") and error.endswith("(1..65535)")


def test_unknown_fields_are_refused() -> None:
    error = one_error("{name: a, address: 10.0.0.1, port: '8000', hostname: node-1}")
    assert error == "endpoints[0]: unknown field(s) 'hostname'"
    with pytest.raises(EndpointsFileError, match="unknown field"):
        parse("endpoints: []\npools: []\n")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("vllm-0", "an entry is an object"),
        ("{address: 10.0.0.1, port: '8000'}", "'name' must be a non-empty string"),
        ("{name: '', address: 10.0.0.1, port: '8000'}", "'name' must be a non-empty string"),
        ("{name: a, namespace: 5, address: 10.0.0.1, port: '8000'}", "'namespace' must be a string"),
        (
            "{name: a, address: 10.0.0.1, port: '8000', labels: {x: 1}}",
            "'labels' must map strings to strings",
        ),
        ("{name: a, address: 10.0.0.1, port: '8000', labels: [x]}", "'labels' must map strings to strings"),
    ],
)
def test_malformed_entries(entry: str, words: str) -> None:
    error = one_error(entry)
    assert error.startswith("endpoints[0]: ") and words in error


def test_bad_entries_are_reported_and_the_rest_kept() -> None:
    found, errors = parse(
        """\
        endpoints:
        - {name: a, address: 10.0.0.1, port: "8000"}
        - {name: b, address: 10.0.0.x, port: "8000"}
        - {name: c, address: 10.0.0.3, port: "99999"}
        - {name: d, address: 10.0.0.4, port: "8000"}
        """
    )
    assert [ep.name for ep in found] == ["a", "d"]
    assert errors == [
        "endpoints[1]: b: invalid IPv4 address '10.0.0.x'",
        "endpoints[2]: c: invalid port '99999' (1..65535)",
    ]


def test_a_later_entry_of_the_same_name_wins() -> None:
    found, errors = parse(
        """\
        endpoints:
        - {name: a, address: 10.0.0.1, port: "8000"}
        - {name: b, address: 10.0.0.2, port: "8000"}
        - {name: a, address: 10.0.0.9, port: "9000", labels: {v: "2"}}
        """
    )
    assert errors == []
    assert sorted(found, key=lambda ep: ep.name) == [
        FileEndpoint("a", "10.0.0.9", 9000, "default", {"v": "2"}),
        FileEndpoint("b", "10.0.0.2", 8000),
    ]


def test_the_file_is_at_most_one_mib() -> None:
    # Exactly 1 MiB passes the size check and goes on to the YAML parser (which stops at once on the
    # '@' here: a full parse of a 1 MiB document would take the pure-Python parser about a second).
    exactly = b"@" + b"x" * (MAX_FILE_BYTES - 1)
    assert len(exactly) == 1 << 20
    with pytest.raises(EndpointsFileError, match="not YAML or JSON"):
        parse_endpoints_file(exactly)
    with pytest.raises(EndpointsFileError, match=r"exceeds 1 MiB \(1048577 bytes\)"):
        parse_endpoints_file(exactly + b"x")
    big = b"endpoints: []\n" + b"#" * MAX_FILE_BYTES
    with pytest.raises(EndpointsFileError, match="exceeds 1 MiB"):
        parse_endpoints_file(big)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("- name: a\n- name: b\n", "must be an object"),
        ("42\n", "must be an object"),
        ("just some text\n", "must be an object"),
        ("endpoints: {a: b}\n", "'endpoints' must be a list"),
        ("endpoints: [\n", "not YAML or JSON"),
    ],
)
def test_a_document_that_is_not_an_endpoints_mapping(text: str, words: str) -> None:
    with pytest.raises(EndpointsFileError, match=words):
        parse_endpoints_file(text.encode())


@pytest.mark.parametrize("text", ["", "   \n", "endpoints:\n", "endpoints: []\n", "{}\n"])
def test_empty_files_list_no_endpoints(text: str) -> None:
    assert parse_endpoints_file(text.encode()) == ([], [])


# --- FileDiscoveryRunner ----------------------------------------------------------------------

TWO = """\
endpoints:
- {name: a, address: 10.0.0.1, port: "8000", labels: {app: vllm}}
- {name: b, address: 10.0.0.2, port: 8001}
"""


def runner_for(path: Path, ds: Datastore, *, watch: bool = False, poll: float = 1.0) -> FileDiscoveryRunner:
    return FileDiscoveryRunner(ds, FileDiscovery("files", str(path), watch), poll_interval=poll)


def by_name(ds: Datastore) -> dict[str, EndpointSpec]:
    return {spec.name: spec for spec in ds.specs()}


async def test_initial_load_fills_the_datastore(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(TWO)
    ds = Datastore()
    runner = runner_for(path, ds)
    await runner.start()
    try:
        # The pod name is the entry's name, as upstream's PodName.
        assert by_name(ds) == {
            "a": EndpointSpec("a", "10.0.0.1", 8000, {"app": "vllm"}, "a"),
            "b": EndpointSpec("b", "10.0.0.2", 8001, {}, "b"),
        }
        assert runner.loads == 1 and runner.source == f"file {path}"
    finally:
        await runner.stop()


async def test_initial_load_with_a_bad_entry_fails_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(TWO + '- {name: broken, address: "::1", port: "8000"}\n')
    runner = runner_for(path, Datastore())
    with pytest.raises(DiscoveryError) as e:
        await runner.start()
    message = str(e.value)
    assert str(path) in message
    assert "endpoints[2]: broken: invalid IPv4 address '::1'" in message
    assert "initial load failed" in message


@pytest.mark.parametrize("content", [None, "- a\n", "endpoints: [\n", "endpoints: []\nextra: 1\n"])
async def test_initial_load_of_an_unreadable_file_fails(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "endpoints.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DiscoveryError, match=f"file-discovery: {path}: "):
        await runner_for(path, Datastore()).start()


async def test_reload_adds_changes_removes_and_logs_bad_entries(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    path = tmp_path / "endpoints.yaml"
    path.write_text(TWO)
    ds = Datastore()
    events: list[tuple[str, bool]] = []
    ds.subscribe(lambda name, spec: events.append((name, spec is not None)))
    runner = runner_for(path, ds)
    runner.load(initial=True)
    events.clear()

    path.write_text(
        textwrap.dedent(
            """\
            endpoints:
            - {name: b, address: 10.0.0.2, port: 9001}
            - {name: c, address: 10.0.0.3, port: "8000"}
            - {name: d, address: 10.0.0.4, port: "0"}
            """
        )
    )
    runner.load(initial=False)
    assert by_name(ds) == {
        "b": EndpointSpec("b", "10.0.0.2", 9001, {}, "b"),
        "c": EndpointSpec("c", "10.0.0.3", 8000, {}, "c"),
    }
    assert sorted(events) == [("a", False), ("b", True), ("c", True)]
    assert runner.loads == 2
    errors = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 1 and "endpoints[2]: d: invalid port '0'" in errors[0]
    # The same file again: no endpoint is touched (the bad entry is reported again).
    events.clear()
    runner.load(initial=False)
    assert events == [] and runner.loads == 3


async def test_reload_of_a_broken_file_keeps_the_endpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(TWO)
    ds = Datastore()
    runner = runner_for(path, ds)
    runner.load(initial=True)
    before = by_name(ds)
    for broken in ("not: [valid\n", "- a list\n"):
        path.write_text(broken)
        runner.load(initial=False)
        assert by_name(ds) == before
    path.unlink()
    runner.load(initial=False)
    assert by_name(ds) == before and runner.loads == 1
    errors = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.ERROR]
    assert len(errors) == 3 and all("keeping the endpoints from the last load" in e for e in errors)


async def test_watched_file_is_reloaded_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(TWO)
    watched_ds, once_ds = Datastore(), Datastore()
    watched = runner_for(path, watched_ds, watch=True, poll=0.01)
    once = runner_for(path, once_ds, watch=False, poll=0.01)
    await watched.start()
    await once.start()
    try:
        assert watched.source == f"file {path} (watched)"
        path.write_text(TWO + '- {name: c, address: 10.0.0.3, port: "8002"}\n')
        await wait_until(lambda: set(by_name(watched_ds)) == {"a", "b", "c"}, what="the added endpoint")
        path.write_text('endpoints:\n- {name: c, address: 10.0.0.3, port: "8002"}\n')
        await wait_until(lambda: set(by_name(watched_ds)) == {"c"}, what="the removals")
        # Read once: unchanged.
        assert set(by_name(once_ds)) == {"a", "b"} and once.loads == 1
    finally:
        await watched.stop()
        await once.stop()


# --- epick serve with dataLayer.discovery ---------------------------------------------------------


class Fake:
    def __init__(self, waiting: int) -> None:
        self.page = vllm_page(waiting=waiting, running=1, kv=0.25)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/plain")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "sim-model", "object": "model"}]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        return app


def serve_config(tmp_path: Path, endpoints: str) -> str:
    endpoints_path = tmp_path / "endpoints.yaml"
    endpoints_path.write_text(endpoints)
    config = tmp_path / "epp.yaml"
    config.write_text(
        f"""\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- name: files
  type: file-discovery
  parameters: {{path: "{endpoints_path}"}}
dataLayer:
  discovery: {{pluginRef: files}}
"""
    )
    return str(config)


async def test_service_fills_its_datastore_from_the_configured_file(
    tmp_path: Path, make_app: MakeApp
) -> None:
    a, b = await make_app(Fake(waiting=3).app()), await make_app(Fake(waiting=5).app())
    config = serve_config(
        tmp_path,
        f"""\
endpoints:
- {{name: vllm-a, address: 127.0.0.1, port: "{a.port}", labels: {{llm-d.ai/role: decode}}}}
- {{name: vllm-b, address: 127.0.0.1, port: {b.port}}}
""",
    )
    service = Service(
        Settings(config_file=config, proxy=None, metrics_port=None, refresh_metrics_interval=0.01)
    )
    assert isinstance(service.discovery, FileDiscoveryRunner)
    assert len(service.datastore) == 0
    await service.start()
    try:
        assert by_name(service.datastore) == {
            "vllm-a": EndpointSpec("vllm-a", "127.0.0.1", a.port, {"llm-d.ai/role": "decode"}, "vllm-a"),
            "vllm-b": EndpointSpec("vllm-b", "127.0.0.1", b.port, {}, "vllm-b"),
        }
        # The injected default source scrapes them.
        await wait_until(
            lambda: all(ep.metrics.update_time is not None for ep in service.datastore.all_endpoints()),
            what="both endpoints scraped",
        )
        waiting = {ep.name: ep.metrics.waiting_queue_size for ep in service.datastore.all_endpoints()}
        assert waiting == {"vllm-a": 3, "vllm-b": 5}
    finally:
        await service.stop()


async def test_service_fails_to_start_on_a_bad_endpoints_file(tmp_path: Path) -> None:
    config = serve_config(tmp_path, 'endpoints:\n- {name: x, address: 10.0.0.1, port: "0"}\n')
    service = Service(Settings(config_file=config, proxy=None, metrics_port=None))
    try:
        with pytest.raises(DiscoveryError, match="x: invalid port"):
            await service.start()
    finally:
        await service.stop()


async def test_endpoints_on_the_command_line_win_over_the_configured_discovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = serve_config(tmp_path, 'endpoints:\n- {name: from-file, address: 10.0.0.1, port: "8000"}\n')
    static = (EndpointSpec("static", "127.0.0.1", 1, {}),)
    with caplog.at_level(logging.WARNING):
        service = Service(Settings(endpoints=static, config_file=config, proxy=None, metrics_port=None))
    assert service.discovery is None
    assert any(
        "dataLayer.discovery" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records
    )
    assert [spec.name for spec in service.datastore.specs()] == ["static"]


def test_serve_accepts_a_config_file_as_the_only_source_of_endpoints(tmp_path: Path) -> None:
    config = serve_config(tmp_path, "endpoints: []\n")
    options = settings_from(build_parser().parse_args(["serve", "--config-file", config]))
    assert options.config_file == config and options.endpoints == () and options.kubernetes is None


async def test_stop_without_start_is_harmless(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(TWO)
    runner = runner_for(path, Datastore(), watch=True, poll=0.01)
    await runner.stop()
    await runner.start()
    await runner.stop()
    await runner.stop()


async def test_a_reload_that_points_discovery_at_another_file_follows_it(tmp_path: Path) -> None:
    config = serve_config(tmp_path, 'endpoints:\n- {name: old-0, address: 10.0.0.1, port: "8000"}\n')
    other = tmp_path / "other.yaml"
    other.write_text('endpoints:\n- {name: new-0, address: 10.0.0.2, port: "8000"}\n')
    service = Service(Settings(config_file=config, proxy=None, metrics_port=None))
    await service.start()
    try:
        assert set(by_name(service.datastore)) == {"old-0"}
        text = Path(config).read_text().replace(str(tmp_path / "endpoints.yaml"), str(other))
        Path(config).write_text(text)
        assert service.reload()
        await wait_until(
            lambda: set(by_name(service.datastore)) == {"new-0"}, what="the new file's endpoints"
        )
        assert isinstance(service.discovery, FileDiscoveryRunner) and service.discovery.path == str(other)
        # Reloading the same config keeps the running discovery.
        running = service.discovery
        assert service.reload()
        assert service.discovery is running
    finally:
        await service.stop()
