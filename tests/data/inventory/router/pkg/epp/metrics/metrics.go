package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	compbasemetrics "k8s.io/component-base/metrics"

	metricsutil "github.com/llm-d/llm-d-router/pkg/common/observability/metrics"
)

const (
	inferenceObjectiveComponent = "inference_objective"

	// LLMDRouterEndpointPickerSubsystem is re-exported for the plugins.
	LLMDRouterEndpointPickerSubsystem = metricsutil.LLMDRouterEndpointPickerSubsystem
)

var (
	modelLabels                     = []string{"model_name", "target_model_name"}
	modelLabelsWithFairnessPriority = append(append([]string{}, modelLabels...), "fairness_id", "priority")
)

var (
	// Deprecated: Use llm_d_epp_request_total instead.
	requestCounter = prometheus.NewCounterVec(
		prometheus.CounterOpts{
			Subsystem: inferenceObjectiveComponent,
			Name:      "request_total",
			Help:      metricsutil.HelpMsgWithStability("[Deprecated: Use llm_d_epp_request_total] Counter of requests.", compbasemetrics.ALPHA),
		},
		modelLabels,
	)

	llmdRequestCounter = prometheus.NewCounterVec(
		prometheus.CounterOpts{
			Subsystem: LLMDRouterEndpointPickerSubsystem,
			Name:      "request_total",
			Help:      metricsutil.HelpMsgWithStability("Total number of processed requests.", compbasemetrics.ALPHA),
		},
		modelLabelsWithFairnessPriority,
	)

	llmdRequestLatencies = prometheus.NewHistogramVec(
		prometheus.HistogramOpts{
			Subsystem: LLMDRouterEndpointPickerSubsystem,
			Name:      "request_duration_seconds",
			Help:      metricsutil.HelpMsgWithStability("End-to-end request latency.", compbasemetrics.ALPHA),
			Buckets:   []float64{0.005, 0.025, 0.1, 1, 10},
		},
		append(modelLabelsWithFairnessPriority, "streaming"),
	)

	llmdRequestQueueBytes = prometheus.NewGaugeVec(
		prometheus.GaugeOpts{
			Subsystem: LLMDRouterEndpointPickerSubsystem,
			Name:      "flow_control_queue_bytes",
			Help:      metricsutil.HelpMsgWithStability("Bytes queued.", compbasemetrics.ALPHA),
		},
		append([]string{"fairness_id", "priority", "inference_pool"}, modelLabels...),
	)

	llmdInfo = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: LLMDRouterEndpointPickerSubsystem, Name: "scheduler_info",
		Help: "Information about the scheduler.",
	})
)

var (
	// DescPerEndpointQueueSize is exported for the collectors package.
	DescPerEndpointQueueSize = prometheus.NewDesc(
		"llm_d_epp_per_endpoint_queue_size",
		metricsutil.HelpMsgWithStability("Requests pending per endpoint.", compbasemetrics.ALPHA),
		[]string{
			"name",
			"model_server_endpoint",
		}, nil,
	)
)
