"""`label-producer` (llm-d, alpha): publish pod labels as string endpoint attributes, for plugins that
read attributes rather than Kubernetes labels (`endpoint-attribute-weight-scorer`).

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/datalayer/extractor/label/producer.go,
its "labels list" version, and README.md at 4557d409; PR #2204): an extractor of endpoint
notifications that wires itself to them (declare it under `plugins` only, not under
`dataLayer.sources`). Parameter `labels`, a non-empty list of `{label, attributeKey}` (both
required in each entry; no `attributeKey` twice): when an endpoint appears or changes, each entry's
attribute "<attributeKey>/<this plugin's name>" holds the endpoint's `label` label as a string (an
empty label value is a value), and the endpoint has no such attribute while it lacks the label. A
consumer names `attributeKey` and `producer: <this plugin's name>`. Removing an endpoint does
nothing more (its attributes leave with it).

Upstream stores an attribute that reads the label each time it is read, so a label update shows at
once; epick's data layer calls the extractor on every change of the endpoint, labels included, which
comes to the same.

Not enforced here: upstream refuses a second `label-producer` in one config (its factory looks at
every plugin of the config). An epick factory sees only the plugins it asks for by name, so the
config loader must do that check; two instances here would simply publish under their own names.
The older upstream form (one `label`, `attributeKey` and `valueType: string|number`, in PR #2204's
first version) is not accepted.
"""

from __future__ import annotations

from collections.abc import Mapping

from epick.framework import Endpoint, NamedPlugin, Reads
from epick.framework.datalayer import data_key
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "label-producer"


class LabelMappingParameters(Parameters):
    label: str = ""
    attribute_key: str = ""


class LabelProducerParameters(Parameters):
    labels: list[LabelMappingParameters] | None = None


class LabelProducer(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.NOTHING

    def __init__(self, name: str | None, labels: Mapping[str, str]) -> None:
        """`labels`: the pod label each attributeKey publishes, by attributeKey."""
        super().__init__(name)
        self.labels = {data_key(attribute, self.name): label for attribute, label in labels.items()}

    def produces(self) -> tuple[str, ...]:
        """The data keys this producer writes."""
        return tuple(self.labels)

    def endpoint_changed(self, endpoint: Endpoint) -> Mapping[str, object | None]:
        labels = endpoint.labels
        return {key: labels.get(label) for key, label in self.labels.items()}


def _factory(name: str, params: LabelProducerParameters, handle: Handle) -> LabelProducer:
    entries = params.labels or []
    if not entries:
        raise ParameterError(
            "labels",
            "requires non-empty 'labels'",
            "list the labels to publish, e.g. labels: [{label: nvidia.com/gpu.product, "
            "attributeKey: gpu.product}]",
        )
    labels: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"labels[{i}]"
        for field, alias in (("label", "label"), ("attribute_key", "attributeKey")):
            if not getattr(entry, field):
                raise ParameterError(
                    f"{where}.{alias}",
                    "requires non-empty 'label' and 'attributeKey' in each mapping",
                    f"set {alias}",
                )
        if entry.attribute_key in labels:
            raise ParameterError(
                f"{where}.attributeKey",
                f'duplicate attributeKey "{entry.attribute_key}"',
                "give each label its own attributeKey",
            )
        labels[entry.attribute_key] = entry.label
    return LabelProducer(name, labels)


SPEC = PluginSpec(
    TYPE,
    _factory,
    LabelProducerParameters,
    "pod labels as string attributes <attributeKey>/<its name>, for attribute consumers",
    worker_state="",
)
