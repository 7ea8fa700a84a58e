"""`selective-kv-policy`: whether the model server may load a request's KV blocks from outside GPU
memory (CPU, secondary tiers) or offload them, set in the request's `kv_transfer_params`.

As upstream's (llm-d/llm-d-router, pkg/epp/framework/plugins/requestcontrol/selectivekv, plugin.go at
e872cb8d and README.md at 248dbdf5; Alpha, PR #2833). It needs a vLLM with `max_load_tokens`
(vllm-project/vllm #55885): `kv_transfer_params.max_load_tokens: 0` turns external loads off, GPU
prefix reuse and storing kept; without the field loading is uncapped.

Parameters (required: both policies `preserve`, an empty `parameters`, is refused):
- `loadPolicy`: `preserve` (default: leave `max_load_tokens` alone), `disable` (always set it to 0),
  or `threshold`: look at the first target of the primary profile. Its reusable tokens outside GPU
  memory are (the longest run any non-GPU, non-speculative tier holds − the GPU run) × block size,
  from the prefix match of `prefixMatchInfoProducerName` (default `precise-prefix-cache-producer`,
  which must be in the config: only the precise index knows tiers; "" reads the approximate
  producer's key, as upstream's unnamed key, and one is added with defaults). No target, no match
  or a producer without tiers: leave the request alone (fail open). Fewer than
  `minExternalReusableTokens` (> 0, required by threshold): set `max_load_tokens: 0`; at least that
  many: remove `max_load_tokens` (uncapped loading), unless the waiting-queue gate is closed, which
  sets it to 0.
- `maxWaitingRequests` (>= 0; > 0 needs threshold): the gate. Per endpoint, an average of the waiting
  queue over its scrapes (a new sample at a later scrape time moves it by 1 − exp(−ln 2 · Δt / 2 s);
  an older one restarts it); the gate closes when the average reaches `maxWaitingRequests` and opens
  again when it falls to half of it. An endpoint with no scrape time passes.
- `offloadPolicy`: `preserve` (default) or `disable` (set `max_offload_tokens: 0`).
Other `kv_transfer_params` fields are kept; the object is made only to set a field to 0 (a value that
is not an object is replaced then). A native generate body and a body that is not a JSON object are
left alone.

Deviations and gaps:
- The change is made to the parsed body (`RequestBody.raw`, as upstream changes its payload map) and
  marked (`RequestBody.mark_mutated`, upstream's `Body.Mutated`): both front ends then forward the
  body re-encoded (compact JSON; the client's formatting is not kept). The cycle state's
  `BODY_MUTATED_KEY` says so too, for other plugins.
- Followed plugin.go at e872cb8d (a field already 0 is left as is, so an unchanged body is not marked;
  an endpoint that leaves the pool drops its gate); 248dbdf5's writes the same fields.
- The prefix match is epick's cycle-state `PrefixMatch` (upstream reads it from the endpoint); its
  per-tier runs come from `PrefixMatch.tiers`, which only `precise-prefix-cache-producer` sets.
- Like upstream, the decision uses the primary profile's target, which in a disaggregated config is
  the decode endpoint, not the one that loads KV at prefill; do not use it there.
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from epick.framework import CycleState, Endpoint, InferenceRequest, NamedPlugin, Reads, SchedulingResult
from epick.framework.datalayer import data_key
from epick.framework.request import CHARS_PER_TOKEN
from epick.kvcache.index import SPECULATIVE
from epick.plugins.prefix.scorer import MATCH_DATA_TYPE, MATCH_PRODUCER_TYPES, PrefixMatch
from epick.plugins.registry import Handle, ParameterError, Parameters, PluginSpec

TYPE = "selective-kv-policy"
DEFAULT_PRODUCER = "precise-prefix-cache-producer"
APPROX_PRODUCER = "approx-prefix-cache-producer"
KV_TRANSFER_PARAMS = "kv_transfer_params"
MAX_LOAD_TOKENS = "max_load_tokens"
MAX_OFFLOAD_TOKENS = "max_offload_tokens"
GPU_TIER = "gpu"
HALF_LIFE = 2.0  # seconds: the waiting-queue average's
REOPEN_RATIO = 0.5  # the gate opens again at this share of maxWaitingRequests
# Written to the request's cycle state (True) when a hook changed the parsed body (`RequestBody.raw`)
# so that the forwarded bytes must be re-encoded from it.
BODY_MUTATED_KEY = data_key("request-body-mutated", "")

LoadPolicy = Literal["preserve", "disable", "threshold"]
OffloadPolicy = Literal["preserve", "disable"]
LoadAction = Literal["preserve", "disable", "enable"]


class SelectiveKVParameters(Parameters):
    load_policy: LoadPolicy = "preserve"
    offload_policy: OffloadPolicy = "preserve"
    min_external_reusable_tokens: int = 0
    max_waiting_requests: int = 0
    prefix_match_info_producer_name: str = DEFAULT_PRODUCER


def check(params: SelectiveKVParameters) -> None:
    """Upstream's validation, as `ParameterError`s."""
    if params.load_policy == "preserve" and params.offload_policy == "preserve":
        raise ParameterError(
            "loadPolicy",
            "at least one of loadPolicy or offloadPolicy must be active",
            "set loadPolicy to disable or threshold, or offloadPolicy to disable",
        )
    if params.load_policy == "threshold" and params.min_external_reusable_tokens <= 0:
        raise ParameterError(
            "minExternalReusableTokens",
            "minExternalReusableTokens must be greater than zero for threshold policy",
            "set the reusable tokens outside GPU memory from which loading pays (e.g. 1024)",
        )
    if params.max_waiting_requests < 0:
        raise ParameterError("maxWaitingRequests", "maxWaitingRequests must not be negative", "use 0 or more")
    if params.max_waiting_requests > 0 and params.load_policy != "threshold":
        raise ParameterError(
            "maxWaitingRequests",
            "maxWaitingRequests requires threshold loadPolicy",
            "set loadPolicy: threshold, or remove maxWaitingRequests",
        )


def producer_name(params: SelectiveKVParameters) -> str:
    """The prefix-match producer read: the one named; "" names upstream's key's own producer, the
    approximate one (which knows no tiers, so threshold then always preserves)."""
    return params.prefix_match_info_producer_name or APPROX_PRODUCER


def _requires(params: SelectiveKVParameters, api_version: str = "") -> tuple[str, ...]:
    """Threshold reading the approximate producer's key gets one added, as upstream's default producer."""
    if params.load_policy == "threshold" and not params.prefix_match_info_producer_name:
        return (APPROX_PRODUCER,)
    return ()


def _is_zero(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == 0


def _set_zero(params: MutableMapping[str, Any], field: str) -> bool:
    """Set `field` to 0 unless it is a number equal to 0; whether anything changed."""
    if _is_zero(params.get(field)):
        return False
    params[field] = 0
    return True


def mutate_kv_transfer_params(
    payload: MutableMapping[str, Any], load: LoadAction, offload: OffloadPolicy
) -> bool:
    """Apply the decisions to `payload["kv_transfer_params"]` in place; whether it changed."""
    value = payload.get(KV_TRANSFER_PARAMS)
    if isinstance(value, MutableMapping):
        params: MutableMapping[str, Any] = value
    else:
        if load != "disable" and offload != "disable":
            return False
        params = {}
    changed = False
    if load == "disable":
        changed = _set_zero(params, MAX_LOAD_TOKENS)
    elif load == "enable" and MAX_LOAD_TOKENS in params:
        del params[MAX_LOAD_TOKENS]
        changed = True
    if offload == "disable":
        changed = _set_zero(params, MAX_OFFLOAD_TOKENS) or changed
    if changed:
        payload[KV_TRANSFER_PARAMS] = params
    return changed


def external_reusable_tokens(match: PrefixMatch, endpoint: str) -> int | None:
    """Tokens of the prompt's prefix `endpoint` holds outside GPU memory beyond what it holds on GPU:
    (the longest non-GPU, non-speculative tier run − the GPU run, at least 0) × block size; None when
    the match has no tier data or no block size (no evidence)."""
    block_tokens = match.block_bytes // CHARS_PER_TOKEN
    if match.tiers is None or block_tokens <= 0:
        return None
    by_tier = match.tiers(endpoint)
    gpu = by_tier.get(GPU_TIER, 0)
    external = max((n for tier, n in by_tier.items() if tier not in (GPU_TIER, SPECULATIVE)), default=0)
    return max(0, external - gpu) * block_tokens


@dataclass(slots=True)
class _Queue:
    average: float
    sampled_at: float
    closed: bool = False


class SelectiveKVPolicy(NamedPlugin):
    plugin_type = TYPE
    reads = Reads.METRICS | Reads.BODY | Reads.HISTORY  # the queue, the body's fields, the gate's state

    def __init__(self, name: str | None = None, params: SelectiveKVParameters | None = None) -> None:
        super().__init__(name)
        params = params or SelectiveKVParameters(load_policy="disable")
        check(params)
        self.load_policy: LoadPolicy = params.load_policy
        self.offload_policy: OffloadPolicy = params.offload_policy
        self.min_external = params.min_external_reusable_tokens
        self.max_waiting = params.max_waiting_requests
        self.match_key = data_key(MATCH_DATA_TYPE, producer_name(params))
        self._queues: dict[str, _Queue] = {}

    # The decision.
    def decide_load(self, result: SchedulingResult, cycle_state: CycleState) -> LoadAction:
        if self.load_policy == "disable":
            return "disable"
        if self.load_policy != "threshold":
            return "preserve"
        r = result.profile_results.get(result.primary_profile)
        if r is None or not r.targets:
            return "preserve"
        endpoint = r.targets[0]
        match = cycle_state.read(self.match_key, PrefixMatch)
        tokens = external_reusable_tokens(match, endpoint.name) if match is not None else None
        if tokens is None:
            return "preserve"
        if tokens < self.min_external:
            return "disable"
        return "disable" if self.queue_closed(endpoint) else "enable"

    def queue_closed(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's waiting-queue gate is closed, after taking in its latest sample."""
        sampled_at = endpoint.metrics.update_time
        if self.max_waiting == 0 or not endpoint.name or sampled_at is None:
            return False
        sample = float(endpoint.metrics.waiting_queue_size)
        q = self._queues.get(endpoint.name)
        if q is None or sampled_at < q.sampled_at:
            q = _Queue(sample, sampled_at)
        elif sampled_at > q.sampled_at:
            weight = 1.0 - math.exp(-math.log(2) * (sampled_at - q.sampled_at) / HALF_LIFE)
            q.average += weight * (sample - q.average)
            q.sampled_at = sampled_at
        limit = float(self.max_waiting)
        if q.closed:
            if q.average <= limit * REOPEN_RATIO:
                q.closed = False
        elif q.average >= limit:
            q.closed = True
        self._queues[endpoint.name] = q
        return q.closed

    # PreRequest.
    def pre_request(
        self, request: InferenceRequest, result: SchedulingResult, cycle_state: CycleState
    ) -> None:
        load = self.decide_load(result, cycle_state)
        if load == "preserve" and self.offload_policy == "preserve":
            return
        body = request.body
        payload = body.raw
        if body.kind == "generate" or not isinstance(payload, MutableMapping):
            return
        if mutate_kv_transfer_params(payload, load, self.offload_policy):
            body.mark_mutated()
            cycle_state.write(BODY_MUTATED_KEY, True)

    def endpoint_removed(self, name: str) -> None:
        self._queues.pop(name, None)

    def dump_state(self) -> object:
        """The waiting-queue gates (`/debug/plugins/state`)."""
        names = sorted(self._queues)[:100]
        return {
            "gates": [
                {"endpoint": n, "average": self._queues[n].average, "closed": self._queues[n].closed}
                for n in names
            ],
            "totalEndpoints": len(self._queues),
        }


def _check_producer(handle: Handle, name: str) -> None:
    """The prefix-match producer `name` is in the config (a `ParameterError` if not, or if it is not one)."""
    try:
        plugin = handle.plugin(name)
    except LookupError:
        raise ParameterError(
            "prefixMatchInfoProducerName",
            f"threshold loadPolicy reads the prefix match of {name!r}, which this config does not define",
            f"add a {DEFAULT_PRODUCER} (only it knows the cache tiers), or name the producer to read",
        ) from None
    if plugin.typed_name.type not in MATCH_PRODUCER_TYPES:
        raise ParameterError(
            "prefixMatchInfoProducerName",
            f"plugin {name!r} ({plugin.typed_name.type}) does not produce prefix-match data",
            f"name a plugin of type {' or '.join(MATCH_PRODUCER_TYPES)}",
        )


def _factory(name: str, params: SelectiveKVParameters, handle: Handle) -> SelectiveKVPolicy:
    check(params)
    if params.load_policy == "threshold":  # upstream's Consumes: the producer must be in the config
        _check_producer(handle, producer_name(params))
    return SelectiveKVPolicy(name, params)


def _worker_state(params: SelectiveKVParameters) -> str:
    if params.max_waiting_requests > 0:
        return "each endpoint's waiting-queue average and gate, from the scrapes its own requests saw"
    return ""


SPEC = PluginSpec(
    TYPE,
    _factory,
    SelectiveKVParameters,
    "turns KV loading from CPU/secondary tiers (max_load_tokens) or offloading off per request",
    requires=_requires,
    worker_state=_worker_state,
)
