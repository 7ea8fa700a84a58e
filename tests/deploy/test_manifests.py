"""deploy/ (`kubectl apply -k deploy/`) and its components: rendered with kubectl's kustomize, validated
offline against Kubernetes' JSON schemas (kubernetes-validate), and checked against epick itself: the
container's args parse with `epp`'s flag parser, the mounted config loads, the probes ask what the health
server answers, the ports agree, and the RBAC grants exactly the API calls the code makes
(tests/deploy/api_calls.py), no more.

The renders: deploy/ as it is (namespace `default`), and an overlay in a temporary directory that sets
another namespace and adds no component, each component, or both. Without kubectl the tests that need a
render are skipped; the code-against-table tests still run.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from epick.cli.epp import settings_from_flags, warn_about
from epick.cli.epp_flags import FLAGS
from epick.cli.goflags import GoFlags, parse_go_flags
from epick.extproc.health import NOT_SERVING, SERVING, HealthService
from epick.service import Settings
from epick.service.service import load_service_config
from tests.deploy import api_calls
from tests.deploy.api_calls import EXCEPTIONS, SITES, Grant, NonResourceGrant
from tests.epp.charts import CHARTS, ChartPod

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SRC = ROOT / "src"
COMPONENTS = ("servicemonitor", "leader-election")
OVERLAY_NAMESPACE = "llm-d"
# The oldest Kubernetes these manifests are checked against, and the newest kubernetes-validate knows.
SCHEMA_VERSIONS = ("1.31", latest_version())
IMAGE = "localhost/epick"
EPP = "epp"  # the container's name
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Namespace", "CustomResourceDefinition"}
# Upstream's renders of the same Deployment: one replica, and several (leader election).
UPSTREAM_ONE = "gie-v1.5.0-default"
UPSTREAM_HA = "gie-v1.5.0-replicas2"
UPSTREAM_NAMED = ("pool-name", "pool-namespace")  # the args that name upstream's release, not ours
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
KUBELET_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

Obj = dict[str, Any]


# --- rendering ---------------------------------------------------------------------------------------


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed: deploy/ cannot be rendered (kustomize is `kubectl kustomize`)")
    return path


def kustomize(directory: Path) -> list[Obj]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, (
        f"`kubectl kustomize {directory}` failed (it needs kubectl 1.22 or newer, whose kustomize has "
        f"`labels` and Components):\n{done.stderr}"
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def overlay(directory: Path, kustomization: Obj) -> Path:
    """A kustomization in `directory`; "DEPLOY" in its resources and components is deploy/ (kustomize
    takes relative paths only)."""
    directory.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(DEPLOY, directory)
    doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", **kustomization}
    for key in ("resources", "components"):
        if key in doc:
            doc[key] = [path.replace("DEPLOY", base) for path in doc[key]]
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return directory


@dataclass(frozen=True)
class Render:
    name: str
    components: tuple[str, ...]
    objects: list[Obj]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Obj:
        found = [o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    @property
    def deployment(self) -> Obj:
        return self.one("Deployment")

    @property
    def namespace(self) -> str:
        return str(self.deployment["metadata"]["namespace"])

    @property
    def pod(self) -> Obj:
        return dict(self.deployment["spec"]["template"]["spec"])

    @property
    def container(self) -> Obj:
        containers = [c for c in self.pod["containers"] if c["name"] == EPP]
        assert len(containers) == 1, f"{self.name}: no single container named {EPP!r}"
        return dict(containers[0])

    @property
    def service(self) -> Obj:
        return self.one("Service")

    def env(self) -> dict[str, str]:
        """The container's environment as the kubelet makes it (the downward API for an example pod)."""
        fields = {
            "metadata.namespace": self.namespace,
            "metadata.name": f"{self.deployment['metadata']['name']}-7d9f8c6b5-x2kqz",
        }
        env: dict[str, str] = {}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            else:
                field = var["valueFrom"]["fieldRef"]["fieldPath"]
                assert field in fields, f"{self.name}: env {var['name']} from {field}: not modelled here"
                env[var["name"]] = fields[field]
        return env

    def args(self) -> list[str]:
        """The container's args, `$(VAR)` expanded from its environment as the kubelet does."""
        assert "command" not in self.container, "the image's ENTRYPOINT is `epp`: set args only"
        env = self.env()
        return [expand(arg, env) for arg in self.container["args"]]

    def flags(self) -> GoFlags:
        return parse_go_flags(self.args(), FLAGS)

    def settings(self) -> Settings:
        return settings_from_flags(self.flags(), environ=self.env())


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined variable's value, `$$` for `$`, anything else as is."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return KUBELET_VAR.sub(one, text)


VARIANTS: dict[str, tuple[str, ...] | None] = {
    "base": None,  # deploy/ itself
    "overlay": (),
    "servicemonitor": ("servicemonitor",),
    "leader-election": ("leader-election",),
    "all": COMPONENTS,
}


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Render]:
    kubectl()
    out: dict[str, Render] = {}
    for name, components in VARIANTS.items():
        if components is None:
            out[name] = Render(name, (), kustomize(DEPLOY))
            continue
        directory = overlay(
            tmp_path_factory.mktemp(name),
            {
                "namespace": OVERLAY_NAMESPACE,
                "resources": ["DEPLOY"],
                "components": [f"DEPLOY/components/{c}" for c in components],
            },
        )
        out[name] = Render(name, components, kustomize(directory))
    return out


@pytest.fixture(params=list(VARIANTS))
def render(request: pytest.FixtureRequest, renders: dict[str, Render]) -> Render:
    return renders[request.param]


def upstream(name: str) -> ChartPod:
    return ChartPod(name, yaml.safe_load((CHARTS / f"{name}.yaml").read_text(encoding="utf-8")))


def upstream_of(render: Render) -> ChartPod:
    return upstream(UPSTREAM_HA if "leader-election" in render.components else UPSTREAM_ONE)


# --- the objects themselves --------------------------------------------------------------------------


def test_every_object_validates_against_the_kubernetes_schemas(render: Render) -> None:
    kinds = {o["kind"] for o in render.objects}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    assert {"ClusterRole", "ClusterRoleBinding"} <= kinds
    errors: list[str] = []
    for obj in render.objects:
        where = f"{render.name}: {obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "ServiceMonitor":  # a CRD's kind: no schema (checked by hand below)
            continue
        for version in SCHEMA_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                errors.append(f"{where} does not validate against Kubernetes {version}: {path}: {e.message}")
        assert DNS_SUBDOMAIN.match(obj["metadata"]["name"]), f"{where}: not a DNS subdomain name"
        for key, value in obj["metadata"].get("labels", {}).items():
            assert LABEL_VALUE.match(value) and len(value) <= 63, f"{where}: label {key}={value!r}"
    assert not errors, "\n".join(errors)


def test_namespaced_objects_and_subjects_are_in_the_namespace(render: Render) -> None:
    expected = "default" if render.name == "base" else OVERLAY_NAMESPACE
    assert render.namespace == expected
    for obj in render.objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{obj['kind']} {obj['metadata']['name']} is cluster-scoped"
        else:
            assert namespace == expected, f"{obj['kind']} {obj['metadata']['name']} is in {namespace}"
        for subject in obj.get("subjects", []):
            assert subject.get("namespace") == expected, f"{obj['kind']} {obj['metadata']['name']}"


def test_the_image_is_this_versions_and_can_be_replaced(tmp_path: Path, renders: dict[str, Render]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    assert {"name": IMAGE, "newTag": version} in kustomization["images"]
    for r in renders.values():
        assert r.container["image"] == f"{IMAGE}:{version}", r.name
        assert r.deployment["metadata"]["labels"]["app.kubernetes.io/version"] == version
    replaced = overlay(
        tmp_path / "image",
        {
            "resources": ["DEPLOY"],
            "images": [{"name": IMAGE, "newName": "registry.example.com/epick", "newTag": "9.9.9"}],
        },
    )
    render = Render("image", (), kustomize(replaced))
    assert render.container["image"] == "registry.example.com/epick:9.9.9"


# --- the Deployment against upstream's and against epp ---------------------------------------------


def given(flags: GoFlags) -> dict[str, Any]:
    return {name: flags[name] for name in flags.given}


def test_the_args_are_upstreams_and_parse_as_epps(render: Render, caplog: pytest.LogCaptureFixture) -> None:
    flags = render.flags()
    with caplog.at_level(logging.WARNING, logger="epick.epp"):
        warn_about(flags)  # stray arguments, deprecated flags
    assert not caplog.records, caplog.text
    ours, theirs = given(flags), given(parse_go_flags(upstream_of(render).args, FLAGS))
    assert {k: v for k, v in ours.items() if k not in UPSTREAM_NAMED} == {
        k: v for k, v in theirs.items() if k not in UPSTREAM_NAMED
    }
    assert set(ours) == set(theirs)
    assert ours["pool-namespace"] == render.namespace  # $(NAMESPACE): the pod's own
    s = render.settings()
    assert s.kubernetes is not None and s.kubernetes.pool == flags.text("pool-name")
    assert s.kubernetes.namespace == render.namespace
    assert s.kubernetes.pool_group == "inference.networking.k8s.io"
    assert s.metrics_auth and not s.tracing
    assert (s.leader_election is not None) == ("leader-election" in render.components)
    if s.leader_election is not None:
        assert s.leader_election.namespace == render.namespace  # the Role below is there


def test_the_pod_is_upstreams(render: Render) -> None:
    chart = upstream_of(render)
    fixture, deployment, container = chart.fixture, render.deployment, render.container
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    replicas = deployment["spec"]["replicas"]
    assert (replicas > 1) == ("leader-election" in render.components)  # several active EPPs: never
    assert render.pod["terminationGracePeriodSeconds"] == fixture["terminationGracePeriodSeconds"]
    drain = render.settings().drain_timeout
    assert render.pod["terminationGracePeriodSeconds"] > drain, "SIGKILL before the drain ends"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == fixture["ports"]
    assert container["livenessProbe"] == fixture["probes"]["liveness"]
    assert container["readinessProbe"] == fixture["probes"]["readiness"]
    assert container["resources"] == fixture["resources"]
    assert container["env"] == fixture["env"]
    assert render.pod["serviceAccountName"] == render.one("ServiceAccount")["metadata"]["name"]
    assert render.pod.get("automountServiceAccountToken", True), "epick needs its token for the API"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels(render).items()


def pod_labels(render: Render) -> dict[str, str]:
    return dict(render.deployment["spec"]["template"]["metadata"]["labels"])


def test_the_pod_runs_restricted(render: Render) -> None:
    pod, container = render.pod, render.container
    pod_context, context = pod.get("securityContext", {}), container.get("securityContext", {})

    def setting(key: str) -> Any:
        return context.get(key, pod_context.get(key))

    assert setting("runAsNonRoot") is True
    assert setting("runAsUser") == 65532  # the image's user
    assert setting("seccompProfile") == {"type": "RuntimeDefault"}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    # A read-only root, so the temporary directory (the self-signed TLS pair, the workers' locks) is a
    # writable emptyDir.
    assert "TMPDIR" not in render.env()
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1 and not tmp[0].get("readOnly", False)
    volume = next(v for v in pod["volumes"] if v["name"] == tmp[0]["name"])
    assert "emptyDir" in volume


def test_the_mounted_config_loads_and_is_the_default(render: Render) -> None:
    settings = render.settings()
    path = settings.config_file
    assert path is not None and path == upstream_of(render).config_path()
    mounts = [
        m for m in render.container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert len(mounts) == 1, f"{path} is under no single mount"
    mount = mounts[0]
    assert mount["mountPath"] == "/config" and "subPath" not in mount
    volume = next(v for v in render.pod["volumes"] if v["name"] == mount["name"])
    assert "items" not in volume["configMap"]
    config_map = render.one("ConfigMap", volume["configMap"]["name"])
    text = config_map["data"][path[len(mount["mountPath"]) :].lstrip("/")]
    loaded = load_service_config(dataclasses.replace(settings, config_file=None, config_text=text))
    assert loaded.warnings == []
    assert sorted(loaded.scheduler.profiles) == ["default"]
    default = yaml.safe_load((ROOT / "config" / "default.yaml").read_text(encoding="utf-8"))
    assert yaml.safe_load(text) == default, "deploy/default-plugins.yaml is config/default.yaml"


def test_the_probes_ask_what_the_health_server_answers(render: Render) -> None:
    settings, container = render.settings(), render.container
    assert settings.extproc is not None
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    liveness, readiness = container["livenessProbe"]["grpc"], container["readinessProbe"]["grpc"]
    assert liveness["port"] == readiness["port"] == settings.extproc.health_port == ports["grpc-health"]
    health = HealthService()
    elected = settings.leader_election is not None
    health.update(synced=True, leader=True if elected else None)
    assert health.status(liveness["service"]) == SERVING
    assert health.status(readiness["service"]) == SERVING
    health.update(synced=False)  # the pool not listed yet: unready
    assert health.status(readiness["service"]) == NOT_SERVING
    if elected:  # a standby is alive, not ready
        health.update(synced=True, leader=False)
        assert health.status(liveness["service"]) == SERVING
        assert health.status(readiness["service"]) == NOT_SERVING


def test_the_service_serves_the_containers_ports(render: Render) -> None:
    settings, service = render.settings(), render.service
    assert settings.extproc is not None
    ports = {p["name"]: p["containerPort"] for p in render.container["ports"]}
    assert ports == {
        "grpc": settings.extproc.port,
        "grpc-health": settings.extproc.health_port,
        "metrics": settings.metrics_port,
    }
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert {n: p["port"] for n, p in by_name.items()} == {
        "grpc-ext-proc": 9002,
        "grpc-health": 9003,
        "http-metrics": 9090,
    }
    for port in by_name.values():
        target = port.get("targetPort", port["port"])
        number = ports[target] if isinstance(target, str) else target
        assert number == port["port"], f"Service port {port['name']} reaches {target}"
        assert number in ports.values()
    assert by_name["grpc-ext-proc"]["appProtocol"] == "http2"
    assert settings.extproc.secure  # ext_proc is TLS: h2, not h2c
    assert service["spec"]["selector"].items() <= pod_labels(render).items()
    # upstream's InferencePool names the Service and port 9002 (endpointPickerRef)
    assert upstream_of(render).fixture["inferencePool"]["spec"]["endpointPickerRef"]["port"]["number"] == 9002


def test_the_service_monitor_scrapes_the_metrics_port(renders: dict[str, Render]) -> None:
    for render in renders.values():
        monitors = render.of_kind("ServiceMonitor")
        assert len(monitors) == ("servicemonitor" in render.components)
        if not monitors:
            continue
        monitor, service = monitors[0], render.service
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        spec = monitor["spec"]
        assert set(spec) <= {"jobLabel", "selector", "endpoints", "namespaceSelector"}
        assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
        assert "namespaceSelector" not in spec  # its own namespace, whatever the overlay's
        assert set(spec["selector"]) == {"matchLabels"}
        assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert spec["jobLabel"] in service["metadata"]["labels"]
        selected = [
            s for s in render.of_kind("Service")
            if spec["selector"]["matchLabels"].items() <= s["metadata"].get("labels", {}).items()
        ]  # fmt: skip
        assert selected == [service]
        (endpoint,) = spec["endpoints"]
        assert set(endpoint) <= {"port", "path", "interval", "scheme", "authorization"}
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
        assert re.fullmatch(r"[0-9]+(ms|s|m)", endpoint["interval"])
        settings = render.settings()
        assert endpoint.get("scheme", "http") == ("https" if settings.metrics_cert_dir else "http")
        # The token: a service-account-token Secret of epick's own account, in the monitor's namespace.
        assert settings.metrics_auth
        credentials = endpoint["authorization"]["credentials"]
        assert credentials["key"] == "token"
        secret = render.one("Secret", credentials["name"])
        assert secret["type"] == "kubernetes.io/service-account-token"
        account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        assert account == render.pod["serviceAccountName"]


# --- RBAC against the code ---------------------------------------------------------------------------


def granted(render: Render) -> set[Grant | NonResourceGrant]:
    """What the Deployment's service account may do, by the render's bindings; asserts that every role
    is bound to it and nothing else, with no wildcard and no resourceNames."""
    account, namespace = render.pod["serviceAccountName"], render.namespace
    roles = {("Role", r["metadata"]["name"]): r for r in render.of_kind("Role")}
    roles |= {("ClusterRole", r["metadata"]["name"]): r for r in render.of_kind("ClusterRole")}
    bound: set[tuple[str, str]] = set()
    grants: set[Grant | NonResourceGrant] = set()
    for binding in render.of_kind("RoleBinding") + render.of_kind("ClusterRoleBinding"):
        where = f"{binding['kind']} {binding['metadata']['name']}"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
        ref = binding["roleRef"]
        key = (ref["kind"], ref["name"])
        assert key in roles, f"{where} refers to a missing {ref['kind']} {ref['name']}"
        bound.add(key)
        namespaced = binding["kind"] == "RoleBinding"
        assert not namespaced or binding["metadata"]["namespace"] == namespace, where
        for rule in roles[key]["rules"]:
            lists = [rule.get(k, []) for k in ("apiGroups", "resources", "verbs", "nonResourceURLs")]
            assert not any("*" in items for items in lists), f"{where}: a wildcard in {rule}"
            assert not rule.get("resourceNames"), f"{where}: resourceNames are in no table row: {rule}"
            for url in rule.get("nonResourceURLs", []):
                assert not namespaced, f"{where}: a non-resource URL needs a ClusterRoleBinding"
                grants |= {NonResourceGrant(url, verb) for verb in rule["verbs"]}
            grants |= {
                Grant(group, resource, verb, namespaced)
                for group in rule.get("apiGroups", [])
                for resource in rule.get("resources", [])
                for verb in rule["verbs"]
            }
    assert bound == set(roles), f"roles bound to nothing: {set(roles) - bound}"
    return grants


def test_rbac_grants_exactly_what_the_code_calls(render: Render) -> None:
    settings = render.settings()
    needed: set[Grant | NonResourceGrant] = set(api_calls.needed(settings))
    excepted = {grant for c in render.components for grant in EXCEPTIONS.get(c, {})}
    have = granted(render)
    missing = sorted(map(str, needed - have))
    extra = sorted(map(str, have - needed - excepted))
    assert not missing, f"{render.name}: the code calls what the RBAC does not grant: {missing}"
    assert not extra, f"{render.name}: granted, but no call in the table needs it: {extra}"
    assert excepted <= have, f"{render.name}: the table's exceptions are not granted: {excepted - have}"
    # the base grants the Lease to nobody; the leader-election component grants it with the flag
    leases = {g for g in have if isinstance(g, Grant) and g.resource == "leases"}
    assert bool(leases) == ("leader-election" in render.components)


# --- the code against the table (no kubectl needed) ------------------------------------------------


@cache
def api_methods() -> frozenset[str]:
    """Every kubernetes_asyncio API method (`CoreV1Api.list_namespaced_pod`, ...), by name."""
    from kubernetes_asyncio import client

    names: set[str] = set()
    for name, cls in inspect.getmembers(client, inspect.isclass):
        if name.endswith("Api"):
            names |= {m for m, _ in inspect.getmembers(cls, inspect.isfunction) if not m.startswith("_")}
    names.add("call_api")  # ApiClient's own: a raw request
    return frozenset(n.removesuffix("_with_http_info") for n in names)


@dataclass(frozen=True)
class Site:
    module: str  # under src/
    function: str  # the enclosing class and function names
    method: str
    line: int
    in_collection: bool  # handed to the reflector (`_Collection(...)`): listed, then watched

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.function, self.method)


def _sites(node: ast.AST, module: str, scope: tuple[str, ...], in_collection: bool) -> Iterator[Site]:
    if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        scope = (*scope, node.name)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_Collection":
        in_collection = True
    name = None
    if isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):  # getattr(api, "list_...")
        name = node.value
    if name is not None and name in api_methods():
        yield Site(module, ".".join(scope), name, getattr(node, "lineno", 0), in_collection)
    for child in ast.iter_child_nodes(node):
        yield from _sites(child, module, scope, in_collection)


@cache
def call_sites() -> tuple[Site, ...]:
    found: list[Site] = []
    for path in sorted((SRC / "epick").rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        found += _sites(ast.parse(path.read_text(encoding="utf-8")), module, (), False)
    return tuple(found)


def test_every_api_call_in_the_code_is_in_the_table() -> None:
    sites = call_sites()
    found = {s.key for s in sites}
    new = sorted(f"{s.module}:{s.line} {s.function} {s.method}" for s in sites if s.key not in SITES)
    assert not new, f"Kubernetes API calls missing from tests/deploy/api_calls.py (and the RBAC?): {new}"
    gone = sorted(map(str, set(SITES) - found))
    assert not gone, f"the table lists calls the code no longer makes: {gone}"


def test_each_sites_verbs_follow_from_its_method() -> None:
    for site in call_sites():
        prefix = site.method.split("_")[0]
        assert prefix in api_calls.VERB_OF_PREFIX, f"{site}: a {prefix}_ call has no verb in the table"
        verbs = {api_calls.VERB_OF_PREFIX[prefix]} | ({"watch"} if site.in_collection else set())
        assert not site.in_collection or prefix == "list", f"{site}: only a list can be watched"
        calls = SITES[site.key]
        assert all(set(call.verbs) == verbs for call in calls), f"{site}: the table says otherwise"
        namespaced = "_namespaced_" in site.method
        assert namespaced or "_cluster_" in site.method, f"{site}: neither namespaced nor cluster-wide"
        assert all(call.namespaced == namespaced for call in calls), site


def test_the_constants_are_the_tables() -> None:
    """The custom-object calls take their group and plural from these; the table names them."""
    from epick.datalayer import objectives
    from epick.datalayer.discovery.kubernetes import pool, resources, rewrites
    from epick.service import leader

    def table(module: str, function: str) -> set[tuple[str, str]]:
        return {
            (g, r)
            for (m, f, _), calls in SITES.items()
            if (m, f) == (module, function)
            for call in calls
            for g in call.groups
            for r in call.resources
        }

    pools = {(g, pool.POOL_PLURAL) for g, _ in pool.POOL_API_VERSIONS}
    assert table(api_calls.DISCOVERY, "KubernetesDiscovery._initial_pool") == pools
    assert table(api_calls.DISCOVERY, "KubernetesDiscovery._pool_collection") == pools
    plurals = {rewrites.REWRITE_PLURAL, objectives.PLURAL}
    watched = {(g, p) for g, _ in resources.API_GROUPS for p in plurals}
    assert table(api_calls.RESOURCES, "PoolResourceWatch._collection") == watched
    lease = {(leader.GROUP, leader.PLURAL)}
    for function in ("LeaderElector._read", "LeaderElector._try_acquire_or_renew", "LeaderElector._write"):
        assert table(api_calls.LEADER, function) == lease
    source = (SRC / api_calls.METRICS).read_text(encoding="utf-8")
    reviews: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "_create":
            group, plural = node.args[:2]
            assert isinstance(group, ast.Constant) and isinstance(plural, ast.Constant), (
                f"{api_calls.METRICS}:{node.lineno}: the review's group and plural are not literals"
            )
            reviews.add((str(group.value), str(plural.value)))
    assert reviews == table(api_calls.METRICS, "MetricsAuth._create")


def test_only_the_known_modules_use_kubernetes_asyncio() -> None:
    users = {
        path.relative_to(SRC).as_posix()
        for path in (SRC / "epick").rglob("*.py")
        if "kubernetes_asyncio" in path.read_text(encoding="utf-8")
    }
    assert users == api_calls.K8S_MODULES, "a module's Kubernetes API calls need a row in api_calls.py"
