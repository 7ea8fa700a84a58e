"""Every Kubernetes API call epick makes, what RBAC it needs, and when: the table deploy/'s RBAC is checked
against (tests/deploy/test_manifests.py).

Each call site is a kubernetes_asyncio API method named in src/epick, keyed by the module and the
function it is named in (`SITES`). A site is either called at once (`call_json`) or handed to the
reflector in a `_Collection`, which lists it and then watches it (`watch=True`): such a site needs both
verbs. The method alone does not say which resource: the custom-object methods take the group and the
plural as arguments, from the module constants `test_the_constants_are_the_tables` checks.

`needed` says, from the settings `epp`'s command line makes, whether the call is made at all: the base
Deployment needs no Lease, the leader-election component's does.

`EXCEPTIONS` are what the manifests grant without epick calling anything: a grant for whoever holds
epick's service-account token, not for epick.

  resource (group)                   verbs          where (src/epick/...)                        when
  pods ("")                          list, watch    datalayer/discovery/kubernetes/discovery.py  a pool or
                                                      KubernetesDiscovery._pods_collection       selector
  inferencepools (--pool-group's;    get            discovery.py KubernetesDiscovery             a pool
    both groups when it is unset)                     ._initial_pool
                                     list, watch    discovery.py KubernetesDiscovery
                                                      ._pool_collection
  inferencemodelrewrites,            list, watch    datalayer/discovery/kubernetes/resources.py  a pool
  inferenceobjectives                                 PoolResourceWatch._collection
    (inference.networking.x-k8s.io, llm-d.ai)
  leases (coordination.k8s.io)       get            service/leader.py LeaderElector._read        leader
                                     create, update   LeaderElector._try_acquire_or_renew        election
                                     update           LeaderElector._write (release)
  tokenreviews                       create         service/metrics_server.py                    metrics
    (authentication.k8s.io)                           MetricsAuth._create                        auth
  subjectaccessreviews               create           MetricsAuth._create                        (default
    (authorization.k8s.io)                                                                       on)
  /metrics (non-resource URL)        get            none: components/servicemonitor's exception
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from epick.service import Settings

POOL_GROUPS = ("inference.networking.k8s.io", "inference.networking.x-k8s.io")
POOL_RESOURCE_GROUPS = ("inference.networking.x-k8s.io", "llm-d.ai")  # objectives and rewrites


@dataclass(frozen=True)
class Grant:
    """One (API group, resource, verb) an RBAC rule may grant; `namespaced`: in the pool's namespace
    (a Role's), else cluster-wide (a ClusterRole bound by a ClusterRoleBinding)."""

    group: str
    resource: str
    verb: str
    namespaced: bool = True

    def __str__(self) -> str:
        scope = "namespaced" if self.namespaced else "cluster"
        return f"{self.verb} {self.group or 'core'}/{self.resource} ({scope})"


@dataclass(frozen=True)
class NonResourceGrant:
    url: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.url} (non-resource)"


@dataclass(frozen=True)
class ApiCall:
    """What one call site needs, and when it is called."""

    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    needed: Callable[[Settings], bool]
    namespaced: bool = True

    def grants(self, settings: Settings) -> set[Grant]:
        if not self.needed(settings):
            return set()
        return {
            Grant(g, r, v, self.namespaced) for g in self.groups for r in self.resources for v in self.verbs
        }


# When each call is made (service.py: Service._discovery, _elect, _metrics_server; workers/supervisor.py).
def discovery(s: Settings) -> bool:
    return s.kubernetes is not None


def pool_in(group: str) -> Callable[[Settings], bool]:
    def needed(s: Settings) -> bool:
        k = s.kubernetes
        return k is not None and k.pool is not None and k.pool_group in (None, group)

    return needed


def rewrites(s: Settings) -> bool:
    return s.kubernetes is not None and s.kubernetes.pool is not None and s.kubernetes.watch_rewrites


def objectives(s: Settings) -> bool:
    return s.kubernetes is not None and s.kubernetes.pool is not None and s.kubernetes.watch_objectives


def leader_election(s: Settings) -> bool:
    return s.kubernetes is not None and s.leader_election is not None


def metrics_auth(s: Settings) -> bool:
    return s.kubernetes is not None and s.metrics_auth and s.metrics_port is not None


DISCOVERY = "epick/datalayer/discovery/kubernetes/discovery.py"
RESOURCES = "epick/datalayer/discovery/kubernetes/resources.py"
LEADER = "epick/service/leader.py"
METRICS = "epick/service/metrics_server.py"

# (module under src/, the function the method is named in, the kubernetes_asyncio method) -> its calls.
SITES: dict[tuple[str, str, str], tuple[ApiCall, ...]] = {
    (DISCOVERY, "KubernetesDiscovery._pods_collection", "list_namespaced_pod"): (
        ApiCall(("",), ("pods",), ("list", "watch"), discovery),
    ),
    (DISCOVERY, "KubernetesDiscovery._initial_pool", "get_namespaced_custom_object"): tuple(
        ApiCall((g,), ("inferencepools",), ("get",), pool_in(g)) for g in POOL_GROUPS
    ),
    (DISCOVERY, "KubernetesDiscovery._pool_collection", "list_namespaced_custom_object"): tuple(
        ApiCall((g,), ("inferencepools",), ("list", "watch"), pool_in(g)) for g in POOL_GROUPS
    ),
    (RESOURCES, "PoolResourceWatch._collection", "list_namespaced_custom_object"): (
        ApiCall(POOL_RESOURCE_GROUPS, ("inferencemodelrewrites",), ("list", "watch"), rewrites),
        ApiCall(POOL_RESOURCE_GROUPS, ("inferenceobjectives",), ("list", "watch"), objectives),
    ),
    (LEADER, "LeaderElector._read", "get_namespaced_custom_object"): (
        ApiCall(("coordination.k8s.io",), ("leases",), ("get",), leader_election),
    ),
    (LEADER, "LeaderElector._try_acquire_or_renew", "create_namespaced_custom_object"): (
        ApiCall(("coordination.k8s.io",), ("leases",), ("create",), leader_election),
    ),
    (LEADER, "LeaderElector._try_acquire_or_renew", "replace_namespaced_custom_object"): (
        ApiCall(("coordination.k8s.io",), ("leases",), ("update",), leader_election),
    ),
    (LEADER, "LeaderElector._write", "replace_namespaced_custom_object"): (
        ApiCall(("coordination.k8s.io",), ("leases",), ("update",), leader_election),
    ),
    (METRICS, "MetricsAuth._create", "create_cluster_custom_object"): (
        ApiCall(("authentication.k8s.io",), ("tokenreviews",), ("create",), metrics_auth, namespaced=False),
        ApiCall(("authorization.k8s.io",), ("subjectaccessreviews",), ("create",), metrics_auth, False),
    ),
}

# The modules that use kubernetes_asyncio (client.py only builds the client). A new one is reviewed here.
K8S_MODULES = {
    DISCOVERY,
    RESOURCES,
    LEADER,
    METRICS,
    "epick/datalayer/discovery/kubernetes/client.py",
}

# The HTTP verb RBAC sees, by the API method's prefix (a `_Collection` adds watch to a list).
VERB_OF_PREFIX = {
    "get": "get",
    "read": "get",
    "list": "list",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}

# Granted without a call by epick, by component; each mirrors a grant of upstream's chart.
EXCEPTIONS: dict[str, dict[NonResourceGrant | Grant, str]] = {
    "servicemonitor": {
        NonResourceGrant("/metrics", "get"): (
            "Prometheus scrapes with a token of epick's service account (the ServiceMonitor's Secret); "
            "epick's SubjectAccessReview asks whether that user may get /metrics. Upstream: GIE v1.5.0 "
            "config/charts/epplib/templates/_rbac.yaml"
        ),
    },
}


def needed(settings: Settings) -> set[Grant]:
    """Every grant the calls made with these settings need."""
    return {grant for calls in SITES.values() for call in calls for grant in call.grants(settings)}
