"""The scheduling framework: contracts, value types and the scheduling cycle.

Pure: nothing here does I/O, and nothing imports HTTP, Kubernetes or asyncio.
"""

from epick.framework.clock import Clock
from epick.framework.cycle_state import CycleState
from epick.framework.endpoint import ROLE_LABEL, Endpoint, Metrics
from epick.framework.errors import EndpointsFilteredError, NoEndpointsError, SchedulingError
from epick.framework.interfaces import (
    Admitter,
    BatchingProducer,
    Closeable,
    DataProducer,
    EndpointRemoved,
    Filter,
    NeedsProfiles,
    Picker,
    PluginTimer,
    PrefillProfileBound,
    PreRequest,
    ProfileHandler,
    ProfileLike,
    ReadinessChecker,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseReceived,
    ResponseStreaming,
    SaturationDetector,
    Scorer,
    Screener,
    StagedSaturationDetector,
    StateDumper,
)
from epick.framework.metrics import LLMD_SUBSYSTEM, ExportsMetrics, MetricSample
from epick.framework.parsing import ParsedRequest, Parser, ParserSet, merge_usage
from epick.framework.plugin import NamedPlugin, Plugin, TypedName, state_key
from epick.framework.profile import SchedulerProfile, WeightedScorer
from epick.framework.reads import Reads, depends_on_metrics_alone, reads_of
from epick.framework.request import (
    BadRequestError,
    ChatMessage,
    InferenceRequest,
    RequestBody,
    new_request_id,
)
from epick.framework.response import Response, Usage
from epick.framework.results import (
    ProfileRunResult,
    SchedulingResult,
    ScoredEndpoint,
    ScoredEndpoints,
    split_scored,
)
from epick.framework.scheduler import Scheduler
from epick.framework.snapshot import Snapshot
from epick.framework.tokens import InitializedTokenizer, RemoteTokenizer, TokenizeCall, TokenizedPrompt
from epick.framework.trace import ScheduleTrace

__all__ = [
    "LLMD_SUBSYSTEM",
    "ROLE_LABEL",
    "Admitter",
    "BadRequestError",
    "BatchingProducer",
    "ChatMessage",
    "Clock",
    "Closeable",
    "CycleState",
    "DataProducer",
    "Endpoint",
    "EndpointRemoved",
    "EndpointsFilteredError",
    "ExportsMetrics",
    "Filter",
    "InferenceRequest",
    "InitializedTokenizer",
    "MetricSample",
    "Metrics",
    "NamedPlugin",
    "NeedsProfiles",
    "NoEndpointsError",
    "ParsedRequest",
    "Parser",
    "ParserSet",
    "Picker",
    "Plugin",
    "PluginTimer",
    "PreRequest",
    "PrefillProfileBound",
    "ProfileHandler",
    "ProfileLike",
    "ProfileRunResult",
    "ReadinessChecker",
    "Reads",
    "RemoteTokenizer",
    "RequestBody",
    "RequestHeaderProcessor",
    "Response",
    "ResponseComplete",
    "ResponseReceived",
    "ResponseStreaming",
    "SaturationDetector",
    "ScheduleTrace",
    "Scheduler",
    "SchedulerProfile",
    "SchedulingError",
    "SchedulingResult",
    "ScoredEndpoint",
    "ScoredEndpoints",
    "Scorer",
    "Screener",
    "Snapshot",
    "StagedSaturationDetector",
    "StateDumper",
    "TokenizeCall",
    "TokenizedPrompt",
    "TypedName",
    "Usage",
    "WeightedScorer",
    "depends_on_metrics_alone",
    "merge_usage",
    "new_request_id",
    "reads_of",
    "split_scored",
    "state_key",
]
