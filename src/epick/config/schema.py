"""The `EndpointPickerConfig` document, as the Go EPP and llm-d write it. Parsed strictly."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The GIE's older and current groups, and llm-d's.
API_VERSIONS = (
    "inference.networking.x-k8s.io/v1alpha1",
    "config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PluginEntry(_Strict):
    name: str | None = None
    type: str
    parameters: dict[str, Any] | None = None


class PluginRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    weight: float | None = None

    @field_validator("weight", mode="before")
    @classmethod
    def _weight_is_a_number(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError("weight must be a number, not a boolean")
        return v


class ProfileEntry(_Strict):
    name: str
    plugins: list[PluginRef] = Field(default_factory=list)


class SaturationDetectorSection(_Strict):
    """Older files give thresholds here; newer ones name a `utilization-detector` plugin."""

    plugin_ref: str | None = Field(default=None, alias="pluginRef")
    queue_depth_threshold: int | None = Field(default=None, alias="queueDepthThreshold")
    kv_cache_util_threshold: float | None = Field(default=None, alias="kvCacheUtilThreshold")
    metrics_staleness_threshold: str | float | None = Field(default=None, alias="metricsStalenessThreshold")


class EndpointPickerConfigFile(_Strict):
    api_version: Literal[
        "inference.networking.x-k8s.io/v1alpha1",
        "config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1",
        "llm-d.ai/v1alpha1",
    ] = Field(alias="apiVersion")
    kind: Literal["EndpointPickerConfig"]
    plugins: list[PluginEntry] = Field(default_factory=list)
    scheduling_profiles: list[ProfileEntry] = Field(default_factory=list, alias="schedulingProfiles")
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    saturation_detector: SaturationDetectorSection | None = Field(default=None, alias="saturationDetector")
    # Sections of the Go EPP's format that epick accepts but does not act on (reported as warnings).
    data: dict[str, Any] | None = None
    data_layer: dict[str, Any] | None = Field(default=None, alias="dataLayer")
    flow_control: dict[str, Any] | None = Field(default=None, alias="flowControl")
    parser: dict[str, Any] | None = None
    request_control: dict[str, Any] | None = Field(default=None, alias="requestControl")
    request_handler: dict[str, Any] | None = Field(default=None, alias="requestHandler")

    @field_validator("plugins", "scheduling_profiles", "feature_gates", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


IGNORED_SECTIONS = {
    "data": "epick's data layer is configured by flags",
    "data_layer": "epick's data layer is configured by flags",
    "flow_control": "epick has no flow-control layer yet",
    "parser": "epick parses OpenAI bodies itself",
    "request_control": "epick's request control is configured by flags",
    "request_handler": "epick parses OpenAI bodies itself",
}
