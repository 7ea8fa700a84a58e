package collectors

import (
	"github.com/prometheus/client_golang/prometheus"

	eppmetrics "github.com/llm-d/llm-d-router/pkg/epp/metrics"
)

type poolCollector struct{}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(
		eppmetrics.DescPerEndpointQueueSize,
		prometheus.GaugeValue,
		1,
		"pool",
		"endpoint",
	)
}
