"""Building the Kubernetes API client: its configuration from a kubeconfig file, or in-cluster when
KUBERNETES_SERVICE_HOST is set, else from the default kubeconfig.

In-cluster, the client speaks HTTPS to `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT` and
trusts the CA the kubelet mounts beside the service account's token. The kubelet rotates that token
(a projected token lives an hour, and is rewritten well before) by swapping a symlink; `TokenFile`
notices the change before the next request, one stat() a request, where client-go re-reads the file
every minute.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from epick.datalayer.discovery.kubernetes.api import _describe
from epick.datalayer.discovery.static import DiscoveryError

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class TokenFile:
    """The service account's bearer token, read again whenever its file changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.token = ""
        self.reads = 0
        self._seen: tuple[int, int, int] | None = None
        self._warned = False
        self.refresh()
        if not self.token:
            raise DiscoveryError(f"the service-account token {self.path} is empty")

    def refresh(self) -> str:
        """The current token: the file's, when it changed since the last read and holds one."""
        try:
            st = self.path.stat()
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                token = self.path.read_text().strip()
                if token:
                    if self._seen is not None:
                        log.info("Kubernetes API: the token %s changed; using the new one", self.path)
                    self.token, self._seen, self._warned = token, seen, False
                    self.reads += 1
        except OSError as e:
            if not self.token:
                raise DiscoveryError(f"cannot read the service-account token: {e}") from None
            if not self._warned:  # mid-rotation, or unmounted: keep the token that worked
                log.warning("Kubernetes API: cannot read %s (%s); keeping the last token", self.path, e)
                self._warned = True
        return self.token

    def hook(self, configuration: Any, *_: Any) -> None:
        """kubernetes-asyncio's refresh_api_key_hook: called before each request."""
        configuration.api_key["BearerToken"] = f"Bearer {self.refresh()}"


def _in_cluster(configuration: Any, service_account: Path) -> None:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise DiscoveryError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set")
    ca = service_account / "ca.crt"
    if not ca.is_file() or ca.stat().st_size == 0:
        raise DiscoveryError(f"no CA certificate at {ca}")
    token = TokenFile(service_account / "token")
    configuration.host = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    configuration.ssl_ca_cert = str(ca)
    configuration.api_key["BearerToken"] = f"Bearer {token.token}"
    configuration.refresh_api_key_hook = token.hook


async def load_client(kubeconfig: str | None, *, service_account: str | None = None) -> Any:
    """An API client configured from `kubeconfig`, else in-cluster (the token and CA under
    `service_account`, default the kubelet's mount), else from the default kubeconfig."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            directory = Path(service_account or SERVICE_ACCOUNT_DIR)
            source = f"in-cluster configuration ({directory})"
            _in_cluster(configuration, directory)
        else:
            source = f"kubeconfig {kubeconfig or '(default location)'}"
            await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except DiscoveryError as e:
        raise DiscoveryError(f"Kubernetes discovery: cannot load the {source}: {e}") from None
    except Exception as e:
        raise DiscoveryError(f"Kubernetes discovery: cannot load the {source}: {_describe(e)}") from None
    return client.ApiClient(configuration)
