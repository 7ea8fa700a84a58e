"""A small in-memory Kubernetes API server: enough of list and watch for pods and InferencePools that the
real kubernetes-asyncio client (and epick's Kubernetes discovery) can run against it.

Every change gets the next resourceVersion (one counter, as etcd's revision) and goes into an event log.
A watch from version N replays the logged events newer than N, then streams new ones as they happen; a
watch without a version (or "0") starts with synthetic ADDED events for what exists. A label or field
selector turns a MODIFIED event into ADDED or DELETED when the object starts or stops matching, as the
real API server's watch cache does. `timeoutSeconds` ends a watch (times `timeout_scale`, so that tests
need not wait whole seconds), after a BOOKMARK when the client allows them. A watch from a version older
than the log keeps (see `expire_history`) is answered 410 Gone: a Status object with HTTP 410, or with
`gone_as_event` an ERROR event on a 200 stream, the two ways real servers say it.

As a cluster's API server it can also serve HTTPS (`start(tls=...)`, a certificate from `ServerTls`),
authenticate bearer tokens (`accept_token`: anything else is 401 Unauthorized) and authorize each
request against RBAC rules (`grant`, the rules of a Role or ClusterRole: what they do not allow is 403
Forbidden with the API server's own message), and stop and start again on the same port (`restart`).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import ipaddress
import json
import re
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

Json = dict[str, Any]
Matcher = Callable[[Json], bool]

POOL_V1 = ("inference.networking.k8s.io", "v1")
POOL_V1ALPHA2 = ("inference.networking.x-k8s.io", "v1alpha2")
PODS = "pods"
REWRITES_GIE = ("inference.networking.x-k8s.io", "v1alpha2")
REWRITES_LLMD = ("llm-d.ai", "v1alpha2")


LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
LEASE = "coordination.k8s.io/v1/leases"


def _pool_resource(group: str, version: str) -> str:
    return f"{group}/{version}/inferencepools"


def _rewrite_resource(group: str, version: str) -> str:
    return f"{group}/{version}/inferencemodelrewrites"


def _objective_resource(group: str, version: str) -> str:
    return f"{group}/{version}/inferenceobjectives"


# label selectors


class SelectorError(ValueError):
    pass


_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^(?P<key>{_NAME})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")
_EQ = re.compile(rf"^(?P<key>{_NAME})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})$")
_EXISTS = re.compile(rf"^(?P<neg>!?)\s*(?P<key>{_NAME})$")


def _split_top_level(selector: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError("unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise SelectorError("unbalanced '('")
    parts.append("".join(current))
    return parts


def parse_label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """`k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, joined by commas (all must hold)."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    if not selector.strip():
        return lambda labels: True
    for raw in _split_top_level(selector):
        req = raw.strip()
        if m := _SET.match(req):
            key, values = m["key"], {v.strip() for v in m["values"].split(",")}
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise SelectorError(f"invalid value in {req!r}")
            if m["op"] == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif m := _EQ.match(req):
            key, value = m["key"], m["value"]
            if m["op"] == "!=":
                tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif m := _EXISTS.match(req):
            key = m["key"]
            if m["neg"]:
                tests.append(lambda labels, k=key: k not in labels)
            else:
                tests.append(lambda labels, k=key: k in labels)
        else:
            raise SelectorError(f"unable to parse requirement {req!r}")
    return lambda labels: all(t(labels) for t in tests)


def _parse_field_selector(selector: str) -> Matcher:
    """Only `metadata.name=X` (or `==`, `!=`), as a client filters one object by name."""
    tests: list[Matcher] = []
    for raw in selector.split(","):
        req = raw.strip()
        if not req:
            continue
        m = re.fullmatch(r"(metadata\.name|metadata\.namespace)\s*(==|=|!=)\s*(\S*)", req)
        if not m:
            raise SelectorError(f"field label not supported: {req!r}")
        path, op, value = m.groups()
        attr = path.split(".")[1]
        if op == "!=":
            tests.append(lambda obj, a=attr, v=value: obj["metadata"].get(a) != v)
        else:
            tests.append(lambda obj, a=attr, v=value: obj["metadata"].get(a) == v)
    return lambda obj: all(t(obj) for t in tests)


# TLS: one self-signed certificate, which is also the CA a client trusts (the kubelet's ca.crt)


@dataclass(frozen=True, slots=True)
class ServerTls:
    """A server certificate for `hosts` (IP addresses or DNS names) and its key, written under `directory`
    as `ca.crt` (what a pod mounts) and `server.key`."""

    cert: Path
    key: Path

    @staticmethod
    def make(directory: Path, hosts: Iterable[str] = ("127.0.0.1",)) -> ServerTls:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver (epick's test double)")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        tls = ServerTls(directory / "ca.crt", directory / "server.key")
        tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        tls.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return tls

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context


# RBAC: what a request asks for, and whether a user's rules allow it


@dataclass(frozen=True, slots=True)
class Attributes:
    """A resource request as the API server's authorizer sees it."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str


def request_attributes(method: str, path: str, watch: bool) -> Attributes | None:
    """The RBAC attributes of a request, or None for a non-resource path."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    name = rest[1] if len(rest) > 1 else ""
    verb = {
        "GET": "get" if name else ("watch" if watch else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return Attributes(verb, group, rest[0], namespace, name)


def rule_allows(rule: Mapping[str, Any], a: Attributes) -> bool:
    """One PolicyRule against a request (as k8s.io/apiserver's RBAC rule matching)."""

    def has(values: Iterable[str], value: str) -> bool:
        values = list(values)
        return "*" in values or value in values

    names = rule.get("resourceNames") or []
    return (
        has(rule.get("verbs", []), a.verb)
        and has(rule.get("apiGroups", []), a.group)
        and has(rule.get("resources", []), a.resource)
        and (not names or a.name in names)
    )


def forbidden_message(user: str, a: Attributes) -> str:
    """The API server's words for a request RBAC refused."""
    what = f"{a.resource}.{a.group}" if a.group else a.resource
    if a.name:
        what += f' "{a.name}"'
    where = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    return (
        f'{what} is forbidden: User "{user}" cannot {a.verb} resource "{a.resource}" '
        f'in API group "{a.group}" {where}'
    )


# the server


@dataclass(slots=True)
class _Event:
    rv: int
    resource: str
    namespace: str
    type: str  # ADDED, MODIFIED, DELETED
    old: Json | None
    new: Json


@dataclass(eq=False, slots=True)
class _Watcher:
    resource: str
    namespace: str
    matches: Matcher
    queue: asyncio.Queue[Json | None] = field(default_factory=asyncio.Queue)


def _status(code: int, reason: str, message: str) -> Json:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _error(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(_status(code, reason, message), status=code)


def _is_true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


class FakeApiServer:
    """Pods and InferencePools in memory, served over list and watch. Use `await start()` / `await stop()`."""

    def __init__(self) -> None:
        self.url = ""
        self.served_pool_versions: set[tuple[str, str]] = {POOL_V1, POOL_V1ALPHA2}
        self.served_rewrite_versions: set[tuple[str, str]] = {REWRITES_GIE, REWRITES_LLMD}
        self.forbidden_rewrite_versions: set[tuple[str, str]] = set()
        self.served_objective_versions: set[tuple[str, str]] = {REWRITES_GIE, REWRITES_LLMD}
        self.gone_as_event = False
        self.timeout_scale = 1.0
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, query) of every request
        self.gone_served = 0
        # TokenReview: token -> (username, groups); SubjectAccessReview: (username, path, verb) allowed
        self.tokens: dict[str, tuple[str, list[str]]] = {}
        self.allowed: set[tuple[str, str, str]] = set()
        self.reviews: list[Json] = []  # every review asked for
        self.fail_paths: dict[str, int] = {}  # a path containing the key fails with 500, that many times
        self._rv = 1
        self._min_rv = 0  # a watch from a version older than this is 410 Gone
        self._objects: dict[tuple[str, str, str], Json] = {}  # (resource, namespace, name) -> object
        self._log: list[_Event] = []
        self._watchers: set[_Watcher] = set()
        self._failures: list[int] = []
        self._runner: web.AppRunner | None = None
        # bearer tokens accepted (token -> user name); empty: any request, token or not, is served
        self.bearer: dict[str, str] = {}
        # RBAC: user -> [(namespace or "" for cluster-wide, PolicyRule)]; None: everything is allowed
        self.rules: dict[str, list[tuple[str, Json]]] | None = None
        self.refused: list[tuple[int, str]] = []  # (401 or 403, the message) of every refusal
        self.tokens_seen: list[str] = []  # the bearer token of every request, in order
        self.tls: ServerTls | None = None
        self.port = 0
        self.host = "127.0.0.1"

    # lifecycle

    def accept_token(self, token: str, user: str) -> None:
        """Serve requests that carry `token` as `user`; once any token is set, others are 401."""
        self.bearer[token] = user

    def revoke_token(self, token: str) -> None:
        self.bearer.pop(token, None)

    def grant(self, user: str, rules: Iterable[Mapping[str, Any]], *, namespace: str = "") -> None:
        """Allow `user` what `rules` (a Role's or ClusterRole's) allow, in `namespace` or everywhere."""
        if self.rules is None:
            self.rules = {}
        self.rules.setdefault(user, []).extend((namespace, dict(r)) for r in rules)

    async def restart(self) -> None:
        """Go away (every watch and connection ends) and come back on the same address, state kept."""
        await self.stop()
        await self.start(tls=self.tls, host=self.host, port=self.port)

    async def start(
        self, *, tls: ServerTls | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> FakeApiServer:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._pods)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/inferencepools", self._pools)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/inferencepools/{name}", self._pool)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/inferencemodelrewrites", self._rewrites)
        app.router.add_get("/apis/{group}/{version}/namespaces/{ns}/inferenceobjectives", self._objectives)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review)
        app.router.add_get(f"{LEASES}/{{name}}", self._get_lease)
        app.router.add_put(f"{LEASES}/{{name}}", self._put_lease)
        app.router.add_post(LEASES, self._create_lease)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        app.middlewares.append(self._record)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        self.tls, self.host = tls, host
        site = web.TCPSite(self._runner, host, port, ssl_context=tls.context() if tls else None)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        return self

    async def stop(self) -> None:
        self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # what tests do

    def add_pod(
        self,
        name: str,
        labels: Mapping[str, str],
        ip: str | None,
        ready: bool = True,
        *,
        namespace: str = "default",
        host_ip: str | None = None,
    ) -> Json:
        key = (PODS, namespace, name)
        if key in self._objects:
            raise ValueError(f"pod {namespace}/{name} exists")
        pod: Json = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": f"uid-{namespace}-{name}-{self._rv}",
                "labels": dict(labels),
                "creationTimestamp": "2025-01-01T00:00:00Z",
            },
            "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai"}]},
            "status": {"phase": "Running"},
        }
        if ip:
            pod["status"]["podIP"] = ip
            pod["status"]["podIPs"] = [{"ip": ip}]
        if host_ip:
            pod["status"]["hostIP"] = host_ip
        pod["status"]["conditions"] = self._conditions(ready)
        return self._put(PODS, namespace, name, pod)

    def set_ready(self, name: str, ready: bool, *, namespace: str = "default") -> Json:
        pod = self._get(PODS, namespace, name)
        pod["status"]["conditions"] = self._conditions(ready)
        return self._put(PODS, namespace, name, pod)

    def set_labels(self, name: str, labels: Mapping[str, str], *, namespace: str = "default") -> Json:
        pod = self._get(PODS, namespace, name)
        pod["metadata"]["labels"] = dict(labels)
        return self._put(PODS, namespace, name, pod)

    def set_ip(self, name: str, ip: str | None, *, namespace: str = "default") -> Json:
        pod = self._get(PODS, namespace, name)
        if ip:
            pod["status"]["podIP"] = ip
            pod["status"]["podIPs"] = [{"ip": ip}]
        else:
            pod["status"].pop("podIP", None)
            pod["status"].pop("podIPs", None)
        return self._put(PODS, namespace, name, pod)

    def mark_deleting(self, name: str, *, namespace: str = "default") -> Json:
        """A graceful delete's first step: deletionTimestamp set, the pod still there (and still Ready)."""
        pod = self._get(PODS, namespace, name)
        pod["metadata"]["deletionTimestamp"] = "2025-01-01T00:01:00Z"
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        return self._put(PODS, namespace, name, pod)

    def delete_pod(self, name: str, *, namespace: str = "default") -> None:
        self._delete(PODS, namespace, name)

    def put_pool(
        self,
        name: str,
        match_labels: Mapping[str, str],
        ports: Iterable[int],
        *,
        namespace: str = "default",
        version: str = "v1",
        app_protocol: str | None = None,
        picker_ref: bool = True,
    ) -> Json:
        """Create or update an InferencePool: v1 (`spec.selector.matchLabels`, `spec.targetPorts`,
        `spec.endpointPickerRef` unless `picker_ref` is False: optional since GIE v1.6.0) or the older
        v1alpha2 (`spec.selector` flat, `spec.targetPortNumber`: one port)."""
        ports = list(ports)
        if version == "v1":
            group = POOL_V1[0]
            spec: Json = {
                "selector": {"matchLabels": dict(match_labels)},
                "targetPorts": [{"number": p} for p in ports],
            }
            if picker_ref:
                spec["endpointPickerRef"] = {"name": f"{name}-epp", "port": {"number": 9002}}
            if app_protocol is not None:
                spec["appProtocol"] = app_protocol
        elif version == "v1alpha2":
            if len(ports) != 1:
                raise ValueError("a v1alpha2 InferencePool has exactly one targetPortNumber")
            group = POOL_V1ALPHA2[0]
            spec = {
                "selector": dict(match_labels),
                "targetPortNumber": ports[0],
                "extensionRef": {"name": f"{name}-epp"},
            }
        else:
            raise ValueError(f"unknown InferencePool version {version!r}")
        resource = _pool_resource(group, version)
        key = (resource, namespace, name)
        pool = copy.deepcopy(self._objects[key]) if key in self._objects else None
        if pool is None:
            pool = {
                "apiVersion": f"{group}/{version}",
                "kind": "InferencePool",
                "metadata": {"name": name, "namespace": namespace, "uid": f"uid-pool-{name}-{self._rv}"},
            }
        pool["spec"] = spec
        return self._put(resource, namespace, name, pool)

    def delete_pool(self, name: str, *, namespace: str = "default", version: str = "v1") -> None:
        group = POOL_V1[0] if version == "v1" else POOL_V1ALPHA2[0]
        self._delete(_pool_resource(group, version), namespace, name)

    def put_rewrite(
        self,
        name: str,
        spec: Json,
        *,
        namespace: str = "default",
        api: tuple[str, str] = REWRITES_GIE,
        created: str = "2025-01-01T00:00:00Z",
    ) -> Json:
        """Create or update an InferenceModelRewrite (the spec is stored as given, valid or not)."""
        return self._put_custom(
            "InferenceModelRewrite",
            api,
            name,
            spec,
            resource=_rewrite_resource(*api),
            namespace=namespace,
            created=created,
        )

    def _put_custom(
        self,
        kind: str,
        api: tuple[str, str],
        name: str,
        spec: Json,
        *,
        resource: str,
        namespace: str,
        created: str,
    ) -> Json:
        key = (resource, namespace, name)
        obj = copy.deepcopy(self._objects[key]) if key in self._objects else None
        if obj is None:
            obj = {
                "apiVersion": f"{api[0]}/{api[1]}",
                "kind": kind,
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
            }
        obj["spec"] = copy.deepcopy(spec)
        return self._put(resource, namespace, name, obj)

    def delete_rewrite(
        self, name: str, *, namespace: str = "default", api: tuple[str, str] = REWRITES_GIE
    ) -> None:
        self._delete(_rewrite_resource(*api), namespace, name)

    def put_objective(
        self,
        name: str,
        spec: Json,
        *,
        namespace: str = "default",
        api: tuple[str, str] = REWRITES_GIE,
        created: str = "2025-01-01T00:00:00Z",
    ) -> Json:
        """Create or update an InferenceObjective (the spec is stored as given, valid or not)."""
        return self._put_custom(
            "InferenceObjective",
            api,
            name,
            spec,
            resource=_objective_resource(*api),
            namespace=namespace,
            created=created,
        )

    def delete_objective(
        self, name: str, *, namespace: str = "default", api: tuple[str, str] = REWRITES_GIE
    ) -> None:
        self._delete(_objective_resource(*api), namespace, name)

    def expire_history(self) -> None:
        """Forget the event log, as compaction does: a watch from any resourceVersion handed out so far is
        answered 410 Gone. Active watches are ended, so clients come back with the version they hold."""
        self._log.clear()
        self._rv += 1  # a list from now on hands out a version a watch may start from
        self._min_rv = self._rv
        self.end_watches()

    def end_watches(self) -> None:
        """End every open watch stream now (as timeoutSeconds or a restarting server would)."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._watchers.clear()

    def fail_next(self, count: int = 1, status: int = 500) -> None:
        """Answer the next `count` requests, whatever they are, with this error status."""
        self._failures.extend([status] * count)

    def watch_count(self, resource: str = PODS) -> int:
        """Open watches on pods ("pods") or InferencePools ("inferencepools")."""
        return sum(1 for w in self._watchers if w.resource.endswith(resource))

    def request_count(self, *, watch: bool, resource: str = PODS) -> int:
        return sum(
            1 for path, q in self.requests if path.endswith(resource) and _is_true(q.get("watch")) == watch
        )

    @property
    def resource_version(self) -> int:
        return self._rv

    # the store

    @staticmethod
    def _conditions(ready: bool) -> list[Json]:
        status = "True" if ready else "False"
        return [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": status},
            {"type": "Ready", "status": status},
        ]

    def _get(self, resource: str, namespace: str, name: str) -> Json:
        try:
            return copy.deepcopy(self._objects[(resource, namespace, name)])
        except KeyError:
            raise KeyError(f"{resource} {namespace}/{name} not found") from None

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _put(self, resource: str, namespace: str, name: str, obj: Json) -> Json:
        key = (resource, namespace, name)
        old = self._objects.get(key)
        rv = self._next_rv()
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(rv)
        self._objects[key] = obj
        self._record_event(_Event(rv, resource, namespace, "MODIFIED" if old else "ADDED", old, obj))
        return copy.deepcopy(obj)

    def _delete(self, resource: str, namespace: str, name: str) -> None:
        key = (resource, namespace, name)
        old = self._objects.pop(key, None)
        if old is None:
            raise KeyError(f"{resource} {namespace}/{name} not found")
        rv = self._next_rv()
        gone = copy.deepcopy(old)
        gone["metadata"]["resourceVersion"] = str(rv)
        self._record_event(_Event(rv, resource, namespace, "DELETED", old, gone))

    def _record_event(self, event: _Event) -> None:
        self._log.append(event)
        for watcher in self._watchers:
            if (watcher.resource, watcher.namespace) == (event.resource, event.namespace):
                out = self._as_seen_by(watcher.matches, event)
                if out is not None:
                    watcher.queue.put_nowait(out)

    @staticmethod
    def _as_seen_by(matches: Matcher, event: _Event) -> Json | None:
        was = event.old is not None and matches(event.old)
        now = matches(event.new)
        if event.type == "DELETED":
            kind = "DELETED" if was else None
        elif was and now:
            kind = "MODIFIED"
        elif now:
            kind = "ADDED"
        elif was:
            kind = "DELETED"
        else:
            kind = None
        return None if kind is None else {"type": kind, "object": copy.deepcopy(event.new)}

    def lease(self, name: str, *, namespace: str = "default") -> Json | None:
        """A Lease as stored (None when there is none)."""
        obj = self._objects.get((LEASE, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    # HTTP

    async def _token_review(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.reviews.append(review)
        known = self.tokens.get(str(review.get("spec", {}).get("token", "")))
        if known is None:
            review["status"] = {"authenticated": False, "error": "invalid bearer token"}
        else:
            name, groups = known
            review["status"] = {
                "authenticated": True,
                "user": {"username": name, "uid": f"uid-{name}", "groups": groups},
            }
        return web.json_response(review, status=201)

    async def _access_review(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.reviews.append(review)
        spec = review.get("spec", {})
        attributes = spec.get("nonResourceAttributes", {})
        allowed = (spec.get("user"), attributes.get("path"), attributes.get("verb")) in self.allowed
        review["status"] = {"allowed": allowed}
        return web.json_response(review, status=201)

    async def _get_lease(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        obj = self._objects.get((LEASE, ns, name))
        if obj is None:
            return _error(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        return web.json_response(obj)

    async def _create_lease(self, request: web.Request) -> web.Response:
        ns, obj = request.match_info["ns"], await request.json()
        name = str(obj.get("metadata", {}).get("name") or "")
        if (LEASE, ns, name) in self._objects:
            return _error(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
        obj["metadata"]["namespace"] = ns
        return web.json_response(self._put(LEASE, ns, name, obj), status=201)

    async def _put_lease(self, request: web.Request) -> web.Response:
        """An update carries the resourceVersion it read: an older one is 409 Conflict, as etcd's
        compare-and-swap makes it."""
        ns, name, obj = request.match_info["ns"], request.match_info["name"], await request.json()
        stored = self._objects.get((LEASE, ns, name))
        if stored is None:
            return _error(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found')
        if obj.get("metadata", {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            return _error(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )
        return web.json_response(self._put(LEASE, ns, name, obj))

    def _refuse(self, request: web.Request) -> web.Response | None:
        """401 for a request without an accepted token, 403 for one RBAC does not allow."""
        if not self.bearer:
            return None
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        self.tokens_seen.append(token)
        user = self.bearer.get(token)
        if user is None:
            self.refused.append((401, "Unauthorized"))
            return _error(401, "Unauthorized", "Unauthorized")
        attributes = request_attributes(request.method, request.path, _is_true(request.query.get("watch")))
        if self.rules is None or attributes is None:
            return None
        for namespace, rule in self.rules.get(user, []):
            if (not namespace or namespace == attributes.namespace) and rule_allows(rule, attributes):
                return None
        message = forbidden_message(user, attributes)
        self.refused.append((403, message))
        return _error(403, "Forbidden", message)

    @web.middleware
    async def _record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        refusal = self._refuse(request)
        if refusal is not None:
            return refusal
        self.requests.append((request.path, dict(request.query)))
        for part, left in list(self.fail_paths.items()):
            if part in request.path and left > 0:
                self.fail_paths[part] = left - 1
                return _error(500, "InternalError", f"injected failure for {part}")
        if self._failures:
            code = self._failures.pop(0)
            return _error(code, "InternalError" if code >= 500 else "BadRequest", f"injected failure {code}")
        response: web.StreamResponse = await handler(request)
        return response

    async def _not_found(self, request: web.Request) -> web.Response:
        return _error(404, "NotFound", "the server could not find the requested resource")

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["ns"]
        try:
            labels = parse_label_selector(request.query.get("labelSelector", ""))
            fields = _parse_field_selector(request.query.get("fieldSelector", ""))
        except SelectorError as e:
            return _error(400, "BadRequest", f"unable to parse requirement: {e}")

        def matches(obj: Json) -> bool:
            return labels(obj["metadata"].get("labels") or {}) and fields(obj)

        return await self._list_or_watch(request, PODS, ns, matches, list_kind="PodList", api_version="v1")

    async def _pools(self, request: web.Request) -> web.StreamResponse:
        group, version, ns = (request.match_info[k] for k in ("group", "version", "ns"))
        if (group, version) not in self.served_pool_versions:
            return _error(404, "NotFound", "the server could not find the requested resource")
        try:
            labels = parse_label_selector(request.query.get("labelSelector", ""))
            fields = _parse_field_selector(request.query.get("fieldSelector", ""))
        except SelectorError as e:
            return _error(400, "BadRequest", f"unable to parse requirement: {e}")

        def matches(obj: Json) -> bool:
            return labels(obj["metadata"].get("labels") or {}) and fields(obj)

        resource = _pool_resource(group, version)
        return await self._list_or_watch(
            request, resource, ns, matches, list_kind="InferencePoolList", api_version=f"{group}/{version}"
        )

    async def _rewrites(self, request: web.Request) -> web.StreamResponse:
        group, version, ns = (request.match_info[k] for k in ("group", "version", "ns"))
        if (group, version) not in self.served_rewrite_versions:
            return _error(404, "NotFound", "the server could not find the requested resource")
        if (group, version) in self.forbidden_rewrite_versions:
            return _error(
                403,
                "Forbidden",
                f'inferencemodelrewrites.{group} is forbidden: User "system:serviceaccount:default:epp" '
                f'cannot list resource "inferencemodelrewrites" in API group "{group}"',
            )
        return await self._list_or_watch(
            request,
            _rewrite_resource(group, version),
            ns,
            lambda obj: True,
            list_kind="InferenceModelRewriteList",
            api_version=f"{group}/{version}",
        )

    async def _objectives(self, request: web.Request) -> web.StreamResponse:
        group, version, ns = (request.match_info[k] for k in ("group", "version", "ns"))
        if (group, version) not in self.served_objective_versions:
            return _error(404, "NotFound", "the server could not find the requested resource")
        return await self._list_or_watch(
            request,
            _objective_resource(group, version),
            ns,
            lambda obj: True,
            list_kind="InferenceObjectiveList",
            api_version=f"{group}/{version}",
        )

    async def _pool(self, request: web.Request) -> web.Response:
        group, version, ns, name = (request.match_info[k] for k in ("group", "version", "ns", "name"))
        if (group, version) not in self.served_pool_versions:
            return _error(404, "NotFound", "the server could not find the requested resource")
        obj = self._objects.get((_pool_resource(group, version), ns, name))
        if obj is None:
            return _error(404, "NotFound", f'inferencepools.{group} "{name}" not found')
        return web.json_response(obj)

    async def _list_or_watch(
        self,
        request: web.Request,
        resource: str,
        ns: str,
        matches: Matcher,
        *,
        list_kind: str,
        api_version: str,
    ) -> web.StreamResponse:
        if _is_true(request.query.get("watch")):
            return await self._watch(request, resource, ns, matches)
        items = [
            copy.deepcopy(obj)
            for (res, obj_ns, _), obj in sorted(self._objects.items())
            if res == resource and obj_ns == ns and matches(obj)
        ]
        return web.json_response(
            {
                "kind": list_kind,
                "apiVersion": api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, resource: str, ns: str, matches: Matcher
    ) -> web.StreamResponse:
        since = request.query.get("resourceVersion", "")
        backlog: list[Json]
        if since in ("", "0"):
            backlog = [
                {"type": "ADDED", "object": copy.deepcopy(obj)}
                for (res, obj_ns, _), obj in sorted(self._objects.items())
                if res == resource and obj_ns == ns and matches(obj)
            ]
        else:
            try:
                from_rv = int(since)
            except ValueError:
                return _error(400, "BadRequest", f"invalid resourceVersion {since!r}")
            if from_rv < self._min_rv:
                self.gone_served += 1
                gone = _status(410, "Expired", f"too old resource version: {from_rv} ({self._min_rv})")
                if not self.gone_as_event:
                    return web.json_response(gone, status=410)
                backlog = [{"type": "ERROR", "object": gone}]
                return await self._stream(request, None, backlog, None, False)
            backlog = []
            for event in self._log:
                if event.rv > from_rv and (event.resource, event.namespace) == (resource, ns):
                    out = self._as_seen_by(matches, event)
                    if out is not None:
                        backlog.append(out)
        timeout: float | None = None
        if "timeoutSeconds" in request.query:
            timeout = float(request.query["timeoutSeconds"]) * self.timeout_scale
        # Registered before the first await, so no change between the backlog and the live events is lost.
        watcher = _Watcher(resource, ns, matches)
        self._watchers.add(watcher)
        try:
            return await self._stream(
                request, watcher, backlog, timeout, _is_true(request.query.get("allowWatchBookmarks"))
            )
        finally:
            self._watchers.discard(watcher)

    async def _stream(
        self,
        request: web.Request,
        watcher: _Watcher | None,
        backlog: list[Json],
        timeout: float | None,
        bookmarks: bool,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for event in backlog:
                await response.write(json.dumps(event).encode() + b"\n")
            if watcher is None:
                return response
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    if bookmarks:
                        bookmark = {
                            "type": "BOOKMARK",
                            "object": {"kind": "Pod", "metadata": {"resourceVersion": str(self._rv)}},
                        }
                        await response.write(json.dumps(bookmark).encode() + b"\n")
                    break
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    continue
                if event is None:
                    break
                await response.write(json.dumps(event).encode() + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        return response
