"""Building the Kubernetes API client: its configuration from a kubeconfig file, or in-cluster when
KUBERNETES_SERVICE_HOST is set, else from the default kubeconfig.
"""

from __future__ import annotations

import os
from typing import Any

from epick.datalayer.discovery.kubernetes.api import _describe
from epick.datalayer.discovery.static import DiscoveryError


async def load_client(kubeconfig: str | None) -> Any:
    """An API client configured from `kubeconfig`, else in-cluster, else from the default kubeconfig."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            source = "in-cluster configuration"
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            source = f"kubeconfig {kubeconfig or '(default location)'}"
            await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except Exception as e:
        raise DiscoveryError(f"Kubernetes discovery: cannot load the {source}: {_describe(e)}") from None
    return client.ApiClient(configuration)
