"""`endpoint-notification-source` and `k8s-notification-source`: events instead of polling.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/source/notifications): the
endpoint source calls its extractors (`topology-extractor`, ...) as endpoints appear, change and
leave; the Kubernetes source watches one resource kind (`group`, `version`, `kind`: version and kind
required) for the extractors bound to it.
"""

from __future__ import annotations

from pydantic import field_validator

from epick.framework import NamedPlugin, Reads
from epick.plugins.registry import Handle, Parameters, PluginSpec

ENDPOINT_TYPE = "endpoint-notification-source"
K8S_TYPE = "k8s-notification-source"


class EndpointNotifications(NamedPlugin):
    plugin_type = ENDPOINT_TYPE
    reads = Reads.NOTHING

    def notifies_endpoints(self) -> bool:
        return True


class K8sNotificationParameters(Parameters):
    group: str = ""
    version: str
    kind: str

    @field_validator("version", "kind")
    @classmethod
    def _required(cls, v: str) -> str:
        if not v:
            raise ValueError("version and kind are required for k8s-notification-source")
        return v


class K8sNotifications(NamedPlugin):
    plugin_type = K8S_TYPE
    reads = Reads.NOTHING

    def __init__(self, name: str | None, group: str, version: str, kind: str) -> None:
        super().__init__(name)
        self._gvk = (group, version, kind)

    @property
    def gvk(self) -> tuple[str, str, str]:
        return self._gvk


def _endpoint(name: str, params: object, handle: Handle) -> EndpointNotifications:
    return EndpointNotifications(name)


def _k8s(name: str, params: K8sNotificationParameters, handle: Handle) -> K8sNotifications:
    return K8sNotifications(name, params.group, params.version, params.kind)


ENDPOINT_SPEC = PluginSpec(ENDPOINT_TYPE, _endpoint, summary="endpoint add/update/delete events")
K8S_SPEC = PluginSpec(K8S_TYPE, _k8s, K8sNotificationParameters, "watches one Kubernetes resource kind")
