"""The EPP containers upstream's Helm charts render (tests/data/charts/*.yaml, with their sources)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHARTS = Path(__file__).parents[1] / "data" / "charts"


@dataclass(frozen=True)
class ChartPod:
    """One rendered EPP container: its arguments, environment, probes and the config it mounts."""

    name: str
    fixture: dict[str, Any]

    @property
    def args(self) -> list[str]:
        return list(self.fixture["args"])

    @property
    def namespace(self) -> str:
        return str(self.fixture["release"]["namespace"])

    @property
    def replicas(self) -> int:
        return int(self.fixture["workload"].get("replicas") or 1)

    @property
    def pod_name(self) -> str:
        return f"{self.fixture['workload']['name']}-7d9f8c6b5-x2kqz"

    def probe(self, kind: str) -> tuple[int, str]:
        grpc = self.fixture["probes"][kind]["grpc"]
        return int(grpc["port"]), str(grpc.get("service", ""))

    def port(self, name: str) -> int:
        return int(self.fixture["ports"][name])

    def config_path(self) -> str | None:
        """The --config-file the arguments name (the last one given)."""
        path = None
        for i, arg in enumerate(self.args):
            if arg == "--config-file":
                path = self.args[i + 1]
            elif arg.startswith("--config-file="):
                path = arg.split("=", 1)[1]
        return path

    def config_text(self) -> str | None:
        """The text of that config file, from the ConfigMap the chart mounts at its directory."""
        path = self.config_path()
        if path is None:
            return None
        mount = next(
            m for m in self.fixture["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")
        )
        volume = next(v for v in self.fixture["podVolumes"] if v["name"] == mount["name"])
        data = self.fixture["configMaps"][volume["configMap"]["name"]]
        return str(data[Path(path).name])


def chart_pods() -> list[ChartPod]:
    return [
        ChartPod(path.stem, yaml.safe_load(path.read_text(encoding="utf-8")))
        for path in sorted(CHARTS.glob("*.yaml"))
    ]
