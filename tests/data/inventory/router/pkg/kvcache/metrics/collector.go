package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	metricsutil "github.com/llm-d/llm-d-router/pkg/common/observability/metrics"
)

const routerSubsystem = metricsutil.LLMDRouterEndpointPickerSubsystem

type dualCounter struct {
	deprecated, current prometheus.Counter
}

// newDualCounter builds a family under its old kvcache_ name and one under llm_d_epp_.
func newDualCounter(oldSubsystem, oldName, newName, help string) *dualCounter {
	return &dualCounter{
		deprecated: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvcache", Subsystem: oldSubsystem, Name: oldName,
			Help: "Deprecated: use " + routerSubsystem + "_" + newName + ". " + help,
		}),
		current: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: routerSubsystem, Name: newName,
			Help: help,
		}),
	}
}

var (
	Admissions = newDualCounter("index", "admissions_total",
		"kv_cache_index_admissions_total", "Total number of KV-block admissions")

	LookupLatency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Subsystem: routerSubsystem, Name: "kv_cache_index_lookup_latency_seconds",
		Help:    "Latency of Lookup calls in seconds",
		Buckets: prometheus.DefBuckets,
	})
)
