"""`--watch-config-file`: a config file changed as a ConfigMap update changes it is reloaded, plugins
whose configuration did not change keeping their state; a bad file keeps the running config; every
reload is counted in upstream's llm_d_epp_config_* families."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from epick.datalayer.datastore import EndpointSpec
from epick.service import Service, Settings, config_watch
from tests.datalayer.pages import wait_until

CONFIG = textwrap.dedent(
    """\
    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins:
    - type: approx-prefix-cache-producer
    - type: prefix-cache-scorer
    - type: queue-scorer
    schedulingProfiles:
    - name: default
      plugins:
      - {pluginRef: prefix-cache-scorer, weight: WEIGHT}
      - {pluginRef: queue-scorer, weight: 1}
    """
)


def publish(mount: Path, text: str, version: int) -> None:
    """Write `text` as the kubelet updates a ConfigMap volume: a new timestamped directory, then the
    `..data` link swapped to it in one rename; config.yaml is a link through `..data`."""
    data = mount / f"..v{version}"
    data.mkdir()
    (data / "config.yaml").write_text(text)
    tmp = mount / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, mount / "..data")
    if not (mount / "config.yaml").is_symlink():
        (mount / "config.yaml").symlink_to("..data/config.yaml")


def weights(service: Service) -> list[float]:
    return [w.weight for w in service.director.config.scheduler.profiles["default"].scorers]


async def test_a_configmap_update_is_reloaded_and_a_bad_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_watch, "CHECK_INTERVAL_S", 0.01)
    mount = tmp_path / "config"
    mount.mkdir()
    publish(mount, CONFIG.replace("WEIGHT", "3"), 1)
    service = Service(
        Settings(
            endpoints=(EndpointSpec("a", "127.0.0.1", 1, {}),),
            proxy=None,
            metrics_port=None,
            config_file=str(mount / "config.yaml"),
            watch_config_file=True,
        )
    )
    await service.start()
    try:
        producer = service.director.config.plugins["approx-prefix-cache-producer"]
        producer.index.add("a", [1, 2, 3])  # type: ignore[attr-defined]
        assert weights(service) == [3.0, 1.0] and service.reloads.generation == 1

        publish(mount, CONFIG.replace("WEIGHT", "5"), 2)
        await wait_until(lambda: service.reloads.generation == 2)
        assert weights(service) == [5.0, 1.0]
        kept = service.director.config.plugins["approx-prefix-cache-producer"]
        assert kept is producer and len(kept.index) == 3  # type: ignore[attr-defined]
        assert service.reloads.last_success > 0

        publish(mount, CONFIG.replace("WEIGHT", "-1"), 3)  # a negative weight: refused
        await wait_until(lambda: service.reloads.counts["invalid"] == 1)
        assert weights(service) == [5.0, 1.0] and service.reloads.generation == 2

        os.replace(mount / "..data", mount / "..gone")  # the link dangles: unreadable
        await wait_until(lambda: service.reloads.counts["read_error"] == 1)
        os.replace(mount / "..gone", mount / "..data")
        publish(mount, CONFIG.replace("WEIGHT", "7"), 4)
        await wait_until(lambda: service.reloads.generation == 3)
        assert weights(service) == [7.0, 1.0]

        page = generate_latest(service.metrics.registry).decode()
        assert 'llm_d_epp_config_reload_total{result="success"} 2.0' in page
        assert 'llm_d_epp_config_reload_total{result="invalid"} 1.0' in page
        assert 'llm_d_epp_config_reload_total{result="read_error"} 1.0' in page
        assert "llm_d_epp_config_active_generation 3.0" in page
    finally:
        await service.stop()


def test_the_watch_needs_a_config_file() -> None:
    from epick.service import SettingsError

    with pytest.raises(SettingsError, match='"watch-config-file" requires "config-file"'):
        Settings(proxy=None, watch_config_file=True).check()
