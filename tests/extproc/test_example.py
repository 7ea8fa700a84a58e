"""The shipped gateway example: Envoy accepts it, it carries GIE's ext_proc settings, and what it
health-checks (the ext_proc port) answers."""

from __future__ import annotations

import subprocess

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore
from epick.extproc.server import SERVICE_NAME, ExtProcOptions, ExtProcServer
from epick.requestcontrol.director import Director
from tests.extproc.gateway import EXAMPLE, envoy_binary, ext_proc_filter


def test_envoy_accepts_the_example() -> None:
    done = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(EXAMPLE), "--base-id", "7301"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


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
    director = Director(load_default_config(seed=1), Datastore())
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
