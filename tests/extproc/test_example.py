"""The shipped gateway example: Envoy accepts it, it carries GIE's ext_proc settings, what it
health-checks (the ext_proc port) answers, and its TLS settings make Envoy verify epick's certificate
(the CA from its trusted_ca file and the DNS name it matches)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore
from epick.extproc.server import SERVICE_NAME, ExtProcOptions, ExtProcServer
from epick.requestcontrol.director import Director
from tests.extproc.gateway import EXAMPLE, envoy_binary, ext_proc_filter, free_port
from tests.extproc.test_tls import CA, SecretDir

CA_PATH = "/etc/epick/ca.crt"  # where the example's trusted_ca points


def epick_tls(config: dict[str, Any]) -> dict[str, Any]:
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "epick")
    return dict(cluster["transport_socket"]["typed_config"])


def with_ca(tmp_path: Path, ca_pem: bytes) -> str:
    """The example's text with its trusted_ca path pointing at a file holding `ca_pem`: Envoy's
    validate mode reads the file."""
    text = EXAMPLE.read_text()
    assert CA_PATH in text
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca_pem)
    return text.replace(CA_PATH, str(ca_file))


def test_envoy_accepts_the_example(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(with_ca(tmp_path, CA("example-ca").pem))
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--base-id", "7301"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_example_verifies_epicks_certificate_by_ca_and_name() -> None:
    tls = epick_tls(yaml.safe_load(EXAMPLE.read_text()))
    assert tls["common_tls_context"]["alpn_protocols"] == ["h2"]  # else gRPC refuses the health checks
    validation = tls["common_tls_context"]["validation_context"]
    assert validation["trusted_ca"] == {"filename": CA_PATH}
    assert validation["match_typed_subject_alt_names"] == [
        {"san_type": "DNS", "matcher": {"exact": tls["sni"]}}
    ]


def parse_stats(text: str, prefix: str) -> dict[str, int]:
    lines = (line.partition(": ") for line in text.splitlines())
    return {
        name.removeprefix(prefix): int(v) for name, _, v in lines if name.startswith(prefix) and v.isdigit()
    }


async def envoy_health_checks(tmp_path: Path, config: dict[str, Any], epick_port: int) -> dict[str, int]:
    """Run Envoy on `config` (the example, its ports moved to free ones and epick's to `epick_port`) until
    its first health check of epick is done; its cluster.epick health-check and ssl counters."""
    listen, admin = free_port(), free_port()
    config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"] = listen
    config["admin"]["address"]["socket_address"]["port_value"] = admin
    cluster = next(c for c in config["static_resources"]["clusters"] if c["name"] == "epick")
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"]["port_value"] = epick_port
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "envoy.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [envoy_binary(), "-c", str(path), "--concurrency", "1", "--log-level", "warn",
             "--base-id", str(listen)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(400):
                assert proc.poll() is None, log.read_text()
                try:
                    async with session.get(f"http://127.0.0.1:{admin}/stats?filter=cluster.epick.") as r:
                        stats = parse_stats(await r.text(), "cluster.epick.")
                except aiohttp.ClientError:
                    stats = {}
                if stats.get("health_check.success", 0) + stats.get("health_check.failure", 0) > 0:
                    return stats
                await asyncio.sleep(0.025)
        raise AssertionError(f"Envoy never health-checked epick: {log.read_text()}")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.parametrize("cert", ["trusted", "another CA", "another name"])
async def test_envoy_with_the_example_checks_epicks_certificate(tmp_path: Path, cert: str) -> None:
    """Envoy, configured as the example, health-checks epick over TLS: it succeeds with a certificate
    from the trusted CA for the expected name, and fails verification otherwise."""
    trusted, other = CA("trusted-ca"), CA("other-ca")
    issuer = other if cert == "another CA" else trusted
    pair = issuer.issue(dns="epick.example.com" if cert == "another name" else "localhost")
    secret = SecretDir(tmp_path / "certs", pair)
    config = yaml.safe_load(with_ca(tmp_path, trusted.pem))
    director = Director(load_default_config(seed=1), Datastore().snapshot)
    server = ExtProcServer(
        director, ExtProcOptions(host="127.0.0.1", port=0, health_port=0, cert_path=str(secret.path))
    )
    await server.start()
    try:
        stats = await envoy_health_checks(tmp_path, config, server.port)
    finally:
        await server.stop()
    seen = {name: n for name, n in stats.items() if n}
    if cert == "trusted":
        assert stats["health_check.success"] == 1, seen
    else:
        assert stats["health_check.failure"] == 1, seen
        verify = "ssl.fail_verify_error" if cert == "another CA" else "ssl.fail_verify_san"
        assert stats[verify] >= 1, seen


def test_the_example_has_gie_gateway_settings() -> None:
    settings = ext_proc_filter(yaml.safe_load(EXAMPLE.read_text()))
    assert settings["processing_mode"] == {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": "FULL_DUPLEX_STREAMED",
        "response_body_mode": "FULL_DUPLEX_STREAMED",
        "request_trailer_mode": "SEND",
        "response_trailer_mode": "SEND",
    }
    assert settings["failure_mode_allow"] is False


async def test_the_ext_proc_port_answers_health_checks() -> None:
    director = Director(load_default_config(seed=1), Datastore().snapshot)
    server = ExtProcServer(director, ExtProcOptions(host="127.0.0.1", port=0, health_port=0, secure=False))
    await server.start()
    try:
        for port in (server.port, server.health_port):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop()
