"""The ext_proc server's bounds: open streams, and a plaintext health port for Kubernetes' probes."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epick.config import load_default_config
from epick.datalayer.datastore import Datastore
from epick.extproc.server import SERVICE_NAME, ExtProcOptions, ExtProcServer
from epick.requestcontrol.director import Director


def server(**options: object) -> ExtProcServer:
    director = Director(load_default_config(seed=1), Datastore().snapshot)
    return ExtProcServer(director, ExtProcOptions(host="127.0.0.1", port=0, health_port=0, **options))  # type: ignore[arg-type]


async def test_streams_beyond_the_limit_are_refused() -> None:
    s = server(secure=False, max_streams=1)
    await s.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") as channel:
            stub = pb_grpc.ExternalProcessorStub(channel)
            held = stub.Process()
            await held.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
            await held.read()  # the stream is open and answered: it holds the one slot
            refused = stub.Process()
            # Read only: a write can lose the race with the server's refusal and fail locally
            # ("Internal error from Core"), which would hide the status the server sent.
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await refused.read()
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            await held.done_writing()
            held.cancel()
    finally:
        await s.stop()


async def test_the_health_port_can_be_plaintext_while_ext_proc_keeps_tls() -> None:
    s = server(secure=True, health_plaintext=True)
    await s.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.health_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME)
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{s.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await asyncio.wait_for(
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2), 5
                )
    finally:
        await s.stop()
