"""`epp` started as the kubelet starts it: a process with a chart's arguments and environment, its
config file where the chart mounts it (under a temporary directory here), the API double as its
cluster; probed as the kubelet probes, and reached through a real Envoy."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.epp.charts import ChartPod
from tests.extproc.gateway import TEMPLATE, Modes, envoy_binary, envoy_ready, free_port
from tests.kubernetes.test_serve import kubeconfig


async def probe(port: int, service: str) -> int:
    """A plaintext grpc.health.v1 Check on 127.0.0.1:`port`, as the kubelet's grpc probe makes it."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(reply.status)


@dataclass
class Epp:
    """One `epp` process and the ports it was given."""

    proc: subprocess.Popen[bytes]
    grpc_port: int
    health_port: int
    metrics_port: int
    log_path: Path
    extra: list[str] = field(default_factory=list)

    def log_lines(self) -> list[dict[str, Any]]:
        """Every line it wrote to stderr, each parsed as JSON (a line that is not JSON fails)."""
        text = self.log_path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    async def health(self, service: str) -> int:
        return await probe(self.health_port, service)

    async def wait_health(self, service: str, status: int, timeout: float = 20.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: object = None
        while loop.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"epp exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                last = await self.health(service)
                if last == status:
                    return
            except grpc.aio.AioRpcError as e:
                last = e.code()
            await asyncio.sleep(0.05)
        raise AssertionError(f"health {service!r} never {status} (last {last}):\n{self.log_path.read_text()}")

    async def terminate(self, timeout: float = 60.0) -> float:
        """SIGTERM, as the kubelet stops a container; the seconds it took to exit (the loop runs on
        meanwhile: the API double and the model servers are on it)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None:
            if loop.time() - start > timeout:
                raise AssertionError(f"epp did not exit in {timeout}s:\n{self.log_path.read_text()}")
            await asyncio.sleep(0.02)
        return loop.time() - start

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_epp(
    pod: ChartPod, tmp: Path, api_url: str, *, extra: list[str] | None = None, tag: str = ""
) -> Epp:
    """Start `epp` with the chart's arguments (its config directory moved under `tmp`), the chart's
    environment, and free ports given after the chart's own (the last value wins, as in pflag)."""
    config_dir = tmp / f"config{tag}"
    config_dir.mkdir(exist_ok=True)
    path = pod.config_path()
    text = pod.config_text()
    args = pod.args
    if path is not None and text is not None:
        (config_dir / Path(path).name).write_text(text, encoding="utf-8")
        mount = str(Path(path).parent)
        args = [a.replace(mount + "/", f"{config_dir}/") for a in args]
    ports = free_port(), free_port(), free_port()
    args += [f"--grpc-port={ports[0]}", f"--grpc-health-port={ports[1]}", f"--metrics-port={ports[2]}"]
    args += extra or []
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env.update(
        NAMESPACE=pod.namespace,
        POD_NAME=pod.pod_name,
        KUBECONFIG=kubeconfig(tmp / f"kubeconfig{tag}", api_url),
    )
    log_path = tmp / f"epp{tag}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "epick.cli.epp", *args], stdout=log, stderr=subprocess.STDOUT, env=env
        )
    return Epp(proc, *ports, log_path, extra or [])


class Envoy:
    """A real Envoy whose ext_proc filter speaks to an `epp` process (TLS, GIE's full-duplex modes)."""

    def __init__(self, tmp: Path, grpc_port: int, modes: Modes | None = None) -> None:
        self.listen_port, self.admin_port = free_port(), free_port()
        config = Template(TEMPLATE.read_text()).substitute(
            listen_port=self.listen_port,
            admin_port=self.admin_port,
            grpc_port=grpc_port,
            failure_mode_allow="false",
            **(modes or Modes()).template_values(),
        )
        path = tmp / "envoy.yaml"
        path.write_text(config)
        self.log_path = tmp / "envoy.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                [envoy_binary(), "-c", str(path), "--concurrency", "1", "--log-level", "warn",
                 "--base-id", str(self.listen_port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    async def wait_ready(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            await envoy_ready(session, self.proc, self.admin_port, self.log_path)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
