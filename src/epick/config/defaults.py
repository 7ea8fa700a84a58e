"""The config used when none is given: the Go EPP's default weights."""

DEFAULT_CONFIG_YAML = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
"""

DEFAULT_PROFILE = "default"
DEFAULT_PICKER = "max-score-picker"
DEFAULT_HANDLER = "single-profile-handler"
# Built with the thresholds of a `saturationDetector` section, or as the default detector.
DEFAULT_SATURATION_DETECTOR = "utilization-detector"

# Upstream's parsers when a config lists none (llm-d/llm-d-router, pkg/epp/config/loader/defaults.go):
# the last, claiming no path, forwards what the others do not claim.
DEFAULT_PARSERS = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")
# The parser types upstream registers (named in the fixes a wrong parser reference gets).
PARSER_TYPES = (
    "openai-parser",
    "anthropic-parser",
    "vllmhttp-parser",
    "sglanghttp-parser",
    "vertexai-parser",
    "vllmgrpc-parser",
    "passthrough-parser",
)
