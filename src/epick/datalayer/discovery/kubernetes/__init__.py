"""Kubernetes discovery: the Ready pods an InferencePool (or a label selector) selects, kept live by watches.

One endpoint per pod and target port: named `<pod>` when there is one port, `<pod>-rank-<i>` for port i
when there are several (as the Go EPP names them); address the pod IP; labels the pod's labels. A pod
counts while it is Ready (condition Ready=True), has a pod IP and is not being deleted.

An InferencePool is read from `inference.networking.k8s.io/v1` (`spec.selector.matchLabels`,
`spec.targetPorts[].number`), or, where that has no such pool, from the older
`inference.networking.x-k8s.io/v1alpha2` (`spec.selector` a flat map, `spec.targetPortNumber`). The pool is
watched too: a new selector or new ports re-list the pods; a deleted pool empties the datastore until it
comes back.

Each collection is listed once, then watched from the list's resourceVersion. A watch that ends
(timeoutSeconds, a dropped connection) resumes from the last resourceVersion seen; one whose version has
expired (410 Gone) re-lists and replaces the endpoints. Errors are retried with a backoff (logged once a
streak, and once on recovery); the background tasks end only with `stop()`.

Asked to (`on_rewrites`), it also follows the pool's InferenceModelRewrite resources.

The modules: `discovery` (`KubernetesDiscovery`, which ties the others together), `client` (building the
API client), `pool` (InferencePools, selectors, pods as endpoints), `rewrites` (InferenceModelRewrites),
`reflector` (list and watch), `api` (the API server's JSON and errors).
"""

from epick.datalayer.discovery.kubernetes.api import Json
from epick.datalayer.discovery.kubernetes.discovery import KubernetesDiscovery
from epick.datalayer.discovery.kubernetes.pool import DEFAULT_TARGET_PORTS, POOL_API_VERSIONS, POOL_PLURAL
from epick.datalayer.discovery.kubernetes.reflector import SHORT_WATCH_S, EventHandler, ListHandler

__all__ = [
    "DEFAULT_TARGET_PORTS",
    "POOL_API_VERSIONS",
    "POOL_PLURAL",
    "SHORT_WATCH_S",
    "EventHandler",
    "Json",
    "KubernetesDiscovery",
    "ListHandler",
]
