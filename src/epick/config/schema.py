"""The `EndpointPickerConfig` document, as the Go EPP and llm-d write it. Parsed strictly.

`featureGates` entries are checked as upstream's loader checks them (llm-d/llm-d-router,
pkg/epp/config/loader/validation.go, `validateFeatureGates`): `name` or `name=<bool>`, the name one
of the gates upstream registers (`epick.config.upstream.FEATURE_GATES`), the value one that Go's
`strconv.ParseBool` takes after trimming and lower-casing. A gate upstream registered in an earlier
release and has since removed (`RETIRED_FEATURE_GATES`: GIE v1.5's `dataLayer` and
`enableLegacyMetrics`, llm-d v0.8's `prepareDataPlugins`) is accepted, so that those releases' files
load unchanged; the loader warns that it has no effect.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from epick.config.issues import CONFIG_ISSUE
from epick.config.quantity import Quantity
from epick.config.suggest import did_you_mean
from epick.config.upstream import FEATURE_GATES, RETIRED_FEATURE_GATES, retired_feature_gate
from epick.plugins.duration import Duration

# GIE's older group and the one it used later, and llm-d's: v1alpha1, which upstream's loader
# decodes today (llm-d/llm-d-router, apix/config/v1alpha1), and v1.
ApiVersion = Literal[
    "inference.networking.x-k8s.io/v1alpha1",
    "config.apix.gateway-api-inference-extension.sigs.k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
    "llm-d.ai/v1",
]
API_VERSIONS: tuple[str, ...] = typing.get_args(ApiVersion)

# What Go's strconv.ParseBool accepts once upstream has trimmed and lower-cased the value.
_GATE_VALUES = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}


def split_feature_gate(entry: str) -> tuple[str, bool]:
    """A `featureGates` entry's gate name and value (a bare name is `=true`), as upstream reads it."""
    parts = entry.split("=")
    if len(parts) == 1:
        return parts[0], True
    return parts[0], _GATE_VALUES[parts[1].strip().lower()]


def check_feature_gate(entry: str) -> str:
    parts = entry.split("=")
    name = parts[0]
    known = [g.name for g in FEATURE_GATES]
    if name not in known and retired_feature_gate(name) is None:
        listed = f"known gates: {', '.join(known)}"
        message = f"unknown feature gate {name!r}"
        close = did_you_mean(name, known + [g.name for g in RETIRED_FEATURE_GATES])
        fix = f"did you mean {close!r}? ({listed})" if close else f"remove it, or use one of the {listed}"
        raise PydanticCustomError(CONFIG_ISSUE, "{message}", {"message": message, "fix": fix})
    if len(parts) > 1 and parts[1].strip().lower() not in _GATE_VALUES:
        raise PydanticCustomError(
            CONFIG_ISSUE,
            "{message}",
            {
                "message": f"{parts[1]!r} is not a valid value for feature gate {name!r}",
                "fix": f"write '{name}', '{name}=true' or '{name}=false'",
            },
        )
    return entry


FeatureGateEntry = Annotated[str, AfterValidator(check_feature_gate)]


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


class PriorityBandSection(_Strict):
    """One priority band: its limits (0 or omitted: upstream's defaults, 5000 requests and 1 GB), its
    policies (omitted: fcfs-ordering-policy and global-strict-fairness-policy) and its queue TTL."""

    priority: int = 0
    max_bytes: Quantity | None = Field(default=None, alias="maxBytes")
    max_requests: Quantity | None = Field(default=None, alias="maxRequests")
    fairness_policy_ref: str = Field(default="", alias="fairnessPolicyRef")
    ordering_policy_ref: str = Field(default="", alias="orderingPolicyRef")
    # The band's queue-wait bound, replacing the global one; "0s": unbounded (llm-d-router #2649).
    default_request_ttl: Duration | None = Field(default=None, alias="defaultRequestTTL")


class FlowControlSection(_Strict):
    """The flow-control layer (used when the `flowControl` feature gate is on), as upstream's
    FlowControlConfig (llm-d/llm-d-router, apix/config/v1alpha1)."""

    max_bytes: Quantity | None = Field(default=None, alias="maxBytes")
    max_requests: Quantity | None = Field(default=None, alias="maxRequests")
    default_request_ttl: Duration | None = Field(default=None, alias="defaultRequestTTL")
    no_endpoint_request_ttl: Duration | None = Field(default=None, alias="noEndpointRequestTTL")
    default_priority_band: PriorityBandSection | None = Field(default=None, alias="defaultPriorityBand")
    default_negative_priority_band: PriorityBandSection | None = Field(
        default=None, alias="defaultNegativePriorityBand"
    )
    priority_bands: list[PriorityBandSection] = Field(default_factory=list, alias="priorityBands")
    usage_limit_policy_plugin_ref: str = Field(default="", alias="usageLimitPolicyPluginRef")
    band_selection_policy_plugin_ref: str = Field(default="", alias="bandSelectionPolicyPluginRef")
    saturation_detector: SaturationDetectorSection | None = Field(default=None, alias="saturationDetector")
    enable_eviction: bool = Field(default=False, alias="enableEviction")

    @field_validator("priority_bands", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


class ParserRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")


class RequestHandlerSection(_Strict):
    """The parsers, in order: a request's path goes to the parser claiming its longest suffix."""

    parsers: list[ParserRef] = Field(default_factory=list)

    @field_validator("parsers", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


class ExtractorRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")


class DataLayerSource(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    extractors: list[ExtractorRef] = Field(default_factory=list)

    @field_validator("extractors", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


class DiscoverySection(_Strict):
    """`dataLayer.discovery`: the endpoints' discovery plugin, `endpoints.pluginRef` (and the peers',
    `peers.pluginRef`); v1alpha1's bare `pluginRef` is the deprecated form of the first, which wins
    where both are given (llm-d/llm-d-router, pkg/epp/config/loader/conversion.go)."""

    plugin_ref: str | None = Field(default=None, alias="pluginRef")
    endpoints: ExtractorRef | None = None
    peers: ExtractorRef | None = None

    @property
    def endpoints_ref(self) -> str | None:
        return self.endpoints.plugin_ref if self.endpoints is not None else self.plugin_ref


class CrossReplicaSection(_Strict):
    """llm-d.ai/v1's `dataLayer.crossReplica`: v1alpha1's crossReplica* fields, grouped."""

    syncer_plugin_ref: str | None = Field(default=None, alias="syncerPluginRef")
    sync_interval: Duration | None = Field(default=None, alias="syncInterval")
    publish_timeout: Duration | None = Field(default=None, alias="publishTimeout")


class DataLayerSection(_Strict):
    """The data layer: polling and notification sources with their extractors, and discovery
    (GIE v1.5's `dataLayer`, llm-d's additions; GIE v1.3-1.4 called the section `data`). The
    cross-replica fields are `crossReplica*` under llm-d.ai/v1alpha1 and `crossReplica.*` under v1."""

    inject_defaults: bool | None = Field(default=None, alias="injectDefaults")
    sources: list[DataLayerSource] = Field(default_factory=list)
    discovery: DiscoverySection | None = None
    peer_discovery: ExtractorRef | None = Field(default=None, alias="peerDiscovery")
    cross_replica_syncer_plugin_ref: str | None = Field(default=None, alias="crossReplicaSyncerPluginRef")
    cross_replica_sync_interval: Duration | None = Field(default=None, alias="crossReplicaSyncInterval")
    cross_replica_publish_timeout: Duration | None = Field(default=None, alias="crossReplicaPublishTimeout")
    cross_replica: CrossReplicaSection | None = Field(default=None, alias="crossReplica")

    @property
    def syncer_ref(self) -> str | None:
        if self.cross_replica is not None:
            return self.cross_replica.syncer_plugin_ref
        return self.cross_replica_syncer_plugin_ref

    @property
    def sync_interval(self) -> float | None:
        if self.cross_replica is not None:
            return self.cross_replica.sync_interval
        return self.cross_replica_sync_interval

    @field_validator("sources", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


class EndpointPickerConfigFile(_Strict):
    api_version: ApiVersion = Field(alias="apiVersion")
    kind: Literal["EndpointPickerConfig"]
    plugins: list[PluginEntry] = Field(default_factory=list)
    scheduling_profiles: list[ProfileEntry] = Field(default_factory=list, alias="schedulingProfiles")
    feature_gates: list[FeatureGateEntry] = Field(default_factory=list, alias="featureGates")
    saturation_detector: SaturationDetectorSection | None = Field(default=None, alias="saturationDetector")
    data_layer: DataLayerSection | None = Field(default=None, alias="dataLayer")
    data: DataLayerSection | None = None  # GIE v1.3-1.4's name for dataLayer
    flow_control: FlowControlSection | None = Field(default=None, alias="flowControl")
    # Sections of the Go EPP's format that epick accepts but does not act on (reported as warnings).
    request_control: dict[str, Any] | None = Field(default=None, alias="requestControl")
    # GIE v1.5's one parser; upstream now lists them under requestHandler.parsers (which wins).
    parser: ParserRef | None = None
    request_handler: RequestHandlerSection | None = Field(default=None, alias="requestHandler")

    @field_validator("plugins", "scheduling_profiles", "feature_gates", mode="before")
    @classmethod
    def _null_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


IGNORED_SECTIONS = {
    "request_control": "epick's request control is configured by flags",
}
