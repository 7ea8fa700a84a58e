"""The service: the composition root that builds a running epick from `Settings` (service.py), runs
it in one process or several (run.py, workers/), and reloads it."""

from epick.service.run import serve
from epick.service.service import Service
from epick.service.settings import KubernetesSettings, Settings, SettingsError

__all__ = ["KubernetesSettings", "Service", "Settings", "SettingsError", "serve"]
