"""Flow-control policies: how requests are ordered within a flow, which flow of a priority band is
served next, how far each band may push the pool, and which in-flight requests may be evicted
(upstream: llm-d/llm-d-router, pkg/epp/framework/plugins/flowcontrol). The protocols they implement
are in `epick.framework.flowcontrol`."""
