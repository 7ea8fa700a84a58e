"""The in-tree plugins, each in its own module, listed in one place."""

from epick.plugins.admission import probabilistic
from epick.plugins.conformance import header_filter, served_verifier
from epick.plugins.datalayer import (
    core_metrics,
    dcgm,
    file_discovery,
    label_producer,
    metrics_source,
    models,
    notifications,
    syncer,
    topology,
)
from epick.plugins.datalayer import multicluster as multicluster_datalayer
from epick.plugins.filters import (
    by_label,
    classic,
    label_selector,
    modality,
    prefix_affinity,
    role,
    served_model,
    utilization,
    utilization_filter,
)
from epick.plugins.filters import endpoint_attribute as endpoint_attribute_filter
from epick.plugins.filters import topology_affinity as topology_affinity_filter
from epick.plugins.flowcontrol import (
    band_selection,
    eviction,
    fairness,
    max_saturation,
    ordering,
    program_aware,
    usage_limits,
)
from epick.plugins.latency import admitter as latency_admitter
from epick.plugins.latency import cost_scorer as latency_cost_scorer
from epick.plugins.latency import gie_scorer as predicted_latency_scorer
from epick.plugins.latency import observation_scorer as latency_observation_scorer
from epick.plugins.latency import observer as latency_observer
from epick.plugins.latency import producer as latency_producer
from epick.plugins.latency import scorer as latency_scorer
from epick.plugins.latency import tier_filter as slo_tier_filter
from epick.plugins.load import concurrency, inflight
from epick.plugins.multimodal import producer as mm_producer
from epick.plugins.multimodal import scorer as mm_scorer
from epick.plugins.parsers import anthropic, openai, passthrough, sglanghttp, vertexai, vllmgrpc, vllmhttp
from epick.plugins.pickers import max_score, random_picker, round_robin, weighted_random
from epick.plugins.prefix import burst, p2p_source, precise, precise_scorer, smallest_cache
from epick.plugins.prefix import producer as prefix_producer
from epick.plugins.prefix import scorer as prefix_scorer
from epick.plugins.prerequest import prefill_header, selective_kv
from epick.plugins.profile import data_parallel, deciders, disagg, header, pd, shadow, single
from epick.plugins.registry import PluginSpec, Registry
from epick.plugins.reporters import request_attribute, topology_stamp
from epick.plugins.requestheader import agent_identity, outlen_bucket
from epick.plugins.scorers import (
    active_request,
    attribute_weight,
    context_length_aware,
    header_label_affinity,
    kv_cache,
    load_aware,
    lora_affinity,
    no_hit_lru,
    queue,
    running_requests,
    session_affinity,
    token_load,
)
from epick.plugins.scorers import endpoint_attribute as endpoint_attribute_scorer
from epick.plugins.scorers import multicluster as multicluster_scorers
from epick.plugins.scorers import topology_affinity as topology_affinity_scorer
from epick.plugins.screeners import disaggregatedset_rollout, endpoint_pin
from epick.plugins.session import filter as session_filter
from epick.plugins.session import producer as session_producer
from epick.plugins.session import state_producer as session_state_producer
from epick.plugins.tokens import producer as token_producer


def in_tree_plugins() -> list[PluginSpec]:
    """Every plugin type epick ships, by its config type name."""
    return [
        header_filter.SPEC,
        served_verifier.SPEC,
        max_score.SPEC,
        random_picker.SPEC,
        weighted_random.SPEC,
        round_robin.SPEC,
        queue.SPEC,
        running_requests.SPEC,
        kv_cache.SPEC,
        lora_affinity.SPEC,
        prefix_scorer.SPEC,
        prefix_producer.SPEC,
        precise.SPEC,
        precise_scorer.SPEC,
        token_producer.SPEC,
        load_aware.SPEC,
        active_request.SPEC,
        session_affinity.SPEC,
        no_hit_lru.SPEC,
        token_load.SPEC,
        label_selector.SPEC,
        by_label.SPEC,
        served_model.SPEC,
        modality.SPEC,
        *classic.specs(),
        role.DECODE_SPEC,
        role.PREFILL_SPEC,
        role.ENCODE_SPEC,
        utilization.SPEC,
        single.SPEC,
        disagg.SPEC,
        pd.SPEC,
        shadow.SPEC,
        deciders.PREFIX_SPEC,
        deciders.ALWAYS_SPEC,
        deciders.MULTIMODAL_SPEC,
        prefill_header.SPEC,
        openai.SPEC,
        anthropic.SPEC,
        vllmhttp.SPEC,
        sglanghttp.SPEC,
        vertexai.SPEC,
        vllmgrpc.SPEC,
        passthrough.SPEC,
        metrics_source.SPEC,
        core_metrics.SPEC,
        dcgm.SOURCE_SPEC,
        dcgm.EXTRACTOR_SPEC,
        models.SOURCE_SPEC,
        models.EXTRACTOR_SPEC,
        notifications.ENDPOINT_SPEC,
        notifications.K8S_SPEC,
        file_discovery.SPEC,
        syncer.SPEC,
        topology.SPEC,
        label_producer.SPEC,
        topology_affinity_filter.SPEC,
        topology_affinity_scorer.SPEC,
        endpoint_attribute_filter.SPEC,
        endpoint_attribute_scorer.SPEC,
        attribute_weight.SPEC,
        header_label_affinity.SPEC,
        context_length_aware.SPEC,
        probabilistic.SPEC,
        request_attribute.SPEC,
        topology_stamp.SPEC,
        data_parallel.SPEC,
        header.SPEC,
        inflight.SPEC,
        concurrency.SPEC,
        prefix_affinity.SPEC,
        latency_producer.SPEC,
        latency_scorer.SPEC,
        slo_tier_filter.SPEC,
        latency_admitter.SPEC,
        latency_cost_scorer.SPEC,
        predicted_latency_scorer.SPEC,
        smallest_cache.SPEC,
        utilization_filter.SPEC,
        session_producer.SPEC,
        session_filter.SPEC,
        agent_identity.SPEC,
        disaggregatedset_rollout.SPEC,
        endpoint_pin.SPEC,
        ordering.FCFS_SPEC,
        ordering.EDF_SPEC,
        ordering.SLO_DEADLINE_SPEC,
        fairness.GLOBAL_STRICT_SPEC,
        fairness.ROUND_ROBIN_SPEC,
        band_selection.SPEC,
        max_saturation.SPEC,
        program_aware.SPEC,
        usage_limits.STATIC_SPEC,
        usage_limits.PRIORITY_HOLDBACK_SPEC,
        usage_limits.SOFT_REFLECTIVE_CEILING_SPEC,
        eviction.SHEDDABLE_FILTER_SPEC,
        eviction.PRIORITY_THEN_TIME_SPEC,
        mm_producer.SPEC,
        mm_scorer.SPEC,
        burst.SPEC,
        multicluster_datalayer.DISCOVERY_SPEC,
        multicluster_datalayer.SOURCE_SPEC,
        multicluster_datalayer.EXTRACTOR_SPEC,
        multicluster_scorers.QUEUE_SPEC,
        multicluster_scorers.KV_SPEC,
        session_filter.MULTICLUSTER_SPEC,
        prefix_producer.MULTICLUSTER_SPEC,
        prefix_scorer.MULTICLUSTER_SPEC,
        p2p_source.SPEC,
        outlen_bucket.SPEC,
        session_state_producer.SPEC,
        selective_kv.SPEC,
        latency_observer.SPEC,
        latency_observation_scorer.SPEC,
    ]


def in_tree_registry() -> Registry:
    """A registry holding the in-tree plugin types."""
    registry = Registry()
    for spec in in_tree_plugins():
        registry.register(spec)
    return registry


__all__ = ["PluginSpec", "Registry", "in_tree_plugins", "in_tree_registry"]
