"""The upstream EPP's plugin types and feature gates, as facts epick checks configs against.

Upstream is llm-d/llm-d-router (the Endpoint Picker's home since GIE moved it there; GIE,
kubernetes-sigs/gateway-api-inference-extension, no longer registers plugin types). Every type is
registered in llm-d/llm-d-router, cmd/epp/runner/runner.go (`registerInTreePlugins`, through
`fwkplugin.Register`, `RegisterAsDefaultProducer`, `RegisterWithPluginDependencies`,
`RegisterDeprecated` and `RegisterDeprecatedWithPluginDependencies`); each type constant is resolved
to its string in its Go package, and a type's origin is the package of the factory registered for it.
Kinds follow upstream's package groups (pkg/epp/framework/plugins/<group>/...) and, within a
package, the interface the plugin implements. The feature gates are the ones that file registers
with `loader.RegisterFeatureGate` (llm-d/llm-d-router, pkg/epp/config/loader/configloader.go
validates them: an unknown gate fails the load). Read at llm-d/llm-d-router commit ebab687, then
brought forward to the newest runner.go the code search store holds (7435f357, after ebab687): the
thirteen types registered since, the new Stable level of ten, priority-holdback-policy's Beta. The
types upstream removed since (by-label, by-label-selector, disagg-headers-handler,
prefill-header-handler, pd-profile-handler, precise-prefix-cache-scorer, the tokenizer alias) stay
here, deprecated, as epick keeps loading the configs that name them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

UPSTREAM_REPOSITORY = "llm-d/llm-d-router"
_PLUGINS = "pkg/epp/framework/plugins/"

# What upstream's config loader decodes (llm-d/llm-d-router, pkg/epp/config/loader/configloader.go):
# its own group, and GIE's older group, deprecated (the loader logs a deprecation notice for it).
UPSTREAM_API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")


@dataclass(frozen=True, slots=True)
class UpstreamType:
    """One plugin type the upstream EPP registers."""

    name: str
    kind: str  # filter, scorer, picker, profile handler, data producer, parser, ...
    package: str  # Go package path of its factory, in `repository`
    stability: str  # "alpha", "beta" or "stable", as registered
    repository: str = UPSTREAM_REPOSITORY
    deprecated_in: str = ""  # the upstream release that deprecated it ("" when not deprecated)
    removal_in: str = ""  # the release upstream schedules its removal for
    replacement: str = ""  # the type upstream names as its replacement
    test_only: bool = False  # registered for upstream's conformance tests only

    @property
    def origin(self) -> str:
        """Where upstream defines it: "repository, Go package path"."""
        return f"{self.repository}, {self.package}"

    @property
    def deprecated(self) -> bool:
        return bool(self.deprecated_in)


def _t(
    name: str,
    kind: str,
    package: str,
    stability: str,
    *,
    deprecated_in: str = "",
    removal_in: str = "",
    replacement: str = "",
    test_only: bool = False,
) -> UpstreamType:
    return UpstreamType(
        name,
        kind,
        _PLUGINS + package,
        stability,
        deprecated_in=deprecated_in,
        removal_in=removal_in,
        replacement=replacement,
        test_only=test_only,
    )


# Sorted by name. Package paths are relative to pkg/epp/framework/plugins/.
UPSTREAM_TYPES: tuple[UpstreamType, ...] = (
    _t("active-request-scorer", "scorer", "scheduling/scorer/activerequest", "beta"),
    _t("agent-identity", "request-header processor", "requestcontrol/requestheader/agentidentity", "alpha"),
    _t("always-disagg-multimodal-decider", "P/D decider", "scheduling/profilehandler/disagg", "beta"),
    _t("always-disagg-pd-decider", "P/D decider", "scheduling/profilehandler/disagg", "beta"),
    _t("anthropic-parser", "parser", "requesthandling/parsers/anthropic", "beta"),
    _t(
        "approx-prefix-cache-producer",
        "data producer",
        "requestcontrol/dataproducer/approximateprefix",
        "beta",
    ),
    _t("burst-prefix-cache-producer", "data producer", "requestcontrol/dataproducer/burstprefix", "alpha"),
    _t(
        "by-label",
        "filter",
        "scheduling/filter/bylabel",
        "beta",
        deprecated_in="v0.9.0",
        removal_in="v0.11.0",
        replacement="label-selector-filter",
    ),
    _t(
        "by-label-selector",
        "filter",
        "scheduling/filter/bylabel",
        "beta",
        deprecated_in="v0.9.0",
        removal_in="v0.11.0",
        replacement="label-selector-filter",
    ),
    _t("concurrency-detector", "saturation detector", "flowcontrol/saturationdetector/concurrency", "beta"),
    _t("context-length-aware", "scorer", "scheduling/scorer/contextlengthaware", "beta"),
    _t("core-metrics-extractor", "extractor", "datalayer/extractor/metrics", "beta"),
    _t(
        "data-parallel-profile-handler", "profile handler", "scheduling/profilehandler/dataparallel", "stable"
    ),
    _t("dcgm-data-source", "data source", "datalayer/source/dcgm", "alpha"),
    _t("dcgm-extractor", "extractor", "datalayer/extractor/dcgm", "alpha"),
    _t("decode-filter", "filter", "scheduling/filter/bylabel", "beta"),
    _t(
        "destination-endpoint-served-verifier",
        "response processor",
        "requestcontrol/test/responsereceived",
        "beta",
        test_only=True,
    ),
    _t(
        "disagg-headers-handler",
        "pre-request plugin",
        "scheduling/profilehandler/disagg",
        "beta",
        deprecated_in="v0.9.0",
        removal_in="v0.11.0",
        replacement="disagg-profile-handler",
    ),
    _t("disagg-profile-handler", "profile handler", "scheduling/profilehandler/disagg", "beta"),
    _t(
        "disaggregatedset-rollout-screener",
        "screener",
        "requestcontrol/screener/disaggregatedsetrollout",
        "alpha",
    ),
    _t("edf-ordering-policy", "flow-control ordering policy", "flowcontrol/ordering/edf", "beta"),
    _t("encode-filter", "filter", "scheduling/filter/bylabel", "beta"),
    _t("endpoint-attribute-filter", "filter", "scheduling/filter/endpointattribute", "alpha"),
    _t("endpoint-attribute-scorer", "scorer", "scheduling/scorer/endpointattribute", "alpha"),
    _t("endpoint-attribute-weight-scorer", "scorer", "scheduling/scorer/attributeweight", "alpha"),
    _t("endpoint-notification-source", "data source", "datalayer/source/notifications", "beta"),
    _t("endpoint-pin-screener", "screener", "requestcontrol/screener/endpointpin", "alpha"),
    _t("fcfs-ordering-policy", "flow-control ordering policy", "flowcontrol/ordering/fcfs", "stable"),
    _t("file-discovery", "endpoint discovery", "datalayer/discovery/file", "beta"),
    _t(
        "global-strict-fairness-policy",
        "flow-control fairness policy",
        "flowcontrol/fairness/globalstrict",
        "stable",
    ),
    _t("header-based-testing-filter", "filter", "scheduling/test/filter", "beta", test_only=True),
    _t("header-label-affinity-scorer", "scorer", "scheduling/scorer/headerlabelaffinity", "alpha"),
    _t("header-profile-handler", "profile handler", "scheduling/profilehandler/headerprofile", "alpha"),
    _t("inflight-load-producer", "data producer", "requestcontrol/dataproducer/inflightload", "beta"),
    _t("k8s-notification-source", "data source", "datalayer/source/notifications", "beta"),
    _t("k8s-peer-discovery", "peer discovery", "datalayer/discovery/k8speer", "alpha"),
    _t("kv-cache-utilization-scorer", "scorer", "scheduling/scorer/kvcacheutilization", "beta"),
    _t("label-producer", "extractor", "datalayer/extractor/label", "alpha"),
    _t("label-selector-filter", "filter", "scheduling/filter/bylabel", "stable"),
    _t("latency-observation-scorer-hub", "scorer", "scheduling/scorer/latencyobservation", "alpha"),
    _t(
        "latency-observer-producer-hub",
        "data producer",
        "requestcontrol/dataproducer/latencyobserver",
        "alpha",
    ),
    _t("latency-scorer", "scorer", "scheduling/scorer/latency", "beta"),
    _t("latency-slo-admitter", "admitter", "requestcontrol/admitter/latencyslo", "beta"),
    _t("load-aware-scorer", "scorer", "scheduling/scorer/loadaware", "beta"),
    _t("lora-affinity-scorer", "scorer", "scheduling/scorer/loraaffinity", "beta"),
    _t("max-saturation-detector", "saturation detector", "flowcontrol/saturationdetector/composite", "beta"),
    _t("max-score-picker", "picker", "scheduling/picker/maxscore", "stable"),
    _t("metrics-data-source", "data source", "datalayer/source/metrics", "beta"),
    _t("mm-embeddings-cache-producer", "data producer", "requestcontrol/dataproducer/multimodal", "beta"),
    _t("mm-embeddings-cache-scorer", "scorer", "scheduling/scorer/mmcacheaffinity", "beta"),
    _t("models-data-extractor", "extractor", "datalayer/extractor/models", "stable"),
    _t("models-data-source", "data source", "datalayer/source/models", "stable"),
    _t(
        "multicluster-approx-prefix-cache-producer",
        "data producer",
        "requestcontrol/dataproducer/approximateprefix",
        "alpha",
    ),
    _t("multicluster-file-discovery", "endpoint discovery", "datalayer/discovery/file", "alpha"),
    _t("multicluster-kv-cache-utilization-scorer", "scorer", "scheduling/scorer/kvcacheutilization", "alpha"),
    _t("multicluster-metrics-data-source", "data source", "datalayer/source/metrics", "alpha"),
    _t("multicluster-metrics-extractor", "extractor", "datalayer/extractor/metrics", "alpha"),
    _t("multicluster-prefix-cache-scorer", "scorer", "scheduling/scorer/prefix", "alpha"),
    _t("multicluster-queue-scorer", "scorer", "scheduling/scorer/queuedepth", "alpha"),
    _t("multicluster-session-affinity-filter", "filter", "scheduling/filter/sessionaffinity", "alpha"),
    _t("no-hit-lru-scorer", "scorer", "scheduling/scorer/nohitlru", "beta"),
    _t("openai-parser", "parser", "requesthandling/parsers/openai", "beta"),
    _t("outlen-bucket", "request-header processor", "requestcontrol/requestheader/outlenbucket", "alpha"),
    _t("p2p-source-producer", "data producer", "requestcontrol/dataproducer/p2psource", "alpha"),
    _t("passthrough-parser", "parser", "requesthandling/parsers/passthrough", "beta"),
    _t(
        "pd-profile-handler",
        "profile handler",
        "scheduling/profilehandler/disagg",
        "beta",
        deprecated_in="v0.7.0",
        removal_in="v0.9.0",
        replacement="disagg-profile-handler",
    ),
    _t(
        "precise-prefix-cache-producer",
        "data producer",
        "requestcontrol/dataproducer/preciseprefixcache",
        "beta",
    ),
    _t("precise-prefix-cache-scorer", "scorer", "scheduling/scorer/preciseprefixcache", "beta"),
    _t("predicted-latency-producer", "data producer", "requestcontrol/dataproducer/predictedlatency", "beta"),
    _t("prefill-filter", "filter", "scheduling/filter/bylabel", "beta"),
    _t(
        "prefill-header-handler",
        "pre-request plugin",
        "scheduling/profilehandler/disagg",
        "beta",
        deprecated_in="v0.9.0",
        removal_in="v0.11.0",
        replacement="disagg-profile-handler",
    ),
    _t("prefix-based-pd-decider", "P/D decider", "scheduling/profilehandler/disagg", "beta"),
    _t("prefix-cache-affinity-filter", "filter", "scheduling/filter/prefixcacheaffinity", "beta"),
    _t("prefix-cache-scorer", "scorer", "scheduling/scorer/prefix", "beta"),
    _t(
        "priority-holdback-policy",
        "flow-control usage-limit policy",
        "flowcontrol/usagelimits/priorityholdback",
        "beta",
    ),
    _t(
        "priority-then-time-eviction-order-policy",
        "flow-control eviction ordering policy",
        "flowcontrol/eviction/ordering",
        "alpha",
    ),
    _t("probabilistic-admitter", "admitter", "requestcontrol/admitter/probabilisticadmitter", "beta"),
    _t(
        "program-aware-fairness", "flow-control fairness policy", "flowcontrol/fairness/program-aware", "beta"
    ),
    _t("queue-scorer", "scorer", "scheduling/scorer/queuedepth", "beta"),
    _t("random-picker", "picker", "scheduling/picker/random", "stable"),
    _t("request-attribute-reporter", "response processor", "requestcontrol/requestattributereporter", "beta"),
    _t(
        "round-robin-fairness-policy",
        "flow-control fairness policy",
        "flowcontrol/fairness/roundrobin",
        "beta",
    ),
    _t("running-requests-size-scorer", "scorer", "scheduling/scorer/runningrequests", "beta"),
    _t("selective-kv-policy", "pre-request plugin", "requestcontrol/selectivekv", "alpha"),
    # Not registered at 7435f357: the PR that adds it registers it Alpha (docs/plugins.md).
    _t("served-model-filter", "filter", "scheduling/filter/servedmodel", "alpha"),
    _t("session-affinity-filter", "filter", "scheduling/filter/sessionaffinity", "alpha"),
    _t("session-affinity-scorer", "scorer", "scheduling/scorer/sessionaffinity", "alpha"),
    _t("session-id-producer", "data producer", "requestcontrol/dataproducer/sessionid", "beta"),
    _t("session-state-producer", "data producer", "requestcontrol/dataproducer/sessionstate", "alpha"),
    _t("sglanghttp-parser", "parser", "requesthandling/parsers/sglanghttp", "beta"),
    _t(
        "sheddable-eviction-filter", "flow-control eviction filter", "flowcontrol/eviction/filtering", "alpha"
    ),
    _t("single-profile-handler", "profile handler", "scheduling/profilehandler/single", "stable"),
    _t(
        "slo-deadline-ordering-policy",
        "flow-control ordering policy",
        "flowcontrol/ordering/slodeadline",
        "beta",
    ),
    _t("slo-headroom-tier-filter", "filter", "scheduling/filter/sloheadroomtier", "beta"),
    _t(
        "soft-reflective-ceiling-policy",
        "flow-control usage-limit policy",
        "flowcontrol/usagelimits/softreflectiveceiling",
        "alpha",
    ),
    _t("static-usage-limit-policy", "flow-control usage-limit policy", "flowcontrol/usagelimits", "beta"),
    _t(
        "strict-band-selection-policy",
        "flow-control band-selection policy",
        "flowcontrol/bandselection",
        "beta",
    ),
    _t("thunder-agent", "request-control plugin", "thunderagent", "alpha"),
    _t("token-load-scorer", "scorer", "scheduling/scorer/tokenload", "beta"),
    _t("token-producer", "data producer", "requestcontrol/dataproducer/tokenizer", "beta"),
    _t(
        "tokenizer",
        "data producer",
        "requestcontrol/dataproducer/tokenizer",
        "beta",
        deprecated_in="v0.9.0",
        removal_in="v0.11.0",
        replacement="token-producer",
    ),
    _t("topology-affinity-filter", "filter", "scheduling/filter/topologyaffinity", "alpha"),
    _t("topology-affinity-scorer", "scorer", "scheduling/scorer/topologyaffinity", "alpha"),
    _t("topology-extractor", "extractor", "datalayer/extractor/topology", "alpha"),
    _t(
        "topology-stamp-handler",
        "response processor",
        "requestcontrol/responsereceived/topologystamp",
        "alpha",
    ),
    _t("utilization-detector", "saturation detector", "flowcontrol/saturationdetector/utilization", "beta"),
    _t("utilization-filter", "filter", "scheduling/filter/utilization", "alpha"),
    _t("vertexai-parser", "parser", "requesthandling/parsers/vertexai", "beta"),
    _t("vllmgrpc-parser", "parser", "requesthandling/parsers/vllmgrpc", "beta"),
    _t("vllmhttp-parser", "parser", "requesthandling/parsers/vllmhttp", "beta"),
    _t("weighted-random-picker", "picker", "scheduling/picker/weightedrandom", "stable"),
)

_BY_NAME = {t.name: t for t in UPSTREAM_TYPES}


def upstream_type(name: str) -> UpstreamType | None:
    """The upstream type called `name`, or None when upstream registers no such type."""
    return _BY_NAME.get(name)


def missing_types(have: Iterable[str]) -> tuple[UpstreamType, ...]:
    """The upstream types not among `have` (type names and aliases epick registers), by name."""
    present = set(have)
    return tuple(t for t in UPSTREAM_TYPES if t.name not in present)


# Upstream types whose work epick does without a plugin, and what to do instead. Only true
# equivalents are listed; any other missing type's error points at docs/plugins.md.
EQUIVALENT_FIXES: dict[str, str] = {}


def missing_types_table(have: Iterable[str]) -> str:
    """The Markdown table of docs/plugins.md's "Upstream types epick does not have yet" section."""
    lines = ["| type | kind | upstream origin |", "|---|---|---|"]
    for t in missing_types(have):
        notes = []
        if t.deprecated:
            notes.append(f"deprecated upstream since {t.deprecated_in}, replaced by `{t.replacement}`")
        if t.test_only:
            notes.append("upstream registers it for its conformance tests only")
        note = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"| `{t.name}`{note} | {t.kind} | {t.origin} |")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class FeatureGate:
    """A feature gate the upstream EPP registers; `featureGates` entries are `name` or `name=<bool>`."""

    name: str
    enabled_by_default: bool
    enables: str  # what turning it on does upstream
    package: str  # Go package path that defines the gate, in `repository`
    repository: str = UPSTREAM_REPOSITORY

    @property
    def origin(self) -> str:
        return f"{self.repository}, {self.package}"


# Registered in llm-d/llm-d-router, cmd/epp/runner/runner.go (`loader.RegisterFeatureGate`).
FEATURE_GATES: tuple[FeatureGate, ...] = (
    FeatureGate(
        "flowControl",
        False,
        "the flow-control layer (the flowControl section's queues and priority bands, its fairness, "
        "ordering and usage-limit policies) in place of saturation-only admission control",
        "pkg/epp/flowcontrol",
    ),
    FeatureGate(
        "haPopulateNonLeaderDatastore",
        True,
        "running the datastore reconcilers on non-leader replicas, so that a request reaching a standby "
        "replica is routed instead of answered with 503",
        "pkg/epp/server",
    ),
)


@dataclass(frozen=True, slots=True)
class RetiredFeatureGate:
    """A gate upstream registered once and removed: its loader now rejects it as unknown, but the
    files of the releases that had it (GIE v1.5.0, llm-d-inference-scheduler v0.8.0) still carry it."""

    name: str
    removed_in: str  # the first llm-d-router release without it
    change: str  # the upstream change that removed it
    did: str  # what it did
    in_epick: str  # why it has no effect in epick


RETIRED_FEATURE_GATES: tuple[RetiredFeatureGate, ...] = (
    RetiredFeatureGate(
        "dataLayer",
        "v0.10.0",
        "llm-d/llm-d-router#1728",
        "turned on the data layer, which upstream always runs now",
        "always runs its data layer",
    ),
    RetiredFeatureGate(
        "enableLegacyMetrics",
        "v0.9.0",
        "llm-d/llm-d-router#1418",
        "fell back to the legacy backend/metrics polling, since deleted",
        "scrapes metrics through its data layer only",
    ),
    RetiredFeatureGate(
        "prepareDataPlugins",
        "v0.9.0",
        "kubernetes-sigs/gateway-api-inference-extension#2453",
        "turned on the PrepareData plugins, which upstream always runs now",
        "always runs its data producers",
    ),
)


def feature_gate(name: str) -> FeatureGate | None:
    return next((g for g in FEATURE_GATES if g.name == name), None)


def retired_feature_gate(name: str) -> RetiredFeatureGate | None:
    return next((g for g in RETIRED_FEATURE_GATES if g.name == name), None)
